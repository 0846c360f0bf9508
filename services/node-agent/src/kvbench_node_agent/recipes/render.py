"""Launch recipes for every catalog stack (flags and configs from reference/stacks.md, section in comments).

``render(ctx)`` returns, per machine, the processes in start order. The process and docker launchers run
them; the sim launcher does not use recipes (it starts simulated engines directly).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from kvbench_node_agent.recipes.model import ProcessSpec, RenderContext
from kvbench_node_agent.recipes.ports import PORTS, engine_port

__all__ = ["RECIPES", "EngineSlot", "UnknownStackError", "render"]


class UnknownStackError(ValueError):
    pass


@dataclass(frozen=True)
class EngineSlot:
    machine: int
    index: int  # engine index on its machine
    gpus: list[int]
    role: str  # engine | prefill | decode

    @property
    def port(self) -> int:
        return engine_port(self.index)


# -- shared pieces ------------------------------------------------------------------------------
def _user_args(args: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in args.items():
        if key in ("image", "lmcache_examples"):
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        else:
            out += [flag, json.dumps(value) if isinstance(value, dict | list) else str(value)]
    return out


def _slots(ctx: RenderContext, split: bool, one_per_machine: bool = False) -> list[EngineSlot]:
    tp = ctx.engine.tensor_parallel_size
    slots: list[EngineSlot] = []
    for m, machine in enumerate(ctx.machines):
        gpus = int(ctx.sizing.get("gpus_per_machine") or machine.gpus or tp)
        count = 1 if one_per_machine else max(1, gpus // tp)
        for i in range(count):
            slots.append(EngineSlot(m, i, list(range(i * tp, (i + 1) * tp)), "engine"))
    if not split:
        return slots
    prefill_machines = ctx.sizing.get("prefill_machines")
    prefill_gpus = ctx.sizing.get("prefill_gpus")
    if prefill_machines:
        return [
            EngineSlot(s.machine, s.index, s.gpus, "prefill" if s.machine < prefill_machines else "decode")
            for s in slots
        ]
    prefill_engines = math.ceil(int(prefill_gpus or tp) / tp)
    return [
        EngineSlot(s.machine, s.index, s.gpus, "prefill" if k < prefill_engines else "decode")
        for k, s in enumerate(slots)
    ]


def _gpu_env(ctx: RenderContext, slot: EngineSlot) -> dict[str, str]:
    devices = ",".join(str(g) for g in slot.gpus)
    vendor = ctx.machines[slot.machine].vendor
    env = {"PYTHONHASHSEED": "0"}  # the same block hashes on every instance (stacks.md 0)
    env["HIP_VISIBLE_DEVICES" if vendor == "amd" else "CUDA_VISIBLE_DEVICES"] = devices
    return env


def _image(ctx: RenderContext, default: str) -> str:
    return str(ctx.engine.args.get("image") or default)


def _host(ctx: RenderContext, machine: int) -> str:
    return ctx.machines[machine].host


def _url(ctx: RenderContext, slot: EngineSlot) -> str:
    return f"http://{_host(ctx, slot.machine)}:{slot.port}"


def _role(slot: EngineSlot) -> Any:
    return slot.role


# -- engines -----------------------------------------------------------------------------------
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
        *_user_args(ctx.engine.args),
    ]
    return ProcessSpec(
        name=f"engine-{slot.index}",
        role=_role(slot),
        argv=argv,
        env={**_gpu_env(ctx, slot), **(env or {})},
        files=files or {},
        ports={"http": slot.port},
        health=("http", slot.port, "/health"),
        metrics=(slot.port, "/metrics"),
        gpus=slot.gpus,
        binary="vllm",
        image=_image(ctx, f"vllm/vllm-openai-rocm:{tag}" if rocm else f"vllm/vllm-openai:{tag}"),
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
        *_user_args(ctx.engine.args),
    ]
    ports = {"http": slot.port}
    if slot.role == "prefill":
        ports["bootstrap"] = PORTS["pd_bootstrap_base"] + slot.index
    return ProcessSpec(
        name=f"engine-{slot.index}",
        role=_role(slot),
        argv=argv,
        env={**_gpu_env(ctx, slot), **(env or {})},
        ports=ports,
        health=("http", slot.port, "/health"),
        metrics=(slot.port, "/metrics"),
        gpus=slot.gpus,
        binary="python-module:sglang",
        image=_image(ctx, f"lmsysorg/sglang:{tag}-rocm" if rocm else f"lmsysorg/sglang:{tag}"),
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
        *_user_args(ctx.engine.args),
    ]
    return ProcessSpec(
        name=name,
        role=_role(slot),
        argv=argv,
        env=_gpu_env(ctx, slot),
        files={f"{name}.yml": yaml.safe_dump(base, sort_keys=False)},
        ports={"http": slot.port},
        health=("http", slot.port, "/health"),
        metrics=(slot.port, "/prometheus/metrics"),
        gpus=slot.gpus,
        binary="trtllm-serve",
        image=_image(ctx, f"nvcr.io/nvidia/tensorrt-llm/release:{ctx.engine.version or 'latest'}"),
        serves_requests=slot.role in ("engine", "decode"),
    )


# -- shared services ---------------------------------------------------------------------------
def valkey(ctx: RenderContext) -> ProcessSpec:
    gb = float(ctx.sizing.get("shared_store_gb") or 0)
    port = PORTS["valkey"]
    return ProcessSpec(
        name="valkey",
        role="store",
        binary="valkey-server",
        image="valkey/valkey:8",
        argv=[
            "valkey-server",
            "--bind",
            "0.0.0.0",
            "--port",
            str(port),
            "--maxmemory",
            f"{gb:g}gb",
            "--maxmemory-policy",
            "allkeys-lru",
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ],
        ports={"valkey": port},
        health=("tcp", port, ""),
    )


def mooncake_master(ctx: RenderContext, http_metadata: bool = False) -> ProcessSpec:
    argv = [
        "mooncake_master",
        f"--rpc_port={PORTS['mooncake_rpc']}",
        f"--metrics_port={PORTS['mooncake_metrics']}",
        "--eviction_high_watermark_ratio=0.9",
    ]
    ports = {"rpc": PORTS["mooncake_rpc"], "metrics": PORTS["mooncake_metrics"]}
    if http_metadata:
        argv += ["--enable_http_metadata_server=true", f"--http_metadata_server_port={PORTS['mooncake_http_metadata']}"]
        ports["http_metadata"] = PORTS["mooncake_http_metadata"]
    return ProcessSpec(
        name="mooncake-master",
        role="master",
        argv=argv,
        ports=ports,
        health=("tcp", PORTS["mooncake_rpc"], ""),
        metrics=(PORTS["mooncake_metrics"], "/metrics"),
        binary="mooncake_master",
        image=_image(ctx, "lmsysorg/sglang:latest"),
    )


def lmcache_server(ctx: RenderContext, l2: list[dict[str, Any]], l1_gb: float) -> ProcessSpec:
    """stacks.md 1.12: the LMCache multi-process server (L1 CPU, L2 adapters), on its own ports."""
    argv = [
        "lmcache",
        "server",
        "--host",
        "0.0.0.0",
        "--port",
        str(PORTS["lmcache_zmq"]),
        "--chunk-size",
        str(ctx.engine.args.get("block-size", 256)),
        "--l1-size-gb",
        f"{l1_gb:g}",
        "--eviction-policy",
        "LRU",
        "--no-l1-use-lazy",
        "--http-host",
        "0.0.0.0",
        "--http-port",
        str(PORTS["lmcache_http"]),
        "--prometheus-port",
        str(PORTS["lmcache_metrics"]),
    ]
    for adapter in l2:
        argv += ["--l2-adapter", json.dumps(adapter, separators=(",", ":"))]
    return ProcessSpec(
        name="lmcache",
        role="lmcache",
        argv=argv,
        ports={"zmq": PORTS["lmcache_zmq"], "http": PORTS["lmcache_http"], "metrics": PORTS["lmcache_metrics"]},
        health=("http", PORTS["lmcache_http"], "/healthcheck"),
        metrics=(PORTS["lmcache_metrics"], "/metrics"),
        binary="lmcache",
        image=_image(ctx, "lmcache/vllm-openai:latest"),
    )


def _lmcache_tiers(ctx: RenderContext) -> tuple[float, list[dict[str, Any]]]:
    l1 = float(ctx.sizing.get("host_memory_gb") or 20)
    l2: list[dict[str, Any]] = []
    if ctx.kv_tier == "nvme":
        l2.append({"type": "fs", "base_path": ctx.sizing.get("disk_tier_path"), "use_odirect": True})
    return l1, l2


def _mp_connector() -> list[str]:
    config = {
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": PORTS["lmcache_zmq"]},
    }
    return ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]


def _ktc(config: dict[str, Any]) -> list[str]:
    return ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]


def _offload_bytes(ctx: RenderContext, engines_on_machine: int) -> int:
    return int(float(ctx.sizing.get("host_memory_gb") or 0) * 2**30 / max(engines_on_machine, 1))


def _per_machine(slots: list[EngineSlot]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for s in slots:
        counts[s.machine] = counts.get(s.machine, 0) + 1
    return counts


def _router(ctx: RenderContext, argv: list[str], binary: str, image: str, health_path: str = "/health") -> ProcessSpec:
    port = PORTS["router"]
    return ProcessSpec(
        name="router",
        role="router",
        argv=argv,
        ports={"http": port},
        health=("http", port, health_path) if health_path else ("tcp", port, ""),
        binary=binary,
        image=_image(ctx, image),
        serves_requests=True,
    )


def _pd_router_argv(connector: str) -> list[str]:
    """vllm-router in P/D mode for one KV connector; callers add how it finds and picks engines."""
    return [
        "vllm-router",
        "--host",
        "0.0.0.0",
        "--port",
        str(PORTS["router"]),
        "--vllm-pd-disaggregation",
        "--kv-connector",
        connector,
    ]


def _vllm_router(
    ctx: RenderContext, slots: list[EngineSlot], connector: str, extra: list[str] | None = None
) -> ProcessSpec:
    argv = [
        *_pd_router_argv(connector),
        "--prefill-policy",
        "cache_aware",
        "--decode-policy",
        "power_of_two",
    ]
    for s in slots:
        argv += ["--prefill" if s.role == "prefill" else "--decode", _url(ctx, s)]
    return _router(ctx, argv + (extra or []), "vllm-router", "vllm/vllm-openai:latest")


# -- the recipes -------------------------------------------------------------------------------
Machines = dict[int, list[ProcessSpec]]


def _place(slots: list[EngineSlot], build: Callable[[EngineSlot], ProcessSpec]) -> Machines:
    out: Machines = {}
    for s in slots:
        out.setdefault(s.machine, []).append(build(s))
    return out


def _head_first(out: Machines, *specs: ProcessSpec) -> Machines:
    out.setdefault(0, [])
    out[0] = [*specs, *out[0]]
    return out


def _head_last(out: Machines, *specs: ProcessSpec) -> Machines:
    out.setdefault(0, []).extend(specs)
    return out


def r_vllm_prefix(ctx: RenderContext, on: bool) -> Machines:
    return _place(_slots(ctx, False), lambda s: vllm(ctx, s, [], prefix_cache=on))


def r_vllm_cpu_offload(ctx: RenderContext) -> Machines:  # stacks.md 1.2
    slots = _slots(ctx, False)
    per = _per_machine(slots)

    def gib(s: EngineSlot) -> float:  # the size is the total across the engine's TP ranks (stacks.md 1.2)
        return float(ctx.sizing.get("host_memory_gb") or 0) / per[s.machine]

    return _place(
        slots, lambda s: vllm(ctx, s, ["--kv-offloading-size", f"{gib(s):g}", "--kv-offloading-backend", "native"])
    )


def r_vllm_shared_fs(ctx: RenderContext) -> Machines:  # stacks.md 1.3
    slots = _slots(ctx, False)
    per = _per_machine(slots)

    def build(s: EngineSlot) -> ProcessSpec:
        config = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "cpu_bytes_to_use": _offload_bytes(ctx, per[s.machine]),
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
        return vllm(ctx, s, _ktc(config))

    return _place(slots, build)


def r_vllm_lmcache_valkey(ctx: RenderContext) -> Machines:  # stacks.md 1.4 with the product's LMCache server
    l1, l2 = _lmcache_tiers(ctx)
    l2.append({"type": "valkey", "host": _host(ctx, 0), "port": PORTS["valkey"]})
    out = _place(_slots(ctx, False), lambda s: vllm(ctx, s, _mp_connector()))
    for m in range(len(ctx.machines)):
        out.setdefault(m, []).insert(0, lmcache_server(ctx, l2, l1))
    return _head_first(out, valkey(ctx))


def r_vllm_lmcache_mooncake(ctx: RenderContext) -> Machines:  # stacks.md 1.5 (MP mode, L2 mooncake_store)
    l1, l2 = _lmcache_tiers(ctx)
    gb = float(ctx.sizing.get("shared_store_gb") or 0)
    l2.append(
        {
            "type": "mooncake_store",
            "master_server_address": f"{_host(ctx, 0)}:{PORTS['mooncake_rpc']}",
            "metadata_server": "P2PHANDSHAKE",
            "protocol": "rdma" if ctx.network.get("rdma_device") else "tcp",
            "device_name": ctx.network.get("rdma_device") or "",
            "global_segment_size": int(gb * 2**30),
        }
    )
    out = _place(_slots(ctx, False), lambda s: vllm(ctx, s, _mp_connector()))
    for m in range(len(ctx.machines)):
        out.setdefault(m, []).insert(0, lmcache_server(ctx, l2, l1))
    return _head_first(out, mooncake_master(ctx))


def r_vllm_mooncake_store(ctx: RenderContext) -> Machines:  # stacks.md 1.6
    gb = float(ctx.sizing.get("shared_store_gb") or 0)
    slots = _slots(ctx, False)
    per = _per_machine(slots)

    def build(s: EngineSlot) -> ProcessSpec:
        cfg = {
            "mode": "embedded",
            "metadata_server": "P2PHANDSHAKE",
            "master_server_address": f"{_host(ctx, 0)}:{PORTS['mooncake_rpc']}",
            "global_segment_size": int(gb * 2**30 / max(sum(per.values()), 1)),
            "local_buffer_size": 2**30,
            "protocol": "rdma" if ctx.network.get("rdma_device") else "tcp",
            "device_name": ctx.network.get("rdma_device") or "",
        }
        name = f"mooncake-{s.index}.json"
        return vllm(
            ctx,
            s,
            _ktc({"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}),
            env={"MOONCAKE_CONFIG_PATH": f"{{run_dir}}/{name}"},
            files={name: json.dumps(cfg, indent=2)},
        )

    return _head_first(_place(slots, build), mooncake_master(ctx))


def r_vllm_pd_nixl(ctx: RenderContext, offload: bool = False) -> Machines:  # stacks.md 1.7 and 1.9
    slots = _slots(ctx, True)
    per = _per_machine(slots)

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
                            "kv_connector_extra_config": {"cpu_bytes_to_use": _offload_bytes(ctx, per[s.machine])},
                        },
                    ]
                },
            }
        side = PORTS["nixl_side_channel_base"] + s.index
        spec = vllm(
            ctx,
            s,
            _ktc(config),
            env={
                "VLLM_NIXL_SIDE_CHANNEL_HOST": _host(ctx, s.machine),
                "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side),
                "UCX_TLS": "all",
                **({"UCX_NET_DEVICES": f"{ctx.network['rdma_device']}:1"} if ctx.network.get("rdma_device") else {}),
            },
        )
        return spec.model_copy(update={"ports": {**spec.ports, "nixl_side_channel": side}})

    return _head_last(_place(slots, build), _vllm_router(ctx, slots, "nixl"))


def r_vllm_pd_mooncake(ctx: RenderContext) -> Machines:  # stacks.md 1.8
    slots = _slots(ctx, True)

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
            _ktc({"kv_connector": "MooncakeConnector", "kv_role": role, "kv_connector_extra_config": extra}),
            env=env,
        )
        if s.role == "prefill":
            spec = spec.model_copy(update={"ports": {**spec.ports, "bootstrap": PORTS["pd_bootstrap_base"] + s.index}})
        return spec

    return _head_last(_place(slots, build), _vllm_router(ctx, slots, "mooncake"))


def _lmcache_proxy(
    ctx: RenderContext, script: str, prefill: EngineSlot, decode: EngineSlot, extra: list[str], ports: dict[str, int]
) -> ProcessSpec:
    """LMCache's P/D proxy (an example script of the LMCache repository) on the head machine."""
    examples = str(ctx.engine.args.get("lmcache_examples") or "/opt/lmcache/examples")
    argv = [
        "python3",
        f"{examples}/{script}",
        "--port",
        str(PORTS["router"]),
        "--prefiller-host",
        _host(ctx, prefill.machine),
        "--prefiller-port",
        str(prefill.port),
        "--decoder-host",
        _host(ctx, decode.machine),
        "--decoder-port",
        str(decode.port),
        *extra,
    ]
    proxy = _router(ctx, argv, "python3", "lmcache/vllm-openai:latest", health_path="")
    return proxy.model_copy(update={"ports": {**proxy.ports, **ports}})


def r_vllm_pd_nixl_lmcache(ctx: RenderContext) -> Machines:  # stacks.md 1.10 (start: proxy, decoder, prefiller)
    slots = _slots(ctx, True, one_per_machine=True)
    decode = next(s for s in slots if s.role == "decode")
    buffer = 1 << 30

    def build(s: EngineSlot) -> ProcessSpec:
        if s.role == "prefill":
            cfg: dict[str, Any] = {
                "enable_pd": True,
                "transfer_channel": "nixl",
                "pd_role": "sender",
                "pd_proxy_host": _host(ctx, 0),
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
                "pd_peer_host": _host(ctx, s.machine),
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
            _ktc(
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
    proxy = _lmcache_proxy(
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
    out = _place(sorted(slots, key=lambda s: s.role != "decode"), build)  # decoder before prefiller
    return _head_first(out, proxy)


def r_vllm_pd_lmcache_store(ctx: RenderContext) -> Machines:  # stacks.md 1.11 (b), MP mode
    slots = _slots(ctx, True)
    l1, l2 = _lmcache_tiers(ctx)
    gb = float(ctx.sizing.get("shared_store_gb") or 0)
    l2.append(
        {
            "type": "mooncake_store",
            "master_server_address": f"{_host(ctx, 0)}:{PORTS['mooncake_rpc']}",
            "metadata_server": "P2PHANDSHAKE",
            "protocol": "tcp",
            "global_segment_size": int(gb * 2**30),
        }
    )
    telemetry = f"http://{_host(ctx, 0)}:{PORTS['lmcache_telemetry']}/api/v1/telemetry"

    def build(s: EngineSlot) -> ProcessSpec:
        env = (
            {"LMCACHE_REQUEST_TELEMETRY_TYPE": "fastapi", "LMCACHE_REQUEST_TELEMETRY_ENDPOINT": telemetry}
            if s.role == "prefill"
            else {}
        )
        return vllm(ctx, s, _mp_connector(), env=env)

    prefill = next(s for s in slots if s.role == "prefill")
    decode = next(s for s in slots if s.role == "decode")
    proxy = _lmcache_proxy(
        ctx,
        "disagg_prefill_mp/disagg_proxy_server.py",
        prefill,
        decode,
        ["--telemetry-port", str(PORTS["lmcache_telemetry"])],
        {"telemetry": PORTS["lmcache_telemetry"]},
    )
    out = _place(slots, build)
    for m in range(len(ctx.machines)):
        out.setdefault(m, []).insert(0, lmcache_server(ctx, l2, l1))
    # start order (Mooncake docs): master, LMCache servers, proxy, prefiller, decoder
    out[0] = [
        mooncake_master(ctx),
        *[p for p in out[0] if p.role == "lmcache"],
        proxy,
        *[p for p in out[0] if p.role not in ("lmcache",)],
    ]
    return out


def r_vllm_lmcache_mp(ctx: RenderContext) -> Machines:  # stacks.md 1.12 (the LMCache study's stack)
    l1, l2 = _lmcache_tiers(ctx)
    out = _place(_slots(ctx, False), lambda s: vllm(ctx, s, _mp_connector()))
    for m in range(len(ctx.machines)):
        out.setdefault(m, []).insert(0, lmcache_server(ctx, l2, l1))
    return out


def r_sglang_radix(ctx: RenderContext, on: bool) -> Machines:  # stacks.md 2.1
    return _place(_slots(ctx, False), lambda s: sglang(ctx, s, [] if on else ["--disable-radix-cache"]))


def _hicache(ctx: RenderContext) -> list[str]:
    return [
        "--enable-hierarchical-cache",
        "--hicache-size",
        f"{float(ctx.sizing.get('host_memory_gb') or 0):g}",
        "--hicache-write-policy",
        "write_through",
        "--page-size",
        "64",
    ]


def r_sglang_hicache_host(ctx: RenderContext) -> Machines:  # stacks.md 2.2
    return _place(_slots(ctx, False), lambda s: sglang(ctx, s, _hicache(ctx)))


def r_sglang_hicache_file(ctx: RenderContext) -> Machines:  # stacks.md 2.3
    path = str(ctx.sizing.get("shared_mount_path"))
    return _place(
        _slots(ctx, False),
        lambda s: sglang(
            ctx,
            s,
            [*_hicache(ctx), "--hicache-storage-backend", "file", "--hicache-storage-prefetch-policy", "timeout"],
            env={"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": path},
        ),
    )


def _mooncake_extra(ctx: RenderContext) -> str:
    gb = float(ctx.sizing.get("shared_store_gb") or 0)
    return json.dumps(
        {
            "master_server_address": f"{_host(ctx, 0)}:{PORTS['mooncake_rpc']}",
            "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": f"{gb:g}gb",
            "protocol": "rdma" if ctx.network.get("rdma_device") else "tcp",
            "device_name": ctx.network.get("rdma_device") or "",
        },
        separators=(",", ":"),
    )


def r_sglang_hicache_mooncake(ctx: RenderContext) -> Machines:  # stacks.md 2.4
    out = _place(
        _slots(ctx, False),
        lambda s: sglang(
            ctx,
            s,
            [
                *_hicache(ctx),
                "--hicache-storage-backend",
                "mooncake",
                "--hicache-storage-backend-extra-config",
                _mooncake_extra(ctx),
            ],
        ),
    )
    return _head_first(out, mooncake_master(ctx))


def _sglang_pd(
    ctx: RenderContext, backend: str, decode_extra: list[str] | None = None, prefill_extra: list[str] | None = None
) -> Machines:  # stacks.md 2.5
    slots = _slots(ctx, True)
    device = ctx.network.get("rdma_device")

    def build(s: EngineSlot) -> ProcessSpec:
        extra = ["--disaggregation-mode", s.role, "--disaggregation-transfer-backend", backend]
        if device:
            extra += ["--disaggregation-ib-device", str(device)]
        if s.role == "prefill":
            extra += [
                "--disaggregation-bootstrap-port",
                str(PORTS["pd_bootstrap_base"] + s.index),
                *(prefill_extra or []),
            ]
        else:
            extra += decode_extra or []
        return sglang(ctx, s, extra)

    argv = [
        "python3",
        "-m",
        "sglang_router.launch_router",
        "--pd-disaggregation",
        "--host",
        "0.0.0.0",
        "--port",
        str(PORTS["router"]),
    ]
    for s in slots:
        if s.role == "prefill":
            argv += ["--prefill", _url(ctx, s), str(PORTS["pd_bootstrap_base"] + s.index)]
        else:
            argv += ["--decode", _url(ctx, s)]
    router = _router(ctx, argv, "python-module:sglang_router", "lmsysorg/sglang:latest")
    return _head_last(_place(slots, build), router)


def r_sglang_pd_offload(ctx: RenderContext) -> Machines:  # stacks.md 2.6
    out = _sglang_pd(
        ctx,
        "mooncake",
        decode_extra=[
            "--disaggregation-decode-enable-offload-kvcache",
            *_hicache(ctx),
            "--hicache-storage-backend",
            "mooncake",
            "--hicache-storage-backend-extra-config",
            _mooncake_extra(ctx),
        ],
        prefill_extra=[
            "--enable-hierarchical-cache",
            "--hicache-storage-backend",
            "mooncake",
            "--hicache-storage-backend-extra-config",
            _mooncake_extra(ctx),
        ],
    )
    return _head_first(out, mooncake_master(ctx))


def r_trtllm(ctx: RenderContext, config: dict[str, Any]) -> Machines:  # stacks.md 3
    return _place(_slots(ctx, False), lambda s: trtllm(ctx, s, config))


def r_trtllm_pd(ctx: RenderContext) -> Machines:  # stacks.md 3, disaggregated over NIXL
    slots = _slots(ctx, True)
    out = _place(
        slots,
        lambda s: trtllm(
            ctx,
            s,
            {
                "cache_transceiver_config": {"backend": "NIXL", "max_tokens_in_buffer": 32768},
                **({"disable_overlap_scheduler": True} if s.role == "prefill" else {}),
            },
        ),
    )
    disagg = {
        "hostname": "0.0.0.0",
        "port": PORTS["router"],
        "backend": "pytorch",
        "context_servers": {
            "num_instances": sum(s.role == "prefill" for s in slots),
            "urls": [f"{_host(ctx, s.machine)}:{s.port}" for s in slots if s.role == "prefill"],
        },
        "generation_servers": {
            "num_instances": sum(s.role == "decode" for s in slots),
            "urls": [f"{_host(ctx, s.machine)}:{s.port}" for s in slots if s.role == "decode"],
        },
    }
    router = _router(
        ctx,
        ["trtllm-serve", "disaggregated", "-c", "{run_dir}/disagg.yaml"],
        "trtllm-serve",
        f"nvcr.io/nvidia/tensorrt-llm/release:{ctx.engine.version or 'latest'}",
    )
    router = router.model_copy(
        update={
            "files": {"disagg.yaml": yaml.safe_dump(disagg, sort_keys=False)},
            "env": {"TRTLLM_NIXL_KVCACHE_BACKEND": "UCX"},
        }
    )
    return _head_last(out, router)


def r_trtllm_lmcache_valkey(ctx: RenderContext) -> Machines:  # stacks.md 3, LMCache with Valkey
    l1, l2 = _lmcache_tiers(ctx)
    l2.append({"type": "valkey", "host": _host(ctx, 0), "port": PORTS["valkey"]})
    out = _place(
        _slots(ctx, False),
        lambda s: trtllm(
            ctx,
            s,
            {
                "kv_connector_config": {
                    "connector": "lmcache-mp",
                    "server_url": f"tcp://127.0.0.1:{PORTS['lmcache_zmq']}",
                }
            },
        ),
    )
    for m in range(len(ctx.machines)):
        out.setdefault(m, []).insert(0, lmcache_server(ctx, l2, l1))
    return _head_first(out, valkey(ctx))


def r_vllm_pd_mori(ctx: RenderContext) -> Machines:  # stacks.md 6: vllm-router first
    slots = _slots(ctx, True)
    discovery = f"{_host(ctx, 0)}:{PORTS['mori_discovery']}"

    def build(s: EngineSlot) -> ProcessSpec:
        role = "kv_producer" if s.role == "prefill" else "kv_consumer"
        extra = {
            "proxy_ip": _host(ctx, 0),
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
            _ktc({"kv_connector": "MoRIIOConnector", "kv_role": role, "kv_connector_extra_config": extra}),
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

    router = _router(
        ctx,
        [
            *_pd_router_argv("moriio"),
            "--vllm-discovery-address",
            f"0.0.0.0:{PORTS['mori_discovery']}",
            "--policy",
            "consistent_hash",
        ],
        "vllm-router",
        "vllm/vllm-openai-rocm:latest",
    )
    router = router.model_copy(
        update={
            "ports": {**router.ports, "discovery": PORTS["mori_discovery"]},
            "env": {"VLLM_DISCOVERY_ADDRESS": discovery},
        }
    )
    return _head_first(_place(slots, build), router)


def r_sglang_hicache_mori(ctx: RenderContext) -> Machines:  # stacks.md 6 (UNCONFIRMED recipe there)
    return _place(
        _slots(ctx, False),
        lambda s: sglang(
            ctx,
            s,
            [*_hicache(ctx), "--hicache-storage-backend", "mori"],
            env={
                "UMBP_MASTER_ADDRESS": f"{_host(ctx, 0)}:{PORTS['mooncake_rpc']}",
                "UMBP_NODE_ADDRESS": _host(ctx, s.machine),
            },
        ),
    )


RECIPES: dict[str, Callable[[RenderContext], Machines]] = {
    "vllm-prefix-off": lambda c: r_vllm_prefix(c, False),
    "vllm-prefix-gpu": lambda c: r_vllm_prefix(c, True),
    "vllm-native-cpu-offload": r_vllm_cpu_offload,
    "vllm-native-shared-fs": r_vllm_shared_fs,
    "vllm-lmcache-valkey": r_vllm_lmcache_valkey,
    "vllm-lmcache-mooncake": r_vllm_lmcache_mooncake,
    "vllm-mooncake-store": r_vllm_mooncake_store,
    "vllm-pd-nixl": r_vllm_pd_nixl,
    "vllm-pd-mooncake": r_vllm_pd_mooncake,
    "vllm-pd-nixl-native-offload": lambda c: r_vllm_pd_nixl(c, offload=True),
    "vllm-pd-nixl-lmcache": r_vllm_pd_nixl_lmcache,
    "vllm-pd-lmcache-store": r_vllm_pd_lmcache_store,
    "vllm-lmcache-mp": r_vllm_lmcache_mp,
    "sglang-radix-off": lambda c: r_sglang_radix(c, False),
    "sglang-radix": lambda c: r_sglang_radix(c, True),
    "sglang-hicache-host": r_sglang_hicache_host,
    "sglang-hicache-file": r_sglang_hicache_file,
    "sglang-hicache-mooncake": r_sglang_hicache_mooncake,
    "sglang-pd-nixl": lambda c: _sglang_pd(c, "nixl"),
    "sglang-pd-mooncake": lambda c: _sglang_pd(c, "mooncake"),
    "sglang-pd-decode-offload": r_sglang_pd_offload,
    "trtllm-reuse-off": lambda c: r_trtllm(c, {"kv_cache_config": {"enable_block_reuse": False}}),
    "trtllm-reuse": lambda c: r_trtllm(c, {"kv_cache_config": {"enable_block_reuse": True}}),
    "trtllm-host-offload": lambda c: r_trtllm(
        c,
        {
            "kv_cache_config": {
                "enable_block_reuse": True,
                "host_cache_size": int(float(c.sizing.get("host_memory_gb") or 0) * 2**30),
            }
        },
    ),
    "trtllm-pd-nixl": r_trtllm_pd,
    "trtllm-lmcache-valkey": r_trtllm_lmcache_valkey,
    "vllm-pd-mori": r_vllm_pd_mori,
    "sglang-hicache-mori": r_sglang_hicache_mori,
    "sglang-pd-mori": lambda c: _sglang_pd(c, "mori"),
}


def render(ctx: RenderContext) -> dict[str, list[ProcessSpec]]:
    """Processes per machine name, in start order."""
    recipe = RECIPES.get(ctx.stack)
    if recipe is None:
        raise UnknownStackError(f"no launch recipe for stack {ctx.stack}")
    by_index = recipe(ctx)
    return {machine.name: by_index.get(i, []) for i, machine in enumerate(ctx.machines)}
