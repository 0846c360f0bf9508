from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kvbench_contracts.commands import PoolMachine, StartStack
from kvbench_contracts.engine import sim_late_counter
from kvbench_contracts.plan import EngineSpec, SimCluster
from kvbench_core.procs import pid_alive
from kvbench_node_agent.launchers.base import LaunchError, read_block_size
from kvbench_node_agent.launchers.sim import SimLauncher, sim_engine_spec, split_layout
from kvbench_node_agent.normalize import normalize
from kvbench_node_agent.scrape import parse_samples
from kvbench_stacks.topology import SimEngineCounts


def revised(cmd: StartStack, update: dict[str, Any]) -> StartStack:
    """The command with some fields replaced, validated as the agent decodes it from the bus."""
    return StartStack.model_validate({**cmd.model_dump(), **update})


def command(stack: str) -> StartStack:
    return StartStack(
        node_id="n0",
        run_id="R",
        deployment_id="D1",
        workload="w",
        stack=stack,
        model="Qwen/Qwen3-8B",
        engine=EngineSpec(tensor_parallel_size=1),
        sim=SimCluster(gpu="H100", speed=2.0),
    )


def test_sim_argv_expresses_the_stack() -> None:
    from kvbench_sim.stacks import layout_for  # noqa: PLC0415

    off = sim_engine_spec(command("vllm-prefix-off"), 9000)
    assert off.cluster.gpu == "H100"
    assert off.workload.stack == "vllm-prefix-off"
    assert not layout_for(off.workload.model_dump(), off.cluster.model_dump()).engine.prefix_caching
    offload = sim_engine_spec(command("vllm-native-cpu-offload"), 9000)
    assert [t.name for t in layout_for(offload.workload.model_dump(), offload.cluster.model_dump()).engine.tiers] == [
        "host"
    ]
    decode = sim_engine_spec(command("vllm-pd-nixl"), 9000, pd_role="decode")
    assert decode.pd_role == "decode"
    with pytest.raises(LaunchError, match="no simulated server form"):
        sim_engine_spec(command("vllm-pd-lmcache-store"), 9000)


def test_settings_the_contract_refuses_never_reach_the_launcher() -> None:
    with pytest.raises(ValidationError, match="machines"):
        revised(command("vllm-prefix-gpu"), {"sim": {"gpu": "H100", "machines": 0}})


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


async def test_sim_launcher_starts_a_split_stack_behind_its_router(tmp_path: Path) -> None:
    """P/D as the plan places it: the first machine starts the prefill engine and the router, the second the decode
    engine; a streamed request through the router is prefilled on one engine and decoded on the other, which
    counts the transferred KV."""
    import aiohttp  # noqa: PLC0415

    split = revised(
        command("vllm-pd-nixl"),
        {
            "sim": {"gpu": "H100", "speed": 4.0, "machines": 2},
            "sizing": {"prefill_machines": 1},
            "routing": "pd_aware",
            "pool": [{"name": "n0", "host": "127.0.0.1", "gpus": 1}, {"name": "n1", "host": "127.0.0.1", "gpus": 1}],
        },
    )
    second = SimLauncher("n1", tmp_path, health_timeout_s=60)
    other = await second.start(split)
    assert [e.role for e in other.endpoints] == ["decode"]  # the second machine runs the decode engine
    launcher = SimLauncher("n0", tmp_path, health_timeout_s=60)
    deployment = await launcher.start(split)
    try:
        assert sorted(e.role for e in deployment.endpoints) == ["prefill", "router"]
        roles = {e.role: e for e in [*deployment.endpoints, *other.endpoints]}
        assert deployment.facts["routing"] == "pd_aware"
        prompt = " ".join(f"p{i}" for i in range(2000))
        body = {"model": "Qwen/Qwen3-8B", "prompt": prompt, "max_tokens": 3, "stream": True}
        async with aiohttp.ClientSession() as http:
            async with http.post(roles["router"].base_url + "/v1/completions", json=body) as response:
                assert response.status == 200
                events = [line async for line in response.content if line.startswith(b"data: {")]
            assert len(events) == 3
            async with http.get(roles["decode"].metrics_url) as response:
                decode_metrics = parse_samples(await response.text())
            async with http.get(roles["prefill"].metrics_url) as response:
                prefill_metrics = parse_samples(await response.text())
        transferred = 'vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer"}'
        assert decode_metrics[transferred] == 1999  # all but the last prompt token came over the link
        assert decode_metrics['vllm:nixl_bytes_transferred_count{engine="0"}'] == 1
        assert prefill_metrics['vllm:prompt_tokens_total{engine="0"}'] == 2000
    finally:
        await launcher.stop(deployment)
        await second.stop(other)
    assert all(p.proc.poll() is not None for p in [*deployment.processes, *other.processes])


async def test_engines_of_two_machines_share_the_stacks_store(tmp_path: Path) -> None:
    """A shared-store stack on two simulated machines: the first machine starts the store; a prompt prefilled on
    one machine's engine is a shared-store hit on the other's."""
    import asyncio  # noqa: PLC0415
    import time  # noqa: PLC0415

    import aiohttp  # noqa: PLC0415

    shared = revised(
        command("vllm-lmcache-mooncake"),
        {
            "sim": {"gpu": "H100", "speed": 4.0, "machines": 2},
            "pool": [{"name": "n0", "host": "127.0.0.1", "gpus": 1}, {"name": "n1", "host": "127.0.0.1", "gpus": 1}],
        },
    )
    second = SimLauncher("n1", tmp_path, health_timeout_s=60)
    first = SimLauncher("n0", tmp_path, health_timeout_s=60)
    late = await second.start(shared)  # its engine waits for the store, which comes up with the first machine
    head = await first.start(shared)
    try:
        assert "chunks" in head.facts["shared_store"]
        assert [p.name for p in head.processes] == ["sim-store", "sim-engine0"]
        prompt = " ".join(f"doc{i}" for i in range(3000))
        body = {"model": "Qwen/Qwen3-8B", "prompt": prompt, "max_tokens": 2}
        async with aiohttp.ClientSession() as http:
            async with http.post(head.endpoints[0].base_url + "/v1/completions", json=body) as response:
                assert (await response.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            deadline = time.monotonic() + 20
            before: dict[str, float] = {}
            while before.get('kvbench_sim_tier_chunks{tier="shared"}', 0) < 11 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)  # the store lands, then reaches the other engine
                async with http.get(late.endpoints[0].metrics_url) as response:
                    before = parse_samples(await response.text())
            assert before['kvbench_sim_tier_chunks{tier="shared"}'] == 11  # 11 whole 256-token chunks of the prompt
            assert before['kvbench_sim_tier_chunks{tier="host"}'] == 0  # nothing of it in this engine's own tiers
            async with http.post(late.endpoints[0].base_url + "/v1/completions", json=body) as response:
                cached = (await response.json())["usage"]["prompt_tokens_details"]["cached_tokens"]
            async with http.get(late.endpoints[0].metrics_url) as response:
                samples = parse_samples(await response.text())
        assert cached == 2816  # its first sight of the prompt: every chunk from the shared store
        assert samples['vllm:external_prefix_cache_hits_total{engine="0"}'] == 2816
    finally:
        await first.stop(head)
        await second.stop(late)


async def _tier_chunks(http: object, url: str, tier: str, want: int, timeout_s: float = 20.0) -> float:
    """The engine's ``kvbench_sim_tier_chunks`` for ``tier`` once it reaches ``want`` (or the timeout)."""
    import asyncio  # noqa: PLC0415
    import time  # noqa: PLC0415

    import aiohttp  # noqa: PLC0415

    assert isinstance(http, aiohttp.ClientSession)
    deadline = time.monotonic() + timeout_s
    while True:
        async with http.get(url) as response:
            value = parse_samples(await response.text()).get(f'kvbench_sim_tier_chunks{{tier="{tier}"}}', 0.0)
        if value >= want or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.1)


@pytest.mark.parametrize(
    ("stack", "sizing", "tier"),
    [
        ("vllm-lmcache-mp", {"host_memory_gb": 10, "disk_tier_gb": 50, "disk_tier_path": "/mnt/nvme/lmcache"}, "disk"),
        ("vllm-native-shared-fs", {"host_memory_gb": 10, "shared_mount_path": "/mnt/kv"}, "shared"),
    ],
)
async def test_a_restarted_stack_finds_its_file_tiers_records(
    tmp_path: Path, stack: str, sizing: dict[str, object], tier: str
) -> None:
    """A stack restarted within the run (cache_state: empty, a lost engine) starts with empty GPU and host tiers
    but finds what its disk tier or shared filesystem stored, and serves the prompt from there; a new run starts
    with none."""
    import aiohttp  # noqa: PLC0415

    first = revised(
        command(stack),
        {
            "sizing": sizing,
            "sim": {"gpu": "H100", "speed": 4.0, "machines": 1},
            "pool": [{"name": "n0", "host": "127.0.0.1", "gpus": 1}],
        },
    )
    launcher = SimLauncher("n0", tmp_path, health_timeout_s=60)
    prompt = " ".join(f"doc{i}" for i in range(3000))
    body = {"model": "Qwen/Qwen3-8B", "prompt": prompt, "max_tokens": 2}
    async with aiohttp.ClientSession() as http:
        deployment = await launcher.start(first)
        try:
            engine = deployment.endpoints[0]
            async with http.post(engine.base_url + "/v1/completions", json=body) as response:
                assert (await response.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            assert await _tier_chunks(http, engine.metrics_url, tier, 11) == 11  # 11 whole 256-token chunks
        finally:
            await launcher.stop(deployment)

        again = await launcher.start(first.model_copy(update={"deployment_id": "D2"}))
        try:
            engine = again.endpoints[0]
            assert await _tier_chunks(http, engine.metrics_url, tier, 11) == 11
            async with http.get(engine.metrics_url) as response:
                held = normalize(parse_samples(await response.text()))
            if tier == "disk":  # what the report's disk-tier table reads: the records and their bytes
                assert held["disk_tier_records"] == 11
                assert held["disk_tier_bytes"] == 11 * 256 * 147_456  # Qwen3-8B's KV bytes a token (models.yaml)
            else:
                assert "disk_tier_records" not in held  # a shared filesystem is not this machine's disk tier
            assert await _tier_chunks(http, engine.metrics_url, "host", 0, timeout_s=0) == 0
            async with http.post(engine.base_url + "/v1/completions", json=body) as response:
                cached = (await response.json())["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached == 2816  # all from the file tier: the GPU and host tiers started empty
        finally:
            await launcher.stop(again)

        other_run = await launcher.start(first.model_copy(update={"deployment_id": "D3", "run_id": "R2"}))
        try:
            assert await _tier_chunks(http, other_run.endpoints[0].metrics_url, tier, 1, timeout_s=1) == 0
        finally:
            await launcher.stop(other_run)


async def test_engines_loading_from_the_store_at_once_share_its_bandwidth(tmp_path: Path) -> None:
    """Valkey's 2 GB/s is the pool's, not each engine's: a prompt stored by one machine and loaded by two others at
    once takes each of them about twice as long to load as one engine loading alone (the engines' own TTFT, in
    virtual time)."""
    import asyncio  # noqa: PLC0415

    import aiohttp  # noqa: PLC0415

    names = ["n0", "n1", "n2"]
    shared = revised(
        command("vllm-lmcache-valkey"),
        {
            "sim": {"gpu": "H100", "speed": 1.0, "machines": 3},
            "pool": [{"name": n, "host": "127.0.0.1", "gpus": 1} for n in names],
        },
    )
    launchers = [SimLauncher(n, tmp_path, health_timeout_s=60) for n in names]
    deployments = [await launcher.start(shared) for launcher in launchers]
    writer, a, b = (d.endpoints[0] for d in deployments)
    try:
        assert "2 GB/s shared" in deployments[0].facts["shared_store"]

        def body(tag: str) -> dict[str, object]:
            return {"model": "Qwen/Qwen3-8B", "prompt": " ".join(f"{tag}{i}" for i in range(3000)), "max_tokens": 1}

        async with aiohttp.ClientSession() as http:

            async def ask(url: str, tag: str) -> None:
                async with http.post(url + "/v1/completions", json=body(tag)) as response:
                    assert (await response.json())["usage"]["prompt_tokens_details"]["cached_tokens"] in (0, 2816)

            async def ttft_sum(metrics_url: str) -> float:
                async with http.get(metrics_url) as response:
                    samples = parse_samples(await response.text())
                return samples.get('vllm:time_to_first_token_seconds_sum{engine="0"}', 0.0)

            for tag in ("alone", "both"):
                await ask(writer.base_url, tag)
            for engine in (a, b):  # both documents reached the store and every engine's mirror
                assert await _tier_chunks(http, engine.metrics_url, "shared", 22) == 22
            before = await ttft_sum(b.metrics_url)
            await ask(b.base_url, "alone")
            alone = await ttft_sum(b.metrics_url) - before
            before_a, before_b = await ttft_sum(a.metrics_url), await ttft_sum(b.metrics_url)
            await asyncio.gather(ask(a.base_url, "both"), ask(b.base_url, "both"))
            together = [await ttft_sum(a.metrics_url) - before_a, await ttft_sum(b.metrics_url) - before_b]
        load_alone = 2816 * 147_456 / 2e9  # 0.21 s of the TTFT
        assert alone == pytest.approx(load_alone, abs=0.06)
        for ttft in together:
            assert ttft == pytest.approx(2 * load_alone, abs=0.08)
    finally:
        for launcher, deployment in zip(launchers, deployments, strict=True):
            await launcher.stop(deployment)


@pytest.mark.parametrize(
    ("stack", "engine", "tiers", "prefill_tiers"),
    [
        ("vllm-pd-mori", "vllm", [], []),
        ("sglang-pd-mori", "sglang", [], []),
        ("sglang-pd-mooncake", "sglang", [], []),
        ("trtllm-pd-nixl", "trtllm", [], []),
        ("sglang-pd-decode-offload", "sglang", ["host"], []),  # the decode side only
        ("vllm-pd-nixl-lmcache", "vllm", ["host", "disk"], ["host", "disk"]),
        ("sglang-hicache-mori", "sglang", ["host", "shared"], None),
        ("trtllm-lmcache-valkey", "trtllm", ["host", "shared"], None),
    ],
)
def test_every_simulated_stack_has_its_engines_and_tiers(
    stack: str, engine: str, tiers: list[str], prefill_tiers: list[str] | None
) -> None:
    from kvbench_sim.stacks import layout_for  # noqa: PLC0415

    spec = revised(
        command(stack),
        {
            "engine": {"name": engine, "tensor_parallel_size": 1},
            "kv_tier": "nvme" if "disk" in tiers else "gpu",
            "sim": {"gpu": "MI300X" if "mori" in stack else "H100", "machines": 2},
            "sizing": {"prefill_machines": 1, "host_memory_gb": 10, "disk_tier_gb": 50},
        },
    )
    engine_spec = sim_engine_spec(spec, 9000, pd_role="decode" if prefill_tiers is not None else None)
    sim = layout_for(engine_spec.workload.model_dump(), engine_spec.cluster.model_dump())
    assert [t.name for t in sim.engine.tiers] == tiers
    assert sim.engine_name == engine
    if prefill_tiers is None:
        assert sim.prefill_engines == 0
    else:
        assert sim.prefill_engines == 1
        assert sim.prefill is not None
        assert [t.name for t in sim.prefill.tiers] == prefill_tiers


async def test_an_sglang_split_stack_with_decode_side_offload_is_served(tmp_path: Path) -> None:
    """sglang-pd-decode-offload: a prefill engine without tiers, a decode engine with a host tier, SGLang's metric
    names, and the prompt's KV counted as moved."""
    import aiohttp  # noqa: PLC0415

    split = revised(
        command("sglang-pd-decode-offload"),
        {
            "engine": {"name": "sglang", "tensor_parallel_size": 1},
            "sim": {"gpu": "H100", "speed": 4.0, "machines": 2},
            "sizing": {"prefill_machines": 1, "host_memory_gb": 10},
            "routing": "pd_aware",
            "pool": [{"name": "n0", "host": "127.0.0.1", "gpus": 1}, {"name": "n1", "host": "127.0.0.1", "gpus": 1}],
        },
    )
    second = SimLauncher("n1", tmp_path, health_timeout_s=60)
    other = await second.start(split)
    launcher = SimLauncher("n0", tmp_path, health_timeout_s=60)
    deployment = await launcher.start(split)
    try:
        roles = {e.role: e for e in [*deployment.endpoints, *other.endpoints]}
        body = {"model": "Qwen/Qwen3-8B", "prompt": " ".join(f"p{i}" for i in range(1000)), "max_tokens": 3,
                "stream": True}  # fmt: skip
        async with aiohttp.ClientSession() as http:
            async with http.post(roles["router"].base_url + "/v1/completions", json=body) as response:
                events = [line async for line in response.content if line.startswith(b"data: {")]
            assert len(events) == 3
            metrics = {}
            for role in ("prefill", "decode"):
                async with http.get(roles[role].metrics_url) as response:
                    metrics[role] = await response.text()
        assert "sglang:kv_transfer_total_mb" in metrics["decode"]
        assert 'kvbench_sim_tier_chunks{tier="host"}' in metrics["decode"]
        assert 'kvbench_sim_tier_chunks{tier="host"}' not in metrics["prefill"]
    finally:
        await launcher.stop(deployment)
        await second.stop(other)


def test_a_split_stack_places_prefill_and_decode_on_the_machines_the_plan_says() -> None:
    pool = [PoolMachine(name=f"sim-{i}", host=f"10.0.0.{i + 1}", gpus=1) for i in range(2)]
    cmd = revised(command("vllm-pd-nixl"), {"pool": [p.model_dump() for p in pool], "sizing": {"prefill_machines": 1}})
    slots = split_layout(cmd, SimEngineCounts(prefill=1, engines=1), gpus_per_machine=1, tp=1)
    assert [(s.role, s.machine) for s in slots] == [("prefill", 0), ("decode", 1)]
    # every agent of the pool works out the same ports, distinct per engine
    assert slots == split_layout(revised(cmd, {"node_id": "sim-1"}), SimEngineCounts(1, 1), 1, 1)
    assert len({s.port for s in slots}) == 2
    # two GPUs a machine: one prefill engine and three decode engines fill the first machine, then the second
    four = split_layout(cmd, SimEngineCounts(prefill=1, engines=3), gpus_per_machine=2, tp=1)
    assert [(s.role, s.number, s.machine) for s in four] == [
        ("prefill", 0, 0), ("decode", 0, 0), ("decode", 1, 1), ("decode", 2, 1),
    ]  # fmt: skip


def test_scrape_keeps_the_buckets_the_pacing_counters_read() -> None:
    text = (
        "# TYPE kvbench_sim_token_lateness_seconds histogram\n"
        'kvbench_sim_token_lateness_seconds_bucket{le="0.001"} 90.0\n'
        'kvbench_sim_token_lateness_seconds_bucket{le="0.005"} 98.0\n'
        'kvbench_sim_token_lateness_seconds_bucket{le="0.0075"} 99.0\n'
        'kvbench_sim_token_lateness_seconds_bucket{le="+Inf"} 100.0\n'
        "kvbench_sim_token_lateness_seconds_count 100.0\n"
        "kvbench_sim_token_lateness_seconds_sum 0.2\n"
    )
    samples = parse_samples(text)
    # the bounds the normalised counters name are kept, the others dropped (they multiply a scrape's size)
    assert samples == {
        'kvbench_sim_token_lateness_seconds_bucket{le="0.001"}': 90.0,
        'kvbench_sim_token_lateness_seconds_bucket{le="0.005"}': 98.0,
        "kvbench_sim_token_lateness_seconds_count": 100.0,
        "kvbench_sim_token_lateness_seconds_sum": 0.2,
    }
    counters = normalize(samples)
    assert counters[sim_late_counter(1000)] == 10.0
    assert counters[sim_late_counter(5000)] == 2.0
    assert sim_late_counter(2000) not in counters  # a bucket the engine did not export is unknown, not zero


def test_a_pools_agreed_ports_lie_in_their_own_range() -> None:
    from kvbench_core.procs import AGREED_PORTS_FROM, AGREED_PORTS_SPAN  # noqa: PLC0415
    from kvbench_node_agent.launchers.sim import store_port  # noqa: PLC0415

    ports = {store_port(revised(command("vllm-lmcache-mooncake"), {"run_id": f"run-{i}"})) for i in range(200)}
    assert len(ports) > 150  # spread by the run
    assert all(AGREED_PORTS_FROM <= p < AGREED_PORTS_FROM + AGREED_PORTS_SPAN for p in ports)
