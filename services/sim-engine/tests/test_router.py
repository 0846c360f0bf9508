"""The simulated stacks' router: which engine each policy picks."""

from __future__ import annotations

import pytest

from kvbench_sim.router import Backends

ENGINES = ["http://e0", "http://e1", "http://e2"]


def test_round_robin_takes_engines_in_turn_and_prefill_engines_in_turn() -> None:
    backends = Backends(ENGINES, ["http://p0", "http://p1"], "round_robin")
    assert [backends.pick(None, "x") for _ in range(4)] == [*ENGINES, ENGINES[0]]
    assert [backends.pick_prefill() for _ in range(3)] == ["http://p0", "http://p1", "http://p0"]


def test_session_affinity_keeps_a_conversation_on_one_engine_and_spreads_conversations() -> None:
    backends = Backends(ENGINES, [], "session_affinity")
    for session in ("alice", "bob", "carol"):
        assert len({backends.pick(session, f"turn {k}") for k in range(5)}) == 1
    assert len({backends.pick(f"user-{k}", "same prompt") for k in range(30)}) == 3
    assert backends.pick(None, "a prompt") == backends.pick(None, "a prompt")  # no key: the prompt's start


def test_prefix_aware_sends_equal_prompt_starts_to_one_engine() -> None:
    backends = Backends(ENGINES, [], "prefix_aware")
    assert len({backends.pick(f"user-{k}", "shared system prompt") for k in range(10)}) == 1
    assert len({backends.pick("one user", f"document {k}") for k in range(30)}) == 3


def test_pd_aware_picks_the_decode_engine_with_the_fewest_requests_in_flight() -> None:
    backends = Backends(ENGINES, ["http://p0"], "pd_aware")
    backends.in_flight.update({"http://e0": 3, "http://e1": 1, "http://e2": 2})
    assert backends.pick("s", "x") == "http://e1"
    backends.in_flight["http://e1"] += 5
    assert backends.pick("s", "x") == "http://e2"


def test_bad_settings_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="choose one of round_robin"):
        Backends(ENGINES, [], "random")
    with pytest.raises(ValueError, match="at least one"):
        Backends([], ["http://p0"], "pd_aware")


async def test_an_unreachable_engine_is_a_502_that_names_it() -> None:
    from aiohttp.test_utils import TestClient, TestServer  # noqa: PLC0415

    from kvbench_core.procs import free_port  # noqa: PLC0415
    from kvbench_sim.router import build_router  # noqa: PLC0415

    dead = f"http://127.0.0.1:{free_port()}"
    for prefill in ([dead], []):
        client = TestClient(TestServer(build_router(Backends([dead], prefill, "pd_aware"))))
        await client.start_server()
        try:
            response = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True})
            assert response.status == 502
            assert ("prefill engine" if prefill else dead) in (await response.json())["error"]
            metrics = await (await client.get("/metrics")).text()
            assert "kvbench_sim_router_requests_total" in metrics
        finally:
            await client.close()
