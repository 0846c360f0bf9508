"""Catalog stacks in simulated form: which engines, with which cache settings and tiers (PLAN.md stack ids).

The tier figures are the practical paths, not datasheets (simulator.md section 4): host memory moves at the
GPU's pinned host-link rate; LMCache's file (L2) adapter is software-bound, fitted to the LMCache study's
disk-hit TTFT (about 0.3 GB/s and 5 ms per chunk file, one file at a time; a GPU profile measured on faster hosts
says its own rate, ``file_tier_gbps``); network stores move at the NIC's
rate with a millisecond of RPC per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvbench_contracts.plan import SimCluster, Sizing
from kvbench_sim.profiles import (
    CACHE_SERVER_STORE,
    CACHE_SERVER_TIERS,
    ColdStart,
    EngineConfig,
    TierConfig,
    load_profile,
)
from kvbench_stacks.catalog import CATALOG, SIMULATED_STACKS
from kvbench_stacks.topology import sim_engine_counts

__all__ = ["SIM_STACKS", "SimLayout", "layout_for"]

LMCACHE_CHUNK = 256
LMCACHE_FS = {"bw_gbps": 0.3, "lat_ms": 5.0, "queue_depth": 1}

# the catalog says which stacks have a simulated form; this module says what each one's engines and tiers are
SIM_STACKS = SIMULATED_STACKS

# the GPU profiles' measured restart costs (simulator.md section 4; the LMCache study on GB10)
COLD_STARTS = {"GB10": ColdStart(first_request_s=0.67, first_use_ms_per_token=0.82)}


@dataclass(frozen=True)
class SimLayout:
    """Engines of one workload: decode-capable engines, and prefill engines for split stacks."""

    engine: EngineConfig
    engines: int
    prefill_engines: int = 0
    prefill: EngineConfig | None = None
    link_gbps: float = 25.0  # GB/s between machines (P/D transfers)
    link_setup_ms: float = 1.0
    engine_name: str = "vllm"
    # LMCache stacks with sizing.engines_per_cache_server: the engines in groups of this many share one server's
    # tiers (its L1 and disk, their capacity and the link that moves their data)
    engines_per_cache_server: int | None = None


def layout_for(workload: dict[str, Any], cluster: dict[str, Any]) -> SimLayout:
    """``workload``: the merged workload dict of a plan; ``cluster``: its ``cluster.sim`` section."""
    stack = str(workload["stack"])
    if stack not in SIM_STACKS:
        raise ValueError(f"stack {stack!r} has no simulated form; simulated stacks: {', '.join(SIM_STACKS)}")
    sizing = workload.get("sizing") or {}
    engine_spec = workload.get("engine") or {}
    args = engine_spec.get("args") or {}
    tp = int(engine_spec.get("tensor_parallel_size", 1))
    gpu = str(cluster.get("gpu", "L40S"))
    profile = load_profile(gpu, str(workload.get("model", "Qwen/Qwen3-8B")))
    prefill_engines, engines = sim_engine_counts(
        stack, Sizing.model_validate(sizing), SimCluster.model_validate(cluster), tp
    )
    block = _int(args.get("block_size") or args.get("block-size")) or profile.model.attention_block_size
    host_machine_gb = float(cluster.get("host_memory_gb", 256))
    host_gb = float(sizing.get("host_memory_gb") or 0) or host_machine_gb * 0.5
    nic_gbytes = float(cluster.get("nic_gbps", 200)) / 8 * 0.9
    disk_gbps = float(cluster.get("disk_gbps", 6))
    chunk = block if profile.model.attention_block_size else LMCACHE_CHUNK

    def host(chunk_tokens: int | None = None) -> TierConfig:
        return TierConfig(name="host", capacity_gb=host_gb, bw_gbps=profile.gpu.host_link_gbps, lat_ms=0.05,
                          chunk_tokens=chunk_tokens, queue_depth=8)  # fmt: skip

    def shared(store_id: str, bw: float, lat_ms: float, chunk_tokens: int | None) -> TierConfig:
        size = float(sizing.get("shared_store_gb") or 1000)
        return TierConfig(name="shared", capacity_gb=size, bw_gbps=bw, lat_ms=lat_ms, chunk_tokens=chunk_tokens,
                          queue_depth=16, store_id=store_id)  # fmt: skip

    tiers: tuple[TierConfig, ...] = ()
    if stack in (
        "vllm-native-cpu-offload",
        "sglang-hicache-host",
        "trtllm-host-offload",
        "vllm-pd-nixl-native-offload",
        "sglang-pd-decode-offload",
    ):
        tiers = (host(),)
    elif stack in ("vllm-lmcache-mp", "vllm-pd-nixl-lmcache"):
        tiers = (host(chunk),)
        if CATALOG[stack].has_disk_tier(str(workload.get("kv_tier", "gpu")), sizing.get("disk_tier_gb")):
            disk_gb = float(sizing.get("disk_tier_gb") or 1000)
            fs = TierConfig(name="disk", capacity_gb=disk_gb, chunk_tokens=chunk, **LMCACHE_FS)  # type: ignore[arg-type]
            adapter_gbps = profile.gpu.file_tier_gbps or fs.bw_gbps  # the software path on this GPU's hosts
            update: dict[str, Any] = {"bw_gbps": min(adapter_gbps, disk_gbps)}
            if profile.gpu.file_tier_cached_gbps:  # the OS keeps recent files in half the machine's memory
                update |= {"page_cache_gb": host_machine_gb * 0.5, "cached_bw_gbps": profile.gpu.file_tier_cached_gbps}
            tiers = (*tiers, fs.model_copy(update=update))
    elif stack in ("vllm-lmcache-valkey", "trtllm-lmcache-valkey"):
        tiers = (host(chunk), shared("valkey", min(nic_gbytes, 2.0), 1.0, chunk))
    elif stack in ("vllm-lmcache-mooncake", "vllm-mooncake-store", "sglang-hicache-mooncake"):
        tiers = (host(chunk), shared("mooncake", nic_gbytes, 0.5, chunk))
    elif stack == "sglang-hicache-mori":  # MoRI-IO moves a HiCache tier's pages over RDMA, like Mooncake's store
        tiers = (host(chunk), shared("mori", nic_gbytes, 0.5, chunk))
    elif stack in ("vllm-native-shared-fs", "sglang-hicache-file"):
        tiers = (host(), shared("shared-fs", min(disk_gbps, nic_gbytes), 0.2, LMCACHE_CHUNK))
    per_machine = max(1, int(sizing.get("gpus_per_machine") or cluster.get("gpus_per_machine", 1)) // tp)
    share: int | None = None
    if CATALOG[stack].lmcache_server:
        # as the recipe does: by default each machine's engines share its one LMCache server
        share = int(sizing.get("engines_per_cache_server") or (0 if CATALOG[stack].split else per_machine)) or None
    if share:
        # a machine's servers split its host memory and disk tier; a server serving engines on other machines moves
        # their data over the network; the server's tiers are its own, whoever's engines use them
        part = min(share, per_machine) / per_machine
        tiers = tuple(
            t.model_copy(update={
                "capacity_gb": t.capacity_gb * part,
                **({"bw_gbps": min(t.bw_gbps, nic_gbytes)} if t.name == "host" and share > per_machine else {}),
                **({"store_id": CACHE_SERVER_STORE} if t.name in CACHE_SERVER_TIERS and not t.store_id else {}),
            })
            for t in tiers
        )  # fmt: skip
    prefix = not stack.endswith(("-off", "reuse-off"))
    config = EngineConfig(
        block_size=block,
        max_num_seqs=_int(args.get("max_num_seqs") or args.get("max-num-seqs")) or 256,
        max_num_batched_tokens=_int(args.get("max_num_batched_tokens") or args.get("max-num-batched-tokens")) or 8192,
        gpu_memory_utilization=_float(args.get("gpu_memory_utilization") or args.get("gpu-memory-utilization")),
        # vLLM's --kv-cache-memory-bytes fixes the GPU KV cache whatever the memory share says
        kv_cache_gb=(_float(args.get("kv_cache_memory_bytes") or args.get("kv-cache-memory-bytes")) or 0) / 1e9 or None,
        prefix_caching=prefix,
        tensor_parallel_size=tp,
        tiers=tiers,
        cold_start=COLD_STARTS.get(gpu.upper(), ColdStart()),
    )
    name = str(engine_spec.get("name", "vllm"))
    if CATALOG[stack].split:
        # decode-side offload: only the decode engines keep a host tier (the prefill engines hand every prompt on)
        prefill = config.model_copy(update={"tiers": ()}) if stack == "sglang-pd-decode-offload" else config
        return SimLayout(config, engines, prefill_engines, prefill, nic_gbytes, 1.0, name)
    return SimLayout(config, engines, engine_name=name, engines_per_cache_server=share)


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float | str) and str(value).strip() else None


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float | str) and str(value).strip() else None
