"""vLLM stacks with one kind of engine: prefix cache, native offload, LMCache, Mooncake store (stacks.md 1)."""

from __future__ import annotations

import json

from kvbench_stacks.recipes.common import (
    EngineSlot,
    Machines,
    engine_slots,
    engines_per_machine,
    head_first,
    kv_transfer_config,
    offload_bytes,
    place,
)
from kvbench_stacks.recipes.engines import vllm
from kvbench_stacks.recipes.model import ProcessSpec, RenderContext
from kvbench_stacks.recipes.registry import recipe
from kvbench_stacks.recipes.servers import (
    lmcache_mooncake_l2,
    lmcache_mp_connector,
    lmcache_tiers,
    mooncake_master,
    mooncake_master_address,
    mooncake_transport,
    valkey,
    valkey_l2_adapter,
    with_lmcache_servers,
)


@recipe("vllm-prefix-off", on=False)
@recipe("vllm-prefix-gpu", on=True)
def vllm_prefix(ctx: RenderContext, on: bool) -> Machines:
    return place(engine_slots(ctx, False), lambda s: vllm(ctx, s, [], prefix_cache=on))


@recipe("vllm-native-cpu-offload")
def vllm_cpu_offload(ctx: RenderContext) -> Machines:  # stacks.md 1.2
    slots = engine_slots(ctx, False)
    per = engines_per_machine(slots)

    def gib(s: EngineSlot) -> float:  # the size is the total across the engine's TP ranks (stacks.md 1.2)
        return float(ctx.sizing.get("host_memory_gb") or 0) / per[s.machine]

    return place(
        slots, lambda s: vllm(ctx, s, ["--kv-offloading-size", f"{gib(s):g}", "--kv-offloading-backend", "native"])
    )


@recipe("vllm-native-shared-fs")
def vllm_shared_fs(ctx: RenderContext) -> Machines:  # stacks.md 1.3
    slots = engine_slots(ctx, False)
    per = engines_per_machine(slots)

    def build(s: EngineSlot) -> ProcessSpec:
        config = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "cpu_bytes_to_use": offload_bytes(ctx, per[s.machine]),
                "spec_name": "TieringOffloadingSpec",
                "secondary_tiers": [
                    {
                        "type": "fs",
                        "root_dir": ctx.sizing.get("shared_mount_path"),
                        "n_read_threads": 16,
                        "n_write_threads": 16,
                    }
                ],
            },
        }
        return vllm(ctx, s, kv_transfer_config(config))

    return place(slots, build)


@recipe("vllm-lmcache-valkey")
def vllm_lmcache_valkey(ctx: RenderContext) -> Machines:  # stacks.md 1.4 with the product's LMCache server
    l1, l2 = lmcache_tiers(ctx)
    l2.append(valkey_l2_adapter(ctx))
    out = with_lmcache_servers(
        ctx, place(engine_slots(ctx, False), lambda s: vllm(ctx, s, lmcache_mp_connector(ctx, s))), l2, l1
    )
    return head_first(out, valkey(ctx))


@recipe("vllm-lmcache-mooncake")
def vllm_lmcache_mooncake(ctx: RenderContext) -> Machines:  # stacks.md 1.5 (MP mode, L2 mooncake_store)
    l1, l2 = lmcache_tiers(ctx)
    l2.append(lmcache_mooncake_l2(ctx))
    out = with_lmcache_servers(
        ctx, place(engine_slots(ctx, False), lambda s: vllm(ctx, s, lmcache_mp_connector(ctx, s))), l2, l1
    )
    return head_first(out, mooncake_master(ctx))


@recipe("vllm-mooncake-store")
def vllm_mooncake_store(ctx: RenderContext) -> Machines:  # stacks.md 1.6
    gb = float(ctx.sizing.get("shared_store_gb") or 0)
    slots = engine_slots(ctx, False)
    per = engines_per_machine(slots)

    def build(s: EngineSlot) -> ProcessSpec:
        cfg = {
            "mode": "embedded",
            "metadata_server": "P2PHANDSHAKE",
            "master_server_address": mooncake_master_address(ctx),
            "global_segment_size": int(gb * 2**30 / max(sum(per.values()), 1)),
            "local_buffer_size": 2**30,
            **mooncake_transport(ctx),
        }
        name = f"mooncake-{s.index}.json"
        return vllm(
            ctx,
            s,
            kv_transfer_config({"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}),
            env={"MOONCAKE_CONFIG_PATH": f"{{run_dir}}/{name}"},
            files={name: json.dumps(cfg, indent=2)},
        )

    return head_first(place(slots, build), mooncake_master(ctx))


@recipe("vllm-lmcache-mp")
def vllm_lmcache_mp(ctx: RenderContext) -> Machines:  # stacks.md 1.12 (the LMCache study's stack)
    l1, l2 = lmcache_tiers(ctx)
    out = with_lmcache_servers(
        ctx, place(engine_slots(ctx, False), lambda s: vllm(ctx, s, lmcache_mp_connector(ctx, s))), l2, l1
    )
    return out
