"""The conductor's node watcher against a real NATS that stops answering: the bus failing is not a lost node (the
run goes on), a heartbeat key that expires is (the run fails with node_unresponsive)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvbench_contracts.events import NodeInventory
from kvbench_contracts.node import Heartbeat
from kvbench_core.bus import Bus
from kvbench_core.embedded import EmbeddedNats
from kvbench_planner import conductor as conducting
from kvbench_planner.conductor import Conductor, RunFailedError

pytestmark = pytest.mark.integration


async def test_a_frozen_bus_is_waited_out_and_a_missing_heartbeat_still_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(conducting, "HEARTBEAT_GRACE_S", 2.0)  # a short grace, so the test is short
    server = EmbeddedNats(tmp_path / "nats").start()
    assert server.pid is not None
    try:
        async with Bus.connect(server.url, name="watch-test") as bus:
            kv = await bus.kv("kvbench_nodes")
            await kv.put("gpu-a", b"{}")
            stop = asyncio.Event()
            conductor = SimpleNamespace(bus=bus, _ready_at={})  # what _watch_nodes reads of its conductor
            watcher = asyncio.create_task(Conductor._watch_nodes(conductor, ["gpu-a"], stop, {}))  # type: ignore[arg-type]
            await asyncio.sleep(1.5)
            os.kill(server.pid, signal.SIGSTOP)  # the server stops answering: every KV read times out
            await asyncio.sleep(8)
            os.kill(server.pid, signal.SIGCONT)
            await asyncio.sleep(2)
            assert not watcher.done(), watcher.exception() if watcher.done() else None  # the outage is no lost node
            await kv.delete("gpu-a")  # the agent's heartbeat is gone for good
            deadline = time.monotonic() + 15
            while not watcher.done():
                assert time.monotonic() < deadline, "a missing heartbeat was never noticed"
                await asyncio.sleep(0.2)
            with pytest.raises(RunFailedError) as lost:
                watcher.result()
            assert lost.value.problem.code == "node_unresponsive"
            stop.set()
    finally:
        if server.pid:
            os.kill(server.pid, signal.SIGCONT)
        server.stop()


async def test_an_agent_that_restarted_and_lost_its_stack_fails_the_run_within_a_heartbeat(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats").start()
    try:
        async with Bus.connect(server.url, name="restart-test") as bus:
            kv = await bus.kv("kvbench_nodes")
            inventory = NodeInventory(node_id="gpu-a", hostname="a", simulated=True)

            async def beat(deployments: list[str]) -> None:
                await kv.put("gpu-a", Heartbeat(inventory=inventory, at=time.time(), deployments=deployments)
                             .model_dump_json().encode())  # fmt: skip

            await beat([])  # written before the stack came up: not a restart
            stop = asyncio.Event()
            watch = Conductor._watch_nodes(SimpleNamespace(bus=bus, _ready_at={}), ["gpu-a"], stop, {"gpu-a": "D1"})  # type: ignore[arg-type]
            watcher = asyncio.create_task(watch)
            await asyncio.sleep(1.5)
            await beat(["D1"])  # the stack is up and the agent says so
            await asyncio.sleep(1.5)
            assert not watcher.done()
            began = time.monotonic()
            await beat([])  # a restarted agent: the key is fresh, its engines are gone
            with pytest.raises(RunFailedError) as restarted:
                await asyncio.wait_for(watcher, timeout=5)
            assert time.monotonic() - began < 3  # within a heartbeat, not the key's 15 s TTL
            assert restarted.value.problem.code == "node_restarted"
            assert "gpu-a" in restarted.value.problem.message
    finally:
        server.stop()


async def test_a_load_generator_that_restarted_or_vanished_is_noticed_and_a_finished_shard_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvbench_contracts.node import LoadgenHeartbeat  # noqa: PLC0415

    monkeypatch.setattr(conducting, "LOADGEN_END_GRACE_S", 1.0)
    server = EmbeddedNats(tmp_path / "nats").start()

    def beat(name: str, *shards: str) -> bytes:
        return LoadgenHeartbeat(loadgen_id=name, at=time.time(), shards=list(shards)).model_dump_json().encode()

    try:
        async with Bus.connect(server.url, name="loadgen-watch-test") as bus:
            kv = await bus.kv("kvbench_loadgens")
            loop = asyncio.get_running_loop()
            await kv.put("lg-a", beat("lg-a", "J#0"))
            await kv.put("lg-b", beat("lg-b", "J#1"))
            ends: list[asyncio.Future[object]] = [loop.create_future(), loop.create_future()]
            watcher = asyncio.create_task(Conductor._watch_shards(SimpleNamespace(bus=bus), "J", ends))  # type: ignore[arg-type]
            await asyncio.sleep(2.5)
            # shard 0 ends the way a finished job does: its end arrives, then the shard leaves the heartbeat
            ends[0].set_result("finished")
            await kv.put("lg-a", beat("lg-a"))
            await asyncio.sleep(2.5)
            assert not watcher.done(), watcher.result() if watcher.done() else None
            # shard 1's load generator comes back without it: the process restarted
            await kv.put("lg-b", beat("lg-b"))
            index, reason = await asyncio.wait_for(watcher, timeout=10)
            assert index == 1
            assert "load generator lg-b, running shard 2 of 2" in reason
            assert "restarted" in reason
            # and one whose heartbeat is gone
            ends = [loop.create_future()]
            await kv.put("lg-c", beat("lg-c", "K#0"))
            watcher = asyncio.create_task(Conductor._watch_shards(SimpleNamespace(bus=bus), "K", ends))  # type: ignore[arg-type]
            await asyncio.sleep(2.5)
            await kv.delete("lg-c")
            index, reason = await asyncio.wait_for(watcher, timeout=10)
            assert (index, "stopped (its heartbeat is gone)" in reason) == (0, True)
    finally:
        server.stop()
