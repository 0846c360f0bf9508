from __future__ import annotations

import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kvbench_sim.engine import Engine
from kvbench_sim.profiles import TierConfig, load_profile
from kvbench_sim.server import PacedEngine, build_app
from kvbench_stacks.catalog import LOCAL_CACHE_RESET


async def make_client(speed: float = 50.0) -> TestClient:  # type: ignore[type-arg]
    paced = PacedEngine(Engine(load_profile("L40S", "Qwen/Qwen3-8B"), seed=0), speed=speed)
    client = TestClient(TestServer(build_app(paced, "Qwen/Qwen3-8B", seed=0)))
    await client.start_server()
    return client


async def stream(client: TestClient, body: dict[str, object], path: str = "/v1/completions") -> list[dict]:  # type: ignore[type-arg]
    response = await client.post(path, json={**body, "stream": True, "stream_options": {"include_usage": True}})
    assert response.status == 200
    events = []
    async for line in response.content:
        if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
            events.append(json.loads(line[6:]))
    return events


async def test_streaming_completion_reports_cached_tokens_and_vllm_metrics() -> None:
    client = await make_client()
    try:
        prompt = " ".join(f"t{i}" for i in range(300))
        first = await stream(client, {"prompt": prompt + " a", "max_tokens": 5})
        second = await stream(client, {"prompt": prompt + " b", "max_tokens": 5})
        texts = [e["choices"][0]["text"] for e in first if e["choices"]]
        assert len(texts) == 5
        assert first[-1]["usage"]["prompt_tokens"] == 301
        assert first[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert second[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 288  # 18 full blocks
        metrics = await (await client.get("/metrics")).text()
        assert 'vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-8B"} 288.0' in metrics
        assert "vllm:prompt_tokens_cached_by_source_total" in metrics
        assert "vllm:kv_cache_usage_perc" in metrics
        assert (await client.get("/health")).status == 200
    finally:
        await client.close()


async def test_chat_output_is_deterministic_and_reset_drops_the_cache() -> None:
    client = await make_client()
    try:
        body = {"messages": [{"role": "user", "content": " ".join(["w"] * 100)}], "max_tokens": 4}
        a = await stream(client, body, "/v1/chat/completions")
        b = await stream(client, body, "/v1/chat/completions")

        def text(events: list[dict]) -> str:  # type: ignore[type-arg]
            return "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])

        assert text(a) == text(b)
        assert text(a).strip()
        reset = await client.post("/reset_prefix_cache")
        assert (await reset.json())["dropped_blocks"] > 0
        c = await stream(client, body, "/v1/chat/completions")
        assert c[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        await client.close()


async def test_bad_requests_get_a_400_naming_the_field() -> None:
    client = await make_client()
    try:
        response = await client.post("/v1/completions", json={"max_tokens": 3})
        assert response.status == 400
        assert "prompt" in await response.text()
    finally:
        await client.close()


async def test_sglang_mode_scrapes_like_sglang_and_a_host_tier_shows_in_the_vllm_sources() -> None:
    from kvbench_node_agent.normalize import normalize  # noqa: PLC0415
    from kvbench_node_agent.scrape import parse_samples  # noqa: PLC0415
    from kvbench_sim.profiles import TierConfig  # noqa: PLC0415

    prompt = " ".join(f"t{i}" for i in range(300))
    paced = PacedEngine(Engine(load_profile("L40S", "Qwen/Qwen3-8B"), seed=0), speed=50.0)
    client = TestClient(TestServer(build_app(paced, "Qwen/Qwen3-8B", seed=0, flavor="sglang")))
    await client.start_server()
    try:
        await stream(client, {"prompt": prompt + " a", "max_tokens": 3})
        await stream(client, {"prompt": prompt + " b", "max_tokens": 3})
        text = await (await client.get("/metrics")).text()
        assert "vllm:" not in text
        counters = normalize(parse_samples(text))
        assert counters["prompt_tokens_gpu"] == 288
        assert counters["prompt_tokens"] == 602
    finally:
        await client.close()
    # a host tier: a reset GPU cache leaves the hit to the host tier, reported as vLLM's source="host"
    host = TierConfig(name="host", capacity_gb=10, bw_gbps=25, lat_ms=0.05)
    cached, text = await _asked_again_after_a_reset((host,))
    assert cached == 288
    counters = normalize(parse_samples(text))
    assert counters["prompt_tokens_host"] == 288
    assert counters["prompt_tokens_gpu"] == 0
    assert counters["kv_bytes_loaded_host"] == 288 * 147_456


async def _asked_again_after_a_reset(tiers: tuple[TierConfig, ...], flavor: str = "vllm") -> tuple[int, str]:
    """A 301-token prompt, the engine's prefix cache emptied through its own route, a prompt sharing 300 tokens with
    it: the second one's cached tokens, and the engine's /metrics text."""
    from kvbench_sim.profiles import EngineConfig  # noqa: PLC0415

    prompt = " ".join(f"t{i}" for i in range(300))
    engine = Engine(load_profile("L40S", "Qwen/Qwen3-8B", EngineConfig(tiers=tiers)), seed=0)
    client = TestClient(TestServer(build_app(PacedEngine(engine, speed=50.0), "Qwen/Qwen3-8B", flavor=flavor)))
    await client.start_server()
    try:
        await stream(client, {"prompt": prompt + " a", "max_tokens": 3})
        route = LOCAL_CACHE_RESET[flavor]
        assert route is not None, f"{flavor} has no route that empties its prefix cache"
        await client.post(route)
        events = await stream(client, {"prompt": prompt + " b", "max_tokens": 3})
        return events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"], await (
            await client.get("/metrics")
        ).text()
    finally:
        await client.close()


async def test_a_shared_stores_bytes_read_as_remote_through_the_agents_normaliser() -> None:
    """A Mooncake store tier's puts and gets reach the report as kv_bytes_stored_remote / _loaded_remote (and the
    simulated switch's ports, which move with them): the simulator writes vLLM's operation labels, which the
    normaliser selects, and the conformance suite holds to vLLM's source."""
    from kvbench_node_agent.normalize import normalize  # noqa: PLC0415
    from kvbench_node_agent.scrape import parse_samples  # noqa: PLC0415
    from kvbench_sim.profiles import TierConfig  # noqa: PLC0415

    store = TierConfig(name="shared", capacity_gb=10, bw_gbps=22.5, lat_ms=0.5, store_id="mooncake")
    cached, text = await _asked_again_after_a_reset((store,))
    assert cached == 288
    counters = normalize(parse_samples(text))
    assert counters["kv_bytes_stored_remote"] >= 288 * 147_456
    assert counters["kv_bytes_loaded_remote"] == 288 * 147_456
    assert counters["prompt_tokens_gpu"] == 0


async def test_each_engine_empties_its_prefix_cache_through_its_own_route() -> None:
    """vLLM's POST /reset_prefix_cache keeps the host tier; SGLang's POST /flush_cache empties HiCache's host pool
    with the radix tree; a TensorRT-LLM server has no such route (the acceptance test restarts it instead)."""
    from kvbench_sim.profiles import EngineConfig, TierConfig  # noqa: PLC0415

    prompt = " ".join(f"t{i}" for i in range(300))
    host = TierConfig(name="host", capacity_gb=10, bw_gbps=25, lat_ms=0.05)
    for flavor, route, host_kept in (("vllm", "/reset_prefix_cache", True), ("sglang", "/flush_cache", False),
                                     ("trtllm", None, True)):  # fmt: skip
        engine = Engine(load_profile("L40S", "Qwen/Qwen3-8B", EngineConfig(tiers=(host,))), seed=0)
        client = TestClient(TestServer(build_app(PacedEngine(engine, speed=50.0), "Qwen/Qwen3-8B", flavor=flavor)))
        await client.start_server()
        try:
            await stream(client, {"prompt": prompt + " a", "max_tokens": 3})
            for other in ("/reset_prefix_cache", "/flush_cache"):
                if other != route:
                    assert (await client.post(other)).status in (404, 405), (flavor, other)
            if route is None:
                continue
            assert (await client.post(route)).status == 200
            events = await stream(client, {"prompt": prompt + " b", "max_tokens": 3})
            cached = events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached == (288 if host_kept else 0), flavor  # from the host tier, or recomputed
        finally:
            await client.close()


async def test_a_hundred_concurrent_streams_each_get_every_token_in_order_and_done() -> None:
    """Bursts of 64 tokens or more are written from two threads straight to the sockets: every stream still gets
    its tokens whole, in order, then the usage and [DONE], and the timing of every token is counted."""
    import asyncio  # noqa: PLC0415

    client = await make_client(speed=20.0)
    try:

        async def one(k: int) -> tuple[list[str], bool, int]:
            body = {"prompt": f"user {k} asks something", "max_tokens": 12, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            response = await client.post("/v1/completions", json=body)
            texts, done, completion = [], False, 0
            async for line in response.content:
                if line.strip() == b"data: [DONE]":
                    done = True
                elif line.startswith(b"data: "):
                    event = json.loads(line[6:])
                    if event["choices"]:
                        texts.append(event["choices"][0]["text"])
                    else:
                        completion = event["usage"]["completion_tokens"]
            return texts, done, completion

        results = await asyncio.gather(*(one(k) for k in range(100)))
        metrics = await (await client.get("/metrics")).text()
    finally:
        await client.close()
    for k, (texts, done, completion) in enumerate(results):
        assert len(texts) == 12, (k, texts)
        assert done
        assert completion == 12
        assert all(t.startswith(" w") for t in texts)
    assert await one_more(k=7) == results[7][0]  # the same prompt gives the same words
    for histogram in ("lateness", "timing_error"):
        prefix = f"kvbench_sim_token_{histogram}_seconds_count"
        count = next(line for line in metrics.splitlines() if line.startswith(prefix))
        assert float(count.split()[-1]) == 1200


async def one_more(k: int) -> list[str]:
    client = await make_client(speed=20.0)
    try:
        events = await stream(client, {"prompt": f"user {k} asks something", "max_tokens": 12})
    finally:
        await client.close()
    return [e["choices"][0]["text"] for e in events if e["choices"]]


def test_a_burst_starts_half_its_expected_length_early_within_bounds() -> None:
    """Centring a step's writes on its due time: the lead is half the burst's expected length, capped by half the
    step and by 5 ms; the per-write cost it uses follows measured bursts."""
    paced = PacedEngine(Engine(load_profile("H100", "Qwen/Qwen3-8B"), seed=0))
    paced.write_cost_s = 10e-6
    assert paced.burst_lead_s(400, step_wall_s=0.030) == pytest.approx(0.002)
    assert paced.burst_lead_s(400, step_wall_s=0.002) == pytest.approx(0.001)  # never more than half the step
    assert paced.burst_lead_s(5000, step_wall_s=0.5) == pytest.approx(0.005)  # never more than 5 ms
    assert paced.burst_lead_s(0, step_wall_s=0.030) == 0.0


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
async def test_every_labelled_series_the_normaliser_reads_carries_values_it_selects(flavor: str) -> None:
    """Every series the simulator writes under a family the node agent reads by label (engine_metrics.READS, held
    to the engines' own source by the conformance suite) carries label values that read declares: a value it does
    not select (the store's "get" for vLLM's "load_get") is traffic the report never sees. Exercised with a host, a
    disk and a shared tier, so each tier's series is written."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    from kvbench_node_agent.engine_metrics import reads_of  # noqa: PLC0415
    from kvbench_sim.profiles import TierConfig  # noqa: PLC0415

    tiers = (
        TierConfig(name="host", capacity_gb=10, bw_gbps=25, lat_ms=0.05),
        TierConfig(name="disk", capacity_gb=10, bw_gbps=5, lat_ms=0.2),
        TierConfig(name="shared", capacity_gb=10, bw_gbps=22.5, lat_ms=0.5, store_id="mooncake"),
    )
    _, text = await _asked_again_after_a_reset(tiers, flavor)
    reads = {r.family.removesuffix("_total"): r for r in reads_of(flavor) if r.labels}
    checked = 0
    for family in text_string_to_metric_families(text):
        read = reads.get(family.name.removesuffix("_total"))
        if read is None:
            continue
        for sample in family.samples:
            for name, values in read.labels:
                assert sample.labels.get(name) in values, (sample.name, sample.labels, name, values)
                checked += 1
    assert checked, f"the simulator wrote none of the labelled series {sorted(reads)}"


async def test_a_pd_transfer_leaves_the_prefill_machine_as_it_reaches_the_decode_one() -> None:
    """The prefill engine counts the prompt KV it offered (no real engine does: vLLM counts a transfer where the
    decode side pulls it), so the simulated switch sees the bytes leave the prefill machine's port as they reach the
    decode machine's: a split stack's traffic used to appear on the decode ports only."""
    from kvbench_contracts.engine import SIM_KV_BYTES_SENT  # noqa: PLC0415
    from kvbench_node_agent.normalize import normalize  # noqa: PLC0415
    from kvbench_node_agent.scrape import parse_samples  # noqa: PLC0415
    from kvbench_sim.tiers import Link  # noqa: PLC0415

    prompt = " ".join(f"t{i}" for i in range(300))
    prefill = TestClient(TestServer(build_app(PacedEngine(Engine(load_profile("H100", "Qwen/Qwen3-8B")), speed=50.0),
                                              "Qwen/Qwen3-8B", engine_id="p0")))  # fmt: skip
    decode_engine = PacedEngine(Engine(load_profile("H100", "Qwen/Qwen3-8B")), speed=50.0, transfer=Link("pd", 50e9))
    decode = TestClient(TestServer(build_app(decode_engine, "Qwen/Qwen3-8B", engine_id="d0")))
    await prefill.start_server()
    await decode.start_server()
    try:
        handed = await prefill.post(
            "/v1/completions",
            json={"prompt": prompt, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}},
        )
        params = (await handed.json())["kv_transfer_params"]
        await stream(decode, {"prompt": prompt, "max_tokens": 3, "kv_transfer_params": params})
        sent = normalize(parse_samples(await (await prefill.get("/metrics")).text()))
        received = normalize(parse_samples(await (await decode.get("/metrics")).text()))
        assert sent[SIM_KV_BYTES_SENT] == received["kv_bytes_transferred"] == 300 * 147_456
        assert received.get(SIM_KV_BYTES_SENT, 0.0) == 0.0  # the decode engine sent nothing
    finally:
        await prefill.close()
        await decode.close()
