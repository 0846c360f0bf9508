"""The machine's allow-lists come from its operator's settings, comma-separated, and travel in its inventory."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvbench_contracts.events import MachinePolicy
from kvbench_node_agent.settings import NodeAgentSettings


def test_the_lists_come_comma_separated_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVBENCH_NODE_AGENT_NODE_ID", "gpu-1")
    monkeypatch.setenv("KVBENCH_NODE_AGENT_ALLOWED_IMAGES", "vllm/vllm-openai:*, lmcache/vllm-openai:*")
    monkeypatch.setenv("KVBENCH_NODE_AGENT_ALLOWED_DATA_DIRS", "/mnt/nvme")
    settings = NodeAgentSettings()
    assert settings.policy() == MachinePolicy(
        allowed_images=["vllm/vllm-openai:*", "lmcache/vllm-openai:*"], allowed_data_dirs=["/mnt/nvme"]
    )
    monkeypatch.setenv("KVBENCH_NODE_AGENT_ALLOWED_CODE_DIRS", "relative/dir")
    with pytest.raises(ValidationError, match="directories must be absolute paths: relative/dir"):
        NodeAgentSettings()
