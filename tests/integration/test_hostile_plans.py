"""Hostile and broken plans through the planner's API (both review and submit) and the offline review: every one is
refused with the field and the fix, none is a server error, and nothing is created."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from kvbench_core.settings import load_settings
from kvbench_planner.api import create_app
from kvbench_planner.settings import PlannerSettings
from kvbench_planner.validation import review_text

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hostile-plans-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/yaml"}


def demo(**changes: object) -> dict[str, object]:
    plan: dict[str, object] = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    for path, value in changes.items():
        node: Any = plan
        *parents, last = path.split("__")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        node[last] = value
    return plan


def as_yaml(plan: dict[str, object]) -> bytes:
    return yaml.safe_dump(plan).encode()


BILLION_LAUGHS = b"""version: 1
name: bomb
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
workloads: [{name: w, strategy: own_cache, stack: vllm-prefix-gpu, cluster: {sim: {}}, engine: {args: {x: *f}}}]
"""

HOSTILE: dict[str, tuple[bytes, str]] = {
    "nested 4 KB deep": (b"[" * 2000 + b"]" * 2000, "nests"),
    "nested mapping": (b"a: " + b"{b: " * 1500 + b"1" + b"}" * 1500, "nests"),
    "an alias bomb": (BILLION_LAUGHS, "aliases"),
    "a rate of inf": (
        as_yaml(demo(defaults__traffic__arrivals={"mode": "request_rate", "rates": [float("inf")]})),
        "rates",
    ),
    "a duration of inf": (as_yaml(demo(defaults__traffic__duration_s=float("inf"))), "duration_s"),
    "a duration of 1e300": (as_yaml(demo(defaults__traffic__duration_s=1e300)), "duration_s"),
    "a trace of /etc/shadow": (
        as_yaml(
            demo(defaults__traffic={"shape": "trace_replay", "trace": {"format": "mooncake", "path": "/etc/shadow"}})
        ),
        "traffic.trace.path",
    ),
    "a trace out of the tree": (
        as_yaml(demo(defaults__traffic={"shape": "trace_replay", "trace": {"format": "mooncake", "path": "../../x"}})),
        "traffic.trace.path",
    ),
    "a disk tier at ../../etc": (as_yaml(demo(defaults__sizing={"disk_tier_path": "../../etc"})), "disk_tier_path"),
    "a shared mount under /proc": (as_yaml(demo(defaults__sizing={"shared_mount_path": "/proc/self"})), "shared_mount"),
    "a dataset under /root": (
        as_yaml(demo(defaults__traffic={"shape": "agentic_replay", "dataset": "/root/x"})),
        "dataset",
    ),
    "six thousand jobs": (
        as_yaml(
            demo(
                defaults__traffic__arrivals={"mode": "closed_loop", "users": list(range(1, 65))},
                defaults__measurement={"repeats": 100},
            )
        ),
        "jobs",
    ),
    "a 100-character name": (as_yaml(demo(name="n" * 100)), "name"),
    "a 10 kB engine argument": (
        as_yaml(demo(defaults__engine={"args": {"served-model-name": "x" * 10_000}})),
        "engine.args",
    ),
    "an engine argument that is no flag": (as_yaml(demo(defaults__engine={"args": {"--x; rm -rf /": 1}})), "flag name"),
    "binary garbage": (bytes(range(256)) * 4, "YAML"),
    "a list": (b"[1, 2, 3]", "mapping"),
    "a NUL in a path": (as_yaml(demo(defaults__sizing={"disk_tier_path": "/data/\x00x"})), "disk_tier_path"),
}


@pytest.fixture
def client(nats_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("KVBENCH_NATS_URL", nats_url)
    monkeypatch.setenv("KVBENCH_API_TOKEN", TOKEN)
    monkeypatch.setenv("KVBENCH_PLANNER_NODE_WAIT_S", "60")
    with TestClient(create_app(load_settings(PlannerSettings)), raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_plan_is_refused_everywhere_and_creates_nothing(client: TestClient, case: str) -> None:
    body, mentioned = HOSTILE[case]
    before = {r["run_id"] for r in client.get("/v1/runs", headers=AUTH).json()}
    offline = review_text(body)
    assert not offline.valid, case
    for path in ("/v1/plans/validate", "/v1/runs"):
        response = client.post(path, content=body, headers=AUTH)
        assert 400 <= response.status_code < 500, (case, path, response.status_code, response.text[:300])
        problems = response.json().get("errors") or response.json().get("detail")
        assert problems, (case, response.text[:300])
        text = str(problems)
        assert mentioned in text, (case, text[:500])
        assert all(p.get("fix") for p in problems if isinstance(p, dict)), (case, text[:500])
    assert {r["run_id"] for r in client.get("/v1/runs", headers=AUTH).json()} == before, case


def test_a_body_larger_than_the_limit_is_refused_without_a_length_too(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(300):
            yield b"#" * 8192 + b"\n"

    response = client.post("/v1/runs", content=chunks(), headers=AUTH)  # chunked: no Content-Length
    assert response.status_code == 413


def test_no_more_runs_than_the_planner_takes(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # the session's bus may hold another test's run still waiting for machines (this planner resumed it): the limit
    # is one more than those
    active = sum(r["status"] in ("pending", "running") for r in client.get("/v1/runs", headers=AUTH).json())
    client.app.state.settings = client.app.state.settings.model_copy(update={"max_active_runs": active + 1})  # type: ignore[attr-defined]
    plan = (ROOT / "examples" / "demo.yaml").read_bytes()
    first = client.post("/v1/runs", content=plan, headers=AUTH)
    assert first.status_code == 201, first.text
    second = client.post("/v1/runs", content=plan, headers=AUTH)
    assert second.status_code == 429
    assert second.json()["detail"][0]["code"] == "too_many_runs"
    client.post(f"/v1/runs/{first.json()['run_id']}/cancel", headers=AUTH)
