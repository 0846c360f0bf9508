"""On a real machine the agent counts the stack's disk tier directory at each scrape and sends the count once, on
its first engine's sample (the reporter sums engines): what the report's disk-tier table reads."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from kvbench_contracts.commands import StartStack
from kvbench_contracts.envelope import Envelope
from kvbench_contracts.events import EngineEndpoint, EngineSampled, StackReady
from kvbench_contracts.plan import EngineSpec, SimCluster, Sizing
from kvbench_core.bus import Bus
from kvbench_core.procs import free_port
from kvbench_node_agent.agent import NodeAgent
from kvbench_node_agent.launchers.base import Deployment
from kvbench_node_agent.settings import NodeAgentSettings

pytestmark = pytest.mark.integration

METRICS = Path(__file__).resolve().parents[2] / "services" / "node-agent" / "tests" / "metrics" / "vllm-0.25.1"


async def test_the_disk_tier_is_counted_on_the_machine_and_sent_once_a_round(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = tmp_path / "lmcache"
    (tier / "chunks").mkdir(parents=True)
    for i in range(7):
        (tier / "chunks" / f"{i}.kv").write_bytes(b"k" * 1000)
    text = (METRICS / "metrics-offload.txt").read_text()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=text)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    port = free_port()
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    node = f"n-disk-{uuid.uuid4().hex[:6]}"
    base = f"http://127.0.0.1:{port}"
    endpoints = [EngineEndpoint(node_id=node, engine_id=f"e{i}", base_url=base, metrics_url=base + "/metrics")
                 for i in range(2)]  # fmt: skip
    settings = NodeAgentSettings(node_id=node, state_dir=str(tmp_path / "state"), scrape_interval_s=0.2)
    try:
        async with Bus.connect(nats_url, name="t-disk-tier") as bus:
            agent = NodeAgent(settings, bus, CollectorRegistry())

            async def launched(command: StartStack) -> Deployment:
                return Deployment(command.deployment_id, command.run_id, command.stack, endpoints)

            monkeypatch.setattr(agent, "_launch", launched)
            command = StartStack(
                node_id=node, run_id="R-disk", deployment_id=f"D{uuid.uuid4().hex[:8]}", workload="w",
                stack="vllm-lmcache-mp", model="Qwen/Qwen3-8B", engine=EngineSpec(), sim=SimCluster(),
                launcher="process", kv_tier="nvme",
                sizing=Sizing(host_memory_gb=10, disk_tier_gb=50, disk_tier_path=str(tier)),
            )  # fmt: skip
            seen: list[EngineSampled] = []

            async def collect(events: list[Envelope]) -> None:
                seen.extend(e for e in events if isinstance(e, EngineSampled) and e.node_id == node)

            bus.subscribe_batch([EngineSampled], collect, durable=f"t{uuid.uuid4().hex[:8]}",
                                filter_subject=EngineSampled.subject_filter(node_id=node))  # fmt: skip
            await agent.handle(command)
            stored = await bus.js.get_last_msg(
                "KVBENCH_CONTROL", StackReady.subject_filter(node_id=node, deployment_id=command.deployment_id)
            )
            for _ in range(100):
                if len({s.engine_id for s in seen}) == 2 and len(seen) >= 6:
                    break
                await asyncio.sleep(0.1)
            (tier / "chunks" / "0.kv").unlink()  # evicted: the next counts say so
            before = len(seen)
            for _ in range(100):
                if len(seen) >= before + 4:
                    break
                await asyncio.sleep(0.1)
            await agent.shutdown()
    finally:
        await runner.cleanup()
    ready = StackReady.model_validate_json(stored.data or b"")
    assert ready.workload == "w"
    assert ready.facts["disk_tier_found"] == f"7 files, 0.00 GB under {tier}"  # what earlier runs left, said at start
    first = [s for s in seen if s.engine_id == "e0"]
    second = [s for s in seen if s.engine_id == "e1"]
    assert first
    assert second
    assert all("disk_tier_records" not in s.normalized for s in second)  # the machine's count rides on one engine
    counts = [(s.normalized["disk_tier_records"], s.normalized["disk_tier_bytes"]) for s in first]
    assert counts[0] == (7.0, 7000.0)
    assert counts[-1] == (6.0, 6000.0)
    assert first[0].normalized["prompt_tokens"] > 0  # the engine's own counters are still read
