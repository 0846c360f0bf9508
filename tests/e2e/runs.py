"""Submitting a plan to a running kvbench and waiting for its end, as the end-to-end tests do."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from kvbench_cli.api import Endpoints, fetch_report
from kvbench_cli.deployment import LocalDeployment

__all__ = ["record_counts", "run_to_end", "served_report", "submit_until_running"]


def submit_until_running(api_url: str, plan_text: str, timeout_s: float = 60) -> str:
    """POST the plan and wait until its first job runs; returns the run id (for tests that break something
    mid-job)."""
    response = httpx.post(
        f"{api_url}/v1/runs", content=plan_text.encode(), headers={"Content-Type": "application/yaml"}, timeout=30
    )
    assert response.status_code == 201, response.text
    run_id = str(response.json()["run_id"])
    deadline = time.monotonic() + timeout_s
    while httpx.get(f"{api_url}/v1/runs/{run_id}").json()["jobs"][0]["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    return run_id


def run_to_end(api_url: str, plan_text: str, timeout_s: float = 400, path: str = "/v1/runs") -> dict[str, Any]:
    """POST the plan (to ``path``: /v1/accept?workload=NAME for an acceptance test), poll the run until it ends;
    returns its last status (``run_id``, ``status``, ...)."""
    with httpx.Client(timeout=30) as client:
        response = client.post(
            f"{api_url}{path}", content=plan_text.encode(), headers={"Content-Type": "application/yaml"}
        )
        assert response.status_code == 201, response.text
        run_id = response.json()["run_id"]
        deadline = time.monotonic() + timeout_s
        while True:
            status: dict[str, Any] = client.get(f"{api_url}/v1/runs/{run_id}").json()
            if status["status"] in ("succeeded", "failed", "cancelled"):
                return {**status, "run_id": run_id}
            assert time.monotonic() < deadline, status
            time.sleep(2)


def served_report(
    plan_text: str, sim_machines: int, nats_url: str, database_url: str, state_dir: Path
) -> dict[str, Any]:
    """Stand a whole kvbench up on ``sim_machines`` simulated machines, run the plan to its end and return its
    report (the run must succeed)."""
    deployment = LocalDeployment(state_dir)
    state = deployment.up(sim_machines=sim_machines, nats_url=nats_url, database_url=database_url, tie_to_parent=True)
    try:
        status = run_to_end(state.api_url, plan_text)
        assert status["status"] == "succeeded", status
        report: dict[str, Any] = fetch_report(Endpoints(state.api_url, state.report_url, None), status["run_id"])
        return report
    finally:
        deployment.down()


async def record_counts(database_url: str, run_id: str) -> list[asyncpg.Record]:
    """Each job of the run: the records its load generators published (records_expected), those stored, and the
    distinct request ids among them (a duplicate shows as stored > distinct)."""
    conn = await asyncpg.connect(database_url)
    try:
        return list(
            await conn.fetch(
                "SELECT j.job_id, j.records_expected, count(r.request_id) AS stored, "
                "count(DISTINCT r.request_id) AS distinct_ids FROM jobs j LEFT JOIN request_records r "
                "USING (job_id) WHERE j.run_id = $1 GROUP BY j.job_id, j.records_expected",
                run_id,
            )
        )
    finally:
        await conn.close()
