"""A live in-memory copy of a JetStream KV bucket, fed by one long-lived watcher.

Listing a bucket with ``kv.keys()`` creates a consumer per call; under load the server runs out of
consumers. A mirror costs one consumer for its whole life and answers reads from memory. Writes made
through the mirror are applied locally at once, so a caller reads its own writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.js.kv import KeyValue

__all__ = ["KvMirror"]

log = logging.getLogger(__name__)


class KvMirror:
    def __init__(self, kv: KeyValue, name: str) -> None:
        self._kv = kv
        self.name = name
        self.values: dict[str, bytes] = {}
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float = 10.0) -> KvMirror:
        self._task = asyncio.create_task(self._follow(), name=f"kv-mirror:{self.name}")
        await asyncio.wait_for(self._ready.wait(), timeout_s)
        return self

    async def _follow(self) -> None:
        while True:
            try:
                watcher = await self._kv.watchall()
                async for entry in watcher:
                    if entry is None:  # the initial values have all arrived
                        self._ready.set()
                        continue
                    if entry.operation in ("DEL", "PURGE"):
                        self.values.pop(entry.key, None)
                    else:
                        self.values[entry.key] = entry.value or b""
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
