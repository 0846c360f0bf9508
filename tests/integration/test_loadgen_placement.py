"""Where a job's shards run, through a real NATS JetStream work queue: a load generator that already runs a shard
of a job leaves the next one to a free peer, and runs it itself only when no peer is free or none took it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from kvbench_contracts.commands import RunLoad
from kvbench_contracts.envelope import Envelope
from kvbench_contracts.events import EngineEndpoint
from kvbench_contracts.node import LoadgenHeartbeat, shard_key
from kvbench_contracts.plan import Traffic
from kvbench_core.bus import Bus, LeaveForOthers
from kvbench_core.embedded import EmbeddedNats
from kvbench_loadgen.placement import ShardPlacement

pytestmark = pytest.mark.integration


def _shard(job_id: str, index: int, shards: int) -> RunLoad:
    endpoint = EngineEndpoint(node_id="n", engine_id="e", base_url="http://127.0.0.1:9", metrics_url="http://x")
    return RunLoad(run_id="r", job_id=job_id, workload="w", model="m", endpoints=[endpoint],
                   traffic=Traffic(shape="shared_prompt"), load_level=4, duration_s=10, warmup_s=0,
                   shard_index=index, shards=shards)  # fmt: skip


class _Loadgen:
    """The loadgen service's command path (claim, then run) over a real consumer of the shared durable, with the
    job itself left out: the shards it took, its heartbeat written as it takes each one."""

    def __init__(self, bus: Bus, name: str, wait_s: float) -> None:
        self.bus, self.name = bus, name
        self.running: list[str] = []
        self.left_for_others = 0
        self.placement = ShardPlacement(bus, name, wait_s)

    async def beat(self) -> None:
        kv = await self.bus.kv("kvbench_loadgens")
        beat = LoadgenHeartbeat(loadgen_id=self.name, at=time.time(), shards=self.running)
        await kv.put(self.name, beat.model_dump_json().encode())

    async def on_command(self, command: Envelope) -> None:
        assert isinstance(command, RunLoad)
        try:
            await self.placement.claim(command, self.running)
        except LeaveForOthers:
            self.left_for_others += 1
            raise
        self.running.append(shard_key(command.job_id, command.shard_index))
        await self.beat()

    def listen(self) -> None:
        self.bus.subscribe([RunLoad], self.on_command, durable="loadgen", filter_subject="kvbench.cmd.loadgen.>",
                           batch=1)  # fmt: skip


async def _until(condition: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_second_shard_waits_for_a_free_peer_and_runs_here_only_when_none_takes_it(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats").start()
    try:
        async with (
            Bus.connect(server.url, name="lg-a") as bus_a,
            Bus.connect(server.url, name="lg-b") as bus_b,
        ):
            a, b = _Loadgen(bus_a, "lg-a", wait_s=3.0), _Loadgen(bus_b, "lg-b", wait_s=3.0)
            await a.beat()
            await b.beat()  # b is alive and free, but not yet asking for work
            a.listen()
            await bus_a.publish(_shard("J", 0, 2))
            await bus_a.publish(_shard("J", 1, 2))
            await _until(lambda: a.running == ["J#0"] and a.left_for_others >= 1, 10)
            await asyncio.sleep(0.6)  # a keeps leaving shard 2 for b while b is free
            assert a.running == ["J#0"]
            b.listen()
            await _until(lambda: b.running == ["J#1"], 10)
            assert a.running == ["J#0"]  # each load generator runs one shard of the job

            # a job of three shards over two load generators: the third runs beside another, on either
            await bus_a.publish(_shard("K", 0, 3))
            await bus_a.publish(_shard("K", 1, 3))
            await bus_a.publish(_shard("K", 2, 3))
            await _until(lambda: sum(s.startswith("K#") for s in a.running + b.running) == 3, 15)
            assert sorted(s for s in a.running if s.startswith("K#"))  # one or two of them on each
            assert sorted(s for s in b.running if s.startswith("K#"))

            # free: alive (a heartbeat in the bucket) and running no shard of the job
            await _Loadgen(bus_a, "lg-c", wait_s=1.5).beat()
            assert await a.placement.free_peers("K") == ["lg-c"]
            assert await a.placement.free_peers("L") == ["lg-b", "lg-c"]
            await (await bus_b.kv("kvbench_loadgens")).delete("lg-b")  # how a stopped one's heartbeat goes
            assert await a.placement.free_peers("L") == ["lg-c"]
    finally:
        server.stop()


async def test_with_no_free_peer_the_shard_runs_here_at_once_and_with_one_that_never_asks_after_the_wait(
    tmp_path: Path,
) -> None:
    server = EmbeddedNats(tmp_path / "nats").start()
    try:
        async with Bus.connect(server.url, name="lg-a") as bus:
            a = _Loadgen(bus, "lg-a", wait_s=1.5)
            await a.beat()
            a.listen()
            started = time.monotonic()
            await bus.publish(_shard("J", 0, 2))
            await bus.publish(_shard("J", 1, 2))
            await _until(lambda: a.running == ["J#0", "J#1"], 10)
            assert a.left_for_others == 0  # nobody else alive: no wait at all
            assert time.monotonic() - started < 1.5

            kv = await bus.kv("kvbench_loadgens")
            idle = LoadgenHeartbeat(loadgen_id="lg-idle", at=time.time(), shards=[])
            await kv.put("lg-idle", idle.model_dump_json().encode())
            started = time.monotonic()
            await bus.publish(_shard("K", 0, 2))
            await bus.publish(_shard("K", 1, 2))
            await _until(lambda: "K#1" in a.running, 15)
            assert a.left_for_others >= 1
            assert time.monotonic() - started >= 1.5  # it waited for the idle peer, then ran the shard itself
    finally:
        server.stop()
