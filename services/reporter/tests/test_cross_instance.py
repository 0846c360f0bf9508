"""Who computed what another engine reused (a shared LMCache server, issue 19): the simulated engines' counter by
the engine that computed the tokens, differenced over a job's window, with the restarts an engine id lives through."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kvbench_reporter.html import render_html
from kvbench_reporter.report import _cross_instance, cross_instance_hits

T0 = datetime(2026, 12, 2, tzinfo=UTC)
SERIES = "kvbench_sim_cross_instance_hit_tokens_total"


def _sample(engine: str, seconds: float, **by_owner: float) -> dict[str, Any]:
    raw = {"vllm:prompt_tokens_total": 1.0} | {f'{SERIES}{{computed_by="{o}"}}': v for o, v in by_owner.items()}
    return {"engine_id": engine, "sampled_at": T0 + timedelta(seconds=seconds), "samples": raw}


def _window(samples: list[dict[str, Any]]) -> dict[str, float]:
    return cross_instance_hits(samples, T0, T0 + timedelta(seconds=30))  # type: ignore[arg-type]


def test_each_engines_count_is_differenced_over_the_window_by_who_computed_it() -> None:
    samples = [
        _sample("b", -2, a=100),  # before the job: its start
        _sample("b", 10, a=400, c=50),
        _sample("b", 29, a=1000, c=50),  # the last inside the job
        _sample("b", 35, a=9999),  # after it
        _sample("a", 5, b=300),  # no sample before the start: the engine started counting in the window
    ]
    assert _window(samples) == {"a -> b": 900.0, "c -> b": 50.0, "b -> a": 300.0}


def test_a_count_that_falls_is_a_new_process_and_another_stacks_engine_is_not_counted() -> None:
    samples = [
        _sample("b", -5, a=5000),  # the previous workload's engine of the same id, ended before this job
        _sample("b", 3, a=200),  # this stack's engine: counting from zero
        _sample("b", 20, a=700),
        _sample("z", -8, a=123),  # an engine with nothing inside the window: another stack's
        _sample("z", 40, a=456),
    ]
    assert _window(samples) == {"a -> b": 700.0}
    assert _window([_sample("b", 3)]) == {}  # a real engine says nothing of it


def test_the_workload_sums_its_jobs_and_the_html_names_both_sides(workload: Any) -> None:
    jobs = [{"cross_instance_hits": {"a -> b": 300.0}}, {"cross_instance_hits": {"a -> b": 100.0, "b -> a": 50.0}}]
    cross = _cross_instance(jobs, 900.0)
    assert cross is not None
    assert cross["tokens"] == 450.0
    assert cross["share_of_prompt_tokens"] == 0.5
    assert cross["pairs"][0] == {"computed_by": "a", "reused_by": "b", "tokens": 400.0}
    assert _cross_instance([{"cross_instance_hits": {}}, {}], 900.0) is None
    shared = workload("shared", 80.0, 0)
    shared["engine_counters"] = {"engines": 2}
    shared["cross_instance_hits"] = cross
    report = {"run_id": "R", "plan_name": "p", "status": "succeeded", "reasons": [], "submitted_at": "2026",
              "generated_at": "2026", "definitions": {}, "workloads": [shared], "events": []}  # fmt: skip
    page = render_html(report)
    assert "Reused across instances" in page
    assert "<td>a</td><td>b</td><td>400</td>" in page
    assert "50.0% of the prompt tokens" in page


def test_a_phase_shorter_than_the_scrape_interval_is_read_by_the_scrape_after_it() -> None:
    """An acceptance phase of a few seconds may fit between two scrapes: the first scrape after its end (before the
    next job began) closes the window; one after the next job began belongs to that job."""
    from kvbench_reporter.report import counter_deltas  # noqa: PLC0415

    def row(seconds: float, hits: float) -> dict[str, Any]:
        return {"engine_id": "e", "role": "both", "sampled_at": T0 + timedelta(seconds=seconds), "gpus": [],
                "normalized": {"prompt_tokens_external": hits}}  # fmt: skip

    samples = [row(-1, 100), row(4, 700), row(9, 5000)]  # the phase ran from 0 to 3 s
    end = T0 + timedelta(seconds=3)
    closed = counter_deltas(samples, T0, end, close_by=T0 + timedelta(seconds=8))  # type: ignore[arg-type]
    assert closed["prompt_tokens_external"] == 600.0
    # the scrape at 9 s came after the next job began at 8 s: not this phase's
    late = counter_deltas(samples[::2], T0, end, close_by=T0 + timedelta(seconds=8))  # type: ignore[arg-type]
    assert late["prompt_tokens_external"] == 0.0
    # a restarted engine's first scrape closes it too: its count, from zero
    restarts = [row(-1, 100), row(4, 40)]
    restarted = counter_deltas(restarts, T0, end, T0 + timedelta(seconds=8))  # type: ignore[arg-type]
    assert restarted["prompt_tokens_external"] == 40.0


def test_a_cache_servers_counters_join_the_window_but_it_is_no_engine() -> None:
    """A real LMCache server is scraped beside the engines (role cache_server): its hits by tier are in the window's
    counters, and the workload's engine count is the engines'."""
    from kvbench_reporter.report import counter_deltas  # noqa: PLC0415

    def row(engine: str, role: str, seconds: float, **normalized: float) -> dict[str, Any]:
        return {"engine_id": engine, "role": role, "sampled_at": T0 + timedelta(seconds=seconds),
                "normalized": normalized, "gpus": []}  # fmt: skip

    samples = [
        row("n0-engine-0", "both", 0, prompt_tokens=0.0, prompt_tokens_external=0.0),
        row("n0-engine-0", "both", 20, prompt_tokens=1000.0, prompt_tokens_external=600.0),
        row("n0-lmcache", "cache_server", 0, cache_server_hit_tokens_host=0.0, cache_server_hit_tokens_disk=0.0),
        row("n0-lmcache", "cache_server", 20, cache_server_hit_tokens_host=200.0, cache_server_hit_tokens_disk=400.0),
    ]
    deltas = counter_deltas(samples, T0, T0 + timedelta(seconds=30))  # type: ignore[arg-type]
    assert deltas["engines"] == 1
    assert (deltas["cache_server_hit_tokens_host"], deltas["cache_server_hit_tokens_disk"]) == (200.0, 400.0)
    assert deltas["prompt_tokens_external"] == 600.0
