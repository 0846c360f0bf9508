"""Two runs submitted at once on the same machines: the second is queued (its place and what it waits for in the
API) until the first ends, never runs a job beside it, and both succeed; a plan that says ``when_busy: refuse`` is
refused (409, naming the field) while the machines are busy, and nothing is created."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _submit(api: str, plan: str) -> httpx.Response:
    return httpx.post(f"{api}/v1/runs", content=plan.encode(), headers={"Content-Type": "application/yaml"}, timeout=30)


@pytest.mark.parametrize("local_kvbench", ["single"], indirect=True)
def test_two_runs_on_the_same_machines_queue_and_both_succeed(short_plan: Any, local_kvbench: Any) -> None:
    _, state = local_kvbench
    api = state.api_url
    plans = [short_plan(name, duration_s=6, users=2, gpu_only=True, measurement={"warmup_s": 1})
             for name in ("first", "second")]  # fmt: skip
    first = _submit(api, plans[0]).json()["run_id"]
    second = _submit(api, plans[1]).json()["run_id"]
    runs_before = len(httpx.get(f"{api}/v1/runs").json())
    refused_plan = yaml.safe_load(plans[0])
    refused_plan["when_busy"] = "refuse"
    refused = _submit(api, yaml.safe_dump(refused_plan))
    assert refused.status_code == 409, refused.text
    assert refused.json()["detail"][0]["code"] == "machines_busy"
    assert refused.json()["detail"][0]["field"] == "when_busy"
    assert first in refused.json()["detail"][0]["message"]
    assert len(httpx.get(f"{api}/v1/runs").json()) == runs_before  # refused: no run created

    seen_queued: list[dict[str, Any]] = []
    overlaps = 0
    deadline = time.monotonic() + 240
    while True:
        a, b = (httpx.get(f"{api}/v1/runs/{run}").json() for run in (first, second))
        if b["status"] == "queued":
            seen_queued.append(b["queue"])
        running = [r for r in (a, b) if any(j["status"] == "running" for j in r["jobs"])]
        overlaps += len(running) > 1
        if a["status"] in ("succeeded", "failed") and b["status"] in ("succeeded", "failed"):
            break
        assert time.monotonic() < deadline, (a["status"], b["status"])
        time.sleep(0.2)
    assert (a["status"], b["status"]) == ("succeeded", "succeeded"), (a["reasons"], b["reasons"])
    assert overlaps == 0
    assert seen_queued, "the second run was never queued"
    assert seen_queued[0]["position"] == 1
    assert any(first in why for why in seen_queued[0]["waiting_for"])
    assert b["queue"] is None
    summary = {r["run_id"]: r for r in httpx.get(f"{api}/v1/runs").json()}
    assert summary[second]["status"] == "succeeded"
