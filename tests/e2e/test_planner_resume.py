"""Killing the planner mid-run with SIGKILL and starting it again: the run finishes, each job run once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import httpx
import pytest

from .conftest import bus_of

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.faults]


def _status(api: str, run_id: str) -> dict[str, object]:
    """The run's status; a planner that is still starting may refuse or not know the run for a moment."""
    last = ""
    for _ in range(100):
        try:
            response = httpx.get(f"{api}/v1/runs/{run_id}", timeout=5)
        except httpx.HTTPError as exc:
            last = repr(exc)
        else:
            if response.status_code == 200:
                result: dict[str, object] = response.json()
                return result
            last = f"HTTP {response.status_code}: {response.text[:300]}"
        time.sleep(0.2)
    raise AssertionError(f"the planner did not report run {run_id}: {last}")


def test_planner_killed_mid_run_resumes_without_repeating_jobs(
    short_plan: Any, local_kvbench: Any, fresh_database: str, fault_matrix: Any
) -> None:
    deployment, state = local_kvbench
    plan = short_plan(
        "resume",
        duration_s=8,
        users=2,
        gpu_only=True,
        synthetic={"prefix_tokens": 256, "turns": 2, "think_time_s": 0.0},
        measurement={"warmup_s": 1, "repeats": 3, "cache_state": "warm"},
    )
    created = httpx.post(
        f"{state.api_url}/v1/runs",
        content=plan.encode(),
        headers={"Content-Type": "application/yaml"},
        timeout=30,
    )
    assert created.status_code == 201, created.text
    run_id = created.json()["run_id"]
    deadline = time.monotonic() + 120
    while True:  # kill the planner while the second job runs
        run = _status(state.api_url, run_id)
        jobs = run["jobs"]
        assert isinstance(jobs, list)
        if jobs[0]["status"] == "succeeded" and jobs[1]["status"] == "running":
            break
        assert time.monotonic() < deadline, run
        time.sleep(0.3)
    deployment.restart("planner", kill=True, tie_to_parent=True)
    killed_at = time.monotonic()
    deadline = time.monotonic() + 180
    while (run := _status(state.api_url, run_id))["status"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, run
        time.sleep(0.5)
    fault_matrix("planner SIGKILL", bus_of(state), str(run["status"]), noticed_s=time.monotonic() - killed_at)
    assert run["status"] == "succeeded", run

    async def starts() -> dict[str, int]:
        conn = await asyncpg.connect(fresh_database)
        try:
            rows = await conn.fetch(
                "SELECT job_id, count(*) AS n FROM events WHERE run_id = $1 AND "
                "schema = 'kvbench.job.started/1' GROUP BY job_id",
                run_id,
            )
        finally:
            await conn.close()
        return {r["job_id"]: int(r["n"]) for r in rows}

    deadline = time.monotonic() + 30
    while len(counts := asyncio.run(starts())) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sorted(counts.values()) == [1, 1, 1], counts
