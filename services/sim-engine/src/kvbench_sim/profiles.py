"""Hardware and model profiles (YAML shipped with the package, validated on load)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EngineConfig", "GpuProfile", "ModelProfile", "Profile", "load_profile"]


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
    eff: Efficiency


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

    @property
    def kv_bytes_per_token(self) -> float:
        if self.kv_bpt_effective:
            return self.kv_bpt_effective
        return float(2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes)


class EngineConfig(_Strict):
    block_size: int = Field(16, gt=0)
    max_num_seqs: int = Field(256, gt=0)
    max_num_batched_tokens: int = Field(8192, gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    prefix_caching: bool = True
    tensor_parallel_size: int = Field(1, ge=1)
    kv_cache_gb: float | None = Field(None, gt=0, description="Fix the GPU KV cache size instead of deriving it")


class Profile(_Strict):
    gpu: GpuProfile
    model: ModelProfile
    engine: EngineConfig

    @property
    def gpu_kv_bytes(self) -> float:
        if self.engine.kv_cache_gb:
            return self.engine.kv_cache_gb * 1e9
        tp = self.engine.tensor_parallel_size
        usable = self.gpu.mem_gb * 1e9 * tp * self.engine.gpu_memory_utilization - self.model.weight_bytes
        if usable <= 0:
            raise ValueError(
                f"{self.model.name} ({self.model.weight_bytes / 1e9:.0f} GB) does not fit {tp} x {self.gpu.name}; "
                "raise tensor_parallel_size"
            )
        return usable

    @property
    def gpu_kv_blocks(self) -> int:
        return int(self.gpu_kv_bytes // (self.engine.block_size * self.model.kv_bytes_per_token))


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
