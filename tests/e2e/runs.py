"""Submitting a plan to a running kvbench and waiting for its end, as the end-to-end tests do."""

from __future__ import annotations

import time
from typing import Any

import httpx

__all__ = ["run_to_end"]


def run_to_end(api_url: str, plan_text: str, timeout_s: float = 400) -> dict[str, Any]:
    """POST the plan, poll the run until it ends; returns its last status (``run_id``, ``status``, ...)."""
    with httpx.Client(timeout=30) as client:
        response = client.post(
            f"{api_url}/v1/runs", content=plan_text.encode(), headers={"Content-Type": "application/yaml"}
        )
        assert response.status_code == 201, response.text
        run_id = response.json()["run_id"]
        deadline = time.monotonic() + timeout_s
        while True:
            status: dict[str, Any] = client.get(f"{api_url}/v1/runs/{run_id}").json()
            if status["status"] in ("succeeded", "failed", "cancelled"):
                return {**status, "run_id": run_id}
            assert time.monotonic() < deadline, status
            time.sleep(2)
