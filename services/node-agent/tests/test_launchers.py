from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench_contracts.commands import StartStack
from kvbench_core.embedded import pid_alive
from kvbench_node_agent.launchers.base import LaunchError, read_block_size
from kvbench_node_agent.launchers.sim import SimLauncher, sim_engine_argv
from kvbench_node_agent.scrape import parse_samples


def command(stack: str) -> StartStack:
    return StartStack(
        node_id="n0",
        run_id="R",
        deployment_id="D1",
        workload="w",
        stack=stack,
        model="Qwen/Qwen3-8B",
        engine={"tensor_parallel_size": 1},
        sim={"gpu": "H100", "speed": 2.0},
    )


def test_sim_argv_expresses_the_stack() -> None:
    from kvbench_sim.stacks import layout_for  # noqa: PLC0415

    off = sim_engine_argv(command("vllm-prefix-off"), 9000)
    assert off[off.index("--gpu") + 1] == "H100"
    layout = json.loads(off[off.index("--layout") + 1])
    assert layout["workload"]["stack"] == "vllm-prefix-off"
    assert not layout_for(layout["workload"], layout["cluster"]).engine.prefix_caching
    offload = json.loads(sim_engine_argv(command("vllm-native-cpu-offload"), 9000)[-1])
    assert [t.name for t in layout_for(offload["workload"], offload["cluster"]).engine.tiers] == ["host"]
    with pytest.raises(LaunchError, match="batch mode"):
        sim_engine_argv(command("vllm-pd-nixl"), 9000)


def test_scrape_keeps_engine_series_and_drops_created_and_buckets() -> None:
    text = (
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 288.0\n'
        'vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9\n'
        "# TYPE python_gc_objects_collected counter\n"
        'python_gc_objects_collected_total{generation="0"} 5.0\n'
    )
    assert parse_samples(text) == {'vllm:prefix_cache_hits_total{engine="0"}': 288.0}


def test_block_size_is_read_from_the_engine_log(tmp_path: Path) -> None:
    log = tmp_path / "e.log"
    log.write_text(
        "boot\nSetting attention block size to 16 tokens\nconnector: Setting attention block size to 2144 tokens\n"
    )
    assert read_block_size(log) == 2144


async def test_sim_launcher_starts_a_healthy_engine_and_stops_it(tmp_path: Path) -> None:
    launcher = SimLauncher("n0", tmp_path, health_timeout_s=60)
    deployment = await launcher.start(command("vllm-prefix-gpu"))
    pid = deployment.processes[0].proc.pid
    try:
        assert pid_alive(pid)
        assert deployment.facts["attention_block_size"] == 16
        assert deployment.endpoints[0].base_url.startswith("http://127.0.0.1:")
    finally:
        await launcher.stop(deployment)
    assert not pid_alive(pid)
