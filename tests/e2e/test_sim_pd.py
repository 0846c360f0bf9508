"""A prefill/decode split through every service on simulated engines (the router and the P/D pair in server mode),
against batch (what-if) mode: the same TTFT and the same ITL gain over colocated engines."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from kvbench_cli.api import Endpoints, fetch_report
from kvbench_cli.deployment import LocalDeployment
from kvbench_contracts.plan import Plan
from kvbench_sim.whatif import run_plan

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PLAN = Path(__file__).resolve().parents[2] / "examples" / "pd-split-small.yaml"


def _run(api_url: str, plan_text: str) -> str:
    with httpx.Client(timeout=30) as client:
        response = client.post(
            f"{api_url}/v1/runs", content=plan_text.encode(), headers={"Content-Type": "application/yaml"}
        )
        assert response.status_code == 201, response.text
        run_id: str = response.json()["run_id"]
        deadline = time.monotonic() + 400
        while True:
            status = client.get(f"{api_url}/v1/runs/{run_id}").json()
            if status["status"] in ("succeeded", "failed", "cancelled"):
                break
            assert time.monotonic() < deadline, status
            time.sleep(2)
    assert status["status"] == "succeeded", status
    return run_id


def test_served_split_matches_batch_mode(nats_url: str, fresh_database: str, tmp_path: Path) -> None:
    plan_text = PLAN.read_text()
    batch = run_plan(Plan.model_validate(yaml.safe_load(plan_text)))
    expected: dict[str, Any] = {w["name"]: w["test_points"][0]["jobs"][0] for w in batch["workloads"]}
    batch_gain = expected["colocated"]["itl_ms"]["p99"] / expected["pd-nixl"]["itl_ms"]["p99"]
    assert batch_gain > 1.5  # the regime this plan is for

    deployment = LocalDeployment(tmp_path / "kvbench")
    state = deployment.up(sim_machines=2, nats_url=nats_url, database_url=fresh_database, tie_to_parent=True)
    try:
        run_id = _run(state.api_url, plan_text)
        report = fetch_report(Endpoints(state.api_url, state.report_url, None), run_id)
    finally:
        deployment.down()
    served = {w["name"]: w for w in report["workloads"]}
    pd, colocated = served["pd-nixl"], served["colocated"]
    speed = Plan.model_validate(yaml.safe_load(plan_text)).workloads[0].cluster.sim.speed  # type: ignore[union-attr]
    assert pd["ttft_ms"]["p50"] * speed == pytest.approx(expected["pd-nixl"]["ttft_ms"]["p50"], rel=0.2)
    served_gain = colocated["itl_ms"]["p99"] / pd["itl_ms"]["p99"]
    assert served_gain == pytest.approx(batch_gain, rel=0.3)
    # each prompt is computed once on the prefill engine and its KV moved once to the decode engine
    sources = pd["prompt_token_sources"]["tokens"]
    assert sources["transferred"] > 0
    assert sources["transferred"] == pytest.approx(sources["recomputed"], rel=0.01), sources
