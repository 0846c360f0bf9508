"""The stack catalog, loaded from ``catalog.yaml`` (data, not code) and validated on load."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CATALOG",
    "LOCAL_CACHE_RESET",
    "ORCHESTRATOR_LOCKS",
    "SIMULATED_STACKS",
    "SharedStore",
    "StackSpec",
    "get_stack",
]

SharedStore = Literal["valkey", "mooncake", "mori", "shared-fs"]

# how each engine empties its own prefix cache while it runs, keeping what a KV connector holds outside it (the
# acceptance test's reset step): vLLM's POST /reset_prefix_cache (served with VLLM_SERVER_DEV_MODE=1; external records
# stay unless reset_external=true), SGLang's POST /flush_cache (python/sglang/srt/mem_cache/flush_cache.py; with
# HiCache it empties the host tier too, which the reloaded pass then shows). trtllm-serve serves no such route (its
# endpoints: the OpenAI ones, /health, /metrics, /version): its engines are restarted alone, the cache servers kept
LOCAL_CACHE_RESET: dict[str, str | None] = {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache", "trtllm": None}


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
    validated_on: tuple[str, ...] = Field(
        default=(),
        description="Engine versions whose own code accepted every rendered process of the stack: its parsers and "
        "config resolution, in the conformance suite (make conformance, which fails when this list says otherwise)",
    )
    live_runs: tuple[str, ...] = Field(
        default=(), description="Engine versions with a real run of the stack recorded in data/live/"
    )
    min_version: str | None = Field(None, description="Oldest engine version with the stack's connector")
    recipe: str = Field(description="Section of reference/stacks.md with the launch recipe")
    shared_store: SharedStore | None = Field(None, description="The store every machine of the pool shares")
    disk_tier: bool = Field(False, description="Engines keep a local disk tier when the plan's kv_tier is nvme")
    engine_image_lacks: str | None = Field(
        None,
        description="What the engine's published image lacks that the stack's engines load in-process (a plan for "
        "real machines must then name engine.args.image, an image that has it)",
    )

    def checked_releases(self, engine: str | None = None) -> list[str]:
        """The releases of ``engine`` (default: the stack's own) whose parsers accepted the stack, as bare version
        numbers (``validated_on`` holds "vllm 0.28.0")."""
        prefix = f"{engine or self.engine} "
        return [v.removeprefix(prefix) for v in self.validated_on if v.startswith(prefix)]

    @property
    def split(self) -> bool:
        """Prefill and decode run on separate engines (a router in front hands prompts on)."""
        return self.strategy in ("split", "split_offload")

    def external_hits_tier(self, role: str) -> Literal["host", "remote", "transferred"] | None:
        """Where this stack's KV connector brings prompt tokens from, for an engine that counts them only as
        "external" (vLLM before 0.32 has no per-source counter): a P/D decode engine's come from a prefill engine,
        a shared store's or shared filesystem's from the pool, the native CPU offload's from host memory; None
        where the connector serves from more than one tier (LMCache's host and disk) and the engine cannot tell."""
        if self.split and role == "decode":
            return "transferred"
        if self.shared_store is not None or self.shared_mount:
            return "remote"
        if self.engine == "vllm" and self.strategy == "spill" and not self.lmcache_server and not self.disk_tier:
            return "host"
        return None

    @property
    def keeps_kv_off_gpu(self) -> bool:
        """Whether the stack keeps KV anywhere but the GPU: a tier of its own, a shared store or filesystem, an LMCache
        server."""
        off_gpu = bool(set(self.tiers) - {"gpu"}) or self.shared_store is not None
        return off_gpu or self.shared_mount or self.lmcache_server

    @property
    def local_cache_reset(self) -> str | None:
        """The engine's route that empties its prefix cache while it runs (None: only restarting it does)."""
        return LOCAL_CACHE_RESET.get(self.engine)

    def has_disk_tier(self, kv_tier: str, disk_tier_gb: float | None) -> bool:
        """Whether the engines keep a local disk tier for this plan: the stack offers one and the plan asks for it."""
        return self.disk_tier and (kv_tier == "nvme" or bool(disk_tier_gb))


@cache
def _load() -> tuple[dict[str, StackSpec], dict[str, str]]:
    data = yaml.safe_load(resources.files("kvbench_stacks").joinpath("catalog.yaml").read_text())
    stacks = {s["id"]: StackSpec.model_validate(s) for s in data["stacks"]}
    locks = {k: v for k, v in data["orchestrators"].items() if v}
    return stacks, locks


CATALOG, ORCHESTRATOR_LOCKS = _load()
SIMULATED_STACKS: tuple[str, ...] = tuple(s.id for s in CATALOG.values() if s.simulated)


def get_stack(stack_id: str) -> StackSpec | None:
    return CATALOG.get(stack_id)
