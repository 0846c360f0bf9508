"""Known answers for 'did it help?': paired speed-ups, their interval and the verdict."""

from __future__ import annotations

from typing import Any

import pytest

from kvbench_core.compare import choose_baseline, compare_to_baseline


def job(repeat: int, ttft_p50: float, tokens_per_s: float, status: str = "succeeded") -> dict[str, Any]:
    return {"load_level": 8.0, "repeat": repeat, "status": status, "ttft_ms": {"p50": ttft_p50, "p99": ttft_p50 * 3},
            "output_tokens_per_s": tokens_per_s, "goodput_rps": tokens_per_s / 100}  # fmt: skip


def test_a_clear_gain_is_helped_with_an_interval_above_one() -> None:
    base = [job(r, 400.0 + 10 * r, 100.0) for r in range(3)]
    faster = [job(r, 100.0 + 2 * r, 200.0 + r) for r in range(3)]
    out = compare_to_baseline(faster, base, "gpu")
    ttft = out["speedup"]["ttft_p50"]
    assert ttft["n"] == 3
    assert ttft["mean"] == pytest.approx((4.0 * 410 / 102 * 420 / 104) ** (1 / 3))  # the geometric mean
    assert ttft["ci95"][0] > 1.0
    assert out["verdict"] == ttft["verdict"] == "helped"
    assert out["speedup"]["output_tokens_per_s"]["verdict"] == "helped"


def test_slower_is_hurt_noise_is_no_difference_and_one_repeat_cannot_say() -> None:
    base = [job(r, 100.0, 100.0) for r in range(3)]
    assert compare_to_baseline([job(r, 200.0 + r, 50.0) for r in range(3)], base, "b")["verdict"] == "hurt"
    noisy = [job(0, 90.0, 100.0), job(1, 110.0, 100.0), job(2, 100.0, 100.0)]
    assert compare_to_baseline(noisy, base, "b")["verdict"] == "no significant difference"
    one = compare_to_baseline([job(0, 50.0, 100.0)], base, "b")
    assert one["verdict"] == "not enough repeats to say"
    assert one["speedup"]["ttft_p50"]["mean"] == pytest.approx(2.0)
    # two pairs: Student's t with one degree of freedom spans orders of magnitude; no interval, no verdict
    two = compare_to_baseline([job(0, 50.0, 100.0), job(1, 40.0, 100.0)], base, "b")
    assert two["speedup"]["ttft_p50"]["n"] == 2
    assert two["speedup"]["ttft_p50"]["ci95"] is None
    assert two["verdict"] == "not enough repeats to say"
    failed = compare_to_baseline([job(0, 50.0, 100.0, status="failed")], base, "b")
    assert failed["verdict"] == "no valid result"


def test_one_lucky_repeat_does_not_hide_a_consistent_gain() -> None:
    # the demo's shape: a GPU cache that sometimes hits (TTFT 1.35 s, 0.74 s, 0.81 s) against a shared store
    # that always does (68, 90, 135 ms): ratios 19.9x, 8.2x, 6.0x; their arithmetic interval spans 1, not so the log
    base = [job(0, 1349.5, 80.0), job(1, 742.0, 96.0), job(2, 808.5, 86.0)]
    store = [job(0, 67.9, 132.0), job(1, 90.0, 130.0), job(2, 135.2, 132.0)]
    ttft = compare_to_baseline(store, base, "gpu")["speedup"]["ttft_p50"]
    assert ttft["mean"] == pytest.approx(9.9, abs=0.1)
    assert 1.5 < ttft["ci95"][0] < ttft["mean"] < ttft["ci95"][1]
    assert ttft["verdict"] == "helped"


def test_the_baseline_is_the_plans_else_the_first_own_cache_workload() -> None:
    strategies = {"off": "own_cache", "gpu": "own_cache", "store": "shared_pool"}
    assert choose_baseline(["off", "gpu", "store"], strategies, "gpu") == "gpu"
    assert choose_baseline(["store", "off", "gpu"], strategies, None) == "off"
    assert choose_baseline(["store"], strategies, None) is None
