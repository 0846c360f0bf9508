"""The accuracy gate: each workload's answers against the baseline's to the same requests."""

from __future__ import annotations

from typing import Any

from kvbench_reporter.accuracy import accuracy_gate


def _workload(name: str, jobs: list[tuple[str, int]]) -> dict[str, Any]:
    return {"name": name, "jobs": [{"job_id": job, "load_level": 4.0, "repeat": repeat} for job, repeat in jobs]}


BASE = _workload("gpu", [("b0", 0), ("b1", 1)])
STORE = _workload("store", [("s0", 0), ("s1", 1)])
SAME = {f"u{i}/1": f"digest{i}" for i in range(20)}


def test_identical_answers_pass_and_the_baseline_is_the_reference() -> None:
    answers = {"b0": SAME, "b1": SAME, "s0": SAME, "s1": dict(list(SAME.items())[:10])}
    gate = accuracy_gate(STORE, BASE, answers, "Qwen/Qwen3-8B")
    assert (gate["verdict"], gate["passed"], gate["compared"], gate["differ"]) == ("passed", True, 30, 0)
    reference = accuracy_gate(BASE, BASE, answers, "Qwen/Qwen3-8B")
    assert (reference["verdict"], reference["kept"]) == ("reference", 40)


def test_a_dense_model_whose_answers_differ_fails_naming_the_requests() -> None:
    changed = {**SAME, "u3/1": "other", "u7/1": "other"}
    gate = accuracy_gate(STORE, BASE, {"b0": SAME, "b1": SAME, "s0": changed, "s1": SAME}, "Qwen/Qwen3-8B")
    assert gate["passed"] is False
    assert gate["differ"] == 2
    assert gate["differing"] == ["s0:u3/1", "s0:u7/1"]
    assert "s0:u3/1" in gate["reason"]
    # answers of another repeat are never compared with these: repeat 0 against repeat 0 only
    shifted = accuracy_gate(STORE, BASE, {"b0": SAME, "b1": changed, "s0": SAME, "s1": SAME}, "Qwen/Qwen3-8B")
    assert shifted["differ"] == 2


def test_a_hybrid_model_may_differ_within_its_stated_share() -> None:
    one = {**SAME, "u3/1": "other"}  # 1 of 40: 2.5%, within 10%
    gate = accuracy_gate(STORE, BASE, {"b0": SAME, "b1": SAME, "s0": one, "s1": SAME}, "nvidia/Qwen3.6-35B-A3B-NVFP4")
    assert gate["passed"] is True
    assert gate["allowed_share"] == 0.10
    many = dict.fromkeys(SAME, "other")
    assert accuracy_gate(STORE, BASE, {"b0": SAME, "s0": many}, "nvidia/Qwen3.6-35B-A3B-NVFP4")["passed"] is False


def test_no_answers_in_common_is_said_not_passed() -> None:
    gate = accuracy_gate(STORE, BASE, {"b0": SAME}, "Qwen/Qwen3-8B")
    assert (gate["verdict"], gate["passed"]) == ("not checked", None)
    assert accuracy_gate(STORE, None, {}, "Qwen/Qwen3-8B")["verdict"] == "not checked"
