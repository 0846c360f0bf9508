from __future__ import annotations

import pytest

from kvbench_contracts.events import EngineEndpoint
from kvbench_loadgen.client import StreamResult
from kvbench_loadgen.driver import to_record
from kvbench_loadgen.routing import Router
from kvbench_workloads.prompts import words
from kvbench_workloads.sessions import Session
from kvbench_workloads.shapes.documents import document_sessions
from kvbench_workloads.shapes.synthetic import SyntheticSession
from kvbench_workloads.sources import UnsupportedShapeError, build_source, contexts_for_ratio


def test_prompts_are_deterministic_with_exact_word_counts() -> None:
    assert words("k", 1000) == words("k", 1000)
    assert len(words("k", 1000)) == 1000
    assert words("k", 10) != words("other", 10)


def test_synthetic_sessions_share_a_prefix_per_group_and_resend_history() -> None:
    traffic = {
        "shape": "synthetic_sessions",
        "synthetic": {"prefix_tokens": 50, "groups": 2, "turns": 2, "input_tokens": 5, "output_tokens": 3},
    }
    source = build_source(traffic, users=4)
    sessions = [source.next_session(u) for u in source.users]
    assert all(isinstance(s, SyntheticSession) for s in sessions)
    s0, s1, s2 = (s for s in sessions[:3] if isinstance(s, SyntheticSession))
    assert s0.prefix == s2.prefix != s1.prefix
    first = s0.next_turn()
    assert first is not None
    assert first.prompt_tokens == 55
    first_text = first.text()
    assert first_text is not None
    assert first_text.split() == list(first.words or ())
    assert first.head(20) == first_text[:20]
    s0.record(first, " o1 o2 o3", ok=True)
    second = s0.next_turn()
    assert second is not None
    second_text = second.text()
    assert second_text is not None
    assert second_text.startswith(first_text + " o1 o2 o3 ")  # history resent verbatim
    s0.record(second, " x", ok=True)
    assert s0.next_turn() is None  # two turns, then the session is over
    again = source.next_session(0)
    assert again is not None
    assert again.session_id == "u0-s1"


def test_a_failed_turn_ends_a_synthetic_session() -> None:
    session = SyntheticSession("u0-s0", [], turns=5, input_tokens=3, output_tokens=2, think_time_s=0)
    turn = session.next_turn()
    assert turn is not None
    session.record(turn, "", ok=False)
    assert session.next_turn() is None


def test_shards_split_users_and_replayed_sessions_without_overlap() -> None:
    traffic = {"shape": "synthetic_sessions"}
    a, b = build_source(traffic, users=5, shard=0, shards=2), build_source(traffic, users=5, shard=1, shards=2)
    assert a.users == [0, 2, 4]
    assert b.users == [1, 3]
    docs = {"shape": "document_reuse", "documents": {"count": 3, "tokens": 10, "rounds": 2}}
    seen: list[str] = []
    for shard in (0, 1):
        src = build_source(docs, users=1, shard=shard, shards=2)
        while (s := src.next_session(0)) is not None:
            seen.append(s.session_id)
    assert len(seen) == len(set(seen)) == 6


def test_document_reuse_tiles_rounds_and_marks_the_measured_ones() -> None:
    spec = {"count": 3, "tokens": 20, "question_tokens": 4, "rounds": 2, "order": "tile"}
    sessions = document_sessions(spec, seed=0)
    turns = [s.next_turn() for s in sessions]
    assert [t.phase for t in turns if t] == [1, 1, 1, 2, 2, 2]
    first, again = turns[0], turns[3]
    assert first is not None
    assert again is not None
    assert first.prompt
    assert again.prompt
    assert first.prompt_tokens == 24
    # the same document on both rounds (a cache hit), a new question each time
    assert first.prompt.split()[:20] == again.prompt.split()[:20]
    assert first.prompt.split()[20:] != again.prompt.split()[20:]
    source = build_source({"shape": "document_reuse", "documents": {**spec, "measure_rounds": [2]}}, users=1)
    assert source.measure_phases == frozenset({2})
    interleaved = document_sessions({**spec, "order": "interleave"}, seed=0)
    assert [s.session_id.split("-")[0] for s in interleaved][:2] == ["d0", "d0"]
    shuffled = document_sessions({**spec, "order": "random"}, seed=1)
    assert sorted(s.session_id.split("-")[0] for s in shuffled) == sorted(s.session_id.split("-")[0] for s in sessions)


def test_working_set_ratio_becomes_distinct_contexts() -> None:
    assert contexts_for_ratio(2.0, 100_000, 8_000) == 25
    traffic = {"shape": "document_reuse", "documents": {"count": 1, "tokens": 1_000, "rounds": 1}}
    source = build_source(traffic, users=1, working_set_ratio=1.5, capacity_tokens=10_000)
    count = 0
    while source.next_session(0) is not None:
        count += 1
    assert count == 15
    assert any("working_set_ratio" in n for n in source.notes)
    synthetic = {"shape": "synthetic_sessions", "synthetic": {"prefix_tokens": 100, "groups": 1}}
    source = build_source(synthetic, users=2, working_set_ratio=1.0, capacity_tokens=1_000)
    prefixes = set()
    for _ in range(10):
        for user in source.users:
            session = source.next_session(user)
            assert isinstance(session, SyntheticSession)
            prefixes.add(" ".join(session.prefix))
    assert len(prefixes) == 10  # 1.0 x 1,000 tokens / 100-token prefixes


def test_working_set_ratio_without_a_capacity_is_refused_with_the_fix() -> None:
    with pytest.raises(UnsupportedShapeError, match="working_set_ratio"):
        build_source({"shape": "synthetic_sessions"}, users=1, working_set_ratio=2.0)


def test_unknown_shapes_say_what_is_supported() -> None:
    with pytest.raises(UnsupportedShapeError, match="synthetic_sessions"):
        build_source({"shape": "bogus"}, users=1)


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


def test_base_session_is_abstract() -> None:
    with pytest.raises(NotImplementedError):
        Session("s").next_turn()
