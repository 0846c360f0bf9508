"""A disk tier's records over each job: before, after, and whether eviction reclaimed space (the LMCache study found
377 records and 32 GB left on disk after a week)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kvbench_reporter.html import render_html
from kvbench_reporter.report import disk_tier_census, stacks_started

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def _sample(engine: str, seconds: float, records: float | None, size: float | None) -> dict[str, Any]:
    normalized: dict[str, float] = {"prompt_tokens": 1.0}
    if records is not None and size is not None:
        normalized |= {"disk_tier_records": records, "disk_tier_bytes": size}
    return {
        "engine_id": engine,
        "sampled_at": T0 + timedelta(seconds=seconds),
        "normalized": normalized,
        "role": "both",
    }


def test_each_machines_tier_is_read_at_the_jobs_start_and_end_and_summed() -> None:
    samples = [
        _sample("a", -1, 100, 1e9),  # before the job: its start value
        _sample("a", 5, 150, 1.5e9),
        _sample("a", 20, 200, 2e9),  # the last one inside the job
        _sample("a", 31, 900, 9e9),  # after the job: not its end
        _sample("b", 2, 10, 1e8),  # no sample before the start: the first one is the start
        _sample("b", 25, 30, 3e8),
        _sample("c", 10, None, None),  # an engine that carries no count adds nothing
        _sample("d", 35, 5000, 5e10),  # another stack's engine, sampled after the job: not this job's tier
    ]
    census = disk_tier_census(samples, T0, T0 + timedelta(seconds=30))  # type: ignore[arg-type]
    assert census == {
        "records_before": 110.0,
        "records_after": 230.0,
        "bytes_before": 1.1e9,
        "bytes_after": 2.3e9,
        "reclaimed": False,
        "engines": 2,
    }


def test_bytes_that_fall_during_the_job_say_eviction_reclaimed_space() -> None:
    samples = [_sample("a", 0, 100, 1e9), _sample("a", 10, 120, 1.2e9), _sample("a", 20, 110, 1.1e9)]
    census = disk_tier_census(samples, T0, T0 + timedelta(seconds=30))  # type: ignore[arg-type]
    assert census is not None
    assert census["reclaimed"] is True
    assert disk_tier_census([_sample("a", 0, None, None)], T0, T0 + timedelta(seconds=30)) is None  # type: ignore[list-item]


def test_the_report_page_shows_the_table_only_for_a_stack_with_a_disk_tier(workload: Any) -> None:
    with_disk = workload("lmcache-disk", 80.0, 0)
    with_disk["jobs"][0]["disk_tier"] = {"records_before": 0, "records_after": 377, "bytes_before": 0,
                                         "bytes_after": 32e9, "reclaimed": False, "engines": 1}  # fmt: skip
    report = {"run_id": "R", "plan_name": "p", "status": "succeeded", "reasons": [], "submitted_at": "2026",
              "generated_at": "2026", "definitions": {}, "workloads": [with_disk], "events": []}  # fmt: skip
    page = render_html(report)
    assert "The disk tier's records" in page
    assert "<td>377</td>" in page
    assert "<td>32.0</td>" in page  # GB
    assert "eviction reclaimed space?" in page
    plain = workload("gpu-only", 80.0, 0)
    report["workloads"] = [plain]
    assert "eviction reclaimed space?" not in render_html(report)


def test_each_workloads_stacks_show_what_their_machines_said_as_they_started(workload: Any) -> None:
    ready: dict[str, Any] = {
        "schema": "kvbench.stack.ready/1",
        "occurred_at": T0,
        "payload": {
            "node_id": "gpu-1",
            "deployment_id": "R-w1g0-gpu-1",
            "workload": "lmcache-disk",
            "facts": {"engine.attention_block_size": 16, "disk_tier_found": "377 files, 32.00 GB under /x"},
        },
    }
    other = {**ready, "payload": {**ready["payload"], "workload": "gpu-only", "facts": {"note": "<b>"}}}
    progressed = {"schema": "kvbench.job.started/1", "occurred_at": T0, "payload": {"workload": "lmcache-disk"}}
    events = [ready, other, progressed]
    (started,) = stacks_started(events, "lmcache-disk")  # type: ignore[arg-type]
    assert started["facts"] == {"engine.attention_block_size": "16", "disk_tier_found": "377 files, 32.00 GB under /x"}
    with_disk = workload("lmcache-disk", 80.0, 0)
    with_disk["stacks"] = [started]
    plain = workload("gpu-only", 80.0, 0)
    plain["stacks"] = stacks_started(events, "gpu-only")  # type: ignore[arg-type]
    report = {"run_id": "R", "plan_name": "p", "status": "succeeded", "reasons": [], "submitted_at": "2026",
              "generated_at": "2026", "definitions": {}, "workloads": [with_disk, plain], "events": []}  # fmt: skip
    page = render_html(report)
    assert "disk_tier_found: <code>377 files, 32.00 GB under /x</code>" in page
    assert "engine.attention_block_size: <code>16</code>" in page
    assert "<code>&lt;b&gt;</code>" in page  # escaped
