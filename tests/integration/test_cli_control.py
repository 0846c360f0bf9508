"""The CLI covers what the planner's API does: runs, cancel, nodes, groups, secrets, switches, against a real
planner with an API token (the one KVBENCH_API_TOKEN of both sides)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvbench_core.procs import free_port, stop_pid, wait_port

pytestmark = pytest.mark.integration

TOKEN = "cli-control-test-token"


@pytest.fixture
def planner(nats_url: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "KVBENCH_NATS_URL": nats_url, "KVBENCH_PLANNER_PORT": str(port), "KVBENCH_API_TOKEN": TOKEN,
           "KVBENCH_PLANNER_NODE_WAIT_S": "60",
           "KVBENCH_SECRETS_KEY": base64.b64encode(os.urandom(32)).decode()}  # fmt: skip
    with open(tmp_path / "planner.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kvbench_planner"], env=env, stdout=log, stderr=log,
                                start_new_session=True)  # fmt: skip
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_pid(proc.pid, group=True)


def kvbench(url: str, *args: str, token: str | None = TOKEN, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVBENCH_")}
    if token:
        env["KVBENCH_API_TOKEN"] = token
    command = [sys.executable, "-c", "from kvbench_cli.main import main; main()", *args, "--api", url,
               "--report-api", url]  # fmt: skip
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60, env=env, check=False)


def test_secrets_are_set_from_stdin_listed_by_name_and_never_shown(planner: str) -> None:
    stored = kvbench(planner, "secrets", "set", "hf-token", stdin="hf_secret_value_123\n")
    assert stored.returncode == 0, stored.stderr
    assert "hf_secret_value_123" not in stored.stdout + stored.stderr
    listed = kvbench(planner, "secrets", "list", "--json")
    assert {"name": "hf-token"} in json.loads(listed.stdout)
    assert "hf_secret_value_123" not in listed.stdout
    refused = kvbench(planner, "secrets", "set", "Bad Name", stdin="x\n")
    assert refused.returncode == 2
    assert "lowercase letters" in refused.stderr
    assert kvbench(planner, "secrets", "delete", "hf-token").returncode == 0


def test_without_the_token_a_mutation_says_which_variable_to_set(planner: str) -> None:
    result = kvbench(planner, "secrets", "set", "x", token=None, stdin="v\n")
    assert result.returncode == 1
    assert "KVBENCH_API_TOKEN" in result.stderr


def test_runs_cancel_nodes_groups_switches(planner: str, tmp_path: Path) -> None:
    demo = Path(__file__).resolve().parents[2] / "examples" / "demo.yaml"
    submitted = kvbench(planner, "run", str(demo))
    assert submitted.returncode == 0, submitted.stderr
    run_id = re.search(r"run (\w+) submitted", submitted.stdout)
    assert run_id is not None, submitted.stdout
    runs = {r["run_id"]: r for r in json.loads(kvbench(planner, "runs", "--json").stdout)}
    assert runs[run_id.group(1)]["plan_name"] == "demo-prefix-cache"
    cancelled = kvbench(planner, "cancel", run_id.group(1))
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled" in cancelled.stdout
    assert kvbench(planner, "cancel", "01NOSUCHRUN").returncode == 1
    assert kvbench(planner, "nodes", "--json").returncode == 0
    unknown = kvbench(planner, "groups", "create", "lab", "no-such-node")
    assert unknown.returncode == 2
    assert "unknown_node" in unknown.stderr
    assert kvbench(planner, "groups", "list").returncode == 0
    assert json.loads(kvbench(planner, "switches", "list", "--json").stdout)["connected"] == []
