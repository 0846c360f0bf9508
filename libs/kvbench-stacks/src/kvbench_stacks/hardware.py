"""Known models and GPUs, for the model-fit check (weights must fit the tensor-parallel GPUs)."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GPUS", "KNOWN_MODELS", "GpuSpec", "KnownModel", "find_model", "gpu_spec", "min_tensor_parallel"]

# weights may take at most this share of the GPUs' memory; the rest is KV cache and activations
WEIGHT_SHARE = 0.9


@dataclass(frozen=True)
class KnownModel:
    id: str
    params_b: float
    dtype: str
    bytes_per_param: float
    layers: int
    kv_heads: int
    head_dim: int

    @property
    def weights_gb(self) -> float:
        return self.params_b * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        return int(2 * self.layers * self.kv_heads * self.head_dim * 2)


@dataclass(frozen=True)
class GpuSpec:
    name: str
    vendor: str
    memory_gb: float


KNOWN_MODELS: dict[str, KnownModel] = {
    m.id.lower(): m
    for m in (
        KnownModel("Qwen/Qwen3-8B", 8.2, "bf16", 2, 36, 8, 128),
        KnownModel("Qwen/Qwen3-32B", 32.8, "bf16", 2, 64, 8, 128),
        KnownModel("Qwen/Qwen3-32B-FP8", 32.8, "fp8", 1, 64, 8, 128),
        KnownModel("Qwen/Qwen3-235B-A22B", 235.1, "bf16", 2, 94, 4, 128),
        KnownModel("Qwen/Qwen3-235B-A22B-FP8", 235.1, "fp8", 1, 94, 4, 128),
        KnownModel("meta-llama/Llama-3.1-8B", 8.0, "bf16", 2, 32, 8, 128),
        KnownModel("meta-llama/Llama-3.1-8B-Instruct", 8.0, "bf16", 2, 32, 8, 128),
        KnownModel("meta-llama/Llama-3.1-70B", 70.6, "bf16", 2, 80, 8, 128),
        KnownModel("meta-llama/Llama-3.1-70B-Instruct", 70.6, "bf16", 2, 80, 8, 128),
        # hybrid: 10 of 40 layers are full attention (2 kv heads, d 256); the rest carry per-sequence state
        KnownModel("Qwen/Qwen3.6-35B-A3B", 35.0, "bf16", 2, 10, 2, 256),
        KnownModel("nvidia/Qwen3.6-35B-A3B-NVFP4", 35.0, "nvfp4", 0.63, 10, 2, 256),
    )
}

GPUS: dict[str, GpuSpec] = {
    g.name.upper(): g
    for g in (
        GpuSpec("L40S", "nvidia", 48),
        GpuSpec("A100", "nvidia", 80),
        GpuSpec("H100", "nvidia", 80),
        GpuSpec("H200", "nvidia", 141),
        GpuSpec("B200", "nvidia", 180),
        GpuSpec("GB10", "nvidia", 121),
        GpuSpec("MI300X", "amd", 192),
        GpuSpec("MI325X", "amd", 256),
        GpuSpec("MI355X", "amd", 288),
    )
}


def find_model(model_id: str) -> KnownModel | None:
    return KNOWN_MODELS.get(model_id.lower())


def gpu_spec(name: str | None) -> GpuSpec | None:
    if not name:
        return None
    key = name.upper().replace("NVIDIA ", "").replace("AMD ", "").replace("INSTINCT ", "").strip()
    for known, spec in GPUS.items():
        if key == known or key.startswith((known + " ", known + "-")):
            return spec
    return None


def min_tensor_parallel(model: KnownModel, gpu: GpuSpec) -> int:
    """The smallest power of two whose GPUs hold the weights (TP must divide the attention heads)."""
    need = model.weights_gb / (gpu.memory_gb * WEIGHT_SHARE)
    return 1 << max(0, math.ceil(math.log2(max(need, 1.0))))
