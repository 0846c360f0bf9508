from __future__ import annotations

import pytest

from kvbench_contracts.records import RequestRecord
from kvbench_core.columns import Columns
from kvbench_core.stats import coefficient_of_variation, drift, repeat_interval, slice_figures, t_critical_95


def test_repeat_interval_matches_a_hand_computed_t_interval() -> None:
    out = repeat_interval([10.0, 12.0, 14.0])
    assert out["mean"] == pytest.approx(12.0)
    assert out["std"] == pytest.approx(2.0)
    half = 4.303 * 2.0 / 3**0.5
    assert out["ci95"] == pytest.approx([12.0 - half, 12.0 + half])
    assert repeat_interval([5.0])["ci95"] is None
    assert t_critical_95(22) == 2.060


def test_drift_is_flagged_only_when_significant_and_large() -> None:
    times = [float(t) for t in range(10)]
    rising = [100.0 + 10 * t for t in times]
    assert drift(times, rising)["significant"] is True
    flat = [100.0, 101.0, 99.0, 100.0, 100.5, 99.5, 100.0, 101.0, 99.0, 100.0]
    assert drift(times, flat)["significant"] is False
    assert coefficient_of_variation([1.0, 1.0, 1.0]) == 0.0


def test_slices_put_requests_in_their_start_window() -> None:
    records = [
        RequestRecord(
            request_id=str(i),
            job_id="j",
            workload="w",
            start_s=10.0 + i,
            ttft_s=0.1 * (i + 1),
            e2e_s=0.5,
            chunk_times_s=[0.5],
            chunk_tokens=[4],
            prompt_tokens=100,
            output_tokens=4,
            cached_tokens=50,
            ok=True,
        )
        for i in range(10)
    ]
    slices = slice_figures(Columns.from_records(records), warmup_s=10.0, load_end_s=20.0, slices=2)
    assert [s["requests"] for s in slices] == [5, 5]
    assert slices[0]["ttft_p50_ms"] == pytest.approx(300.0)
    assert slices[1]["cache_hit_ratio"] == pytest.approx(0.5)
    assert slices[0]["output_tokens_per_s"] == pytest.approx(20 / 5)
