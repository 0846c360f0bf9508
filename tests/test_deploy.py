"""The lab deployment files: no secret on a command line or at a default, every service scraped, nothing local baked
into an image, the agent's unit runs the agent's own program."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "deploy/compose/compose.yaml").read_text())
AGENT = yaml.safe_load((ROOT / "deploy/compose/agent.yaml").read_text())


def test_the_bus_wants_a_token_that_is_not_on_its_command_line() -> None:
    nats = COMPOSE["services"]["nats"]
    assert "token" not in " ".join(nats["command"])
    assert "authorization { token:" in COMPOSE["configs"]["nats-conf"]["content"]
    for name in ("planner", "reporter", "loadgen", "switch-poller"):
        environment = {**COMPOSE["x-service"]["environment"], **COMPOSE["services"][name].get("environment", {})}
        assert "KVBENCH_NATS_TOKEN" in environment, name
    assert "KVBENCH_NATS_TOKEN" in AGENT["services"]["node-agent"]["environment"]


def test_no_default_password_and_every_service_scraped() -> None:
    assert "?" in COMPOSE["services"]["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]  # required, no default
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = {t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    for name in ("planner", "reporter", "loadgen", "switch-poller"):
        assert any(t.startswith(f"{name}:") for t in targets), name
    fixed = {"loadgen": "KVBENCH_LOADGEN_OPS_PORT", "switch-poller": "KVBENCH_SWITCH_POLLER_OPS_PORT"}
    assert {f"{n}:{COMPOSE['services'][n]['environment'][k]}" for n, k in fixed.items()} <= targets


def test_images_get_nothing_local() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", ".kvbench", "demo-output", ".git", "deploy/compose/.env"} <= ignored


def test_the_agent_unit_runs_the_agents_own_program() -> None:
    unit = (ROOT / "deploy/systemd/kvbench-agent.service").read_text()
    scripts = tomllib.loads((ROOT / "services/node-agent/pyproject.toml").read_text())["project"]["scripts"]
    assert "kvbench-agent" in scripts
    assert "/bin/kvbench-agent --config /etc/kvbench/agent.env" in unit


def test_the_agent_container_can_start_engines_and_see_the_gpus() -> None:
    """The containerised agent (deploy/compose/agent.yaml) starts engines with `docker run` on the host's daemon: its
    image has the CLI, it sees the GPUs it registers, and the model cache it checks is the one the engines get (docker
    mounts host paths, so the cache sits at the host's own path in both)."""
    agent = AGENT["services"]["node-agent"]
    dockerfile = (ROOT / "deploy/docker/service.Dockerfile").read_text()
    assert "FROM docker:" in dockerfile
    assert 'if [ "$SERVICE" = "kvbench-node-agent" ]; then install -m 0755 /tmp/docker-cli /usr/local/bin/docker' in (
        dockerfile
    )
    assert "/var/run/docker.sock:/var/run/docker.sock" in agent["volumes"]
    (gpus,) = agent["deploy"]["resources"]["reservations"]["devices"]
    assert gpus["driver"] == "nvidia"
    assert "utility" in agent["environment"]["NVIDIA_DRIVER_CAPABILITIES"]
    hf_home = agent["environment"]["HF_HOME"]
    assert f"{hf_home}:{hf_home}" in agent["volumes"]
    assert "devices" not in agent  # no /dev/infiniband required: machines without it run the same file
    assert "/var/lib/kvbench/agent:/var/lib/kvbench/agent" in agent["volumes"]
    assert agent["environment"]["KVBENCH_NODE_AGENT_STATE_DIR"] == "/var/lib/kvbench/agent"
