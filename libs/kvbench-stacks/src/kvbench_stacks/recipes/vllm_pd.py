"""vLLM prefill/decode split stacks: NIXL, Mooncake, LMCache (stacks.md 1.7-1.11)."""

from __future__ import annotations

from typing import Any

import yaml

from kvbench_stacks.recipes.common import (
    EngineSlot,
    Machines,
    engine_slots,
    engines_per_machine,
    head_first,
    head_last,
    host_of,
    kv_transfer_config,
    nixl_telemetry,
    offload_bytes,
    place,
)
from kvbench_stacks.recipes.engines import vllm
from kvbench_stacks.recipes.model import ProcessSpec, RenderContext
from kvbench_stacks.recipes.ports import PORTS
from kvbench_stacks.recipes.registry import recipe
from kvbench_stacks.recipes.servers import (
    lmcache_mooncake_l2,
    lmcache_mp_connector,
    lmcache_pd_proxy,
    lmcache_tiers,
    mooncake_master,
    vllm_pd_router,
    with_lmcache_servers,
)


@recipe("vllm-pd-nixl")
@recipe("vllm-pd-nixl-native-offload", offload=True)
def vllm_pd_nixl(ctx: RenderContext, offload: bool = False) -> Machines:  # stacks.md 1.7 and 1.9
    slots = engine_slots(ctx, True)
    per = engines_per_machine(slots)

    def build(s: EngineSlot) -> ProcessSpec:
        nixl = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": "fail"}
        config: dict[str, Any] = nixl
        if offload:
            config = {
                "kv_connector": "MultiConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {
                    "connectors": [
                        {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                        {
                            "kv_connector": "OffloadingConnector",
                            "kv_role": "kv_both",
                            "kv_connector_extra_config": {"cpu_bytes_to_use": offload_bytes(ctx, per[s.machine])},
                        },
                    ]
                },
            }
        side = PORTS["nixl_side_channel_base"] + s.index
        spec = vllm(
            ctx,
            s,
            kv_transfer_config(config),
            env={
                "VLLM_NIXL_SIDE_CHANNEL_HOST": host_of(ctx, s.machine),
                "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side),
                "UCX_TLS": "all",
                **({"UCX_NET_DEVICES": f"{ctx.network['rdma_device']}:1"} if ctx.network.get("rdma_device") else {}),
            },
        )
        return spec.model_copy(update={"ports": {**spec.ports, "nixl_side_channel": side}})

    return head_last(place(slots, build), vllm_pd_router(ctx, slots, "nixl"))


@recipe("vllm-pd-mooncake")
def vllm_pd_mooncake(ctx: RenderContext) -> Machines:  # stacks.md 1.8
    slots = engine_slots(ctx, True)

    def build(s: EngineSlot) -> ProcessSpec:
        role = "kv_producer" if s.role == "prefill" else "kv_consumer"
        extra = {
            "mooncake_protocol": "rdma" if ctx.network.get("rdma_device") else "tcp",
            "device_name": ctx.network.get("rdma_device") or "",
        }
        env = {"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(PORTS["pd_bootstrap_base"] + s.index)} if s.role == "prefill" else {}
        spec = vllm(
            ctx,
            s,
            kv_transfer_config(
                {"kv_connector": "MooncakeConnector", "kv_role": role, "kv_connector_extra_config": extra}
            ),
            env=env,
        )
        if s.role == "prefill":
            spec = spec.model_copy(update={"ports": {**spec.ports, "bootstrap": PORTS["pd_bootstrap_base"] + s.index}})
        return spec

    return head_last(place(slots, build), vllm_pd_router(ctx, slots, "mooncake"))


@recipe("vllm-pd-nixl-lmcache")
def vllm_pd_nixl_lmcache(ctx: RenderContext) -> Machines:  # stacks.md 1.10 (start: proxy, decoder, prefiller)
    slots = engine_slots(ctx, True, one_per_machine=True)
    decode = next(s for s in slots if s.role == "decode")
    buffer = 1 << 30

    def build(s: EngineSlot) -> ProcessSpec:
        if s.role == "prefill":
            cfg: dict[str, Any] = {
                "enable_pd": True,
                "transfer_channel": "nixl",
                "pd_role": "sender",
                "pd_proxy_host": host_of(ctx, 0),
                "pd_proxy_port": PORTS["lmcache_pd_proxy"],
                "pd_buffer_size": buffer,
                "pd_buffer_device": "cuda",
                "nixl_backends": ["UCX"],
                "local_cpu": False,
                "save_unfull_chunk": True,
            }
        else:
            cfg = {
                "enable_pd": True,
                "transfer_channel": "nixl",
                "pd_role": "receiver",
                "pd_peer_host": host_of(ctx, s.machine),
                "pd_peer_init_port": [PORTS["lmcache_pd_init_base"] + s.index],
                "pd_peer_alloc_port": [PORTS["lmcache_pd_alloc_base"] + s.index],
                "pd_buffer_size": buffer,
                "pd_buffer_device": "cuda",
                "nixl_backends": ["UCX"],
            }
            if ctx.kv_tier in ("cpu_ram", "nvme"):
                cfg["local_cpu"] = True
                cfg["max_local_cpu_size"] = float(ctx.sizing.get("host_memory_gb") or 5)
        name = f"lmcache-{s.role}.yaml"
        role = "kv_producer" if s.role == "prefill" else "kv_consumer"
        spec = vllm(
            ctx,
            s,
            kv_transfer_config(
                {
                    "kv_connector": "LMCacheConnectorV1",
                    "kv_role": role,
                    "kv_connector_extra_config": {
                        "discard_partial_chunks": False,
                        "lmcache_rpc_port": f"{s.role}{s.machine}",
                    },
                }
            ),
            env={"LMCACHE_CONFIG_FILE": f"{{run_dir}}/{name}", "UCX_TLS": "cuda_ipc,cuda_copy,tcp"},
            files={name: yaml.safe_dump(cfg, sort_keys=False)},
            prefix_cache=False,
        )
        spec = nixl_telemetry(spec, s)  # LMCache's NIXL channel counts no bytes itself
        if s.role == "decode":
            spec = spec.model_copy(
                update={
                    "ports": {
                        **spec.ports,
                        "pd_init": PORTS["lmcache_pd_init_base"] + s.index,
                        "pd_alloc": PORTS["lmcache_pd_alloc_base"] + s.index,
                    }
                }
            )
        return spec

    prefill = next(s for s in slots if s.role == "prefill")
    proxy = lmcache_pd_proxy(
        ctx,
        "disagg_prefill/disagg_proxy_server.py",
        prefill,
        decode,
        [
            "--decoder-init-port",
            str(PORTS["lmcache_pd_init_base"] + decode.index),
            "--decoder-alloc-port",
            str(PORTS["lmcache_pd_alloc_base"] + decode.index),
            "--proxy-host",
            "0.0.0.0",
            "--proxy-port",
            str(PORTS["lmcache_pd_proxy"]),
        ],
        {"pd_proxy": PORTS["lmcache_pd_proxy"]},
    )
    out = place(sorted(slots, key=lambda s: s.role != "decode"), build)  # decoder before prefiller
    return head_first(out, proxy)


@recipe("vllm-pd-lmcache-store")
def vllm_pd_lmcache_store(ctx: RenderContext) -> Machines:  # stacks.md 1.11 (b), MP mode
    slots = engine_slots(ctx, True)
    l1, l2 = lmcache_tiers(ctx)
    l2.append(lmcache_mooncake_l2(ctx, rdma=False))  # stacks.md 1.11 (b): the store over TCP
    telemetry = f"http://{host_of(ctx, 0)}:{PORTS['lmcache_telemetry']}/api/v1/telemetry"

    def build(s: EngineSlot) -> ProcessSpec:
        env = (
            {"LMCACHE_REQUEST_TELEMETRY_TYPE": "fastapi", "LMCACHE_REQUEST_TELEMETRY_ENDPOINT": telemetry}
            if s.role == "prefill"
            else {}
        )
        return vllm(ctx, s, lmcache_mp_connector(ctx, s), env=env)

    prefill = next(s for s in slots if s.role == "prefill")
    decode = next(s for s in slots if s.role == "decode")
    proxy = lmcache_pd_proxy(
        ctx,
        "disagg_prefill_mp/disagg_proxy_server.py",
        prefill,
        decode,
        ["--telemetry-port", str(PORTS["lmcache_telemetry"])],
        {"telemetry": PORTS["lmcache_telemetry"]},
    )
    out = with_lmcache_servers(ctx, place(slots, build), l2, l1)
    # start order (Mooncake docs): master, LMCache servers, proxy, prefiller, decoder
    out[0] = [
        mooncake_master(ctx),
        *[p for p in out[0] if p.role == "lmcache"],
        proxy,
        *[p for p in out[0] if p.role not in ("lmcache",)],
    ]
    return out
