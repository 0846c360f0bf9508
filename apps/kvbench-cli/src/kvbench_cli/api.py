"""Small HTTP client for the planner and reporter APIs."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx

from kvbench_cli.deployment import LocalDeployment
from kvbench_core.settings import read_secret_file

__all__ = ["ApiError", "Endpoints", "fetch_report", "resolve_endpoints"]


class ApiError(RuntimeError):
    def __init__(self, message: str, status: int = 0, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class Endpoints:
    def __init__(self, api_url: str, report_url: str, token: str | None) -> None:
        self.api_url = api_url.rstrip("/")
        self.report_url = report_url.rstrip("/")
        self.token = token

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


def resolve_endpoints(state_dir: Path, api: str | None, report: str | None) -> Endpoints:
    state = LocalDeployment(state_dir).load()
    api_url = api or os.environ.get("KVBENCH_API_URL") or (state.api_url if state else None)
    report_url = report or os.environ.get("KVBENCH_REPORT_URL") or (state.report_url if state else None)
    if not api_url or not report_url:
        raise ApiError("no kvbench to talk to: run `kvbench up` (or `make up`), or pass --api and --report-api")
    token = os.environ.get("KVBENCH_API_TOKEN")
    if token is None and state is not None and state.api_token_file and not api:
        token = read_secret_file(Path(state.api_token_file))  # `up --listen` made one
    return Endpoints(api_url, report_url, token)


def fetch_report(endpoints: Endpoints, run_id: str, html: bool = False, wait_s: float = 120.0) -> Any:
    """The report, waiting while the reporter is still finishing it (409) or has not seen the run (404)."""
    suffix = "report.html" if html else "report"
    deadline = time.monotonic() + wait_s
    with httpx.Client(timeout=30.0) as client:
        while True:
            response = client.get(f"{endpoints.report_url}/v1/runs/{run_id}/{suffix}", headers=endpoints.headers())
            if response.status_code == 200:
                return response.text if html else response.json()
            if response.status_code not in (404, 409) or time.monotonic() > deadline:
                raise ApiError(
                    f"report of {run_id}: HTTP {response.status_code}: {response.text[:300]}",
                    response.status_code,
                )
            time.sleep(0.5)
