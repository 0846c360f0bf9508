"""A live in-memory copy of a JetStream KV bucket, fed by one long-lived watcher.

Listing a bucket with ``kv.keys()`` creates a consumer per call; under load the server runs out of
consumers. A mirror costs one consumer for its whole life and answers reads from memory. Writes made
through the mirror are applied locally at once, so a caller reads its own writes.

A watcher's "initial values done" marker comes from the count its new consumer reports when made; on a replicated
bucket that count can read zero before the consumer has caught up, and the marker then comes before any value. So
the mirror is ready only once the watcher has delivered one entry per subject the stream's leader counted before
the watch began (a watcher delivers the last message of every subject, deleted keys' markers included).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from kvbench_core.bus_errors import TRANSIENT_BUS_ERRORS

__all__ = ["KvMirror", "kv_subject_counts"]

log = logging.getLogger(__name__)


async def kv_subject_counts(js: JetStreamContext, bucket: str) -> dict[str, int]:
    """Key -> messages held for it, in ``bucket``'s stream, as the stream's leader answers (deleted keys' markers
    included; keys whose values expired are gone)."""
    prefix = f"$KV.{bucket}."
    info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"{prefix}>")
    return {subject.removeprefix(prefix): count for subject, count in (info.state.subjects or {}).items()}


class KvMirror:
    def __init__(self, kv: KeyValue, name: str, js: JetStreamContext) -> None:
        self._kv = kv
        self._js = js
        self.name = name
        self.values: dict[str, bytes] = {}
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float = 10.0, give_up_s: float = 180.0) -> KvMirror:
        """Returns once the bucket's values have all arrived. A bus that is slow to answer (a cluster still forming
        its streams' replicas, a busy machine) is waited for: the watcher is made again every ``timeout_s``, up to
        ``give_up_s``, after which the service cannot start and says which bucket it waited for."""
        deadline = asyncio.get_running_loop().time() + give_up_s
        while True:
            try:
                # entries a watch must deliver before the mirror is whole: one per subject the leader counts now
                expected = len(await kv_subject_counts(self._js, self.name))
            except TRANSIENT_BUS_ERRORS as exc:
                if asyncio.get_running_loop().time() >= deadline:
                    raise TimeoutError(f"the bus did not describe KV bucket {self.name}: {exc!r}") from None
                await asyncio.sleep(min(timeout_s, 1.0))
                continue
            self._task = asyncio.create_task(self._follow(expected), name=f"kv-mirror:{self.name}")
            try:
                await asyncio.wait_for(self._ready.wait(), timeout_s)
                return self
            except TimeoutError:
                await self.stop()
                if asyncio.get_running_loop().time() >= deadline:
                    raise TimeoutError(
                        f"the bus gave no initial values of KV bucket {self.name} in {give_up_s:.0f} s: check that "
                        "NATS answers (kvbench status) and that this service's user may read the bucket"
                    ) from None
                log.warning("KV bucket's values not in yet; watching again", extra={"bucket": self.name})
                self.values.clear()

    async def _follow(self, expected: int) -> None:
        while True:
            try:
                watcher = await self._kv.watchall()
                initial_done, delivered = False, 0  # a new watcher delivers every value again
                async for entry in watcher:
                    if entry is None:  # the consumer's count says the initial values are in (see the module's doc)
                        initial_done = True
                    else:
                        delivered += 1
                        if entry.operation in ("DEL", "PURGE"):
                            self.values.pop(entry.key, None)
                        else:
                            self.values[entry.key] = entry.value or b""
                    if initial_done and delivered >= expected:
                        self._ready.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("KV watcher stopped; watching again", extra={"bucket": self.name})
                await asyncio.sleep(1.0)

    def snapshot(self) -> dict[str, bytes]:
        return dict(self.values)

    async def put(self, key: str, value: bytes) -> None:
        await self._kv.put(key, value)
        self.values[key] = value

    async def purge(self, key: str) -> None:
        await self._kv.purge(key)
        self.values.pop(key, None)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
