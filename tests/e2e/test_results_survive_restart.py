"""`kvbench up`, a run, `kvbench down`, `kvbench up`: the run's report is still served (the embedded database is
kept with the deployment's state, durable), and `down --wipe` removes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench_cli.api import Endpoints, fetch_report
from kvbench_cli.deployment import LocalDeployment
from kvbench_core.embedded import EmbeddedPostgres

from .conftest import PlanMaker
from .runs import run_to_end

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_report_outlives_down_and_up(tmp_path: Path, nats_url: str, short_plan: PlanMaker) -> None:
    deployment = LocalDeployment(tmp_path / "state")
    kept = EmbeddedPostgres.kept_in(tmp_path / "state").base_dir
    try:
        state = deployment.up(sim_machines=2, nats_url=nats_url, tie_to_parent=True)
        assert state.pg_dir == str(kept)
        status = run_to_end(
            state.api_url, short_plan("survives", duration_s=8, users=1, gpu_only=True, measurement={"warmup_s": 1})
        )
        assert status["status"] == "succeeded", status
        before = fetch_report(Endpoints(state.api_url, state.report_url, None), status["run_id"])
        assert "postgresql" in deployment.down()
        assert (kept / "data" / "PG_VERSION").exists()  # `down` keeps the results

        again = deployment.up(sim_machines=2, nats_url=nats_url, tie_to_parent=True)
        after = fetch_report(Endpoints(again.api_url, again.report_url, None), status["run_id"], wait_s=0)
        assert after["run_id"] == status["run_id"]
        assert after["workloads"][0]["requests"] == before["workloads"][0]["requests"]
    finally:
        deployment.down(wipe=True)
    assert not kept.exists()  # --wipe deletes them
