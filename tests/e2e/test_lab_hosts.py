"""Two "GPU hosts" of their own, each a network namespace with its own address on a bridge, join a control plane
started with `kvbench up --listen --nats-tls`: each machine's agent gets a bus user of its own (`kvbench
agent-credentials`), its password and the bus's certificate authority copied to it, and is started with
`kvbench-agent`; they register into one cluster group over TLS, and a plan on that group runs to a report. Needs root
and iproute2."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from kvbench_cli.api import Endpoints, fetch_report
from kvbench_cli.deployment import LocalDeployment
from kvbench_cli.main import main

from .conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """A bridge on this machine (the control plane's address) and two namespaces cabled to it."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (network namespaces)")
    tag = secrets.token_hex(2)
    octet = int(tag, 16) % 200 + 20
    bridge, control = f"kvbr{tag}", f"10.{octet}.77.1"
    hosts = [(f"kvlab{tag}{i}", f"10.{octet}.77.{i + 2}") for i in range(2)]
    _ip("link", "add", bridge, "type", "bridge")
    try:
        _ip("addr", "add", f"{control}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, (ns, address) in enumerate(hosts):
            _ip("netns", "add", ns)
            _ip("link", "add", f"kvh{tag}{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", f"kvh{tag}{i}", "master", bridge, "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield control, hosts
    finally:
        for ns, _ in hosts:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], check=False, capture_output=True)


def test_agents_on_two_hosts_join_a_listening_control_plane_and_run_a_plan(
    two_hosts: tuple[str, list[tuple[str, str]]], tmp_path: Path, fresh_database: str
) -> None:
    control, hosts = two_hosts
    deployment = LocalDeployment(tmp_path / "control")
    agents: list[subprocess.Popen[bytes]] = []
    try:
        state = deployment.up(sim_machines=0, database_url=fresh_database, listen=control, tie_to_parent=True,
                              nats_tls=True)  # fmt: skip
        assert state.nats_url.startswith(f"tls://{control}:")  # TLS on the bus, certificates made by up
        assert state.nats_ca_file
        assert state.api_url.startswith(f"http://{control}:")
        assert state.nats_users  # the bus takes only its users
        assert state.api_token_file
        token = Path(state.api_token_file).read_text().strip()
        clean = {k: v for k, v in os.environ.items() if not k.startswith("KVBENCH_")}
        for ns, address in hosts:
            # what an operator does for each machine: make its agent's bus user on the control machine, copy the
            # password file there (mode 600); the running bus takes the new user without a restart
            with pytest.raises(SystemExit) as made:
                main(["--state-dir", str(tmp_path / "control"), "agent-credentials", ns])
            assert made.value.code == 0
            host_dir = tmp_path / ns
            host_dir.mkdir()
            password = host_dir / "nats-password"
            shutil.copy(tmp_path / "control" / "secrets" / "nats-users" / f"agent-{ns}", password)
            password.chmod(0o600)
            shutil.copy(state.nats_ca_file, host_dir / "nats-ca.pem")  # the bus's authority, to check its certificate
            argv = ["ip", "netns", "exec", ns, sys.executable, "-m", "kvbench_node_agent.cli", "--nats", state.nats_url,
                    "--nats-user", f"agent-{ns}", "--nats-password-file", str(password),
                    "--nats-ca-file", str(host_dir / "nats-ca.pem"), "--node-id", ns,
                    "--group", "lab", "--address", address, "--simulated", "--sim-gpus", "1",
                    "--state-dir", str(host_dir / "state")]  # fmt: skip
            with (host_dir / "agent.log").open("wb") as log:
                agents.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=clean))

        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(timeout=10) as client:
            deadline = time.monotonic() + 60
            while True:
                groups = {
                    g["name"]: g for g in client.get(f"{state.api_url}/v1/cluster-groups", headers=headers).json()
                }
                up = [m["name"] for m in groups.get("lab", {}).get("machines", []) if m["up"]]
                if len(up) == 2:
                    break
                logs = {ns: (tmp_path / ns / "agent.log").read_text()[-800:] for ns, _ in hosts}
                assert time.monotonic() < deadline, f"the agents did not join: {logs}"
                time.sleep(1)
            nodes = {
                b["inventory"]["node_id"]: b["inventory"]
                for b in client.get(f"{state.api_url}/v1/nodes", headers=headers).json()
            }
            assert {nodes[ns]["address"] for ns, _ in hosts} == {a for _, a in hosts}

            plan = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
            plan["name"] = "lab-hosts"
            defaults = plan["defaults"]
            defaults["cluster"] = {"group": "lab"}
            defaults["traffic"]["duration_s"] = 8
            defaults["traffic"]["arrivals"]["users"] = [2]
            defaults["measurement"]["warmup_s"] = 1
            defaults["measurement"]["repeats"] = 1
            plan["workloads"] = [w for w in plan["workloads"] if w["stack"] == "vllm-prefix-gpu"]
            created = client.post(f"{state.api_url}/v1/runs", content=yaml.safe_dump(plan).encode(),
                                  headers={**headers, "Content-Type": "application/yaml"})  # fmt: skip
            assert created.status_code == 201, created.text
            run_id = created.json()["run_id"]
            deadline = time.monotonic() + 240
            while (status := client.get(f"{state.api_url}/v1/runs/{run_id}", headers=headers).json())["status"] not in (
                "succeeded", "failed", "cancelled",
            ):  # fmt: skip
                assert time.monotonic() < deadline, status
                time.sleep(2)
            assert status["status"] == "succeeded", status
            assert sorted(status["nodes"]) == sorted(ns for ns, _ in hosts)  # the group's two hosts ran it
        report = fetch_report(Endpoints(state.api_url, state.report_url, token), run_id)
        # the control plane listens for other machines: its reads want the token, the reporter's too
        assert httpx.get(f"{state.report_url}/v1/runs/{run_id}/report").status_code == 401
        assert httpx.get(f"{state.api_url}/v1/runs/{run_id}").status_code == 401
        workload = report["workloads"][0]
        assert workload["requests"] > 0
    finally:
        for agent in agents:
            agent.terminate()
        for agent in agents:
            agent.wait(timeout=30)
        deployment.down(wipe=True)
