"""A simulated engine's profile: its GPU and model from the one hardware table (kvbench_stacks.hardware), and
the engine's own configuration (tiers, cold start)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvbench_stacks.hardware import GPUS, KNOWN_MODELS, GpuSimulation, KnownModel, find_model, simulated_gpus

__all__ = [
    "CACHE_SERVER_STORE",
    "CACHE_SERVER_TIERS",
    "ColdStart",
    "EngineConfig",
    "GpuProfile",
    "Profile",
    "TierConfig",
    "cache_server_tier",
    "known_gpus",
    "known_models",
    "load_profile",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuProfile(GpuSimulation):
    """A GPU as the simulator sees it: its identity and memory from the hardware table, with its profile."""

    name: str
    vendor: str
    mem_gb: float = Field(gt=0)


class TierConfig(_Strict):
    """One KV tier behind the GPU (simulator.md section 3): capacity, bandwidth, per-chunk latency, LRU."""

    name: Literal["host", "disk", "shared"]
    capacity_gb: float = Field(gt=0)
    bw_gbps: float = Field(gt=0, description="Practical bandwidth of the whole path, GB/s")
    lat_ms: float = Field(0.05, ge=0, description="Fixed cost per chunk (software path, file open, RPC)")
    chunk_tokens: int | None = Field(None, gt=0, description="Tokens per stored chunk; default: the block size")
    queue_depth: int = Field(4, gt=0, description="Chunks in flight at once (divides the per-chunk latency)")
    store_id: str | None = Field(None, description="Engines naming the same store share it (shared pools)")
    # a file tier's recent files stay in the OS page cache (written or read), and a read of those runs at memory
    # speed: it outlives the engine's restart, not a drop of the page cache
    page_cache_gb: float = Field(0, ge=0, description="File tier: what the page cache holds of its files, GB")
    cached_bw_gbps: float | None = Field(None, gt=0, description="File tier: rate of reads the page cache serves")


# an LMCache server's tiers (its L1 in host memory, its disk adapter) live in the server process, not in the engine:
# they carry this store id (in batch mode ``lmcache-GROUP-TIER``), and the engines of one server share them
CACHE_SERVER_STORE = "lmcache"
CACHE_SERVER_TIERS = ("host", "disk")


def cache_server_tier(config: TierConfig) -> bool:
    """Whether a tier is an LMCache server's rather than the engine's own or a shared pool's."""
    return bool(config.store_id) and str(config.store_id).split("-", 1)[0] == CACHE_SERVER_STORE


class ColdStart(_Strict):
    """What a restarted engine pays (simulator.md section 4: warm-up scales with the work run)."""

    fixed_s: float = Field(0, ge=0, description="Before the engine serves at all")
    first_request_s: float = Field(0, ge=0, description="Added to the first step after a start")
    first_use_ms_per_token: float = Field(0, ge=0, description="Per token of a prefill shape run for the first time")


class EngineConfig(_Strict):
    block_size: int | None = Field(None, gt=0, description="Default 16, or what the model forces")
    max_num_seqs: int = Field(256, gt=0)
    max_num_batched_tokens: int = Field(8192, gt=0)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="Default 0.9 or the GPU's")
    prefix_caching: bool = True
    tensor_parallel_size: int = Field(1, ge=1)
    kv_cache_gb: float | None = Field(None, gt=0, description="Fix the GPU KV cache size instead of deriving it")
    tiers: tuple[TierConfig, ...] = Field((), description="Lookup order after the GPU")
    cold_start: ColdStart = Field(default_factory=ColdStart)


class Profile(_Strict):
    gpu: GpuProfile
    model: KnownModel
    engine: EngineConfig

    @property
    def gpu_kv_bytes(self) -> float:
        if self.engine.kv_cache_gb:
            return self.engine.kv_cache_gb * 1e9
        tp = self.engine.tensor_parallel_size
        usable = self.gpu.mem_gb * 1e9 * tp * self.memory_utilization - self.model.weight_bytes
        if usable <= 0:
            raise ValueError(
                f"{self.model.name} ({self.model.weight_bytes / 1e9:.0f} GB) does not fit {tp} x {self.gpu.name}; "
                "raise tensor_parallel_size"
            )
        return usable

    @property
    def memory_utilization(self) -> float:
        return self.engine.gpu_memory_utilization or self.gpu.mem_util_default or 0.9

    @property
    def block_size(self) -> int:
        return self.engine.block_size or self.model.attention_block_size or 16

    @property
    def state_bytes_per_block(self) -> float:
        """Hybrid models cache a state snapshot with every block (vLLM's mamba "align" mode)."""
        return self.model.state_bytes_per_seq if self.model.attention_block_size else 0.0

    @property
    def block_bytes(self) -> float:
        return self.block_size * self.model.kv_bytes_per_token + self.state_bytes_per_block

    def intake_s(self, prompt_tokens: int) -> float:
        """How long a request takes from its arrival to the engine's queue (the serving path's own cost)."""
        eff = self.gpu.eff
        return (eff.request_ms + eff.request_us_per_token * prompt_tokens / 1e3) / 1e3

    @property
    def gpu_kv_blocks(self) -> int:
        return int(self.gpu_kv_bytes // self.block_bytes)


def known_gpus() -> list[str]:
    return sorted(simulated_gpus())


def known_models() -> list[str]:
    return sorted(m.name for m in KNOWN_MODELS.values())


def load_profile(gpu: str, model: str, engine: EngineConfig | None = None) -> Profile:
    known_gpu = GPUS.get(gpu.upper())
    if known_gpu is None or known_gpu.sim is None:
        raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(known_gpus())}")
    known_model = find_model(model)
    if known_model is None:
        raise ValueError(f"no simulator profile for model {model!r}; known: {', '.join(known_models())}")
    simulated = GpuProfile(name=gpu, vendor=known_gpu.vendor, mem_gb=known_gpu.mem_gb, **dict(known_gpu.sim))
    return Profile(gpu=simulated, model=known_model, engine=engine or EngineConfig())
