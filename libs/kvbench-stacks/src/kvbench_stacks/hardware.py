"""The one table of models and GPUs (``models.yaml``, ``gpus.yaml``: data, validated on load).

The planner checks that weights fit and estimates capacity from it, the agent declares a simulated host's GPUs
from it, the reporter derives break-even bandwidth from it, and the simulator builds its profiles from it; so a
model's weight size or a GPU's memory is written once.
"""

from __future__ import annotations

import math
from functools import cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "GPUS",
    "KNOWN_MODELS",
    "WEIGHT_SHARE",
    "Efficiency",
    "GpuSimulation",
    "KnownGpu",
    "KnownModel",
    "MoeSpec",
    "find_model",
    "gpu_spec",
    "min_tensor_parallel",
    "simulated_gpus",
]

# weights may take at most this share of the GPUs' memory; the rest is KV cache and activations
WEIGHT_SHARE = 0.9


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MoeSpec(_Strict):
    experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    expert_bytes: float = Field(gt=0, description="Bytes of all experts' weights together")
    layer_overhead_us: float = Field(40, ge=0, description="Router and dispatch cost per layer per step")


class KnownModel(_Strict):
    name: str
    layers: int = Field(gt=0)
    q_heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    params_active: float = Field(gt=0, description="Non-embedding parameters used per token")
    weight_bytes: float = Field(gt=0, description="Bytes the checkpoint loads onto the GPUs")
    weights_dtype: Literal["bf16", "fp8", "nvfp4"]
    kv_dtype_bytes: int = Field(gt=0)
    kv_bpt_effective: float | None = Field(None, description="Override of KV bytes per token (hybrid models)")
    attn_layers: int | None = Field(None, gt=0, description="Full-attention layers (hybrid models); default all")
    state_bytes_per_seq: float = Field(0, ge=0, description="Per-sequence state (linear attention / SSM)")
    attention_block_size: int | None = Field(
        None, gt=0, description="Block size the engine forces for this model (vLLM raises it for hybrid models)"
    )
    moe: MoeSpec | None = Field(None, description="Mixture of experts: weights read depend on the tokens")

    @property
    def weights_gb(self) -> float:
        return self.weight_bytes / 1e9

    @property
    def kv_bytes_per_token(self) -> float:
        if self.kv_bpt_effective:
            return self.kv_bpt_effective
        return float(2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes)


class Efficiency(_Strict):
    mfu_max: float = Field(gt=0, le=1)
    t_half: float = Field(ge=0, description="Tokens at which linear-layer MFU reaches half its maximum")
    mfu_attn: float = Field(gt=0, le=1)
    bw_eff: float = Field(gt=0, le=1)
    t0_ms: float = Field(ge=0, description="Fixed cost of every engine step")
    tau_layer_us: float = Field(ge=0, description="Per-layer overhead of every step")
    prefill_fixed_ms: float = Field(ge=0, description="Extra fixed cost of a step that holds a prefill chunk")
    jitter_cv: float = Field(ge=0, lt=1, description="Coefficient of variation of the lognormal step jitter")
    # the serving path in front of the engine core (HTTP, tokenising, block hashing, detokenising): paid once a
    # request, before it reaches the scheduler, beside the GPU's steps rather than in them
    request_ms: float = Field(0.0, ge=0, description="Fixed cost of every request's way into the engine, ms")
    request_us_per_token: float = Field(0.0, ge=0, description="Same, per prompt token, microseconds")


class GpuSimulation(_Strict):
    """What the simulator needs beyond memory: peaks and the efficiencies fitted to measurements."""

    tflops_bf16: float = Field(gt=0)
    hbm_tbps: float = Field(gt=0)
    host_link_gbps: float = Field(gt=0, description="Practical pinned host<->GPU bandwidth, GB/s")
    file_tier_gbps: float | None = Field(
        None, gt=0, description="LMCache's file (L2) adapter measured on this GPU's hosts, GB/s (default: the study's)"
    )
    file_tier_cached_gbps: float | None = Field(
        None, gt=0, description="The same adapter reading files the OS page cache holds, GB/s (unset: not modelled)"
    )
    mem_util_default: float | None = Field(
        None, gt=0, le=1, description="gpu_memory_utilization when not set (unified memory leaves room for the OS)"
    )
    eff: Efficiency


class KnownGpu(_Strict):
    name: str
    vendor: Literal["nvidia", "amd"]
    mem_gb: float = Field(gt=0, description="Memory per GPU, GB")
    sim: GpuSimulation | None = Field(None, description="The simulator's profile; None: cannot be simulated")


def _load(name: str) -> dict[str, dict[str, object]]:
    data = yaml.safe_load(resources.files("kvbench_stacks").joinpath(name).read_text())
    if not isinstance(data, dict):
        raise TypeError(f"kvbench_stacks/{name} must map names to entries")
    return data


@cache
def _tables() -> tuple[dict[str, KnownModel], dict[str, KnownGpu]]:
    models = {n: KnownModel.model_validate({"name": n, **v}) for n, v in _load("models.yaml").items()}
    gpus = {n.upper(): KnownGpu.model_validate({"name": n, **v}) for n, v in _load("gpus.yaml").items()}
    return models, gpus


KNOWN_MODELS: dict[str, KnownModel] = {name.lower(): m for name, m in _tables()[0].items()}
GPUS: dict[str, KnownGpu] = _tables()[1]


def find_model(model_id: str) -> KnownModel | None:
    return KNOWN_MODELS.get(model_id.lower())


def gpu_spec(name: str | None) -> KnownGpu | None:
    """The GPU a device name means: "NVIDIA L40S", "H100 80GB HBM3" and "AMD Instinct MI300X" all resolve."""
    if not name:
        return None
    key = name.upper().replace("NVIDIA ", "").replace("AMD ", "").replace("INSTINCT ", "").strip()
    for known, spec in GPUS.items():
        if key == known or key.startswith((known + " ", known + "-")):
            return spec
    return None


def simulated_gpus() -> list[str]:
    """GPUs the simulator has a profile for, in the table's order."""
    return [gpu.name for gpu in GPUS.values() if gpu.sim is not None]


def min_tensor_parallel(model: KnownModel, gpu: KnownGpu) -> int:
    """The smallest power of two whose GPUs hold the weights (TP must divide the attention heads)."""
    need = model.weights_gb / (gpu.mem_gb * WEIGHT_SHARE)
    return 1 << max(0, math.ceil(math.log2(max(need, 1.0))))
