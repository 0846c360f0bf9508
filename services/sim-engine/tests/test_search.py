"""`kvbench sim search` agrees with exhaustive `kvbench sim run`s of the same candidates: the smallest value meeting
the SLO, the highest rate meeting it within the stated precision, and no "best" when nothing meets it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from kvbench_contracts.plan import Plan
from kvbench_contracts.search import SLO_FIGURES
from kvbench_sim.search import search_plan
from kvbench_sim.whatif import run_plan

ROOT = Path(__file__).resolve().parents[3]
HOST_MEMORY = ROOT / "examples" / "search" / "host-memory.yaml"


def _meets(document: dict[str, Any], slo: dict[str, float]) -> bool:
    """The plan (no search) run as `kvbench sim run` runs it, judged by hand: every job meets every target."""
    report = run_plan(Plan.model_validate({k: v for k, v in document.items() if k != "search"}))
    for point in report["workloads"][0]["test_points"]:
        for job in point["jobs"]:
            for name, target in slo.items():
                source, percentile, direction = SLO_FIGURES[name]
                value = job[source][percentile] if percentile else job[source]
                if value is None or (value > target if direction == "max" else value < target):
                    return False
    return True


def _with(document: dict[str, Any], **fields: Any) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    workload = changed["workloads"][0]
    for path, value in fields.items():
        node = workload
        *parents, leaf = path.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return changed


def test_the_smallest_value_meeting_the_slo_is_the_one_exhaustive_runs_find() -> None:
    document = yaml.safe_load(HOST_MEMORY.read_text())
    answer = search_plan(Plan.model_validate(document), workers=1)
    values = document["search"]["vary"]["sizing.host_memory_gb"]
    slo = document["search"]["slo"]
    exhaustive = [v for v in values if _meets(_with(document, sizing__host_memory_gb=v), slo)]
    assert exhaustive, "the example's SLO should be met by some value"
    assert answer["best"]["sizing.host_memory_gb"] == min(exhaustive)
    # smallest first, stopping at the first that met: nothing above it was evaluated
    tried = [e["values"]["sizing.host_memory_gb"] for e in answer["evaluated"]]
    assert tried == sorted(v for v in values if v <= min(exhaustive))
    below = max(v for v in values if v < min(exhaustive))
    assert answer["best"]["next_failed"]["values"] == {"sizing.host_memory_gb": below}
    assert answer["best"]["next_failed"]["missed"][0]["figure"] == "ttft_p90_ms"


def _rate_plan(precision: float) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(HOST_MEMORY.read_text())
    synthetic = {"prefix_tokens": 2048, "groups": 8, "users_per_group": 4, "turns": 4, "input_tokens": 128,
                 "output_tokens": 64}  # fmt: skip
    arrivals = {"mode": "request_rate", "rates": [1]}
    document["defaults"]["traffic"] = {"shape": "synthetic_sessions", "synthetic": synthetic, "arrivals": arrivals,
                                       "duration_s": 90}  # fmt: skip
    document["defaults"]["measurement"]["warmup_s"] = 15
    document["search"] = {
        "vary": {"sizing.host_memory_gb": [8, 64], "traffic.arrivals.rates": {"from": 1, "to": 64,
                                                                             "precision": precision}},
        "slo": {"ttft_p90_ms": 500},
        "objective": "maximize goodput_rps",
    }  # fmt: skip
    return document


def test_the_highest_rate_meeting_the_slo_is_found_within_the_stated_precision() -> None:
    document = _rate_plan(precision=0.05)
    answer = search_plan(Plan.model_validate(document), workers=2)
    best = answer["best"]
    rate = best["traffic.arrivals.rates"]
    slo = document["search"]["slo"]
    memory = best["sizing.host_memory_gb"]
    # what exhaustive runs say: the answer meets it, the next rate tried above it misses, within the precision
    assert _meets(_with(document, sizing__host_memory_gb=memory, traffic__arrivals__rates=[rate]), slo)
    above = best["next_failed"]["values"]["traffic.arrivals.rates"]
    assert rate < above <= rate * 1.05
    assert not _meets(_with(document, sizing__host_memory_gb=memory, traffic__arrivals__rates=[above]), slo)
    # every rate evaluated for that memory below the answer met it; every one at or above the miss missed
    row = [e for e in answer["evaluated"] if e["values"]["sizing.host_memory_gb"] == memory]
    assert all(e["met"] for e in row if e["values"]["traffic.arrivals.rates"] <= rate)
    assert not any(e["met"] for e in row if e["values"]["traffic.arrivals.rates"] >= above)
    # both memories were searched; ties go to the smaller one
    assert {e["values"]["sizing.host_memory_gb"] for e in answer["evaluated"]} == {8.0, 64.0}
    assert answer["pareto"]


def test_no_candidate_meeting_the_slo_gives_no_best_but_the_closest_and_what_it_missed() -> None:
    document = yaml.safe_load(HOST_MEMORY.read_text())
    document["search"]["slo"] = {"ttft_p90_ms": 1}  # nothing answers in a millisecond
    answer = search_plan(Plan.model_validate(document), workers=1)
    assert answer["best"] is None
    assert len(answer["evaluated"]) == len(document["search"]["vary"]["sizing.host_memory_gb"])
    closest = answer["closest"]
    assert closest["missed"][0]["figure"] == "ttft_p90_ms"
    assert closest["missed"][0]["got"] > 1
    assert closest["sizing.host_memory_gb"] == 64.0  # the one that came nearest (its TTFT was the lowest)
