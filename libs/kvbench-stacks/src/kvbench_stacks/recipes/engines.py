"""The engine processes: one vLLM, SGLang or TensorRT-LLM server on one slot (stacks.md 1, 2, 3)."""

from __future__ import annotations

from typing import Any

import yaml

from kvbench_stacks.recipes.common import EngineSlot, engine_env, image_for, role_of, served_name, user_args
from kvbench_stacks.recipes.images import image_version, sglang_image, trtllm_image, vllm_image
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
    rocm = ctx.machines[slot.machine].vendor == "amd"
    argv = [
        "vllm",
        "serve",
        ctx.model_source,
        *served_name(ctx),
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
        # VLLM_SERVER_DEV_MODE opens vLLM's development routes (/reset_prefix_cache among them; api_server.py serves
        # them only with it): set only where the acceptance test's reset step needs it, and the review says so
        env={**engine_env(ctx, slot), **(env or {}), **({"VLLM_SERVER_DEV_MODE": "1"} if ctx.open_reset_route else {})},
        files=files or {},
        ports={"http": slot.port},
        health=("http", slot.port, "/health"),
        metrics=(slot.port, "/metrics"),
        gpus=slot.gpus,
        binary="vllm",
        image=image_for(ctx, vllm_image(image_version(ctx.stack, "vllm", ctx.engine.version), rocm)),
        serves_requests=slot.role in ("engine", "decode"),
    )


def sglang(ctx: RenderContext, slot: EngineSlot, extra: list[str], env: dict[str, str] | None = None) -> ProcessSpec:
    machine = ctx.machines[slot.machine]
    argv = [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        ctx.model_source,
        *served_name(ctx),
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
        env={**engine_env(ctx, slot), **(env or {})},
        ports=ports,
        health=("http", slot.port, "/health"),
        metrics=(slot.port, "/metrics"),
        gpus=slot.gpus,
        binary="python-module:sglang",
        image=image_for(
            ctx,
            sglang_image(
                image_version(ctx.stack, "sglang", ctx.engine.version), machine.vendor == "amd", machine.gpu_model
            ),
        ),
        serves_requests=slot.role in ("engine", "decode"),
    )


def trtllm(ctx: RenderContext, slot: EngineSlot, config: dict[str, Any]) -> ProcessSpec:
    name = f"engine-{slot.index}"
    # return_perf_metrics: TensorRT-LLM's MetricsCollector fills its per-request counters (prompt and cached tokens,
    # by cache tier) only with it (tensorrt_llm/metrics/collector.py)
    base: dict[str, Any] = {
        "kv_cache_config": {"free_gpu_memory_fraction": 0.9},
        "enable_iter_perf_stats": True,
        "return_perf_metrics": True,
    }
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
        # every release takes --extra_llm_api_options; its alias --config exists only from 1.2 (recorded/trtllm.toml)
        "--extra_llm_api_options",
        f"{{run_dir}}/{name}.yml",
        *user_args(ctx.engine.args),
    ]
    return ProcessSpec(
        name=name,
        role=role_of(slot),
        argv=argv,
        env=engine_env(ctx, slot),
        files={f"{name}.yml": yaml.safe_dump(base, sort_keys=False)},
        ports={"http": slot.port},
        health=("http", slot.port, "/health"),
        metrics=(slot.port, "/prometheus/metrics"),
        gpus=slot.gpus,
        binary="trtllm-serve",
        image=image_for(ctx, trtllm_image(image_version(ctx.stack, "trtllm", ctx.engine.version))),
        serves_requests=slot.role in ("engine", "decode"),
    )


HICACHE_PAGE_SIZE = "64"  # tokens a page of SGLang's hierarchical cache; both sides of a P/D pair must agree


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
        HICACHE_PAGE_SIZE,
    ]
