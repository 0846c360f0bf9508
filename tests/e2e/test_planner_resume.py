"""Killing the planner mid-run with SIGKILL and starting it again: the run finishes, each job run once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import httpx
import pytest
import yaml

from kvbench_cli.deployment import LocalDeployment

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def _three_job_plan() -> str:
    plan = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    plan["name"] = "resume"
    plan["defaults"]["traffic"]["duration_s"] = 8
    plan["defaults"]["traffic"]["arrivals"]["users"] = [2]
    plan["defaults"]["traffic"]["synthetic"].update(prefix_tokens=256, turns=2, think_time_s=0.0)
    plan["defaults"]["measurement"].update(warmup_s=1, repeats=3, cache_state="warm")
    plan["workloads"] = plan["workloads"][1:]
    return yaml.safe_dump(plan)


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
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    deployment = LocalDeployment(tmp_path / "state")
    state = deployment.up(sim_machines=2, nats_url=nats_url, database_url=fresh_database, tie_to_parent=True)
    try:
        created = httpx.post(
            f"{state.api_url}/v1/runs",
            content=_three_job_plan().encode(),
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
        deadline = time.monotonic() + 180
        while (run := _status(state.api_url, run_id))["status"] not in ("succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, run
            time.sleep(0.5)
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
    finally:
        deployment.down()
