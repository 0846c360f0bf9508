"""schemathesis against the planner's /openapi.json: no generated request may cause a server error."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvbench_core.procs import free_port, stop_pid, wait_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def planner_url(nats_url: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "KVBENCH_NATS_URL": nats_url,
        "KVBENCH_PLANNER_PORT": str(port),
        "KVBENCH_PLANNER_NODE_WAIT_S": "0",
    }
    env.pop("KVBENCH_PLANNER_API_TOKEN", None)
    with open(tmp_path / "planner.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvbench_planner"], env=env, stdout=log, stderr=log, start_new_session=True
        )
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_pid(proc.pid, group=True)
        errors = [line for line in (tmp_path / "planner.log").read_text().splitlines() if '"level": "error"' in line]
        assert not errors, errors[:3]


def test_no_generated_request_causes_a_server_error(planner_url: str, tmp_path: Path) -> None:
    assert httpx.get(f"{planner_url}/openapi.json").status_code == 200
    st = Path(sys.executable).with_name("st")
    result = subprocess.run(
        [
            str(st),
            "run",
            f"{planner_url}/openapi.json",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "25",
            "--seed",
            "1",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,  # schemathesis keeps a cache in its working directory; not in the repo
    )
    assert result.returncode == 0, result.stdout[-3000:]
