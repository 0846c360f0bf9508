"""The stack catalog as data (PLAN.md "Stack ids"; recipes in reference/stacks.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CATALOG", "ORCHESTRATOR_LOCKS", "StackSpec", "get_stack"]


@dataclass(frozen=True)
class StackSpec:
    id: str
    engine: str
    strategy: str
    tiers: tuple[str, ...]
    needs: tuple[str, ...]
    title: str
    vendors: tuple[str, ...] = ("nvidia", "amd")
    one_engine_per_machine: bool = False
    lmcache_server: bool = False
    shared_mount: bool = False
    rdma: bool = False
    pd_router: bool = False
    simulated: bool = False
    validated_on: tuple[str, ...] = ()
    recipe: str = ""


def _s(id_: str, engine: str, strategy: str, tiers: str, needs: str, title: str, **kw: Any) -> StackSpec:
    return StackSpec(
        id_, engine, strategy, tuple(tiers.split(",")), tuple(n for n in needs.split(",") if n), title, **kw
    )


_NV = ("nvidia",)
_AMD = ("amd",)
CATALOG: dict[str, StackSpec] = {
    s.id: s
    for s in (
        _s(
            "vllm-prefix-off",
            "vllm",
            "own_cache",
            "gpu",
            "",
            "vLLM, prefix cache off",
            simulated=True,
            validated_on=("vllm 0.28.0",),
            recipe="stacks.md 1.1",
        ),
        _s(
            "vllm-prefix-gpu",
            "vllm",
            "own_cache",
            "gpu",
            "",
            "vLLM, GPU prefix cache only",
            simulated=True,
            validated_on=("vllm 0.28.0",),
            recipe="stacks.md 1.1",
        ),
        _s(
            "vllm-native-cpu-offload",
            "vllm",
            "spill",
            "gpu",
            "host_memory_gb",
            "vLLM, native CPU offload",
            validated_on=("vllm 0.28.0",),
            recipe="stacks.md 1.2",
        ),
        _s(
            "vllm-native-shared-fs",
            "vllm",
            "shared_pool",
            "gpu",
            "host_memory_gb,shared_mount_path",
            "vLLM, native offload to a shared filesystem",
            shared_mount=True,
            recipe="stacks.md 1.3",
        ),
        _s(
            "vllm-lmcache-valkey",
            "vllm",
            "shared_pool",
            "cpu_ram,nvme",
            "shared_store_gb",
            "vLLM with LMCache, shared Valkey tier",
            lmcache_server=True,
            validated_on=("vllm 0.28.0",),
            recipe="stacks.md 1.4",
        ),
        _s(
            "vllm-lmcache-mooncake",
            "vllm",
            "shared_pool",
            "cpu_ram",
            "shared_store_gb",
            "vLLM with LMCache, shared Mooncake tier",
            lmcache_server=True,
            recipe="stacks.md 1.5",
        ),
        _s(
            "vllm-mooncake-store",
            "vllm",
            "shared_pool",
            "gpu",
            "shared_store_gb",
            "vLLM with Mooncake Store",
            recipe="stacks.md 1.6",
        ),
        _s(
            "vllm-pd-nixl",
            "vllm",
            "split",
            "gpu",
            "prefill",
            "vLLM prefill and decode over NIXL",
            rdma=True,
            pd_router=True,
            validated_on=("vllm 0.28.0",),
            recipe="stacks.md 1.7",
        ),
        _s(
            "vllm-pd-mooncake",
            "vllm",
            "split",
            "gpu",
            "prefill",
            "vLLM prefill and decode over Mooncake",
            rdma=True,
            pd_router=True,
            recipe="stacks.md 1.8",
        ),
        _s(
            "vllm-pd-nixl-native-offload",
            "vllm",
            "split_offload",
            "gpu",
            "prefill,host_memory_gb",
            "vLLM prefill and decode over NIXL, with native offload",
            rdma=True,
            pd_router=True,
            validated_on=("vllm 0.28.0",),
            recipe="stacks.md 1.9",
        ),
        _s(
            "vllm-pd-nixl-lmcache",
            "vllm",
            "split_offload",
            "cpu_ram,nvme",
            "prefill,gpus_per_machine",
            "vLLM prefill and decode over NIXL, with LMCache",
            rdma=True,
            pd_router=True,
            lmcache_server=True,
            one_engine_per_machine=True,
            validated_on=("vllm 0.28.0",),
            recipe="stacks.md 1.10",
        ),
        _s(
            "vllm-pd-lmcache-store",
            "vllm",
            "split",
            "cpu_ram",
            "prefill,shared_store_gb",
            "vLLM prefill and decode through the LMCache store",
            pd_router=True,
            lmcache_server=True,
            validated_on=("vllm 0.28.0",),
            recipe="stacks.md 1.11",
        ),
        _s(
            "vllm-lmcache-mp",
            "vllm",
            "spill",
            "cpu_ram,nvme",
            "host_memory_gb",
            "vLLM with an LMCache server (L1 CPU, L2 fs)",
            lmcache_server=True,
            recipe="stacks.md 1.12",
        ),
        _s(
            "sglang-radix-off",
            "sglang",
            "own_cache",
            "gpu",
            "",
            "SGLang, radix cache off",
            simulated=True,
            validated_on=("sglang 0.5.20",),
            recipe="stacks.md 2.1",
        ),
        _s(
            "sglang-radix",
            "sglang",
            "own_cache",
            "gpu",
            "",
            "SGLang, radix cache only",
            simulated=True,
            validated_on=("sglang 0.5.20",),
            recipe="stacks.md 2.1",
        ),
        _s(
            "sglang-hicache-host",
            "sglang",
            "spill",
            "gpu",
            "host_memory_gb",
            "SGLang HiCache, host tier",
            validated_on=("sglang 0.5.20",),
            recipe="stacks.md 2.2",
        ),
        _s(
            "sglang-hicache-file",
            "sglang",
            "shared_pool",
            "gpu",
            "host_memory_gb,shared_mount_path",
            "SGLang HiCache, shared file tier",
            shared_mount=True,
            recipe="stacks.md 2.3",
        ),
        _s(
            "sglang-hicache-mooncake",
            "sglang",
            "shared_pool",
            "gpu",
            "host_memory_gb,shared_store_gb",
            "SGLang HiCache, Mooncake tier",
            recipe="stacks.md 2.4",
        ),
        _s(
            "sglang-pd-nixl",
            "sglang",
            "split",
            "gpu",
            "prefill",
            "SGLang prefill and decode over NIXL",
            rdma=True,
            pd_router=True,
            validated_on=("sglang 0.5.20",),
            recipe="stacks.md 2.5",
        ),
        _s(
            "sglang-pd-mooncake",
            "sglang",
            "split",
            "gpu",
            "prefill",
            "SGLang prefill and decode over Mooncake",
            rdma=True,
            pd_router=True,
            recipe="stacks.md 2.5",
        ),
        _s(
            "sglang-pd-decode-offload",
            "sglang",
            "split_offload",
            "gpu",
            "prefill,host_memory_gb",
            "SGLang prefill and decode with decode-side offload",
            rdma=True,
            pd_router=True,
            recipe="stacks.md 2.6",
        ),
        _s(
            "trtllm-reuse-off",
            "trtllm",
            "own_cache",
            "gpu",
            "",
            "TensorRT-LLM, block reuse off",
            vendors=_NV,
            validated_on=("trtllm 1.3.0rc28",),
            recipe="stacks.md 3",
        ),
        _s(
            "trtllm-reuse",
            "trtllm",
            "own_cache",
            "gpu",
            "",
            "TensorRT-LLM, block reuse only",
            vendors=_NV,
            validated_on=("trtllm 1.3.0rc28",),
            recipe="stacks.md 3",
        ),
        _s(
            "trtllm-host-offload",
            "trtllm",
            "spill",
            "gpu",
            "host_memory_gb",
            "TensorRT-LLM, host offload",
            vendors=_NV,
            validated_on=("trtllm 1.3.0rc28",),
            recipe="stacks.md 3",
        ),
        _s(
            "trtllm-pd-nixl",
            "trtllm",
            "split",
            "gpu",
            "prefill",
            "TensorRT-LLM prefill and decode over NIXL",
            vendors=_NV,
            rdma=True,
            pd_router=True,
            validated_on=("trtllm 1.3.0rc28",),
            recipe="stacks.md 3",
        ),
        _s(
            "trtllm-lmcache-valkey",
            "trtllm",
            "shared_pool",
            "cpu_ram,nvme",
            "shared_store_gb",
            "TensorRT-LLM with LMCache, shared Valkey tier",
            vendors=_NV,
            lmcache_server=True,
            validated_on=("trtllm 1.3.0rc28",),
            recipe="stacks.md 3",
        ),
        _s(
            "vllm-pd-mori",
            "vllm",
            "split",
            "gpu",
            "prefill",
            "vLLM prefill and decode over MoRI-IO",
            vendors=_AMD,
            rdma=True,
            pd_router=True,
            recipe="stacks.md 6",
        ),
        _s(
            "sglang-hicache-mori",
            "sglang",
            "shared_pool",
            "gpu",
            "host_memory_gb",
            "SGLang HiCache, MoRI tier (AMD)",
            vendors=_AMD,
            rdma=True,
            recipe="stacks.md 6",
        ),
        _s(
            "sglang-pd-mori",
            "sglang",
            "split",
            "gpu",
            "prefill",
            "SGLang prefill and decode over MoRI (AMD)",
            vendors=_AMD,
            rdma=True,
            pd_router=True,
            recipe="stacks.md 6",
        ),
    )
}

ORCHESTRATOR_LOCKS = {
    "dynamo": "NVIDIA Dynamo is coming soon",
    "llm-d": "llm-d is coming soon",
    "production-stack": "vLLM production-stack is coming soon",
}


def get_stack(stack_id: str) -> StackSpec | None:
    return CATALOG.get(stack_id)
