"""Shared fixtures for the reporter's tests: a workload entry shaped like the report's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

WorkloadFactory = Callable[[str, float, int], dict[str, Any]]


def _make_workload(name: str, p50: float, cached: int) -> dict[str, object]:
    stats = {"mean": p50, "p50": p50, "p90": p50 * 2, "p95": p50 * 2, "p99": p50 * 3, "count": 3.0}
    return {
        "name": name,
        "stack": f"vllm-{name}",
        "strategy": "own_cache",
        "requests": 10,
        "requests_measured": 8,
        "errors": 0,
        "window_s": 30.0,
        "ttft_ms": stats,
        "tpot_ms": stats,
        "itl_ms": stats,
        "e2e_ms": stats,
        "output_tokens_per_s": 123.4,
        "cached_prompt_tokens": cached,
        "prompt_tokens": 1000,
        "cache_hit_ratio": cached / 1000,
        "prompt_token_sources": {"tokens": {"gpu_hit": cached, "recomputed": 1000 - cached}},
        "engine_counters": None,
        "test_points": [
            {"load_level": 4.0, "ttft_ms": stats, "output_tokens_per_s": 100.0},
            {"load_level": 8.0, "ttft_ms": {**stats, "p50": p50 * 2}, "output_tokens_per_s": 150.0},
        ],
        "hit_ratio_over_time": [
            {"job_id": "J", "start_s": 1.0, "ratio": cached / 1000},
            {"job_id": "J", "start_s": 2.0, "ratio": cached / 1000},
        ],
        "kv_bytes_moved": {"kv_bytes_transferred": 2e9, "kv_bytes_loaded_remote": 0.0, "kv_bytes_stored_remote": 1e9},
        "distributions": {
            "ttft_ms": [p50 * (0.5 + q / 100) for q in range(101)],
            "itl_ms": [10 + q / 10 for q in range(101)],
        },
        "limits": {
            "break_even_gbps": 12.5,
            "kv_bytes_per_token": 147456,
            "prefill_tokens_per_s_best": 85000.0,
            "tiers": [],
            "capacity": {"machines": 2, "goodput_rps_per_machine": 1.5},
            "cost": {"note": "no price table: set KVBENCH_REPORTER_PRICE_PER_GPU_HOUR"},
        },
        "comparison": {
            "baseline": "off",
            "verdict": "not enough repeats to say",
            "speedup": {
                "ttft_p50": {"n": 1, "mean": 6.0, "std": None, "ci95": None, "verdict": "not enough repeats to say"}
            },
        },
        "validity": {"verdict": "preliminary", "reasons": ["short <window>"]},
        "jobs": [
            {
                "job_id": "J",
                "load_level": 8.0,
                "repeat": 0,
                "status": "succeeded",
                "requests": 10,
                "requests_measured": 8,
                "ttft_ms": stats,
                "output_tokens_per_s": 123.4,
                "warmup_s": 10.0,
                "slices": [{"start_s": 10.0 + 2 * i, "ttft_p50_ms": p50 + i, "requests": 3} for i in range(10)],
            }
        ],
    }


@pytest.fixture
def workload() -> WorkloadFactory:
    return _make_workload
