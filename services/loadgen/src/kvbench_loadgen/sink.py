"""Records leave in batches (every 250 ms or 500 records) so publishing never disturbs the timing."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from kvbench_contracts.events import RecordsColumnar
from kvbench_contracts.records import RequestRecord
from kvbench_core.bus import Bus

__all__ = ["RecordSink"]

log = logging.getLogger(__name__)

_MAX_BATCH_BYTES = 600_000  # stay well under NATS' default 1 MB payload limit


class RecordSink:
    def __init__(self, bus: Bus, run_id: str, job_id: str, shard: str, interval_s: float, max_records: int) -> None:
        self._bus = bus
        self._ids = (run_id, job_id, shard)
        self._interval_s = interval_s
        self._max_records = max_records
        self._buffer: list[RequestRecord] = []
        self._bytes = 0
        self._full = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.published = 0

    def add(self, record: RequestRecord) -> None:
        self._buffer.append(record)
        self._bytes += 200 + 12 * len(record.chunk_times_s)  # packed: 12 bytes a chunk
        if len(self._buffer) >= self._max_records or self._bytes >= _MAX_BATCH_BYTES:
            self._full.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="record-sink")

    async def _loop(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), timeout=self._interval_s)
            self._full.clear()
            await self.flush()

    async def flush(self) -> None:
        while self._buffer:
            batch, self._buffer, self._bytes = self._buffer, [], 0
            run_id, job_id, shard = self._ids
            message = RecordsColumnar.from_records(run_id, job_id, shard, batch)
            for attempt in range(10):
                try:
                    await self._bus.publish(message)  # same event id on retry: JetStream drops duplicates
                    break
                except Exception:
                    log.warning("record publish failed; retrying", extra={"job_id": job_id, "attempt": attempt})
                    await asyncio.sleep(min(5.0, 0.2 * 2**attempt))
            else:
                raise RuntimeError(f"could not publish {len(batch)} records of job {job_id}")
            self.published += len(batch)

    async def close(self) -> None:
        # never cancel a publish in flight: let the loop finish its batch, then flush the rest
        self._closing = True
        self._full.set()
        if self._task:
            await self._task
        await self.flush()
