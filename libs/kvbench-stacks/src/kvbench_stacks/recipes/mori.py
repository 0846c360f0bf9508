"""AMD MoRI stacks: vLLM P/D over MoRI-IO, SGLang HiCache over MoRI (stacks.md 6)."""

from __future__ import annotations

from kvbench_stacks.recipes.common import (
    EngineSlot,
    Machines,
    engine_slots,
    head_first,
    host_of,
    kv_transfer_config,
    place,
)
from kvbench_stacks.recipes.engines import hicache_args, sglang, vllm
from kvbench_stacks.recipes.images import vllm_router_image
from kvbench_stacks.recipes.model import ProcessSpec, RenderContext
from kvbench_stacks.recipes.ports import PORTS
from kvbench_stacks.recipes.registry import recipe
from kvbench_stacks.recipes.servers import (
    mooncake_master_address,
    pd_router_argv,
    router_process,
)


@recipe("vllm-pd-mori")
def vllm_pd_mori(ctx: RenderContext) -> Machines:  # stacks.md 6: vllm-router first
    slots = engine_slots(ctx, True)

    def build(s: EngineSlot) -> ProcessSpec:
        role = "kv_producer" if s.role == "prefill" else "kv_consumer"
        extra = {
            "proxy_ip": host_of(ctx, 0),
            "proxy_ping_port": PORTS["mori_discovery"],
            "http_port": s.port,
            "handshake_port": PORTS["mori_handshake_base"] + s.index,
            "notify_port": PORTS["mori_notify_base"] + s.index * 8,
            "backend": "rdma",
            "read_mode": True,
        }
        spec = vllm(
            ctx,
            s,
            kv_transfer_config(
                {"kv_connector": "MoRIIOConnector", "kv_role": role, "kv_connector_extra_config": extra}
            ),
            env={"VLLM_ROCM_USE_AITER": "1"},
        )
        return spec.model_copy(
            update={
                "ports": {
                    **spec.ports,
                    "handshake": PORTS["mori_handshake_base"] + s.index,
                    "notify": PORTS["mori_notify_base"] + s.index * 8,
                }
            }
        )

    router = router_process(
        ctx,
        [
            *pd_router_argv("moriio"),
            "--vllm-discovery-address",
            f"0.0.0.0:{PORTS['mori_discovery']}",
            "--policy",
            "consistent_hash",
        ],
        "vllm-router",
        vllm_router_image(),
    )
    # the router learns its discovery address from --vllm-discovery-address alone: its Rust binary reads no
    # VLLM_DISCOVERY_ADDRESS (a variable set here did nothing; tools/conformance env names)
    router = router.model_copy(update={"ports": {**router.ports, "discovery": PORTS["mori_discovery"]}})
    return head_first(place(slots, build), router)


@recipe("sglang-hicache-mori")
def sglang_hicache_mori(ctx: RenderContext) -> Machines:  # stacks.md 6 (UNCONFIRMED recipe there)
    return place(
        engine_slots(ctx, False),
        lambda s: sglang(
            ctx,
            s,
            [*hicache_args(ctx), "--hicache-storage-backend", "mori"],
            env={
                "UMBP_MASTER_ADDRESS": mooncake_master_address(ctx),
                "UMBP_NODE_ADDRESS": host_of(ctx, s.machine),
            },
        ),
    )
