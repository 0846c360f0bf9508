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


@pytest.fixture
def local_kvbench(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> Iterator[tuple[LocalDeployment, DeploymentState]]:
    deployment = LocalDeployment(tmp_path / "state")
    state = deployment.up(sim_machines=2, nats_url=nats_url, database_url=fresh_database, tie_to_parent=True)
    try:
        yield deployment, state
    finally:
        deployment.down()


# the fault matrix: each fault test adds its row; `pytest -m faults` prints them at the end
FAULT_ROWS: list[dict[str, Any]] = []
FaultRow = Callable[..., None]


@pytest.fixture
def fault_matrix() -> FaultRow:
    """``fault_matrix(case, bus, outcome, noticed_s=None, published=None, stored=None, dead=None)``: one row."""

    def record(case: str, bus: str, outcome: str, **figures: object) -> None:
        FAULT_ROWS.append({"case": case, "bus": bus, "outcome": outcome, **figures})

    return record


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FAULT_ROWS:
        return
    terminalreporter.section("fault matrix")
    terminalreporter.write_line(
        f"{'case':<34} {'bus':<10} {'outcome':<44} {'noticed s':>9} {'published':>9} {'stored':>7} {'dup':>4}"
    )
    for row in FAULT_ROWS:
        noticed = row.get("noticed_s")
        stored, distinct = row.get("stored"), row.get("distinct")
        dup = "-" if stored is None or distinct is None else str(int(stored) - int(distinct))
        terminalreporter.write_line(
            f"{row['case']:<34} {row['bus']:<10} {row['outcome'][:44]:<44} "
            f"{'-' if noticed is None else f'{float(noticed):.1f}':>9} {row.get('published', '-')!s:>9} "
            f"{'-' if stored is None else stored!s:>7} {dup:>4}"
        )
