"""The stack catalog, loaded from ``catalog.yaml`` (data, not code) and validated on load."""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CATALOG", "ORCHESTRATOR_LOCKS", "StackSpec", "get_stack"]


class StackSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="Stack id used in plans")
    title: str = Field(description="What the product guide calls it")
    engine: str = Field(description="vllm, sglang or trtllm")
    strategy: str = Field(description="own_cache, spill, shared_pool, split or split_offload")
    tiers: tuple[str, ...] = Field(description="KV Cache Storage Tiers the stack offers")
    needs: tuple[str, ...] = Field(default=(), description="Sizing fields that must be set")
    vendors: tuple[str, ...] = Field(description="GPU vendors the stack runs on")
    one_engine_per_machine: bool = False
    lmcache_server: bool = Field(False, description="Starts an LMCache server on every node")
    shared_mount: bool = Field(False, description="Needs a shared filesystem mounted on every machine")
    rdma: bool = Field(False, description="Moves KV between machines over RDMA")
    pd_router: bool = Field(False, description="Needs a router that understands prefill and decode")
    simulated: bool = Field(False, description="Has a simulated form on the sim engine")
    validated_on: tuple[str, ...] = Field(default=(), description="Engine versions with a valid run")
    min_version: str | None = Field(None, description="Oldest engine version with the stack's connector")
    recipe: str = Field(description="Section of reference/stacks.md with the launch recipe")


@cache
def _load() -> tuple[dict[str, StackSpec], dict[str, str]]:
    data = yaml.safe_load(resources.files("kvbench_planner").joinpath("catalog.yaml").read_text())
    stacks = {s["id"]: StackSpec.model_validate(s) for s in data["stacks"]}
    locks = {k: v for k, v in data["orchestrators"].items() if v}
    return stacks, locks


CATALOG, ORCHESTRATOR_LOCKS = _load()


def get_stack(stack_id: str) -> StackSpec | None:
    return CATALOG.get(stack_id)
