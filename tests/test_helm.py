"""The Helm chart (deploy/helm/kvbench) lints, renders and validates against the Kubernetes API schemas, with the
real helm binary (`make tools` fetches it pinned; KVBENCH_HELM names it) and kubernetes-validate's bundled schemas.

Rendering with the NATS dependency on needs the official NATS chart's package, which only its own repository serves
(not reachable here): those renders use the chart with the dependency taken out and an external bus (nats.enabled
false), which is also how a cluster with its own NATS installs it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "kvbench"
KUBERNETES = "1.30"
EXTERNAL_BUS = ["--set", "nats.enabled=false", "--set", "natsUrl=nats://nats.example:4222"]


@pytest.fixture(scope="module")
def helm() -> str:
    path = os.environ.get("KVBENCH_HELM") or shutil.which("helm") or ""
    assert Path(path).is_file(), "no helm binary: run `make tools` (it fetches the pinned one)"
    return path


@pytest.fixture(scope="module")
def chart_without_dependency(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("chart") / "kvbench"
    shutil.copytree(CHART, copy)
    chart = yaml.safe_load((copy / "Chart.yaml").read_text())
    assert [d["name"] for d in chart.pop("dependencies")] == ["nats"]
    (copy / "Chart.yaml").write_text(yaml.safe_dump(chart))
    return copy


def render(helm: str, chart: Path, *options: str) -> list[dict[str, Any]]:
    result = subprocess.run([helm, "template", "kvb", str(chart), *options], capture_output=True, text=True,
                            check=False, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_the_chart_lints(helm: str) -> None:
    result = subprocess.run([helm, "lint", str(CHART), *EXTERNAL_BUS], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_every_rendered_manifest_is_valid_kubernetes(helm: str, chart_without_dependency: Path) -> None:
    docs = render(helm, chart_without_dependency, *EXTERNAL_BUS)
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
    assert kinds == [
        "ConfigMap/kvb-kvbench-dashboards",
        "ConfigMap/kvb-kvbench-datasources",
        "DaemonSet/kvb-kvbench-node-agent",
        "Deployment/kvb-kvbench-loadgen",
        "Deployment/kvb-kvbench-planner",
        "Deployment/kvb-kvbench-reporter",
        "Deployment/kvb-kvbench-switch-poller",
        "Service/kvb-kvbench-planner",
        "Service/kvb-kvbench-reporter",
    ]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_agent_runs_on_gpu_nodes_with_the_hosts_network_and_secrets_come_from_secrets(
    helm: str, chart_without_dependency: Path
) -> None:
    docs = {d["kind"] + "/" + d["metadata"]["name"]: d for d in render(helm, chart_without_dependency, *EXTERNAL_BUS)}
    agent = docs["DaemonSet/kvb-kvbench-node-agent"]["spec"]["template"]["spec"]
    assert agent["hostNetwork"] is True
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert agent["tolerations"][0]["key"] == "nvidia.com/gpu"
    container = agent["containers"][0]
    assert set(container["securityContext"]["capabilities"]["add"]) == {"NET_ADMIN", "IPC_LOCK"}
    agent_env = {e["name"]: e.get("value") for e in container["env"]}
    assert agent_env["KVBENCH_NODE_AGENT_ALLOWED_IMAGES"] == ""  # by default a plan cannot choose an image
    allowing = render(helm, chart_without_dependency, *EXTERNAL_BUS, "--set",
                      "nodeAgent.allowedImages={vllm/vllm-openai:*,lmcache/vllm-openai:*}")  # fmt: skip
    daemonset = next(d for d in allowing if d["kind"] == "DaemonSet")
    env = {e["name"]: e.get("value") for e in daemonset["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KVBENCH_NODE_AGENT_ALLOWED_IMAGES"] == "vllm/vllm-openai:*,lmcache/vllm-openai:*"
    for name, doc in docs.items():
        if doc["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for env in doc["spec"]["template"]["spec"]["containers"][0]["env"]:
            if "TOKEN" in env["name"] or env["name"] == "KVBENCH_DATABASE_URL":
                assert "valueFrom" in env, (name, env["name"])  # never a value in the manifest
    loadgen = docs["Deployment/kvb-kvbench-loadgen"]["spec"]
    planner = docs["Deployment/kvb-kvbench-planner"]["spec"]["template"]["spec"]["containers"][0]
    planner_env = {e["name"]: e.get("value") for e in planner["env"]}
    assert planner_env["KVBENCH_PLANNER_LOADGEN_SHARDS"] == str(loadgen["replicas"])  # one shard per replica


def test_the_values_schema_refuses_a_bad_value(helm: str, chart_without_dependency: Path) -> None:
    result = subprocess.run([helm, "template", "kvb", str(chart_without_dependency), *EXTERNAL_BUS, "--set",
                             "nodeAgent.group=Bad Group"], capture_output=True, text=True, check=False)  # fmt: skip
    assert result.returncode != 0
    assert "nodeAgent.group" in result.stderr
    assert "does not match pattern" in result.stderr.lower()


def test_a_chart_without_a_bus_says_what_to_set(helm: str, chart_without_dependency: Path) -> None:
    result = subprocess.run([helm, "template", "kvb", str(chart_without_dependency), "--set", "nats.enabled=false"],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert result.returncode != 0
    assert "set natsUrl, or nats.enabled: true" in result.stderr


def test_the_dependency_is_the_official_nats_chart_clustered_with_jetstream_files() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["dependencies"] == [
        {
            "name": "nats",
            "version": "1.2.x",
            "repository": "https://nats-io.github.io/k8s/helm/charts/",
            "condition": "nats.enabled",
        }
    ]
    nats = yaml.safe_load((CHART / "values.yaml").read_text())["nats"]
    assert nats["config"]["cluster"] == {"enabled": True, "replicas": 3}
    assert nats["config"]["jetstream"]["fileStore"]["enabled"] is True
    assert nats["config"]["merge"]["authorization"]["token"] == "<< $KVBENCH_NATS_TOKEN >>"
    assert "secretKeyRef" in nats["container"]["env"]["KVBENCH_NATS_TOKEN"]["valueFrom"]


def test_the_charts_dashboards_are_the_ones_grafana_provisioning_uses() -> None:
    ours = {p.name: p.read_text() for p in (CHART / "dashboards").glob("*.json")}
    provisioned = {p.name: p.read_text() for p in (ROOT / "deploy" / "grafana" / "dashboards").glob("*.json")}
    assert ours == provisioned


def test_the_services_replicate_streams_three_times_on_the_clustered_bus(
    helm: str, chart_without_dependency: Path
) -> None:
    def replicas(*options: str) -> set[str]:
        docs = render(helm, chart_without_dependency, *options)
        return {
            env["value"]
            for d in docs
            if d["kind"] in ("Deployment", "DaemonSet")
            for container in d["spec"]["template"]["spec"]["containers"]
            for env in container.get("env", [])
            if env["name"] == "KVBENCH_NATS_REPLICAS"
        }

    assert replicas() == {"3"}  # the NATS chart, clustered with three servers: every service asks for R3
    assert replicas(*EXTERNAL_BUS) == {"1"}
    assert replicas(*EXTERNAL_BUS, "--set", "natsReplicas=3") == {"3"}


def test_the_secrets_key_reaches_only_the_planner_and_the_switch_poller(
    helm: str, chart_without_dependency: Path
) -> None:
    holders = {
        d["metadata"]["name"]
        for d in render(helm, chart_without_dependency, *EXTERNAL_BUS)
        if d["kind"] in ("Deployment", "DaemonSet")
        for container in d["spec"]["template"]["spec"]["containers"]
        for env in container.get("env", [])
        if env["name"] == "KVBENCH_SECRETS_KEY"
    }
    assert holders == {"kvb-kvbench-planner", "kvb-kvbench-switch-poller"}


def test_an_agent_built_on_the_engines_image_gets_the_nodes_gpus(helm: str, chart_without_dependency: Path) -> None:
    """With the process launcher the engines run inside the agent's pod: the pod's image can be one built on the
    engines' image, and the node's GPUs are allocated to it through its resources."""
    default = render(helm, chart_without_dependency, *EXTERNAL_BUS)
    agent = next(d for d in default if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert agent["image"] == "ghcr.io/kvbench/kvbench-node-agent:0.1.0"
    docs = render(helm, chart_without_dependency, *EXTERNAL_BUS, "--set", "nodeAgent.image=registry.lab/agent-vllm:1",
                  "--set-string", "nodeAgent.resources.limits.nvidia\\.com/gpu=8")  # fmt: skip
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    kubernetes_validate.validate(daemonset, KUBERNETES, strict=True)
    agent = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert agent["image"] == "registry.lab/agent-vllm:1"
    assert agent["resources"]["limits"]["nvidia.com/gpu"] == "8"
