"""Known answers for the report's definitions (DESIGN.md section 6)."""

from __future__ import annotations

import pytest

from kvbench_contracts.engine import sim_late_counter
from kvbench_contracts.events import ClientTiming
from kvbench_contracts.records import RequestRecord
from kvbench_core.analysis import Slo, analyze, analyze_grouped
from kvbench_core.timing import engine_late_share, engine_slip_p99_ms, timing_verdict


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


def _reference(records: list[RequestRecord], warmup: float, end: float, slo: Slo) -> dict[str, float]:
    """The definitions of DESIGN.md 6 written request by request, the slow and obvious way."""
    import numpy as np  # noqa: PLC0415

    measured = [
        r for r in records if r.start_s >= warmup and r.ok and r.e2e_s is not None and r.start_s + r.e2e_s <= end
    ]
    errors = sum(1 for r in records if warmup <= r.start_s < end and not r.ok)
    itl: list[float] = []
    for r in measured:
        for i in range(1, len(r.chunk_times_s)):
            gap = r.chunk_times_s[i] - r.chunk_times_s[i - 1]
            m = r.chunk_tokens[i] if r.chunk_tokens[i] > 0 else 1
            itl += [gap / m] * m
    tpot = [
        (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)
        for r in measured
        if r.e2e_s is not None and r.ttft_s is not None and r.output_tokens >= 2
    ]

    def good(r: RequestRecord) -> bool:
        t = (
            (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)
            if r.output_tokens >= 2 and r.ttft_s is not None and r.e2e_s is not None
            else None
        )
        return (
            (slo.ttft_ms is None or (r.ttft_s is not None and r.ttft_s * 1e3 <= slo.ttft_ms))
            and (slo.tpot_ms is None or t is None or t * 1e3 <= slo.tpot_ms)
            and (slo.e2e_ms is None or (r.e2e_s is not None and r.e2e_s * 1e3 <= slo.e2e_ms))
        )

    return {
        "requests_measured": len(measured),
        "errors": errors,
        "ttft_p90": float(np.percentile([r.ttft_s for r in measured], 90)) * 1e3,
        "tpot_p50": float(np.percentile(tpot, 50)) * 1e3,
        "itl_p99": float(np.percentile(itl, 99)) * 1e3,
        "itl_count": len(itl),
        "good": sum(good(r) for r in measured),
    }


def test_vectorised_figures_match_the_reference_on_random_records() -> None:
    import random  # noqa: PLC0415

    rng = random.Random(11)
    records = []
    for i in range(600):
        ok = rng.random() > 0.08
        n_chunks = rng.randint(1, 12) if ok else 0
        times = sorted(rng.uniform(0.01, 3.0) for _ in range(n_chunks))
        tokens = [rng.randint(0, 3) for _ in range(n_chunks)]
        records.append(
            RequestRecord(
                request_id=str(i),
                job_id="j",
                workload="w",
                start_s=rng.uniform(0, 100),
                ttft_s=times[0] if times else None,
                e2e_s=times[-1] if times else None,
                chunk_times_s=times,
                chunk_tokens=tokens,
                prompt_tokens=100,
                output_tokens=sum(max(t, 1) for t in tokens),
                cached_tokens=rng.choice([None, 0, 64]),
                ok=ok,
                error=None if ok else "timeout",
            )
        )
    slo = Slo(ttft_ms=1500, tpot_ms=400, e2e_ms=2800)
    out = analyze(records, warmup_s=10, load_duration_s=90, slo=slo)
    ref = _reference(records, 10, 90, slo)
    assert out["requests_measured"] == ref["requests_measured"]
    assert out["errors"] == ref["errors"]
    assert out["ttft_ms"]["p90"] == pytest.approx(ref["ttft_p90"])
    assert out["tpot_ms"]["p50"] == pytest.approx(ref["tpot_p50"])
    assert out["itl_ms"]["p99"] == pytest.approx(ref["itl_p99"])
    assert out["itl_ms"]["count"] == ref["itl_count"]
    assert out["goodput_rps"] == pytest.approx(ref["good"] / 80)


def test_workloads_run_one_after_the_other_are_not_added_up() -> None:
    # two workloads, each one job of 10 requests x 4 tokens over its own 0-2 s window (times are per job)
    def job(workload: str, job_id: str) -> list[RequestRecord]:
        return [
            r.model_copy(update={"job_id": job_id, "workload": workload, "request_id": f"{job_id}-{i}"})
            for i, r in enumerate(rec(0.1 * i, [0.1, 0.2, 0.3, 0.4]) for i in range(10))
        ]

    records = job("a", "a-0") + job("b", "b-0") + job("b", "b-1")
    by_workload = {g["name"]: g for g in analyze_grouped(records, "workload", 0.0, 2.0)}
    assert by_workload["a"]["jobs"] == 1
    assert by_workload["a"]["output_tokens_per_s"] == pytest.approx(40 / 2.0)
    # b's two jobs pool their requests over their summed windows: the same rate as one of them, not twice it
    assert by_workload["b"]["jobs"] == 2
    assert by_workload["b"]["output_tokens_per_s"] == pytest.approx(80 / 4.0)
    assert by_workload["b"]["requests_total"] == 20
    by_job = analyze_grouped(records, "job", 0.0, None)
    assert [(g["job_id"], g["workload"]) for g in by_job] == [("a-0", "a"), ("b-0", "b"), ("b-1", "b")]
    # no load end given: each job's window ends at its own last request's end (0.9 + 0.4)
    assert by_job[0]["window_s"] == pytest.approx(1.3)
    # each job's own window, as its report used it (an export's metadata): b-1 warmed up for 0.5 s
    own = {g["job_id"]: g for g in analyze_grouped(records, "job", 0.0, None, None, {"b-1": (0.5, 2.0)})}
    assert own["b-1"]["window_s"] == pytest.approx(1.5)
    assert own["b-1"]["requests_measured"] == 5  # those sent from 0.5 s on
    assert own["a-0"]["window_s"] == pytest.approx(1.3)  # the others as before


def test_merged_reads_and_client_lag_mark_timing_unreliable() -> None:
    clean = analyze([rec(0.0, [0.1, 0.2, 0.3, 0.4])], 0.0, 1.0)
    assert clean["merged_chunk_share"] == 0.0
    # the client read two chunks at once: they share a stamp (a zero gap)
    merged = analyze([rec(0.0, [0.1, 0.3, 0.3, 0.4])], 0.0, 1.0)
    assert merged["merged_chunk_share"] == pytest.approx(1 / 3)
    assert timing_verdict(None, clean["merged_chunk_share"])["reliable"]
    verdict = timing_verdict(None, merged["merged_chunk_share"])
    assert not verdict["reliable"]
    assert "read together" in verdict["reasons"][0]
    busy = ClientTiming(loop_lag_samples=1000, loop_lag_p99_ms=25.0, loop_lag_max_ms=80.0)
    assert "event loop ran 25.0 ms late" in timing_verdict(busy, 0.0)["reasons"][0]
    idle = ClientTiming(loop_lag_samples=1000, loop_lag_p99_ms=1.2, sends_scheduled=100, sends_late_share=0.0)
    assert timing_verdict(idle, 0.0, engine_late_token_share=0.0)["reliable"]
    assert not timing_verdict(idle, 0.0, engine_late_token_share=0.02)["reliable"]
    late_sends = ClientTiming(sends_scheduled=100, sends_late_share=0.3, send_late_p99_ms=12.0)
    assert "scheduled sends" in timing_verdict(late_sends, 0.0)["reasons"][0]


def test_client_lag_and_engine_slip_against_the_itl_they_distort() -> None:
    quiet = ClientTiming(loop_lag_samples=1000, loop_lag_p99_ms=0.5)
    assert timing_verdict(quiet, 0.0, itl_p99_ms=12.0, time_scale=2.0)["reliable"]
    # 3.6 ms of lag at p99 on a cluster paced at 2x real time is 7.2 engine ms: over a third of a 19 ms p99 ITL
    lagging = ClientTiming(loop_lag_samples=1000, loop_lag_p99_ms=3.6)
    verdict = timing_verdict(lagging, 0.0, itl_p99_ms=19.0, time_scale=2.0)
    assert not verdict["reliable"]
    assert "times the time scale 2" in verdict["reasons"][0]
    assert verdict["figures"]["itl_noise_ms"] == pytest.approx(7.2)
    # the same lag at real time against long gaps is noise the figure can carry
    assert timing_verdict(lagging, 0.0, itl_p99_ms=40.0)["reliable"]
    # the engines' slip adds to the client's
    assert not timing_verdict(quiet, 0.0, itl_p99_ms=12.0, engine_slip_p99_ms=3.0, time_scale=2.0)["reliable"]


def test_engine_slip_p99_is_read_off_the_lateness_buckets() -> None:
    def deltas(**late_by_bound: float) -> dict[str, float]:
        return {"sim_tokens_written": 1000.0, **{sim_late_counter(int(k[1:])): v for k, v in late_by_bound.items()}}

    assert engine_slip_p99_ms(None) is None
    assert engine_slip_p99_ms({"sim_tokens_written": 0.0}) is None
    on_time = deltas(b500=0, b1000=0, b2000=0, b3000=0, b4000=0, b5000=0)
    assert engine_slip_p99_ms(on_time) == pytest.approx(0.495)  # an upper estimate within the first bucket
    # 5% later than 1 ms, 1% later than 2 ms: p99 at the 2 ms bound
    slipping = deltas(b500=80, b1000=50, b2000=10, b3000=5, b4000=2, b5000=1)
    assert engine_slip_p99_ms(slipping) == pytest.approx(2.0)
    behind = deltas(b500=900, b1000=800, b2000=700, b3000=600, b4000=500, b5000=400)
    assert engine_slip_p99_ms(behind) == pytest.approx(5.0)
    assert engine_late_share(behind) == pytest.approx(0.4)


def test_connections_are_counted_and_timed_apart_from_ttft() -> None:
    fresh = rec(0.0, [0.1, 0.2]).model_copy(update={"connect_s": 0.05})
    reused = rec(0.5, [0.1, 0.2])
    out = analyze([fresh, reused, reused.model_copy(update={"request_id": "x"})], 0.0, 1.0)
    assert out["connections"]["new"] == 1
    assert out["connections"]["new_share"] == pytest.approx(1 / 3)
    assert out["connections"]["connect_ms"]["p50"] == pytest.approx(50.0)
    assert out["ttft_ms"]["p50"] == pytest.approx(100.0)  # the handshake is not in TTFT
