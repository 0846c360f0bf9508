"""Killing a load generator mid-job: the planner notices within its heartbeat's TTL (not at the job's timeout),
fails the job with the load generator's name and what to do, and the run goes on to its end."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import pytest

from .conftest import bus_of
from .runs import submit_until_running

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.faults]

HEARTBEAT_TTL_S = 15.0  # kvbench_loadgens


def test_killed_load_generator_fails_its_job_within_the_ttl(
    short_plan: Any, local_kvbench: Any, fault_matrix: Any
) -> None:
    deployment, state = local_kvbench
    plan = short_plan("loadgen-loss", duration_s=120, users=2, gpu_only=True)
    run_id = submit_until_running(state.api_url, plan)
    time.sleep(4)  # a heartbeat has listed the shard
    loadgen = next(s for s in state.services if s.name == "loadgen")
    deployment.hold("loadgen")  # gone for good (the supervisor would start it again: then it "came back without it")
    os.kill(loadgen.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    while (job := httpx.get(f"{state.api_url}/v1/runs/{run_id}").json()["jobs"][0])["status"] == "running":
        # 120 s of load: the job's own timeout is minutes away
        assert time.monotonic() - killed_at < HEARTBEAT_TTL_S + 15, job
        time.sleep(0.5)
    fault_matrix("load generator SIGKILL", bus_of(state), "job failed: load generator lost",
                 noticed_s=time.monotonic() - killed_at)  # fmt: skip
    assert job["status"] == "failed"
    assert "load generator loadgen" in job["reason"]
    assert "stopped (its heartbeat is gone)" in job["reason"]
    assert "run the plan again" in job["reason"]
