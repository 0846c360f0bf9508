"""A stack that cannot start for a reason retrying would not change fails its run at once, with the error's words."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kvbench_contracts.commands import StartStack
from kvbench_contracts.events import StackFailed
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
        stored = await bus.js.get_last_msg("KVBENCH_CONTROL", f"kvbench.stack.{deployment}.failed")
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
        stored = await bus.js.get_last_msg("KVBENCH_CONTROL", f"kvbench.stack.{deployment}.failed")
    failed = StackFailed.model_validate_json(stored.data or b"")
    assert "n-images: engine.args.image: the machine does not run the image evil/miner:latest" in failed.reason
    assert "KVBENCH_NODE_AGENT_ALLOWED_IMAGES" in failed.reason
    assert agent.deployments == {}
