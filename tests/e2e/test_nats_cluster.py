"""`kvbench up --nats-cluster 3`: three NATS servers clustered with routes, every stream and bucket replicated three
times. Killing the JetStream leader (SIGKILL) mid-run: the services move to the other servers, the run completes,
every record the load generator published is stored once, and `kvbench status --json` shows the dead server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvbench_cli.api import Endpoints, fetch_report
from kvbench_cli.bususers import BusUsers
from kvbench_cli.deployment import LocalDeployment
from kvbench_cli.main import main
from kvbench_core.bus import Bus, NatsAuth

from .runs import record_counts

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.faults]


async def _replicas(url: str, auth: NatsAuth) -> dict[str, int]:
    async with Bus.connect(url, name="cluster-test", auth=auth) as bus:
        streams = {name: (await bus.js.stream_info(name)).config.num_replicas or 1
                   for name in ("KVBENCH_CONTROL", "KVBENCH_CMD", "KVBENCH_RECORDS", "KVBENCH_TELEMETRY")}  # fmt: skip
        runs = await bus.js.stream_info("KV_kvbench_runs")
        return {**streams, "KV_kvbench_runs": runs.config.num_replicas or 1}


def _status(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        main(["--state-dir", str(state_dir), "status", "--json"])
    printed = capsys.readouterr().out
    return int(ended.value.code or 0), json.loads(printed[printed.index("{") :])


def test_a_three_server_bus_loses_its_leader_mid_run_and_loses_nothing(
    short_plan: Any, fresh_database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], fault_matrix: Any
) -> None:
    state_dir = tmp_path / "kvbench"
    deployment = LocalDeployment(state_dir)
    state = deployment.up(sim_machines=2, database_url=fresh_database, nats_cluster=3, tie_to_parent=True)
    try:
        assert len(state.nats_url.split(",")) == 3
        assert state.base_env["KVBENCH_NATS_REPLICAS"] == "3"
        assert set(asyncio.run(_replicas(state.nats_url, BusUsers(state_dir).auth("admin"))).values()) == {3}
        code, status = _status(state_dir, capsys)
        assert code == 0, status
        assert sorted(s["role"] for s in status["nats"]) == ["follower", "follower", "leader"]
        assert all(s["pid"] and s["running"] for s in status["nats"])

        plan = short_plan("cluster-failover", duration_s=12, users=4, gpu_only=True,
                          synthetic={"prefix_tokens": 256, "turns": 2, "think_time_s": 0.0},
                          measurement={"warmup_s": 1, "repeats": 2, "cache_state": "warm"})  # fmt: skip
        run_id = httpx.post(f"{state.api_url}/v1/runs", content=plan.encode(), timeout=30,
                            headers={"Content-Type": "application/yaml"}).json()["run_id"]  # fmt: skip
        deadline = time.monotonic() + 60
        while True:  # kill the JetStream leader while the first job streams its records
            jobs = httpx.get(f"{state.api_url}/v1/runs/{run_id}", timeout=10).json()["jobs"]
            if jobs[0]["status"] == "running" and jobs[0]["requests"] > 0:
                break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        (leader,) = [s for s in status["nats"] if s["role"] == "leader"]
        deployment.hold(leader["name"])  # down for the rest of the run: the supervisor does not start it again
        os.kill(int(leader["pid"]), signal.SIGKILL)
        killed_at = time.monotonic()
        deadline = time.monotonic() + 180
        while True:
            try:
                current = httpx.get(f"{state.api_url}/v1/runs/{run_id}", timeout=10).json()
            except httpx.HTTPError:  # the planner is moving to another server
                current = {"status": "running"}
            if current["status"] != "running" and current["status"] != "pending":
                break
            assert time.monotonic() < deadline, current
            time.sleep(0.5)
        assert current["status"] == "succeeded", current
        # every record published is stored, once
        deadline = time.monotonic() + 60
        while True:
            rows = asyncio.run(record_counts(fresh_database, run_id))
            if (
                len(rows) == 2 and all(r["stored"] == r["records_expected"] for r in rows)
            ) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        fault_matrix("NATS leader SIGKILL", "3 servers", str(current["status"]),
                     noticed_s=time.monotonic() - killed_at, published=sum(r["records_expected"] for r in rows),
                     stored=sum(r["stored"] for r in rows), distinct=sum(r["distinct_ids"] for r in rows))  # fmt: skip
        assert len(rows) == 2
        for row in rows:
            assert row["records_expected"] > 0
            assert row["stored"] == row["records_expected"] == row["distinct_ids"], dict(row)
        report = fetch_report(Endpoints(state.api_url, state.report_url, None), run_id)
        assert report["workloads"][0]["requests"] == sum(r["stored"] for r in rows)
        # the dead server shows; two of three still serve, so the deployment is healthy, with a new leader
        code, status = _status(state_dir, capsys)
        roles = {s["name"]: s["role"] for s in status["nats"]}
        assert roles[leader["name"]] == "down", roles
        assert sorted(r for name, r in roles.items() if name != leader["name"]) == ["follower", "leader"], roles
        assert code == 0, status
        print(
            f"leader killed; run ended {time.monotonic() - killed_at:.1f} s later; "
            f"{sum(r['stored'] for r in rows)} records stored once"
        )
    finally:
        deployment.down()
