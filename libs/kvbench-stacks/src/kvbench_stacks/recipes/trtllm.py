"""TensorRT-LLM stacks: block reuse, host offload, NIXL split, LMCache (stacks.md 3)."""

from __future__ import annotations

import yaml

from kvbench_stacks.recipes.common import (
    EngineSlot,
    Machines,
    engine_slots,
    head_first,
    head_last,
    host_of,
    nixl_telemetry,
    place,
)
from kvbench_stacks.recipes.engines import trtllm
from kvbench_stacks.recipes.images import image_version, trtllm_image
from kvbench_stacks.recipes.model import ProcessSpec, RenderContext
from kvbench_stacks.recipes.ports import PORTS
from kvbench_stacks.recipes.registry import recipe
from kvbench_stacks.recipes.servers import (
    cache_server_of,
    lmcache_tiers,
    router_process,
    valkey,
    valkey_l2_adapter,
    with_lmcache_servers,
)


@recipe("trtllm-reuse-off", reuse=False)
@recipe("trtllm-reuse", reuse=True)
def trtllm_block_reuse(ctx: RenderContext, reuse: bool) -> Machines:  # stacks.md 3
    return place(engine_slots(ctx, False), lambda s: trtllm(ctx, s, {"kv_cache_config": {"enable_block_reuse": reuse}}))


@recipe("trtllm-host-offload")
def trtllm_host_offload(ctx: RenderContext) -> Machines:  # stacks.md 3: reuse plus a host tier of host_memory_gb
    host_bytes = int(float(ctx.sizing.get("host_memory_gb") or 0) * 2**30)
    config = {"kv_cache_config": {"enable_block_reuse": True, "host_cache_size": host_bytes}}
    return place(engine_slots(ctx, False), lambda s: trtllm(ctx, s, config))


@recipe("trtllm-pd-nixl")
def trtllm_pd(ctx: RenderContext) -> Machines:  # stacks.md 3, disaggregated over NIXL
    slots = engine_slots(ctx, True)

    def engine(s: EngineSlot) -> ProcessSpec:
        spec = trtllm(
            ctx,
            s,
            {
                "cache_transceiver_config": {"backend": "NIXL", "max_tokens_in_buffer": 32768},
                **({"disable_overlap_scheduler": True} if s.role == "prefill" else {}),
            },
        )
        # NIXL's plugin for the KV transfer: read by the engines' cache transceiver (its NIXL agent), not the
        # disaggregated proxy, which moves no KV; UCX is its default, named so a site's environment cannot change it
        # TensorRT-LLM's metrics collector has no transfer series: NIXL's own telemetry counts the bytes
        return nixl_telemetry(spec.model_copy(update={"env": {**spec.env, "TRTLLM_NIXL_KVCACHE_BACKEND": "UCX"}}), s)

    out = place(slots, engine)
    disagg = {
        "hostname": "0.0.0.0",
        "port": PORTS["router"],
        "backend": "pytorch",
        "context_servers": {
            "num_instances": sum(s.role == "prefill" for s in slots),
            "urls": [f"{host_of(ctx, s.machine)}:{s.port}" for s in slots if s.role == "prefill"],
        },
        "generation_servers": {
            "num_instances": sum(s.role == "decode" for s in slots),
            "urls": [f"{host_of(ctx, s.machine)}:{s.port}" for s in slots if s.role == "decode"],
        },
    }
    router = router_process(
        ctx,
        ["trtllm-serve", "disaggregated", "-c", "{run_dir}/disagg.yaml"],
        "trtllm-serve",
        trtllm_image(image_version(ctx.stack, "trtllm", ctx.engine.version)),
    )
    router = router.model_copy(update={"files": {"disagg.yaml": yaml.safe_dump(disagg, sort_keys=False)}})
    return head_last(out, router)


@recipe("trtllm-lmcache-valkey")
def trtllm_lmcache_valkey(ctx: RenderContext) -> Machines:  # stacks.md 3, LMCache with Valkey
    l1, l2 = lmcache_tiers(ctx)
    l2.append(valkey_l2_adapter(ctx))
    out = place(
        engine_slots(ctx, False),
        lambda s: trtllm(
            ctx,
            s,
            {
                "kv_connector_config": {
                    "connector": "lmcache-mp",
                    "server_url": "tcp://{}:{}".format(*cache_server_of(ctx, s)),
                }
            },
        ),
    )
    return head_first(with_lmcache_servers(ctx, out, l2, l1), valkey(ctx))
