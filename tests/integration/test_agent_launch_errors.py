"""A stack that cannot start for a reason retrying would not change fails its run at once, with the error's words."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kvbench_contracts.commands import StartStack
from kvbench_contracts.envelope import utc_now
from kvbench_contracts.events import StackFailed
from kvbench_contracts.node import Heartbeat
from kvbench_contracts.plan import EngineSpec, SimCluster
from kvbench_core.bus import Bus
from kvbench_node_agent.agent import NodeAgent
from kvbench_node_agent.settings import NodeAgentSettings

pytestmark = pytest.mark.integration


async def test_an_unexpected_launch_error_is_a_stack_failure_not_a_retry(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = NodeAgentSettings(node_id="n-errors", state_dir=str(tmp_path), simulated=True)
    deployment = f"D{uuid.uuid4().hex[:8]}"
    async with Bus.connect(nats_url, name="t-launch-errors") as bus:
        agent = NodeAgent(settings, bus, CollectorRegistry())

        async def broken(_command: StartStack) -> None:
            raise ValueError("no simulator profile for model 'acme/secret'")

        monkeypatch.setattr(agent.sim, "start", broken)
        command = StartStack(node_id="n-errors", run_id="R1", deployment_id=deployment, workload="w",
                             stack="vllm-prefix-gpu", model="acme/secret", engine=EngineSpec(), sim=SimCluster(),
                             launcher="sim")  # fmt: skip
        await agent.handle(command)  # returns: the command is done with, not redelivered
        stored = await bus.js.get_last_msg(
            "KVBENCH_CONTROL", StackFailed.subject_filter(node_id="n-errors", deployment_id=deployment)
        )
    failed = StackFailed.model_validate_json(stored.data or b"")
    assert failed.deployment_id == deployment
    assert "ValueError: no simulator profile for model 'acme/secret'" in failed.reason
    assert deployment not in agent.deployments


async def test_an_image_the_machine_does_not_allow_fails_the_stack_with_the_setting_to_change(
    nats_url: str, tmp_path: Path
) -> None:
    """The plan's engine.args.image reaches a real machine only through its operator's allow-list: otherwise the
    stack fails at once, nothing is started, and the reason names the field and the agent's setting."""
    settings = NodeAgentSettings(node_id="n-images", state_dir=str(tmp_path))
    deployment = f"D{uuid.uuid4().hex[:8]}"
    async with Bus.connect(nats_url, name="t-allowlist") as bus:
        agent = NodeAgent(settings, bus, CollectorRegistry())
        command = StartStack(node_id="n-images", run_id="R1", deployment_id=deployment, workload="w",
                             stack="vllm-prefix-gpu", model="Qwen/Qwen3-8B",
                             engine=EngineSpec(args={"image": "evil/miner:latest"}), sim=SimCluster(),
                             launcher="docker")  # fmt: skip
        await agent.handle(command)
        stored = await bus.js.get_last_msg(
            "KVBENCH_CONTROL", StackFailed.subject_filter(node_id="n-images", deployment_id=deployment)
        )
    failed = StackFailed.model_validate_json(stored.data or b"")
    assert "n-images: engine.args.image: the machine does not run the image evil/miner:latest" in failed.reason
    assert "KVBENCH_NODE_AGENT_ALLOWED_IMAGES" in failed.reason
    assert agent.deployments == {}


async def test_the_hugging_face_token_reaches_only_the_agent_it_was_sealed_to(nats_url: str, tmp_path: Path) -> None:
    """The planner seals the stored token to the public key each agent heartbeats; that agent opens it, another
    cannot, and an agent started again (a new key) fails the stack with a reason instead of starting it without."""
    from kvbench_core.sealing import seal_for  # noqa: PLC0415
    from kvbench_node_agent.launchers.base import LaunchError  # noqa: PLC0415
    from kvbench_planner.conductor import _sealed_for  # noqa: PLC0415

    async with Bus.connect(nats_url, name="t-sealed") as bus:
        gpu1 = NodeAgent(NodeAgentSettings(node_id="gpu1", state_dir=str(tmp_path / "1")), bus, CollectorRegistry())
        gpu2 = NodeAgent(NodeAgentSettings(node_id="gpu2", state_dir=str(tmp_path / "2")), bus, CollectorRegistry())
        await gpu1.register()
        beat = await (await bus.kv("kvbench_nodes")).get("gpu1")  # what the planner reads its key from
    inventory = Heartbeat.model_validate_json(beat.value or b"").inventory.model_dump()
    assert inventory["public_key"] == gpu1.inventory.public_key
    sealed = _sealed_for(inventory, "hf_sealed_token")
    assert "hf_sealed_token" not in sealed
    command = StartStack(node_id="gpu1", run_id="R1", deployment_id="D1", workload="w", stack="vllm-prefix-gpu",
                         model="Qwen/Qwen3-8B", launcher="process", hf_token_secret="hf-token",
                         hf_token_sealed=sealed)  # fmt: skip
    assert gpu1._secret(command) == "hf_sealed_token"
    with pytest.raises(LaunchError, match="gpu2: the Hugging Face token could not be opened"):
        gpu2._secret(command.model_copy(update={"node_id": "gpu2"}))
    assert gpu1._secret(command.model_copy(update={"hf_token_sealed": None})) is None
    assert seal_for(str(gpu2.inventory.public_key), "x") != seal_for(str(gpu2.inventory.public_key), "x")


async def test_a_command_the_agent_cannot_read_fails_its_stack_at_once_with_why(nats_url: str, tmp_path: Path) -> None:
    """A StartStack this agent cannot decode (a planner of another kvbench version) is terminated on the bus, and
    the stand-up it names fails at once, with the decoding error and what to do, not at the planner's timeout."""
    import asyncio  # noqa: PLC0415
    import json  # noqa: PLC0415

    node = f"n-poison-{uuid.uuid4().hex[:6]}"
    deployment = f"D{uuid.uuid4().hex[:8]}"
    settings = NodeAgentSettings(node_id=node, state_dir=str(tmp_path), simulated=True)
    async with Bus.connect(nats_url, name="t-poison") as bus:
        agent = NodeAgent(settings, bus, CollectorRegistry())
        bus.subscribe([StartStack], agent.handle, durable=f"node-agent-{node}", batch=1,
                      filter_subject=f"kvbench.cmd.node.{node}.>", on_poison=agent.unreadable_command)  # fmt: skip
        command = StartStack(node_id=node, run_id="R1", deployment_id=deployment, workload="w",
                             stack="vllm-prefix-gpu", model="m", sim=SimCluster())  # fmt: skip
        wire = json.loads(command.to_bytes())
        wire["sizing"] = {"host_memory_gb": "lots"}  # what a newer planner's field might look like to this agent
        await bus.js.publish(f"kvbench.cmd.node.{node}.start_stack", json.dumps(wire).encode())
        await bus.js.publish(f"kvbench.cmd.node.{node}.start_stack", b"\xff not json")  # nothing names a run
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            try:
                stored = await bus.js.get_last_msg(
                    "KVBENCH_CONTROL", StackFailed.subject_filter(node_id=node, deployment_id=deployment)
                )
                break
            except Exception:
                assert asyncio.get_running_loop().time() < deadline, "the agent never answered the command"
                await asyncio.sleep(0.2)
    failed = StackFailed.model_validate_json(stored.data or b"")
    assert (failed.run_id, failed.node_id) == ("R1", node)
    assert f"The node agent on {node} could not read the start_stack command" in failed.reason
    assert "host_memory_gb" in failed.reason
    assert "same kvbench version" in failed.reason
    assert agent.deployments == {}


async def test_a_start_command_read_after_it_expired_starts_nothing(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent restarted after the planner gave up on a stack (a run cancelled meanwhile) starts no engine for it."""
    settings = NodeAgentSettings(node_id="n-expired", state_dir=str(tmp_path), simulated=True)
    launched: list[str] = []
    async with Bus.connect(nats_url, name="t-expired") as bus:
        agent = NodeAgent(settings, bus, CollectorRegistry())

        async def launch(command: StartStack) -> None:
            launched.append(command.deployment_id)
            raise AssertionError("an expired command was acted on")

        monkeypatch.setattr(agent, "_launch", launch)
        command = StartStack(node_id="n-expired", run_id="R1", deployment_id=f"D{uuid.uuid4().hex[:8]}", workload="w",
                             stack="vllm-prefix-gpu", model="m", sim=SimCluster(),
                             expires_at=utc_now() - timedelta(seconds=1))  # fmt: skip
        await agent.handle(command)
        assert launched == []
        assert command.deployment_id not in agent.deployments
        fresh = command.model_copy(update={"expires_at": utc_now() + timedelta(minutes=5)})
        await agent.handle(fresh)  # the same command in time is acted on (and fails here, as the launch says)
        assert launched == [command.deployment_id]
