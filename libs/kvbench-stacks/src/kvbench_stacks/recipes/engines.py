"""The engine processes: one vLLM, SGLang or TensorRT-LLM server on one slot (stacks.md 1, 2, 3)."""

from __future__ import annotations

from typing import Any

import yaml

from kvbench_stacks.recipes.common import EngineSlot, gpu_env, image_for, role_of, user_args
from kvbench_stacks.recipes.model import ProcessSpec, RenderContext
from kvbench_stacks.recipes.ports import PORTS


def vllm(
    ctx: RenderContext,
    slot: EngineSlot,
    extra: list[str],
    env: dict[str, str] | None = None,
    files: dict[str, str] | None = None,
    prefix_cache: bool = True,
) -> ProcessSpec:
    tag = ctx.engine.version or "latest"
    rocm = ctx.machines[slot.machine].vendor == "amd"
    argv = [
        "vllm",
        "serve",
        ctx.model,
        "--host",
        "0.0.0.0",
        "--port",
        str(slot.port),
        "--tensor-parallel-size",
        str(ctx.engine.tensor_parallel_size),
        "--enable-prompt-tokens-details",
        "--enable-prefix-caching" if prefix_cache else "--no-enable-prefix-caching",
        *extra,
        *user_args(ctx.engine.args),
    ]
    return ProcessSpec(
        name=f"engine-{slot.index}",
        role=role_of(slot),
        argv=argv,
        env={**gpu_env(ctx, slot), **(env or {})},
        files=files or {},
        ports={"http": slot.port},
        health=("http", slot.port, "/health"),
        metrics=(slot.port, "/metrics"),
        gpus=slot.gpus,
        binary="vllm",
        image=image_for(ctx, f"vllm/vllm-openai-rocm:{tag}" if rocm else f"vllm/vllm-openai:{tag}"),
        serves_requests=slot.role in ("engine", "decode"),
    )


def sglang(ctx: RenderContext, slot: EngineSlot, extra: list[str], env: dict[str, str] | None = None) -> ProcessSpec:
    tag = ctx.engine.version or "latest"
    rocm = ctx.machines[slot.machine].vendor == "amd"
    argv = [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        ctx.model,
        "--host",
        "0.0.0.0",
        "--port",
        str(slot.port),
        "--tp-size",
        str(ctx.engine.tensor_parallel_size),
        "--enable-metrics",
        "--enable-cache-report",
        *extra,
        *user_args(ctx.engine.args),
    ]
    ports = {"http": slot.port}
    if slot.role == "prefill":
        ports["bootstrap"] = PORTS["pd_bootstrap_base"] + slot.index
    return ProcessSpec(
        name=f"engine-{slot.index}",
        role=role_of(slot),
        argv=argv,
        env={**gpu_env(ctx, slot), **(env or {})},
        ports=ports,
        health=("http", slot.port, "/health"),
        metrics=(slot.port, "/metrics"),
        gpus=slot.gpus,
        binary="python-module:sglang",
        image=image_for(ctx, f"lmsysorg/sglang:{tag}-rocm" if rocm else f"lmsysorg/sglang:{tag}"),
        serves_requests=slot.role in ("engine", "decode"),
    )


def trtllm(ctx: RenderContext, slot: EngineSlot, config: dict[str, Any]) -> ProcessSpec:
    name = f"engine-{slot.index}"
    base: dict[str, Any] = {"kv_cache_config": {"free_gpu_memory_fraction": 0.9}, "enable_iter_perf_stats": True}
    for key, value in config.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    argv = [
        "trtllm-serve",
        ctx.model,
        "--host",
        "0.0.0.0",
        "--port",
        str(slot.port),
        "--backend",
        "pytorch",
        "--tp_size",
        str(ctx.engine.tensor_parallel_size),
        "--config",
        f"{{run_dir}}/{name}.yml",
        *user_args(ctx.engine.args),
    ]
    return ProcessSpec(
        name=name,
        role=role_of(slot),
        argv=argv,
        env=gpu_env(ctx, slot),
        files={f"{name}.yml": yaml.safe_dump(base, sort_keys=False)},
        ports={"http": slot.port},
        health=("http", slot.port, "/health"),
        metrics=(slot.port, "/prometheus/metrics"),
        gpus=slot.gpus,
        binary="trtllm-serve",
        image=image_for(ctx, f"nvcr.io/nvidia/tensorrt-llm/release:{ctx.engine.version or 'latest'}"),
        serves_requests=slot.role in ("engine", "decode"),
    )


def hicache_args(ctx: RenderContext, *, enable: bool = True) -> list[str]:
    """SGLang's hierarchical cache over host memory (host_memory_gb), written through (stacks.md 2.2).

    ``enable=False``: its sizing only, for a P/D decode engine offloading KV: decode mode turns the radix cache off,
    and SGLang refuses --enable-hierarchical-cache with it ("enable-hierarchical-cache and disable-radix-cache are
    mutually exclusive", SGLang 0.5.20 and 0.5.23); --disaggregation-decode-enable-offload-kvcache alone turns
    the host pool on."""
    return [
        *(["--enable-hierarchical-cache"] if enable else []),
        "--hicache-size",
        f"{float(ctx.sizing.get('host_memory_gb') or 0):g}",
        "--hicache-write-policy",
        "write_through",
        "--page-size",
        "64",
    ]
