"""The planner's REST API on a real NATS: review online vs offline, groups, secrets, auth, bad input."""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kvbench_core.sealing import SecretsKey
from kvbench_core.settings import load_settings
from kvbench_planner.api import create_app
from kvbench_planner.settings import PlannerSettings
from kvbench_planner.validation import load_cluster_file, review_text

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t0ken-for-tests"


SECRETS_KEY = base64.b64encode(bytes(range(32))).decode()


@pytest.fixture
def client(nats_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("KVBENCH_NATS_URL", nats_url)
    monkeypatch.setenv("KVBENCH_PLANNER_API_TOKEN", TOKEN)
    monkeypatch.setenv("KVBENCH_PLANNER_NODE_WAIT_S", "60")  # a run waits for agents, so it can be cancelled
    monkeypatch.setenv("KVBENCH_SECRETS_KEY", SECRETS_KEY)
    with TestClient(create_app(load_settings(PlannerSettings))) as test_client:
        yield test_client


AUTH = {"Authorization": f"Bearer {TOKEN}"}
YAML = {"Content-Type": "application/yaml"}

BAD_PLANS = [
    b"version: 1\nname: x\nworkloads:\n  - {name: a, strategy: split, stack: vllm-pd-nixl,"
    b" cluster: {sim: {machines: 1}}}\n",
    b"version: 1\nname: x\nworkloads:\n  - {name: a, strategy: own_cache, stack: nope, cluster: {sim: {}}, extra: 1}\n",
    b"version: 1\nname: x\nworkloads:\n  - {name: a, strategy: own_cache, stack: trtllm-reuse, engine: {name: trtllm},"
    b" cluster: {sim: {gpu: MI300X}}, traffic: {shape: shared_prompt, duration_s: 900}}\n",
]


def test_api_and_offline_review_agree(client: TestClient) -> None:
    documents = [p.read_bytes() for p in sorted((ROOT / "examples").glob("*.yaml"))] + BAD_PLANS
    for document in documents:
        online = client.post("/v1/plans/validate", content=document, headers=YAML)
        offline = review_text(document).as_dict()
        assert online.status_code == (200 if offline["valid"] else 422)
        assert online.json() == json.loads(json.dumps(offline)), document[:80]


def test_bad_input_gets_a_clear_4xx_and_changes_nothing(client: TestClient) -> None:
    before = client.get("/v1/runs", headers=AUTH).json()
    cases = [b"version: [1", b"[1, 2]", b'{"version": 1, "name": "x", "workloads": "no"}', b"\xff\xfe"]
    for body in cases:
        response = client.post("/v1/runs", content=body, headers={**YAML, **AUTH})
        assert response.status_code == 422, body
        entries = response.json()["errors"]
        assert entries
        assert all(e["message"] and e["fix"] for e in entries)
    huge = client.post("/v1/runs", content=b"#" * 2_000_000, headers={**YAML, **AUTH})
    assert huge.status_code == 413
    assert client.get("/v1/runs", headers=AUTH).json() == before


def test_reads_that_show_plans_machines_or_switches_need_the_token_too(client: TestClient) -> None:
    for path in ("/v1/runs", "/v1/nodes", "/v1/cluster-groups", "/v1/secrets", "/v1/switches"):
        assert client.get(path).status_code == 401, path
        assert client.get(path, headers=AUTH).status_code == 200, path
    assert client.get("/v1/catalog/stacks").status_code == 200  # the catalog is public


def test_mutations_need_the_bearer_token(client: TestClient) -> None:
    # 64 simulated machines, which no test registers: the run waits for them until it is cancelled. With the demo's
    # two, the run failed before the cancel once in CI; most likely it took a simulated machine that another test on
    # this worker's bus had left registered for a few seconds, and failed when that machine went
    demo = (ROOT / "examples" / "demo.yaml").read_bytes().replace(b"sim: {machines: 2,", b"sim: {machines: 64,")
    assert b"machines: 64" in demo
    assert client.post("/v1/runs", content=demo, headers=YAML).status_code == 401
    assert client.post("/v1/runs", content=demo, headers={**YAML, "Authorization": "Bearer wrong"}).status_code == 401
    # a token of non-ASCII bytes is refused like any wrong one (it was a 500)
    raw = {b"content-type": b"application/yaml", b"authorization": "Bearer caf\u00e9".encode()}
    assert client.post("/v1/runs", content=demo, headers=raw).status_code == 401
    created = client.post("/v1/runs", content=demo, headers={**YAML, **AUTH})
    assert created.status_code == 201
    run_id = created.json()["run_id"]
    run = client.get(f"/v1/runs/{run_id}", headers=AUTH).json()
    assert len(run["jobs"]) == 9  # three workloads, three repeats
    cancelled = client.post(f"/v1/runs/{run_id}/cancel", headers=AUTH).json()
    assert cancelled["status"] == "cancelled", cancelled["reasons"]
    (reason,) = cancelled["reasons"]
    assert reason["code"] == "cancelled"
    assert "through the planner's API" in reason["message"]
    assert "0 of 9 jobs had finished" in reason["message"]
    assert {j["status"] for j in cancelled["jobs"]} == {"cancelled"}


def test_cluster_groups_from_registered_machines(client: TestClient) -> None:
    node = f"gpu-{uuid.uuid4().hex[:6]}"
    unknown = client.post("/v1/cluster-groups", json={"name": "lab", "nodes": [node]}, headers=AUTH)
    assert unknown.status_code == 422
    assert unknown.json()["detail"][0]["code"] == "unknown_node"
    inventory = {
        "node_id": node,
        "hostname": "h",
        "simulated": False,
        "vendor": "nvidia",
        "gpu_model": "L40S",
        "gpus": 2,
        "gpu_memory_gb": 48,
        "ram_gb": 256,
        "cpus": 32,
        "group": None,
        "rdma": [{"device": "mlx5_0", "state": "ACTIVE"}],
    }
    portal = client.portal
    assert portal is not None
    bus = client.app.state.bus  # type: ignore[attr-defined]

    async def register() -> None:
        kv = await bus.kv("kvbench_inventory")
        await kv.put(node, json.dumps(inventory).encode())

    portal.call(register)
    name = f"lab-{node[-6:]}"
    for _ in range(100):  # the planner sees the registration through its KV watcher, a moment later
        created = client.post("/v1/cluster-groups", json={"name": name, "nodes": [node]}, headers=AUTH)
        if created.status_code == 201:
            break
        time.sleep(0.05)
    assert created.status_code == 201
    groups = {g["name"]: g for g in client.get("/v1/cluster-groups", headers=AUTH).json()}
    assert groups[name]["machines"][0]["gpu_model"] == "L40S"
    assert groups[name]["machines"][0]["up"] is False
    plan = (
        f"version: 1\nname: g\nworkloads:\n  - {{name: a, strategy: own_cache, stack: vllm-prefix-gpu, "
        f"cluster: {{group: {name}}}, engine: {{tensor_parallel_size: 4}}, "
        f"traffic: {{shape: shared_prompt, duration_s: 900}}}}\n"
    ).encode()
    review = client.post("/v1/plans/validate", content=plan, headers=YAML).json()
    assert [e["code"] for e in review["errors"]] == ["tp_exceeds_gpus"]
    cluster_file, _ = load_cluster_file(
        json.dumps(
            {
                "groups": {
                    name: [
                        {
                            "name": node,
                            "vendor": "nvidia",
                            "gpu_model": "L40S",
                            "gpus": 2,
                            "ram_gb": 256,
                            "rdma": [{"device": "mlx5_0", "state": "ACTIVE"}],
                        }
                    ]
                }
            }
        ).encode()
    )
    assert review_text(plan, cluster_file.get).as_dict() == review
    assert client.delete(f"/v1/cluster-groups/{name}", headers=AUTH).status_code == 204
    assert client.delete(f"/v1/cluster-groups/{name}", headers=AUTH).status_code == 404


def test_secrets_are_write_only(client: TestClient) -> None:
    value = "hf_" + uuid.uuid4().hex
    assert client.put("/v1/secrets/hf-token", json={"value": value}, headers=AUTH).status_code == 204
    listed = client.get("/v1/secrets", headers=AUTH)
    assert {"name": "hf-token"} in listed.json()
    assert value not in listed.text
    assert client.put("/v1/secrets/Bad Name", json={"value": "x"}, headers=AUTH).status_code == 422
    gated = (
        b"version: 1\nname: s\nworkloads:\n  - {name: a, strategy: own_cache, stack: vllm-prefix-gpu, "
        b"hf_token_secret: missing-one, cluster: {sim: {}}, traffic: {shape: shared_prompt, duration_s: 900}}\n"
    )
    review = client.post("/v1/plans/validate", content=gated, headers=YAML).json()
    assert [e["code"] for e in review["errors"]] == ["unknown_secret"]
    # at rest, the bucket holds ciphertext that only the planner's key opens
    stored = client.portal.call(_stored, client, "hf-token")  # type: ignore[union-attr]  # on the app's own loop
    assert value.encode() not in stored
    assert SecretsKey(base64.b64decode(SECRETS_KEY)).decrypt(stored) == value
    assert client.delete("/v1/secrets/hf-token", headers=AUTH).status_code == 204


async def _stored(client: TestClient, name: str) -> bytes:
    """What a NATS client reading the secrets bucket gets (the planner's own bus, as any client with the token)."""
    bus = client.app.state.bus  # type: ignore[attr-defined]
    entry = await (await bus.kv("kvbench_secrets")).get(name)
    return bytes(entry.value or b"")


def test_a_planner_without_a_secrets_key_stores_no_secret(nats_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVBENCH_NATS_URL", nats_url)
    monkeypatch.setenv("KVBENCH_PLANNER_API_TOKEN", TOKEN)
    monkeypatch.delenv("KVBENCH_SECRETS_KEY", raising=False)
    monkeypatch.delenv("KVBENCH_SECRETS_KEY_FILE", raising=False)
    with TestClient(create_app(load_settings(PlannerSettings))) as keyless:
        refused = keyless.put("/v1/secrets/hf-token-keyless", json={"value": "hf_x"}, headers=AUTH)
        assert refused.status_code == 409
        (problem,) = refused.json()["detail"]
        assert problem["field"] == "KVBENCH_SECRETS_KEY_FILE"
        assert "openssl rand -base64 32" in problem["fix"]
        assert {"name": "hf-token-keyless"} not in keyless.get("/v1/secrets", headers=AUTH).json()


def test_switches_are_connected_with_a_credential_that_is_never_returned(client: TestClient) -> None:
    credential = "kvro:" + uuid.uuid4().hex + ":" + uuid.uuid4().hex
    body = {"name": "leaf1", "address": "10.0.0.1", "credential": credential, "ignore_ports": ["mgmt0"]}
    assert client.post("/v1/switches", json=body).status_code in (401, 403)  # a token is required
    created = client.post("/v1/switches", json=body, headers=AUTH)
    assert created.status_code == 201, created.text
    assert credential not in created.text
    listed = client.get("/v1/switches", headers=AUTH)
    # other tests' deployments share this NATS and may have connected their simulated leaf
    (leaf1,) = [s for s in listed.json()["connected"] if s["name"] == "leaf1"]
    assert leaf1["ignore_ports"] == ["mgmt0"]
    assert credential not in listed.text
    assert {"name": "switch-leaf1"} in client.get(
        "/v1/secrets", headers=AUTH
    ).json()  # stored as a secret, by name only
    bad = client.post("/v1/switches", json={**body, "snmp_version": "1"}, headers=AUTH)
    assert bad.status_code == 422
    assert credential not in bad.text
    assert client.delete("/v1/switches/leaf1", headers=AUTH).status_code == 204
    assert client.delete("/v1/switches/leaf1", headers=AUTH).status_code == 404
    assert {"name": "switch-leaf1"} not in client.get("/v1/secrets", headers=AUTH).json()


def test_catalog_says_why_a_stack_cannot_be_chosen(client: TestClient) -> None:
    rows = {
        r["id"]: r
        for r in client.get(
            "/v1/catalog/stacks", params={"engine": "vllm", "vendor": "amd", "version": "0.20.0"}
        ).json()
    }
    assert rows["vllm-prefix-gpu"]["selectable"] is True
    assert "runs on trtllm" in rows["trtllm-reuse"]["why_not"]
    assert "NVIDIA" in rows["trtllm-reuse"]["why_not"]
    assert "0.21.0 or newer" in rows["vllm-pd-mori"]["why_not"]
    assert len(rows) == 29
    assert rows["vllm-mooncake-store"]["shared_store"] == "mooncake"  # the whole catalog row, not only the verdict
    assert rows["vllm-mooncake-store"]["tiers"] == ["gpu"]
    locked = client.get("/v1/catalog/orchestrators").json()
    assert {o["id"] for o in locked if o["locked"]} == {"dynamo", "llm-d", "production-stack"}
    docs = client.get("/docs")  # served offline: its scripts come from the planner itself, not a CDN
    assert docs.status_code == 200
    assert "cdn." not in docs.text
    script = re.search(r'src="([^"]+swagger-ui-bundle\.js)"', docs.text)
    assert script is not None
    assert client.get(script.group(1)).status_code == 200
    openapi = client.get("/openapi.json")
    assert openapi.status_code == 200
    # responses are described, not only requests
    ok = openapi.json()["paths"]["/v1/catalog/stacks"]["get"]["responses"]["200"]["content"]["application/json"]
    assert ok["schema"]["items"]["$ref"].endswith("/StackRow")


def test_a_groups_machines_are_listed_as_people_count_them(client: TestClient) -> None:
    """Eleven machines named n-1 to n-11: n-2 comes before n-10 (a string sort put n-10 and n-11 second and third),
    in the group the API returns, in the listing, and so in the order a workload's roles are placed on them."""
    prefix = f"n{uuid.uuid4().hex[:4]}-"
    nodes = [f"{prefix}{i}" for i in (10, 2, 11, 1, 3, 4, 5, 6, 7, 8, 9)]
    portal = client.portal
    assert portal is not None
    bus = client.app.state.bus  # type: ignore[attr-defined]

    async def register() -> None:
        kv = await bus.kv("kvbench_inventory")
        for node in nodes:
            inventory = {"node_id": node, "hostname": node, "simulated": False, "vendor": "nvidia",
                         "gpu_model": "L40S", "gpus": 1, "gpu_memory_gb": 48, "ram_gb": 64, "cpus": 8}  # fmt: skip
            await kv.put(node, json.dumps(inventory).encode())

    portal.call(register)
    name = f"lab-{prefix}"
    for _ in range(100):  # the planner sees the registrations through its KV watcher, a moment later
        created = client.post("/v1/cluster-groups", json={"name": name, "nodes": nodes}, headers=AUTH)
        if created.status_code == 201:
            break
        time.sleep(0.05)
    assert created.status_code == 201, created.text
    counted = [f"{prefix}{i}" for i in range(1, 12)]
    assert created.json()["nodes"] == counted
    groups = {g["name"]: g for g in client.get("/v1/cluster-groups", headers=AUTH).json()}
    assert [m["name"] for m in groups[name]["machines"]] == counted
    assert client.delete(f"/v1/cluster-groups/{name}", headers=AUTH).status_code == 204
