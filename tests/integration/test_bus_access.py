"""The bus's users and their permissions (kvbench_core.access) on a real NATS: a client with no credentials is refused,
an agent reads only its own commands and writes only its own keys, and nobody but the planner and the switch poller
reads the secrets bucket. What a user may not do never happens: the message is not stored, the key not written."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest

from kvbench_contracts.commands import StartStack
from kvbench_contracts.envelope import Envelope
from kvbench_contracts.events import JobStarted, StackFailed
from kvbench_core.access import Role, nats_users_block, permissions_for
from kvbench_core.bus import Bus, NatsAuth
from kvbench_core.embedded import EmbeddedNats

pytestmark = pytest.mark.integration

USERS: dict[str, tuple[Role, str]] = {
    "admin": ("admin", ""),
    "planner": ("planner", ""),
    "loadgen-0": ("loadgen", ""),
    "reporter": ("reporter", ""),
    "agent-gpu1": ("node_agent", "gpu1"),
    "agent-gpu2": ("node_agent", "gpu2"),
}
PASSWORDS = {user: secrets.token_urlsafe(16) for user in USERS}


@pytest.fixture
async def bus_url(tmp_path: Path) -> AsyncIterator[str]:
    block = nats_users_block([
        (user, PASSWORDS[user], permissions_for(role, user, node_id=node, shard=user))
        for user, (role, node) in USERS.items()
    ])  # fmt: skip
    server = EmbeddedNats(tmp_path / "nats", users=block).start()
    try:
        async with Bus.connect(server.url, name="admin", auth=_auth("admin")) as admin:  # creates the streams
            await (await admin.kv("kvbench_secrets")).put("hf-token", b"kvb-box1:ciphertext")
        yield server.url
    finally:
        server.stop()


def _auth(user: str) -> NatsAuth:
    return NatsAuth(user=user, password=PASSWORDS[user])


def _start(node: str) -> StartStack:
    return StartStack(node_id=node, run_id="R", deployment_id="D", workload="w", stack="vllm-prefix-gpu", model="m")


async def _stored(url: str, stream: str, subject: str) -> bool:
    async with Bus.connect(url, name="admin-check", auth=_auth("admin")) as admin:
        try:
            await admin.js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            return False
        return True


async def test_a_client_without_credentials_or_with_another_users_password_is_refused(bus_url: str) -> None:
    for options in ({}, {"token": "guess"}, {"user": "agent-gpu1", "password": PASSWORDS["agent-gpu2"]}):
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(bus_url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2, **options)


async def test_an_agent_reads_only_its_own_commands_and_drives_no_other_machine(bus_url: str) -> None:
    received: list[object] = []

    async def handle(event: object) -> None:
        received.append(event)

    async with (
        Bus.connect(bus_url, name="planner", auth=_auth("planner")) as planner,
        Bus.connect(bus_url, name="gpu1", auth=_auth("agent-gpu1")) as gpu1,
    ):
        gpu1.subscribe([StartStack], handle, durable="node-agent-gpu1", filter_subject="kvbench.cmd.node.gpu1.>")
        await planner.publish(_start("gpu1"))  # the planner commands
        for _ in range(50):
            if received:
                break
            await gpu1.nc.flush()
            await asyncio.sleep(0.1)
        assert len(received) == 1
        # an agent commands no machine, not even its own (a denied request is never answered: short timeouts)
        with pytest.raises(nats.errors.TimeoutError):
            await gpu1.publish(_start("gpu2"), retry_for_s=0.5)
        assert not await _stored(bus_url, "KVBENCH_CMD", "kvbench.cmd.node.gpu2.start_stack")
        quick = gpu1.nc.jetstream(timeout=1.0)
        # nor reads another machine's commands through a consumer of its own making
        with pytest.raises(nats.errors.TimeoutError):
            await quick.pull_subscribe("kvbench.cmd.node.gpu2.>", durable="node-agent-gpu2", stream="KVBENCH_CMD")
        # it writes its own heartbeat, not another machine's; it reads no secret
        nodes = await quick.key_value("kvbench_nodes")
        await nodes.put("gpu1", b"{}")
        with pytest.raises(nats.errors.TimeoutError):
            await nodes.put("gpu2", b"{}")
        with pytest.raises(nats.errors.TimeoutError):
            await (await quick.key_value("kvbench_secrets")).get("hf-token")


async def test_a_load_generator_and_the_reporter_publish_only_what_they_produce(bus_url: str) -> None:
    async with (
        Bus.connect(bus_url, name="loadgen", auth=_auth("loadgen-0")) as loadgen,
        Bus.connect(bus_url, name="reporter", auth=_auth("reporter")) as reporter,
    ):
        await loadgen.publish(JobStarted(job_id="J1", run_id="R", workload="w", shard="loadgen-0"))  # its own fact
        assert await _stored(bus_url, "KVBENCH_CONTROL", "kvbench.job.J1.started")
        # it reads its peers' heartbeats (to leave a job's second shard to a free one), and writes only its own
        heartbeats = await loadgen.kv("kvbench_loadgens")
        await heartbeats.put("loadgen-0", b'{"loadgen_id": "loadgen-0", "at": 0}')
        async with Bus.connect(bus_url, name="admin-beat", auth=_auth("admin")) as admin:
            await (await admin.kv("kvbench_loadgens")).put("loadgen-9", b'{"loadgen_id": "loadgen-9", "at": 0}')
        assert sorted(await loadgen.kv_values("kvbench_loadgens")) == ["loadgen-0", "loadgen-9"]
        with pytest.raises(nats.errors.TimeoutError):
            await (await loadgen.nc.jetstream(timeout=1.0).key_value("kvbench_loadgens")).put("loadgen-9", b"{}")
        for client in (loadgen, reporter):
            with pytest.raises(nats.errors.TimeoutError):
                await client.publish(_start("gpu1"), retry_for_s=0.5)
        with pytest.raises(nats.errors.TimeoutError):
            await (await reporter.nc.jetstream(timeout=1.0).key_value("kvbench_secrets")).get("hf-token")
        with pytest.raises(nats.errors.TimeoutError):
            await reporter.publish(
                JobStarted(job_id="J2", run_id="R", workload="w", shard="loadgen-0"), retry_for_s=0.5
            )
    assert not await _stored(bus_url, "KVBENCH_CMD", "kvbench.cmd.node.gpu1.start_stack")


async def test_an_agent_cannot_speak_for_another_machine_nor_list_the_others_ids(bus_url: str) -> None:
    """A forged "stack failed" for another machine's deployment: refused by the bus under that machine's subject, and
    under the forger's own subject with the other's node id in its body, stored but refused by every reader. A stream's
    info with a subject filter (every run, job, deployment and secret name in it) is refused to an agent."""
    received: list[Envelope] = []

    async def handle(event: Envelope) -> None:
        received.append(event)

    forged = StackFailed(deployment_id="D1", run_id="R", node_id="gpu1", reason="forged")
    async with (
        Bus.connect(bus_url, name="planner", auth=_auth("planner")) as planner,
        Bus.connect(bus_url, name="gpu1", auth=_auth("agent-gpu1")) as gpu1,
        Bus.connect(bus_url, name="gpu2", auth=_auth("agent-gpu2")) as gpu2,
    ):
        planner.subscribe([StackFailed], handle, durable="planner", stream="KVBENCH_CONTROL")
        with pytest.raises(nats.errors.TimeoutError):
            await gpu2.publish(forged, retry_for_s=0.5)
        assert not await _stored(bus_url, "KVBENCH_CONTROL", forged.subject())
        # the body names gpu1, the subject (the only part the bus checks) gpu2's own
        own_subject = forged.model_copy(update={"node_id": "gpu2"}).subject()
        await gpu2.js.publish(own_subject, forged.to_bytes())
        assert await _stored(bus_url, "KVBENCH_CONTROL", own_subject)
        await gpu1.publish(StackFailed(deployment_id="D1", run_id="R", node_id="gpu1", reason="its own"))
        for _ in range(50):
            if received:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # the forged one, published first, would have been read by now
        assert [(e.node_id, e.reason) for e in received if isinstance(e, StackFailed)] == [("gpu1", "its own")]
        quick = gpu2.nc.jetstream(timeout=1.0)
        for stream in ("KVBENCH_CONTROL", "KVBENCH_CMD", "KV_kvbench_secrets", "KV_kvbench_runs"):
            with pytest.raises(nats.errors.TimeoutError):
                await quick.stream_info(stream, subjects_filter=">")
