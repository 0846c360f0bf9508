"""Reading a KV bucket whole, as a restarted service does (the planner's runs, the mirrors of switches and
secrets): against a real NATS, deleted and purged keys are left out, and a watcher whose "initial values done"
marker comes before its values (what nats-py's watcher does when the consumer's first count reads zero: a busy
machine, a replicated bucket still catching up) does not make a mirror ready with values missing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.js.kv import KeyValue

from kvbench_core.bus import Bus
from kvbench_core.embedded import EmbeddedNats
from kvbench_core.kvmirror import KvMirror

pytestmark = pytest.mark.integration


async def _fill(kv: KeyValue) -> None:
    for index in range(6):
        await kv.put(f"run{index}", f"value {index}".encode())
    await kv.delete("run1")
    await kv.purge("run2")
    await kv.put("run3", b"written again")


async def test_a_bucket_read_whole_leaves_out_deleted_and_purged_keys(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats").start()
    try:
        async with Bus.connect(server.url, name="kv-reads") as bus:
            await _fill(await bus.kv("kvbench_runs"))
            assert sorted(await bus.kv_keys("kvbench_runs")) == [f"run{i}" for i in range(6)]
            assert await bus.kv_values("kvbench_runs") == {
                "run0": b"value 0", "run3": b"written again", "run4": b"value 4", "run5": b"value 5",
            }  # fmt: skip
            assert await bus.kv_values("kvbench_groups") == {}
            mirror = await bus.kv_mirror("kvbench_runs")
            try:
                assert mirror.snapshot() == await bus.kv_values("kvbench_runs")
            finally:
                await mirror.stop()
    finally:
        server.stop()


class _EarlyMarkerKv:
    """The bucket, but each watcher yields the "initial values done" marker before any value: the order nats-py
    produces when consumer info answers num_pending=0 before its callback has taken the first message."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    async def watchall(self, **kwargs: Any) -> AsyncIterator[Any]:
        watcher = await self._kv.watchall(**kwargs)

        async def early_marker_first() -> AsyncIterator[Any]:
            yield None
            await asyncio.sleep(0.5)  # the values come a moment after the marker, as they do in the race
            async for entry in watcher:
                if entry is not None:
                    yield entry

        return early_marker_first()


async def test_a_mirror_is_ready_only_once_every_key_the_stream_holds_has_arrived(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats").start()
    try:
        async with Bus.connect(server.url, name="kv-reads") as bus:
            kv = await bus.kv("kvbench_runs")
            await _fill(kv)
            mirror = await KvMirror(_EarlyMarkerKv(kv), "kvbench_runs", bus.js).start(timeout_s=5)  # type: ignore[arg-type]
            try:
                assert set(mirror.snapshot()) == {"run0", "run3", "run4", "run5"}
            finally:
                await mirror.stop()
    finally:
        server.stop()
