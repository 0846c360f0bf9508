"""Killing a node agent mid-job: the planner fails the run with the guide's node_unresponsive message within
the heartbeat TTL, and no engine process outlives its agent."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvbench_core.procs import pid_alive

from .conftest import bus_of
from .runs import submit_until_running

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.faults]

HEARTBEAT_TTL_S = 15.0


def _engines_of(agent_pid: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == agent_pid and b"kvbench_sim" in cmdline:
                children.append(int(entry.name))
    return children


def test_killed_agent_fails_the_run_within_the_ttl(short_plan: Any, local_kvbench: Any, fault_matrix: Any) -> None:
    deployment, state = local_kvbench
    plan = short_plan("agent-loss", duration_s=120, users=2, gpu_only=True)
    run_id = submit_until_running(state.api_url, plan)
    agent = next(s for s in state.services if s.name == "node-agent-sim-1")
    engines = _engines_of(agent.pid)
    assert engines, "the agent should have started an engine"
    deployment.hold("node-agent-sim-1")  # gone for good: the supervisor does not start it again
    os.kill(agent.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    while [pid for pid in engines if pid_alive(pid)]:
        assert time.monotonic() - killed_at < 5, "an engine outlived its agent"
        time.sleep(0.1)
    while (run := httpx.get(f"{state.api_url}/v1/runs/{run_id}").json())["status"] == "running":
        assert time.monotonic() - killed_at < HEARTBEAT_TTL_S + 10, run
        time.sleep(0.5)
    failed_after = time.monotonic() - killed_at
    fault_matrix(
        "node agent SIGKILL", bus_of(state), f"{run['status']}: {run['reasons'][0]['code']}", noticed_s=failed_after
    )
    assert run["status"] == "failed"
    reason = run["reasons"][0]
    assert reason["code"] == "node_unresponsive"
    assert reason["message"].startswith("A node stopped responding")
    assert "sim-1" in reason["message"]
    assert reason["fix"] == "Check that the agent is running on that machine, and then run the workload again."
    assert failed_after <= HEARTBEAT_TTL_S + 5


@pytest.mark.parametrize("local_kvbench", ["single"], indirect=True)
def test_an_agent_restarted_right_after_its_stack_was_ready_fails_the_run_at_once(
    short_plan: Any, local_kvbench: Any
) -> None:
    """Killed a moment after its stack was ready, before any heartbeat listed it, and started again at once by the
    supervisor: the new agent's first heartbeat, written after the stack was ready and without it, fails the run as
    node_restarted (its engines died with it), not after the job's whole length."""
    _, state = local_kvbench
    run_id = submit_until_running(state.api_url, short_plan("agent-restart", duration_s=120, users=2, gpu_only=True))
    agent = next(s for s in state.services if s.name == "node-agent-sim-1")
    os.kill(agent.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    while (run := httpx.get(f"{state.api_url}/v1/runs/{run_id}").json())["status"] == "running":
        assert time.monotonic() - killed_at < HEARTBEAT_TTL_S, run
        time.sleep(0.5)
    assert run["status"] == "failed"
    assert run["reasons"][0]["code"] == "node_restarted", run["reasons"]
    assert "sim-1" in run["reasons"][0]["message"]
