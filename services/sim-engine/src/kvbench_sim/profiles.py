"""Hardware and model profiles (YAML shipped with the package, validated on load)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ColdStart",
    "EngineConfig",
    "GpuProfile",
    "ModelProfile",
    "MoeSpec",
    "Profile",
    "TierConfig",
    "load_profile",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Efficiency(_Strict):
    mfu_max: float = Field(gt=0, le=1)
    t_half: float = Field(ge=0, description="Tokens at which linear-layer MFU reaches half its maximum")
    mfu_attn: float = Field(gt=0, le=1)
    bw_eff: float = Field(gt=0, le=1)
    t0_ms: float = Field(ge=0, description="Fixed cost of every engine step")
    tau_layer_us: float = Field(ge=0, description="Per-layer overhead of every step")
    prefill_fixed_ms: float = Field(ge=0, description="Extra fixed cost of a step that holds a prefill chunk")
    jitter_cv: float = Field(ge=0, lt=1, description="Coefficient of variation of the lognormal step jitter")


class GpuProfile(_Strict):
    name: str
    vendor: str
    tflops_bf16: float = Field(gt=0)
    hbm_tbps: float = Field(gt=0)
    mem_gb: float = Field(gt=0)
    host_link_gbps: float = Field(gt=0, description="Practical pinned host<->GPU bandwidth, GB/s")
    mem_util_default: float | None = Field(
        None, gt=0, le=1, description="gpu_memory_utilization when not set (unified memory leaves room for the OS)"
    )
    eff: Efficiency


class MoeSpec(_Strict):
    experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    expert_bytes: float = Field(gt=0, description="Bytes of all experts' weights together")
    layer_overhead_us: float = Field(40, ge=0, description="Router and dispatch cost per layer per step")


class ModelProfile(_Strict):
    name: str
    layers: int = Field(gt=0)
    q_heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    params_active: float = Field(gt=0)
    weight_bytes: float = Field(gt=0)
    kv_dtype_bytes: int = Field(gt=0)
    kv_bpt_effective: float | None = Field(None, description="Override of KV bytes per token (hybrid models)")
    attn_layers: int | None = Field(None, gt=0, description="Full-attention layers (hybrid models); default all")
    state_bytes_per_seq: float = Field(0, ge=0, description="Per-sequence state (linear attention / SSM)")
    attention_block_size: int | None = Field(
        None, gt=0, description="Block size the engine forces for this model (vLLM raises it for hybrid models)"
    )
    moe: MoeSpec | None = Field(None, description="Mixture of experts: weights read depend on the tokens")

    @property
    def kv_bytes_per_token(self) -> float:
        if self.kv_bpt_effective:
            return self.kv_bpt_effective
        return float(2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes)


class TierConfig(_Strict):
    """One KV tier behind the GPU (simulator.md section 3): capacity, bandwidth, per-chunk latency, LRU."""

    name: Literal["host", "disk", "shared"]
    capacity_gb: float = Field(gt=0)
    bw_gbps: float = Field(gt=0, description="Practical bandwidth of the whole path, GB/s")
    lat_ms: float = Field(0.05, ge=0, description="Fixed cost per chunk (software path, file open, RPC)")
    chunk_tokens: int | None = Field(None, gt=0, description="Tokens per stored chunk; default: the block size")
    queue_depth: int = Field(4, gt=0, description="Chunks in flight at once (divides the per-chunk latency)")
    store_id: str | None = Field(None, description="Engines naming the same store share it (shared pools)")


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
    model: ModelProfile
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

    @property
    def gpu_kv_blocks(self) -> int:
        return int(self.gpu_kv_bytes // self.block_bytes)


@cache
def _table(name: str) -> dict[str, Any]:
    text = resources.files("kvbench_sim").joinpath("profiles", name).read_text()
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def known_gpus() -> list[str]:
    return sorted(_table("gpus.yaml"))


def known_models() -> list[str]:
    return sorted(_table("models.yaml"))


def load_profile(gpu: str, model: str, engine: EngineConfig | None = None) -> Profile:
    gpus, models = _table("gpus.yaml"), _table("models.yaml")
    if gpu not in gpus:
        raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(sorted(gpus))}")
    if model not in models:
        raise ValueError(f"no simulator profile for model {model!r}; known: {', '.join(sorted(models))}")
    return Profile(
        gpu=GpuProfile(name=gpu, **gpus[gpu]),
        model=ModelProfile(name=model, **models[model]),
        engine=engine or EngineConfig(),
    )
