"""The simulated engine's pacing slip reaches the normalised counters through the agent's own scrape path."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from kvbench_contracts.engine import SIM_LATE_BOUNDS_US, sim_late_counter
from kvbench_node_agent.normalize import normalize
from kvbench_node_agent.scrape import parse_samples
from kvbench_sim.engine import Engine
from kvbench_sim.profiles import load_profile
from kvbench_sim.server import PacedEngine, build_app

pytestmark = pytest.mark.integration


async def test_tokens_written_and_late_ones_are_normalised() -> None:
    paced = PacedEngine(Engine(load_profile("L40S", "Qwen/Qwen3-8B"), seed=0), speed=20.0)
    server = TestServer(build_app(paced, "Qwen/Qwen3-8B"))
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            body = {"model": "Qwen/Qwen3-8B", "prompt": "hello " * 50, "max_tokens": 8, "stream": True}
            async with http.post(server.make_url("/v1/completions"), json=body) as response:
                assert response.status == 200
                await response.read()
            async with http.get(server.make_url("/metrics")) as response:
                text = await response.text()
    finally:
        await server.close()
    counters = normalize(parse_samples(text))
    assert counters["sim_tokens_written"] >= 8
    # one counter per bound, each no more than those under a smaller bound: a window's p99 slip can be read off them
    late = [counters[sim_late_counter(bound)] for bound in SIM_LATE_BOUNDS_US]
    assert all(0 <= n <= counters["sim_tokens_written"] for n in late)
    assert late == sorted(late, reverse=True)
    assert counters["prompt_tokens"] > 0  # the engine flavour's own counters are still read
