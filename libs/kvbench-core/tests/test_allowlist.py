"""A plan cannot choose what a GPU machine runs or where it writes beyond what the machine's operator allows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvbench_contracts.events import MachinePolicy
from kvbench_contracts.plan import Sizing
from kvbench_core.allowlist import refusals

NONE = MachinePolicy()


def test_a_plan_chosen_image_needs_the_operators_allowance() -> None:
    assert refusals({}, Sizing(), NONE) == []  # the stack's own image: nothing to allow
    (refused,) = refusals({"image": "evil/miner:latest"}, Sizing(), NONE)
    assert (refused.code, refused.field) == ("not_allowed", "engine.args.image")
    assert "does not run the image evil/miner:latest (allowed: none: only the stacks' own images)" in refused.message
    assert "KVBENCH_NODE_AGENT_ALLOWED_IMAGES" in refused.fix
    allowed = MachinePolicy(allowed_images=["vllm/vllm-openai:*", "registry.local/*"])
    assert refusals({"image": "vllm/vllm-openai:v0.28.0"}, Sizing(), allowed) == []
    assert refusals({"image": "vllm/vllm-openai-evil:v1"}, Sizing(), allowed)  # a glob is not a prefix


def test_code_a_plan_points_at_must_be_in_an_allowed_directory(tmp_path: Path) -> None:
    assert refusals({"lmcache_examples": "/opt/lmcache/examples"}, Sizing(), NONE) == []
    (refused,) = refusals({"lmcache_examples": "/tmp/payload"}, Sizing(), NONE)
    assert refused.field == "engine.args.lmcache_examples"
    assert "KVBENCH_NODE_AGENT_ALLOWED_CODE_DIRS" in refused.fix
    mine = tmp_path / "lmcache"
    (mine / "examples").mkdir(parents=True)
    policy = MachinePolicy(allowed_code_dirs=[str(mine)])
    assert refusals({"lmcache_examples": str(mine / "examples")}, Sizing(), policy) == []
    (mine / "escape").symlink_to("/tmp")  # a link out of the allowed directory is not inside it
    assert refusals({"lmcache_examples": str(mine / "escape")}, Sizing(), policy)


def test_tier_directories_are_confined_once_the_operator_names_them() -> None:
    tier: dict[str, Any] = {"host_memory_gb": 10, "disk_tier_gb": 50, "disk_tier_path": "/srv/kv/lmcache"}
    assert refusals({}, Sizing(**tier), NONE) == []  # no list: what the plan rules accept
    nvme = MachinePolicy(allowed_data_dirs=["/mnt/nvme"])
    (refused,) = refusals({}, Sizing(**tier), nvme)
    assert refused.field == "sizing.disk_tier_path"
    assert "/srv/kv/lmcache is outside the directories the machine lets a plan write (/mnt/nvme)" in refused.message
    assert refusals({}, Sizing(**{**tier, "disk_tier_path": "/mnt/nvme/lmcache"}), nvme) == []
    assert refusals({}, Sizing(**{**tier, "disk_tier_path": "/mnt/nvme-other/x"}), nvme)


def test_engine_variables_only_as_the_operator_allows() -> None:
    (refused,) = refusals({}, Sizing(), NONE, {"VLLM_USE_FLASHINFER_SAMPLER": "0"})
    assert refused.field == "engine.env.VLLM_USE_FLASHINFER_SAMPLER"
    assert "KVBENCH_NODE_AGENT_ALLOWED_ENV" in refused.fix
    vllm_only = MachinePolicy(allowed_env=["VLLM_*"])
    assert refusals({}, Sizing(), vllm_only, {"VLLM_USE_FLASHINFER_SAMPLER": "0"}) == []
    (other,) = refusals({}, Sizing(), vllm_only, {"VLLM_X": "1", "NCCL_DEBUG": "INFO"})
    assert other.field == "engine.env.NCCL_DEBUG"
