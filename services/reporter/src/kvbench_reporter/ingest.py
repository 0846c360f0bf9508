"""Durable consumers' handlers: every fact lands in ``events``; lifecycle facts also update their rows."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from kvbench_contracts.envelope import Envelope
from kvbench_contracts.events import (
    JobFailed,
    JobFinished,
    JobStarted,
    NodeRegistered,
    RecordsBatch,
    RecordsBinary,
    RecordsColumnar,
    RecordsPacked,
    RunFinished,
    RunStarted,
    RunSubmitted,
    split_binary_records,
    split_columnar_records,
)
from kvbench_contracts.records import (
    OFFSETS_TYPECODE,
    PACKED_COLUMNS,
    RECORD_COLUMNS,
)
from kvbench_contracts.registry import messages_in
from kvbench_reporter.record_tables import chunk_columns, columnar_arrays, per_record_chunks, records_table
from kvbench_reporter.store import Conn, RecordBatch, Store

__all__ = ["CONTROL_MODELS", "Ingestor"]

# every lifecycle fact is stored (the audit trail); _apply turns the ones the report reads into rows
CONTROL_MODELS: tuple[type[Envelope], ...] = messages_in("KVBENCH_CONTROL")

OnRunFinished = Callable[[str], Awaitable[None]]

_OFFSET_BYTES = struct.calcsize("<" + OFFSETS_TYPECODE)
_CHUNKS = ("chunk_times_s", "chunk_tokens")
_COLUMNAR_MARK = f'"schema":"{RecordsColumnar.SCHEMA}"'.encode()


def decode_batch(body: bytes) -> tuple[RecordBatch, datetime]:
    """A record batch body (packed or one JSON object per record) as its stored rows (an Arrow table in
    RECORD_COLUMNS order), keyed by the message's event id, and when it was sent; raises on anything that is not
    one, or that holds a value the table would refuse."""
    if b"\n" in body:  # a JSON head line, then the arrays: a binary form (compact JSON has no raw newline)
        if _COLUMNAR_MARK in body[: body.find(b"\n")]:
            return _columnar_table(*split_columnar_records(body, orjson.loads))
        head, *arrays = split_binary_records(body, orjson.loads)
        if head.get("schema") != RecordsBinary.SCHEMA:
            raise ValueError(f"not a records batch: {head.get('schema')!r}")
        return _packed_table(head, *arrays)
    raw = orjson.loads(body)
    schema = raw.get("schema")
    if schema == RecordsPacked.SCHEMA:
        return _packed_table(
            raw,
            base64.b64decode(raw["chunk_offsets"]),
            base64.b64decode(raw["chunk_times"]),
            base64.b64decode(raw["chunk_tokens"]),
        )
    if schema != RecordsBatch.SCHEMA:
        raise ValueError(f"not a records batch: {schema!r}")
    run_id, event_id = str(raw["run_id"]), str(raw["event_id"])
    records = raw["records"]
    columns: dict[str, Sequence[object] | pa.Array] = {
        name: [r.get(name) for r in records] for name in RECORD_COLUMNS if name not in _CHUNKS
    }
    columns["run_id"] = [run_id] * len(records)
    for name, default in (("prompt_tokens", 0), ("output_tokens", 0)):
        columns[name] = [r.get(name, default) for r in records]
    columns["chunk_times_s"], columns["chunk_tokens"] = per_record_chunks(
        [r.get("chunk_times_s") or [] for r in records], [r.get("chunk_tokens") or [] for r in records]
    )
    table = records_table(columns, len(records))
    jobs = set(table.column("job_id").to_pylist())
    job_id = str(jobs.pop()) if len(jobs) == 1 else None
    return RecordBatch(event_id, run_id, job_id, table), datetime.fromisoformat(str(raw["occurred_at"]))


def _columnar_table(head: dict[str, Any], arrays: dict[str, memoryview]) -> tuple[RecordBatch, datetime]:
    """The stored rows of a columnar batch: every column wrapped over the message's own arrays."""
    if head.get("schema") != RecordsColumnar.SCHEMA:
        raise ValueError(f"not a records batch: {head.get('schema')!r}")
    run_id, job_id, shard, event_id = (
        str(head["run_id"]),
        str(head["job_id"]),
        str(head["shard"]),
        str(head["event_id"]),
    )
    count = head["count"]
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"a columnar batch's count is {count!r}")
    offsets_b = arrays.get("chunk_offsets", memoryview(b""))
    if len(offsets_b) != (count + 1) * _OFFSET_BYTES:
        raise ValueError("packed chunk offsets do not match the records")
    columns: dict[str, Sequence[object] | pa.Array] = dict(columnar_arrays(arrays, count))
    columns.update(_batch_ids(job_id=job_id, run_id=run_id, shard=shard, count=count))
    columns["chunk_times_s"], columns["chunk_tokens"] = chunk_columns(
        np.frombuffer(offsets_b, dtype="<" + OFFSETS_TYPECODE),
        arrays.get("chunk_times", b""),
        arrays.get("chunk_tokens", b""),
    )
    table = records_table(columns, count)
    return RecordBatch(event_id, run_id, job_id, table), datetime.fromisoformat(str(head["occurred_at"]))


def _batch_ids(*, count: int, **ids: str) -> dict[str, pa.Array]:
    """The columns a packed batch carries once (its job, run and shard), repeated for each of its records."""
    return {name: _repeated(value, count) for name, value in ids.items()}


def _repeated(text: str, count: int) -> pa.Array:
    """One text ``count`` times, as a string column built from its buffers (no list of ``count`` references)."""
    raw = text.encode()
    offsets = np.arange(count + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(raw * count)])


def _packed_table(raw: dict[str, Any], offsets_b: bytes, times: bytes, tokens: bytes) -> tuple[RecordBatch, datetime]:
    """The stored rows of a packed batch (either form): its per-record lists as columns, its chunk arrays' bytes as
    the two binary columns over the same buffers."""
    run_id, job_id, shard, event_id = str(raw["run_id"]), str(raw["job_id"]), str(raw["shard"]), str(raw["event_id"])
    count = len(raw["request_id"])
    if len(offsets_b) != (count + 1) * _OFFSET_BYTES:
        raise ValueError("packed chunk offsets do not match the records")
    offsets = np.frombuffer(offsets_b, dtype="<" + OFFSETS_TYPECODE)
    columns: dict[str, Sequence[object] | pa.Array] = {
        name: raw[name] for name in PACKED_COLUMNS if name != "connect_s"
    }
    columns["connect_s"] = raw.get("connect_s") or [None] * count  # a producer older than the field sends none
    columns.update(_batch_ids(job_id=job_id, run_id=run_id, shard=shard, count=count))
    columns["chunk_times_s"], columns["chunk_tokens"] = chunk_columns(offsets, times, tokens)
    table = records_table(columns, count)
    return RecordBatch(event_id, run_id, job_id, table), datetime.fromisoformat(str(raw["occurred_at"]))


class Ingestor:
    def __init__(self, store: Store, on_run_finished: OnRunFinished) -> None:
        self.store = store
        self._on_run_finished = on_run_finished
        self.last_batch_at: datetime | None = None
        self.last_batch_rows = 0
        self.rows_stored = 0

    async def control(self, events: Sequence[Envelope]) -> None:
        finished: list[str] = []
        async with self.store.pool.acquire() as conn, conn.transaction():
            await self.store.insert_events(conn, events)
            for event in events:
                await self._apply(conn, event)
                if isinstance(event, RunFinished):
                    finished.append(event.run_id)
        for run_id in finished:
            await self._on_run_finished(run_id)

    async def _apply(self, conn: Conn, e: Envelope) -> None:
        if isinstance(e, RunSubmitted):
            await conn.execute(
                "INSERT INTO runs (run_id, plan_name, plan, submitted_at) VALUES ($1,$2,$3::jsonb,$4) "
                "ON CONFLICT (run_id) DO NOTHING",
                e.run_id,
                e.plan_name,
                json.dumps(e.plan),
                e.occurred_at,
            )
            for w in e.plan.get("workloads", []):
                await conn.execute(
                    "INSERT INTO workloads (run_id, name, stack, strategy, spec) VALUES ($1,$2,$3,$4,$5::jsonb) "
                    "ON CONFLICT DO NOTHING",
                    e.run_id,
                    w["name"],
                    w["stack"],
                    w["strategy"],
                    json.dumps(w),
                )
            for j in e.jobs:
                await conn.execute(
                    "INSERT INTO test_points (run_id, workload, load_level) VALUES ($1,$2,$3) ON CONFLICT DO NOTHING",
                    e.run_id,
                    j["workload"],
                    float(j["load_level"]),
                )
                await conn.execute(
                    "INSERT INTO jobs (job_id, run_id, workload, stack, load_level, repeat) "
                    "VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT (job_id) DO NOTHING",
                    j["job_id"],
                    e.run_id,
                    j["workload"],
                    j["stack"],
                    float(j["load_level"]),
                    int(j["repeat"]),
                )
        elif isinstance(e, RunStarted):
            await conn.execute(
                "UPDATE runs SET status = 'running', started_at = $2 WHERE run_id = $1 AND finished_at IS NULL",
                e.run_id,
                e.occurred_at,
            )
        elif isinstance(e, RunFinished):
            await conn.execute(
                "UPDATE runs SET status = $2, reasons = $3::jsonb, finished_at = $4 WHERE run_id = $1",
                e.run_id,
                e.status,
                json.dumps([r.as_reason() for r in e.reasons]),
                e.occurred_at,
            )
        elif isinstance(e, JobStarted):
            await conn.execute(
                "UPDATE jobs SET status = 'running', started_at = $2, shard = $3 WHERE job_id = $1 "
                "AND finished_at IS NULL",
                e.job_id,
                e.occurred_at,
                e.shard,
            )
        elif isinstance(e, JobFinished):
            # every shard sends its own JobFinished; the job's row is the union of the distinct shards' reports
            # (recomputed from the stored events, so a redelivered one changes nothing)
            await conn.execute(
                """
                UPDATE jobs j SET
                    shards = $2, shards_finished = agg.n, records_expected = agg.records,
                    load_duration_s = agg.load_end, warmup_s = agg.warmup, offered_load = $3, tokenizer = $4,
                    skipped_arrivals = agg.skipped, replay_lag_p99_s = agg.lag, notes = $5::jsonb,
                    time_scale = $8, client_timing = agg.timing,
                    status = CASE WHEN agg.n >= $2 THEN 'succeeded' ELSE j.status END,
                    finished_at = CASE WHEN agg.n >= $2 THEN $6 ELSE j.finished_at END
                FROM (
                    SELECT count(*)::int AS n, sum((payload->>'records')::int)::int AS records,
                           max((payload->>'load_duration_s')::float8) AS load_end,
                           min((payload->>'warmup_s')::float8) AS warmup,
                           sum(coalesce((payload->>'skipped_arrivals')::int, 0))::int AS skipped,
                           max((payload->>'replay_lag_p99_s')::float8) AS lag,
                           coalesce(jsonb_agg(payload->'client_timing')
                                    FILTER (WHERE jsonb_typeof(payload->'client_timing') = 'object'), '[]') AS timing
                    FROM (
                        SELECT DISTINCT ON (coalesce(payload->>'shard_index', '0')) payload FROM events
                        WHERE job_id = $1 AND schema = $7
                        ORDER BY coalesce(payload->>'shard_index', '0'), occurred_at
                    ) per_shard
                ) agg
                WHERE j.job_id = $1
                """,
                e.job_id,
                e.shards,
                e.offered_load,
                e.tokenizer,
                json.dumps(e.notes),
                e.occurred_at,
                JobFinished.SCHEMA,
                e.time_scale,
            )
        elif isinstance(e, JobFailed):
            await conn.execute(
                "UPDATE jobs SET status = 'failed', finished_at = $2, reason = $3 WHERE job_id = $1",
                e.job_id,
                e.occurred_at,
                e.reason,
            )
        elif isinstance(e, NodeRegistered):
            await conn.execute(
                "INSERT INTO node_inventory (node_id, inventory, updated_at) VALUES ($1,$2::jsonb,$3) "
                "ON CONFLICT (node_id) DO UPDATE SET inventory = EXCLUDED.inventory, updated_at = EXCLUDED.updated_at",
                e.node_id,
                e.inventory.model_dump_json(),
                e.occurred_at,
            )

    def prepare_records(self, bodies: list[bytes]) -> tuple[list[RecordBatch], list[int], datetime | None]:
        """Stage one of the hot path (CPU, no shared state: it runs in a thread): bodies to batches of stored rows,
        the indices of poison bodies, and when the newest batch was sent."""
        batches: list[RecordBatch] = []
        poison: list[int] = []
        newest: datetime | None = None
        for index, body in enumerate(bodies):
            try:
                batch, occurred_at = decode_batch(body)
            except (KeyError, TypeError, ValueError, struct.error, orjson.JSONDecodeError, pa.ArrowException):
                poison.append(index)
                continue
            batches.append(batch)
            newest = occurred_at if newest is None else max(newest, occurred_at)
        return batches, poison, newest

    async def commit_records(self, batches: list[RecordBatch]) -> None:
        """Stage two (I/O): one transaction and one COPY for the whole fetched batch (redelivered batches skipped)."""
        stored = await self.store.insert_batches(batches)
        self.last_batch_rows = stored
        self.rows_stored += stored

    async def records_raw(self, bodies: list[bytes]) -> list[int]:
        """The hot path: record batches decoded with orjson straight into Arrow columns (no object per record).
        Returns the indices of bodies that are not record batches (poison)."""
        batches, poison, newest = self.prepare_records(bodies)
        if newest is not None:
            self.last_batch_at = max(self.last_batch_at, newest) if self.last_batch_at else newest
        await self.commit_records(batches)
        return poison
