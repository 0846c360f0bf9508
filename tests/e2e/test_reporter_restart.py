"""Killing the reporter mid-run and starting it again loses and duplicates nothing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from kvbench_cli.api import Endpoints, fetch_report

from .conftest import bus_of
from .runs import record_counts

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.faults]


def test_reporter_killed_mid_run_loses_and_duplicates_nothing(
    short_plan: Any, local_kvbench: Any, fresh_database: str, fault_matrix: Any
) -> None:
    deployment, state = local_kvbench
    plan = short_plan(
        "reporter-restart",
        duration_s=10,
        users=4,
        gpu_only=True,
        synthetic={"prefix_tokens": 256, "turns": 2, "think_time_s": 0.0},
        measurement={"warmup_s": 1, "repeats": 2, "cache_state": "warm"},
    )
    run_id = httpx.post(
        f"{state.api_url}/v1/runs", content=plan.encode(), headers={"Content-Type": "application/yaml"}, timeout=30
    ).json()["run_id"]
    deadline = time.monotonic() + 60
    while True:  # kill the reporter while the first job streams its records
        jobs = httpx.get(f"{state.api_url}/v1/runs/{run_id}").json()["jobs"]
        if jobs[0]["status"] == "running" and jobs[0]["requests"] > 0:
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    deployment.restart("reporter", kill=True, tie_to_parent=True)
    deadline = time.monotonic() + 120
    while httpx.get(f"{state.api_url}/v1/runs/{run_id}").json()["status"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    report = fetch_report(Endpoints(state.api_url, state.report_url, None), run_id)

    # nothing lost: rows of a batch the killed reporter held come back once JetStream's ack wait passes
    deadline = time.monotonic() + 60
    while True:
        rows = asyncio.run(record_counts(fresh_database, run_id))
        complete = len(rows) == 2 and all(r["stored"] == r["records_expected"] for r in rows)
        if complete or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    published = sum(r["records_expected"] for r in rows)
    fault_matrix("reporter SIGKILL", bus_of(state), "succeeded, records caught up", published=published,
                 stored=sum(r["stored"] for r in rows), distinct=sum(r["distinct_ids"] for r in rows))  # fmt: skip
    assert len(rows) == 2
    for row in rows:
        assert row["records_expected"] > 0
        assert row["stored"] == row["records_expected"] == row["distinct_ids"]
    assert report["workloads"][0]["requests"] == sum(r["stored"] for r in rows)
