"""Engine counters over a window are only as complete as the samples that span it: an engine whose agent scraped
late or stopped inside a job is undercounted, and the report must say so instead of showing low counts as facts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kvbench_reporter.html import render_html
from kvbench_reporter.report import _validity, counter_deltas

T0 = datetime(2026, 12, 5, tzinfo=UTC)
END = T0 + timedelta(seconds=30)


def _row(engine: str, seconds: float, tokens: float, role: str = "both") -> dict[str, Any]:
    return {"engine_id": engine, "role": role, "sampled_at": T0 + timedelta(seconds=seconds), "gpus": [],
            "normalized": {"prompt_tokens": tokens, "prompt_tokens_recomputed": tokens}}  # fmt: skip


def _steady(engine: str, until_s: float, role: str = "both", every_s: float = 2.0) -> list[dict[str, Any]]:
    """Scrapes every ``every_s`` from before the window until ``until_s``, of an engine computing 100 tokens/s."""
    out, t = [], -3.0
    while t <= until_s:
        out.append(_row(engine, t, 100.0 * (t + 10), role))
        t += every_s
    return out


def _deltas(samples: list[dict[str, Any]], close_by: datetime | None = None) -> dict[str, Any]:
    return counter_deltas(samples, T0, END, close_by)  # type: ignore[arg-type]


def test_engines_scraped_through_the_window_are_complete() -> None:
    deltas = _deltas(_steady("p", 40, "prefill") + _steady("d", 40, "decode", every_s=2.5))
    assert deltas["short_coverage"] == []
    # each side counted about the window's 3,000 tokens (give or take a scrape interval at the edges)
    assert 2_700 <= deltas["by_role"]["prefill"]["prompt_tokens"] <= 3_300
    assert 2_700 <= deltas["by_role"]["decode"]["prompt_tokens"] <= 3_300


def test_an_engine_whose_scrapes_stop_inside_the_window_is_named_with_what_its_samples_span() -> None:
    deltas = _deltas(_steady("p", 14, "prefill") + _steady("d", 40, "decode"))
    [gap] = deltas["short_coverage"]
    assert (gap["engine_id"], gap["role"]) == ("p", "prefill")
    assert gap["window_s"] == 30.0
    assert (gap["from_s"], gap["to_s"], gap["counted_s"]) == (-1.0, 13.0, 14.0)
    assert gap["scrape_interval_s"] == 2.0
    assert deltas["by_role"]["prefill"]["prompt_tokens"] == 1_400.0  # low, and now flagged as such


def test_an_engine_first_scraped_late_in_the_window_is_short() -> None:
    late = [r for r in _steady("p", 40) if r["sampled_at"] > T0 + timedelta(seconds=12)]
    [gap] = _deltas(late)["short_coverage"]
    assert gap["from_s"] == 13.0


def test_a_scrape_missed_at_the_edge_is_within_the_tolerance() -> None:
    """One scrape missed at the end (the window ends at its last scrape inside): not flagged; two are."""
    samples = _steady("p", 40)
    one = [r for r in samples if not T0 + timedelta(seconds=28) < r["sampled_at"] <= END]
    assert _deltas(one)["short_coverage"] == []
    two = [r for r in samples if not T0 + timedelta(seconds=26) < r["sampled_at"] <= END]
    assert _deltas(two)["short_coverage"][0]["counted_s"] == 26.0


def test_another_stacks_engine_fetched_with_the_margin_is_not_counted_as_short() -> None:
    before = [_row("old", -9, 0.0), _row("old", -5, 100.0)]  # a previous workload's engine, stopped before the job
    after = [_row("next", 35, 0.0)]  # the next one's, started after it
    assert _deltas(before + after + _steady("p", 40))["short_coverage"] == []


def test_a_phase_whose_closing_scrape_came_after_the_next_job_began_is_short() -> None:
    samples = [_row("e", -3, 0.0), _row("e", -1, 100.0), _row("e", 9, 5000.0), _row("e", 11, 5200.0)]
    deltas = counter_deltas(samples, T0, T0 + timedelta(seconds=3), T0 + timedelta(seconds=8))  # type: ignore[arg-type]
    assert deltas["prompt_tokens"] == 0.0
    assert [g["engine_id"] for g in deltas["short_coverage"]] == ["e"]


def test_the_report_marks_the_workload_preliminary_and_says_which_engine_and_job(workload: Any) -> None:
    deltas = _deltas(_steady("p", 14, "prefill") + _steady("d", 40, "decode"))
    job = {"job_id": "j1", "status": "succeeded", "requests": 10, "engine_counters": deltas}
    pooled = {"requests_measured": 10, "errors": 0}
    validity = _validity({"measurement": {"repeats": 3}}, [job], pooled)
    assert validity["verdict"] == "preliminary"
    [reason] = [r for r in validity["reasons"] if "counter samples" in r]
    assert "job j1: engine p (prefill)" in reason
    assert "14.0 s of the 30.0 s" in reason

    page_workload = workload("w", 80.0, 0)
    page_workload["validity"] = validity
    page_workload["engine_counters"] = {"engines": 2}
    page_workload["prompt_token_sources"].update(
        counters_complete=False, short_coverage=[{"job_id": "j1", **deltas["short_coverage"][0]}]
    )
    report = {"run_id": "r", "plan_name": "p", "status": "succeeded", "reasons": [], "submitted_at": "2026",
              "generated_at": "2026", "definitions": {}, "workloads": [page_workload], "events": []}  # fmt: skip
    page = render_html(report)
    assert "Counts are low:" in page
    assert "job j1, engine p (prefill) sampled over 14.0 of 30.0 s" in page


def test_a_previous_split_stacks_engines_sampled_in_the_margin_do_not_make_this_one_split() -> None:
    """Samples are fetched from 10 s before a job: the previous workload's prefill and decode engines, stopped just
    before this stack started, are in them. They neither count as engines nor give the window a prefill side."""
    previous = [_row("pre", -9, 5.0, "prefill"), _row("pre", -7, 9.0, "prefill"),
                _row("dec", -9, 5.0, "decode"), _row("dec", -7, 9.0, "decode")]  # fmt: skip
    deltas = _deltas(previous + _steady("e0", 40) + _steady("e1", 40))
    assert deltas["engines"] == 2
    assert set(deltas["by_role"]) == {"both"}
    assert 5_400 <= deltas["prompt_tokens"] <= 6_600


def test_reads_at_the_windows_edges_count_exactly_the_window() -> None:
    """Periodic scrapes every 4 s can count up to an interval beyond the window; the reads made on command at its
    edges (ReadEngines) count exactly what the engine did inside it, and say how late each read was."""
    periodic = _steady("e", 40, every_s=4.0)
    edge_at = {"start": T0, "end": END}

    def edge(seconds: float, which: str, job: str = "job-1") -> dict[str, Any]:
        row = _row("e", seconds, 100.0 * (seconds + 10))
        return {**row, "job_id": job, "edge": which, "edge_at": edge_at[which]}

    guessed = _deltas(periodic)["prompt_tokens"]
    with_edges: Any = [*periodic, edge(0.02, "start"), edge(30.05, "end")]
    exact = counter_deltas(with_edges, T0, END, None, "job-1")
    assert round(exact["prompt_tokens"], 6) == 3_003.0  # 30.03 s at 100 tokens/s: the reads' own span, nothing more
    assert abs(guessed - 3_000.0) > abs(exact["prompt_tokens"] - 3_000.0)
    [read] = exact["edge_reads"]
    assert read["engine_id"] == "e"
    assert round(read["start_read_late_s"], 3) == 0.02
    assert round(read["end_read_late_s"], 3) == 0.05
    # another job's edge reads are only samples for this one: the periodic windowing applies
    others: Any = [*periodic, edge(0.02, "start", "job-2"), edge(30.05, "end", "job-2")]
    other = counter_deltas(others, T0, END, None, "job-1")
    assert other["edge_reads"] == []
