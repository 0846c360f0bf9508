"""Faults of the fault matrix that no other test covers: the single NATS server and the embedded PostgreSQL killed
with SIGKILL mid-job and started again. Each run ends as it would have (every record the load generator published
is stored, once) or fails with a reason that names what happened; no service is left dead. `pytest -m faults`
runs these with the other killed-process tests and prints the matrix."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvbench_cli.api import Endpoints, fetch_report
from kvbench_cli.deployment import DeploymentState, LocalDeployment
from kvbench_core.procs import pid_alive

from .conftest import FaultRow, bus_of
from .runs import record_counts, submit_until_running

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.faults]


def _plan(short_plan: Any, name: str) -> str:
    return str(short_plan(name, duration_s=14, users=4, gpu_only=True,
                          synthetic={"prefix_tokens": 256, "turns": 2, "think_time_s": 0.0},
                          measurement={"warmup_s": 1, "repeats": 2, "cache_state": "warm"}))  # fmt: skip


def _wait_end(state: DeploymentState, run_id: str, timeout_s: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status: dict[str, Any] = httpx.get(f"{state.api_url}/v1/runs/{run_id}", timeout=10).json()
        except httpx.HTTPError:
            status = {"status": "running"}
        if status["status"] not in ("pending", "running"):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.5)


def _complete(database_url: str, run_id: str, timeout_s: float = 60) -> list[Any]:
    """The run's per-job counts once every published record is stored (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = asyncio.run(record_counts(database_url, run_id))
        if (rows and all(r["stored"] == r["records_expected"] for r in rows)) or time.monotonic() > deadline:
            return rows
        time.sleep(1.0)


def _dead(state: DeploymentState) -> list[str]:
    return [s.name for s in state.services if not pid_alive(s.pid)]


@pytest.mark.parametrize("outage_s", [10, 60])
def test_the_bus_killed_and_started_again_loses_nothing(
    short_plan: Any, fresh_database: str, tmp_path: Path, fault_matrix: FaultRow, outage_s: float
) -> None:
    deployment = LocalDeployment(tmp_path / "kvbench")
    state = deployment.up(sim_machines=2, database_url=fresh_database, tie_to_parent=True)
    try:
        run_id = submit_until_running(state.api_url, _plan(short_plan, "nats-killed"))
        time.sleep(2)  # records are streaming
        deployment.kill_nats()
        time.sleep(outage_s)
        deployment.restart_nats()  # its JetStream store is on disk: streams, consumers and run state come back
        back_at = time.monotonic()
        status = _wait_end(state, run_id)
        rows = _complete(fresh_database, run_id)
        published, stored = sum(r["records_expected"] for r in rows), sum(r["stored"] for r in rows)
        distinct = sum(r["distinct_ids"] for r in rows)
        dead = _dead(deployment.load() or state)
        fault_matrix(f"NATS SIGKILL, back after {outage_s:g} s", "single", status["status"],
                     noticed_s=time.monotonic() - back_at, published=published, stored=stored,
                     distinct=distinct)  # fmt: skip
        assert status["status"] == "succeeded", status
        assert stored == published == distinct, [dict(r) for r in rows]
        assert not dead, f"services left dead: {dead}"
        report = fetch_report(Endpoints(state.api_url, state.report_url, None), run_id)
        assert report["workloads"][0]["requests"] == stored
    finally:
        deployment.down()


@pytest.mark.parametrize("nats_servers", [1, 3], ids=["single", "cluster3"])
def test_postgres_killed_mid_run_loses_no_record(
    short_plan: Any, tmp_path: Path, fault_matrix: FaultRow, nats_servers: int
) -> None:
    deployment = LocalDeployment(tmp_path / "kvbench")
    # the embedded, durable PostgreSQL
    state = deployment.up(sim_machines=2, nats_cluster=nats_servers, tie_to_parent=True)
    try:
        run_id = submit_until_running(state.api_url, _plan(short_plan, "postgres-killed"))
        time.sleep(2)
        deployment.kill_postgres()
        killed_at = time.monotonic()
        time.sleep(3)
        deployment.restart_postgres()  # it replays its write-ahead log: every acknowledged commit is there
        status = _wait_end(state, run_id)
        rows = _complete(state.database_url, run_id)
        published, stored = sum(r["records_expected"] for r in rows), sum(r["stored"] for r in rows)
        distinct = sum(r["distinct_ids"] for r in rows)
        dead = _dead(deployment.load() or state)
        fault_matrix("PostgreSQL SIGKILL, back after 3 s", bus_of(state), status["status"],
                     noticed_s=time.monotonic() - killed_at, published=published, stored=stored,
                     distinct=distinct)  # fmt: skip
        assert status["status"] == "succeeded", status
        assert stored == published == distinct, [dict(r) for r in rows]
        assert not dead, f"services left dead: {dead}"
        report = fetch_report(Endpoints(state.api_url, state.report_url, None), run_id)
        assert report["workloads"][0]["validity"]["verdict"] != "incomplete", report["workloads"][0]["validity"]
    finally:
        deployment.down(wipe=True)


def test_two_of_three_servers_killed_pause_the_run_and_lose_nothing(
    short_plan: Any, fresh_database: str, tmp_path: Path, fault_matrix: FaultRow
) -> None:
    """Two of a three-server bus killed: the cluster has lost its quorum and JetStream stops (what one server alone
    holds may not be acknowledged); the services wait. One server back: the run goes on and ends as it would have,
    every record published stored once."""
    deployment = LocalDeployment(tmp_path / "kvbench")
    state = deployment.up(sim_machines=2, database_url=fresh_database, nats_cluster=3, tie_to_parent=True)
    try:
        run_id = submit_until_running(state.api_url, _plan(short_plan, "quorum-lost"))
        time.sleep(2)  # records are streaming
        deployment.kill_nats(1)
        deployment.kill_nats(2)
        time.sleep(10)
        deployment.restart_nats(1)  # two of three again: a quorum, its store on disk
        back_at = time.monotonic()
        status = _wait_end(state, run_id)
        rows = _complete(fresh_database, run_id)
        published, stored = sum(r["records_expected"] or 0 for r in rows), sum(r["stored"] for r in rows)
        distinct = sum(r["distinct_ids"] for r in rows)
        dead = _dead(deployment.load() or state)
        outcome = status["status"] if status["status"] == "succeeded" else f"failed: {status['reasons'][0]['code']}"
        fault_matrix("2 of 3 NATS SIGKILL, 1 back 10 s", bus_of(state), outcome,
                     noticed_s=time.monotonic() - back_at, published=published, stored=stored,
                     distinct=distinct)  # fmt: skip
        assert not dead, f"services left dead: {dead}"
        assert stored == distinct, [dict(r) for r in rows]  # nothing stored twice
        if status["status"] == "succeeded":  # the run paused and went on
            assert stored == published, [dict(r) for r in rows]
        else:  # a reason a person can act on; no node was lost (a lone server's stale heartbeats once said one was)
            assert status["reasons"][0]["code"] not in ("internal_error", "node_unresponsive"), status["reasons"]
    finally:
        deployment.down()
