"""Shared set-up of the end-to-end tests: a short version of the demo plan, and a whole local kvbench on the
session's NATS and a database of the test's own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvbench_cli.deployment import DeploymentState, LocalDeployment

ROOT = Path(__file__).resolve().parents[2]

PlanMaker = Callable[..., str]


@pytest.fixture
def short_plan() -> PlanMaker:
    """The demo plan, shortened: ``short_plan(name, duration_s=..., users=..., gpu_only=True, synthetic={...},
    measurement={...})`` returns YAML."""

    def make(
        name: str,
        duration_s: float,
        users: int,
        gpu_only: bool = False,
        synthetic: dict[str, Any] | None = None,
        measurement: dict[str, Any] | None = None,
    ) -> str:
        plan = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
        plan["name"] = name
        defaults = plan["defaults"]
        defaults["traffic"]["duration_s"] = duration_s
        defaults["traffic"]["arrivals"]["users"] = [users]
        # the short slice's own traffic (small shared prefixes, one repeat, real time), whatever the demo shows
        defaults["cluster"]["sim"]["speed"] = 1.0
        defaults["traffic"]["synthetic"] = {"prefix_tokens": 2048, "groups": 4, "users_per_group": 2, "turns": 3,
                                            "input_tokens": 96, "output_tokens": 32, "think_time_s": 0.2}  # fmt: skip
        defaults["traffic"]["synthetic"].update(synthetic or {})
        defaults["measurement"].update({"repeats": 1, "routing": "session_affinity", **(measurement or {})})
        keep = ("vllm-prefix-gpu",) if gpu_only else ("vllm-prefix-gpu", "vllm-prefix-off")
        plan["workloads"] = [w for w in plan["workloads"] if w["stack"] in keep]
        return str(yaml.safe_dump(plan))

    return make


# the buses the killed-process tests run on: the session's one server, and three clustered ones of the deployment's
BUSES = {"single": None, "3 servers": 3}


@pytest.fixture(params=list(BUSES), ids=["single", "cluster3"])
def local_kvbench(
    request: pytest.FixtureRequest, nats_url: str, fresh_database: str, tmp_path: Path
) -> Iterator[tuple[LocalDeployment, DeploymentState]]:
    deployment = LocalDeployment(tmp_path / "state")
    cluster = BUSES[request.param]
    if cluster:
        state = deployment.up(sim_machines=2, database_url=fresh_database, nats_cluster=cluster, tie_to_parent=True)
    else:
        state = deployment.up(sim_machines=2, nats_url=nats_url, database_url=fresh_database, tie_to_parent=True)
    try:
        yield deployment, state
    finally:
        deployment.down()


def bus_of(state: DeploymentState) -> str:
    """The fault matrix's name for a deployment's bus."""
    servers = len(state.nats_url.split(","))
    return "single" if servers == 1 else f"{servers} servers"


FaultRow = Callable[..., None]


@pytest.fixture
def fault_matrix(request: pytest.FixtureRequest) -> FaultRow:
    """``fault_matrix(case, bus, outcome, noticed_s=None, published=None, stored=None, dead=None)``: one row. It
    travels with the test's report (a user property), so the matrix is whole when tests run in several processes."""

    def record(case: str, bus: str, outcome: str, **figures: object) -> None:
        request.node.user_properties.append(("fault_row", {"case": case, "bus": bus, "outcome": outcome, **figures}))

    return record
