"""`kvbench accept` on the simulated cluster: the LMCache study's stack passes every step of the store-and-reload
acceptance test with its evidence (records written to L1 and the disk tier, reloaded after the engines' prefix cache
was emptied, and from disk after the whole stack restarted); a stack with no external tier fails step 3."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from kvbench_cli.api import Endpoints, fetch_report
from kvbench_cli.deployment import LocalDeployment
from kvbench_cli.main import main

from .runs import run_to_end

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# the study's stack shrunk: 40 documents of 8,000 tokens, one round per phase, engines paced 20x real time
PLAN = """
version: 1
name: accept-small
defaults:
  model: nvidia/Qwen3.6-35B-A3B-NVFP4
  engine: {name: vllm, args: {gpu_memory_utilization: 0.3}}
  cluster: {sim: {machines: 1, gpu: GB10, gpus_per_machine: 1, host_memory_gb: 121, speed: 20}}
  traffic:
    shape: document_reuse
    documents: {count: 40, tokens: 8000, rounds: 1, order: tile, measure_rounds: [1]}
    arrivals: {mode: closed_loop, users: [1]}
workloads:
  - {name: vllm-only, strategy: own_cache, stack: vllm-prefix-gpu}
  - {name: lmcache, strategy: spill, stack: vllm-lmcache-mp, kv_tier: nvme,
     sizing: {host_memory_gb: 20, disk_tier_gb: 500, disk_tier_path: /mnt/nvme/lmcache}}
"""


def test_the_study_stack_passes_and_a_gpu_only_stack_fails_step_3(
    nats_url: str, fresh_database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deployment = LocalDeployment(tmp_path / "kvbench")
    state = deployment.up(sim_machines=1, nats_url=nats_url, database_url=fresh_database, tie_to_parent=True)
    endpoints = Endpoints(state.api_url, state.report_url, None)
    try:
        # a plan of several workloads: the test needs to be told which
        refused = httpx.post(f"{state.api_url}/v1/accept", content=PLAN.encode(), timeout=30,
                             headers={"Content-Type": "application/yaml"})  # fmt: skip
        assert refused.status_code == 422
        (error,) = refused.json()["errors"]
        assert error["field"] == "workload"
        assert "--workload NAME" in error["fix"]

        status = run_to_end(state.api_url, PLAN, path="/v1/accept?workload=lmcache")
        assert status["status"] == "succeeded", status
        assert [j["repeat"] for j in status["jobs"]] == [0, 1, 2, 3]  # cold, warm, reset, restart
        (workload,) = fetch_report(endpoints, status["run_id"])["workloads"]
        accepted = workload["acceptance"]
        steps = {s["step"]: s for s in accepted["steps"]}
        assert accepted["passed"] is True, accepted
        assert accepted["verdict"] == "passed"
        assert [steps[n]["status"] for n in range(1, 9)] == ["passed"] * 8
        # the same 40 answers in every pass, compared one by one (a hybrid model: a stated share may differ)
        assert "reset: 40 of 40 identical" in steps[8]["evidence"]
        assert "restart: 40 of 40 identical" in steps[8]["evidence"]
        assert "attention block size" in steps[1]["evidence"]
        assert "disk tier:" in steps[3]["evidence"]
        assert "HTTP 200" in steps[4]["evidence"]
        passes = accepted["passes"]
        assert passes["reset"]["external_hit_rate"] > 0.5  # reloaded from the external tier, not recomputed
        assert passes["reset"]["ttft_p50_ms"] < passes["cold"]["ttft_p50_ms"]
        assert passes["restart"]["tokens"].get("disk", 0) > 0  # the disk records survived the restart

        # through the command a person types: it exits 1 and prints the steps
        plan_file = tmp_path / "plan.yaml"
        plan_file.write_text(PLAN)
        with pytest.raises(SystemExit) as ended:
            main(["accept", str(plan_file), "--workload", "vllm-only", "--json", "--api", state.api_url,
                  "--report-api", state.report_url])  # fmt: skip
        assert ended.value.code == 1
        printed = capsys.readouterr().out
        accepted = json.loads(printed[printed.index("{") :])["acceptance"]
        assert accepted["passed"] is False
        assert accepted["verdict"].startswith("failed at step 3 (records were created in the external tier)")
        assert "has no external KV tier" in accepted["verdict"]
    finally:
        deployment.down()


# TensorRT-LLM serves no route that empties its prefix cache: the reset step restarts its engines alone
NO_RESET_ROUTE_PLAN = """
version: 1
name: accept-trtllm
defaults:
  model: Qwen/Qwen3-8B
  engine: {name: trtllm}
  cluster: {sim: {machines: 2, gpu: L40S, gpus_per_machine: 1, host_memory_gb: 256, speed: 10}}
  traffic:
    shape: document_reuse
    documents: {count: 20, tokens: 4000, rounds: 1, order: tile, measure_rounds: [1]}
    arrivals: {mode: closed_loop, users: [2]}
  measurement: {routing: session_affinity}
workloads:
  - {name: valkey, strategy: shared_pool, stack: trtllm-lmcache-valkey, kv_tier: cpu_ram,
     sizing: {host_memory_gb: 8, shared_store_gb: 100}}
"""


def test_an_engine_with_no_reset_route_is_restarted_alone_and_reloads_from_the_shared_store(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    deployment = LocalDeployment(tmp_path / "kvbench")
    state = deployment.up(sim_machines=2, nats_url=nats_url, database_url=fresh_database, tie_to_parent=True)
    try:
        status = run_to_end(state.api_url, NO_RESET_ROUTE_PLAN, path="/v1/accept?workload=valkey")
        assert status["status"] == "succeeded", status
        (workload,) = fetch_report(Endpoints(state.api_url, state.report_url, None), status["run_id"])["workloads"]
        accepted = workload["acceptance"]
        steps = {s["step"]: s for s in accepted["steps"]}
        # step 4: each machine's engine restarted alone, the pool's store kept running
        assert steps[4]["status"] == "passed", steps[4]
        assert steps[4]["evidence"].count("restarted sim-engine0 alone") == 2, steps[4]
        assert "kept sim-store" in steps[4]["evidence"]
        assert "HTTP" not in steps[4]["evidence"]  # no route was called
        # the restarted engines loaded the documents back from the shared Valkey tier
        assert steps[5]["status"] == "passed", steps[5]
        assert accepted["passes"]["reset"]["external_hit_rate"] > 0.5
        assert steps[7]["status"] == "not applicable"  # no disk tier
    finally:
        deployment.down()
