from __future__ import annotations

import pytest

from kvbench_contracts.events import EngineEndpoint
from kvbench_loadgen.client import StreamResult
from kvbench_loadgen.job import to_record
from kvbench_loadgen.prompts import words
from kvbench_loadgen.routing import Router
from kvbench_loadgen.workload import UnsupportedShapeError, build_users


def test_prompts_are_deterministic_with_exact_word_counts() -> None:
    assert words("k", 1000) == words("k", 1000)
    assert len(words("k", 1000)) == 1000
    assert words("k", 10) != words("other", 10)


def test_synthetic_sessions_share_a_prefix_per_group_and_resend_history() -> None:
    traffic = {
        "shape": "synthetic_sessions",
        "synthetic": {"prefix_tokens": 50, "groups": 2, "turns": 2, "input_tokens": 5, "output_tokens": 3},
    }
    users = build_users(traffic, 4)
    assert users[0].prefix == users[2].prefix != users[1].prefix
    first = users[0].next_prompt()
    assert len(first) == 55
    users[0].record_turn(first, " o1 o2 o3")
    second = users[0].next_prompt()
    assert second[: len(first)] == first  # history resent verbatim
    assert second[len(first) : len(first) + 3] == ["o1", "o2", "o3"]
    users[0].record_turn(second, " x")
    assert users[0].session_number == 1
    assert users[0].history == []


def test_unsupported_shapes_say_what_is_supported() -> None:
    with pytest.raises(UnsupportedShapeError, match="supported: synthetic_sessions"):
        build_users({"shape": "agentic_replay"}, 1)


def test_session_affinity_is_stable() -> None:
    endpoints = [
        EngineEndpoint(node_id=f"n{i}", engine_id=f"e{i}", base_url=f"http://h{i}", metrics_url="m") for i in range(3)
    ]
    router = Router(endpoints, "session_affinity")
    assert len({router.pick("u1-s0", "").engine_id for _ in range(10)}) == 1
    rr = Router(endpoints, "round_robin")
    assert [rr.pick("x", "").engine_id for _ in range(4)] == ["e0", "e1", "e2", "e0"]


def test_record_is_relative_to_send_time_and_uses_usage() -> None:
    result = StreamResult(
        t0=100.0,
        chunk_times=[100.2, 100.25, 100.3],
        chunk_tokens=[1, 1, 1],
        text=["a"] * 3,
        prompt_tokens=40,
        output_tokens=3,
        cached_tokens=32,
    )
    record = to_record(
        result, load_t0=90.0, job_id="j", workload="w", session_id="s", turn=0, prompt_tokens=41, shard="lg"
    )
    assert record.start_s == pytest.approx(10.0)
    assert record.ttft_s == pytest.approx(0.2)
    assert record.e2e_s == pytest.approx(0.3)
    assert record.prompt_tokens == 40
    assert record.cached_tokens == 32
    assert record.ok
