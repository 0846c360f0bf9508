"""A shortened demo plan through every service: planner, node agents, sim engines, loadgen, reporter."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from kvbench_cli.api import Endpoints, fetch_report
from kvbench_cli.deployment import LocalDeployment
from kvbench_core.procs import pid_alive
from kvbench_reporter.schema import Report

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _engines_of(parents: set[int]) -> set[int]:
    """Simulated engines whose parent is one of ``parents`` (our agents), whatever else runs on the machine."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if b"kvbench_sim\x00serve" in cmdline and parent in parents:
                found.add(int(entry.name))
    return found


def test_demo_slice_end_to_end(
    nats_url: str, fresh_database: str, tmp_path: Path, artifacts_dir: Path, short_plan: Any
) -> None:
    deployment = LocalDeployment(tmp_path / "state")
    # two load generators: every job is split into two shards (each takes half the users)
    state = deployment.up(
        sim_machines=2, nats_url=nats_url, database_url=fresh_database, tie_to_parent=True, loadgens=2
    )
    try:
        with httpx.Client(timeout=30) as client:
            nodes = client.get(f"{state.api_url}/v1/nodes").json()
            assert sorted(n["inventory"]["node_id"] for n in nodes)[:2] == ["sim-0", "sim-1"]
            refused = client.post(
                f"{state.api_url}/v1/runs",
                content=b"version: 1\nname: x\nworkloads: []\n",
                headers={"Content-Type": "application/yaml"},
            )
            assert refused.status_code == 422
            response = client.post(
                f"{state.api_url}/v1/runs",
                content=short_plan(
                    "e2e-prefix-cache",
                    duration_s=14,
                    users=4,
                    synthetic={"prefix_tokens": 1536, "turns": 2, "think_time_s": 0.0},
                    measurement={"warmup_s": 3},
                ).encode(),
                headers={"Content-Type": "application/yaml"},
            )
            assert response.status_code == 201, response.text
            run_id = response.json()["run_id"]
            deadline = time.monotonic() + 240
            agents = {svc.pid for svc in state.services if svc.name.startswith("node-agent")}
            engines: set[int] = set()
            while True:
                engines |= _engines_of(agents)  # every engine our agents started during the run
                status = client.get(f"{state.api_url}/v1/runs/{run_id}").json()
                if status["status"] in ("succeeded", "failed", "cancelled"):
                    break
                assert time.monotonic() < deadline, status
                time.sleep(1)
        assert status["status"] == "succeeded", status
        endpoints = Endpoints(state.api_url, state.report_url, None)
        report = fetch_report(endpoints, run_id)
        html = fetch_report(endpoints, run_id, html=True)
        (artifacts_dir / "e2e-report.html").write_text(html)
        Report.model_validate(report)  # the published schema holds
        by_name = {w["name"]: w for w in report["workloads"]}
        off, gpu = by_name["prefix-off"], by_name["prefix-gpu"]
        # the plan's baseline first, then the plan's order; the other workload compared with it, with a verdict
        assert report["baseline"] == "prefix-gpu"
        assert [w["name"] for w in report["workloads"]] == ["prefix-gpu", "prefix-off"]
        assert gpu["comparison"]["is_baseline"]
        assert off["comparison"]["baseline"] == "prefix-gpu"
        assert off["comparison"]["speedup"]["ttft_p50"]["mean"] < 1.0  # no prefix cache: slower
        assert off["comparison"]["verdict"] == "not enough repeats to say"  # one repeat
        for question in ("Did it work?", "How fast?", "Did distributed KV help?", "What limited performance?",
                         "What happened underneath?"):  # fmt: skip
            assert html.count(question) == 2, question
        assert off["cached_prompt_tokens"] == 0
        assert gpu["cached_prompt_tokens"] > 0
        assert gpu["ttft_ms"]["p50"] < off["ttft_ms"]["p50"]
        assert gpu["engine_counters"]["prompt_tokens_gpu"] > 0
        assert off["engine_counters"]["prompt_tokens_gpu"] == 0
        for w in (off, gpu):  # the sources add up to the prompt tokens, and agree with the requests' view
            sources = w["prompt_token_sources"]
            assert sources["source"].startswith("engine counters")
            assert sum(sources["tokens"].values()) == pytest.approx(sources["prompt_tokens"])
            assert abs(sources["cross_check"]["difference"]) < 0.1
        assert gpu["test_points"][0]["load_level"] == 4
        # the simulated machines are cabled to the simulated leaf, which the switch-poller read around the run
        fabric = report["fabric"]
        assert fabric["publish_gate"]["publishable"], fabric
        (leaf,) = fabric["switches"]
        assert leaf["switch"] == state.sim_switch
        assert leaf["switch"].startswith("sim-leaf-")
        assert leaf["read"]
        assert sorted(p["port"] for p in leaf["ports"]) == ["swp1", "swp2"]
        assert sorted(c["node"] for c in leaf["cabled"]) == ["sim-0", "sim-1"]
        job_ids = {j["job_id"] for w in report["workloads"] for j in w["jobs"] if j["status"] == "succeeded"}
        assert {j["job_id"] for j in leaf["jobs"]} == job_ids  # every measured job has its own port window
        assert all("window" in j for j in leaf["jobs"]), leaf["jobs"]
        assert gpu["limits"]["break_even_gbps"] > 0

        async def rows_per_workload() -> tuple[dict[str, int], dict[str, int], list[tuple[int, int]]]:
            conn = await asyncpg.connect(fresh_database)
            try:
                rows = await conn.fetch(
                    "SELECT workload, count(*) AS n, count(DISTINCT shard) AS shards, "
                    "count(DISTINCT session_id) AS sessions FROM request_records WHERE run_id = $1 GROUP BY workload",
                    run_id,
                )
                jobs = await conn.fetch("SELECT shards, shards_finished FROM jobs WHERE run_id = $1", run_id)
            finally:
                await conn.close()
            return (
                {r["workload"]: int(r["n"]) for r in rows},
                {r["workload"]: int(r["shards"]) for r in rows},
                [(j["shards"], j["shards_finished"]) for j in jobs],
            )

        import asyncio  # noqa: PLC0415

        counts, shards, jobs = asyncio.run(rows_per_workload())
        assert counts == {"prefix-off": off["requests"], "prefix-gpu": gpu["requests"]}
        assert shards == {"prefix-off": 2, "prefix-gpu": 2}  # both load generators sent records for each job
        assert jobs == [(2, 2), (2, 2)]
        assert "Workloads compared" in html
        assert html.count('<div class="chart"') >= 4
    finally:
        stopped = deployment.down()
    assert "planner" in stopped
    assert "reporter" in stopped
    assert not [s.name for s in state.services if pid_alive(s.pid)]
    assert len(engines) >= 2
    assert not [pid for pid in engines if pid_alive(pid)]
