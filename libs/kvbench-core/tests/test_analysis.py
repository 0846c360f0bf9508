"""Known answers for the report's definitions (DESIGN.md section 6)."""

from __future__ import annotations

import pytest

from kvbench_contracts.records import RequestRecord
from kvbench_core.analysis import Slo, analyze


def rec(
    start: float,
    chunks: list[float],
    tokens: list[int] | None = None,
    ok: bool = True,
    prompt: int = 100,
    cached: int | None = 0,
) -> RequestRecord:
    tokens = tokens or [1] * len(chunks)
    return RequestRecord(
        request_id=f"r{start}",
        job_id="j",
        workload="w",
        start_s=start,
        ttft_s=chunks[0] if chunks else None,
        e2e_s=chunks[-1] if chunks else None,
        chunk_times_s=chunks,
        chunk_tokens=tokens,
        prompt_tokens=prompt,
        output_tokens=sum(tokens),
        cached_tokens=cached,
        ok=ok,
        error=None if ok else "http_503",
    )


def test_window_edges_errors_and_token_weighted_itl() -> None:
    records = [
        rec(0.5, [0.1, 0.2]),  # starts in the warm-up: excluded
        rec(1.0, [0.1, 0.3, 0.6], [1, 2, 3]),  # measured; multi-token chunks
        rec(9.5, [0.2, 0.6]),  # ends at 10.1, after the load end (10): excluded
        rec(5.0, [], ok=False),  # error inside the window: counted
        rec(10.0, [], ok=False),  # error at the load end: not counted
        rec(2.0, [0.05]),  # single-token output: no TPOT, no ITL
    ]
    out = analyze(records, warmup_s=1.0, load_duration_s=10.0)
    assert out["requests_total"] == 6
    assert out["requests_measured"] == 2
    assert out["errors"] == 1
    assert out["window_s"] == 9.0
    # TTFT over measured: 100 ms and 50 ms
    assert out["ttft_ms"]["mean"] == pytest.approx(75.0)
    assert out["ttft_ms"]["p50"] == pytest.approx(75.0)
    # TPOT of the multi-chunk request: (600 - 100) / (6 - 1) = 100 ms
    assert out["tpot_ms"]["mean"] == pytest.approx(100.0)
    assert out["tpot_ms"]["count"] == 1
    # ITL: chunk of 2 tokens after 200 ms -> two gaps of 100; chunk of 3 after 300 ms -> three gaps of 100
    assert out["itl_ms"]["count"] == 5
    assert out["itl_ms"]["mean"] == pytest.approx(100.0)
    assert out["icl_ms"]["count"] == 2
    assert out["icl_ms"]["mean"] == pytest.approx(250.0)
    assert out["output_tokens_per_s"] == pytest.approx(7 / 9.0)
    assert out["good_fraction"] == pytest.approx(2 / 3)


def test_percentiles_interpolate_linearly() -> None:
    records = [rec(1.0 + i, [t]) for i, t in enumerate([0.1, 0.2, 0.3, 0.4])]
    out = analyze(records, warmup_s=0.0, load_duration_s=100.0)
    assert out["ttft_ms"]["p50"] == pytest.approx(250.0)
    assert out["ttft_ms"]["p90"] == pytest.approx(370.0)


def test_goodput_counts_requests_meeting_every_slo() -> None:
    records = [rec(1.0, [0.1, 0.2]), rec(2.0, [0.5, 0.6]), rec(3.0, [0.1, 0.9])]
    out = analyze(records, 0.0, 10.0, Slo(ttft_ms=200, tpot_ms=300))
    # first: ttft 100, tpot 100 -> good; second: ttft 500 -> bad; third: tpot 800 -> bad
    assert out["goodput_rps"] == pytest.approx(1 / 10)
    assert out["good_fraction"] == pytest.approx(1 / 3)


def test_empty_input_gives_empty_figures_not_errors() -> None:
    out = analyze([], 0.0, 10.0)
    assert out["requests_measured"] == 0
    assert out["ttft_ms"]["p50"] is None
    assert out["good_fraction"] is None
