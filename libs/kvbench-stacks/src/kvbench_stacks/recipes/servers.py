"""The servers beside the engines: Valkey, the Mooncake master, LMCache's server and proxies, routers."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvbench_stacks.catalog import get_stack
from kvbench_stacks.recipes.common import EngineSlot, Machines, engine_slots, host_of, image_for, url_of, user_args
from kvbench_stacks.recipes.images import (
    VALKEY_IMAGE,
    image_version,
    lmcache_image,
    newest_checked,
    sglang_image,
    vllm_router_image,
)
from kvbench_stacks.recipes.model import ProcessSpec, RenderContext
from kvbench_stacks.recipes.ports import PORTS


def _version_of(ctx: RenderContext, engine: str) -> str | None:
    """The release of ``engine``'s image a server beside the engines runs: the plan's where the stack is that
    engine's, else the newest the catalog was checked on."""
    spec = get_stack(ctx.stack)
    if spec is not None and spec.engine == engine:
        return image_version(ctx.stack, engine, ctx.engine.version)
    return newest_checked(engine)


def valkey(ctx: RenderContext) -> ProcessSpec:
    gb = float(ctx.sizing.get("shared_store_gb") or 0)
    port = PORTS["valkey"]
    return ProcessSpec(
        name="valkey",
        role="store",
        binary="valkey-server",
        image=VALKEY_IMAGE,
        argv=[
            "valkey-server",
            # the pool's network address only (and loopback), never every address: it has no password yet
            "--bind",
            host_of(ctx, 0),
            "127.0.0.1",
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
        image=image_for(ctx, sglang_image(_version_of(ctx, "sglang"), rocm=False)),
    )


def valkey_l2_adapter(ctx: RenderContext) -> dict[str, Any]:
    """The LMCache server's L2 adapter for the pool's Valkey: LMCache's RESP adapter (the Redis protocol Valkey
    speaks), which LMCache 0.5.1 and 0.5.6 both register with these fields. Its "valkey" adapter is newer (absent in
    0.5.1: "unknown adapter type 'valkey'") and takes `startup_nodes`, not host and port (0.5.6 refused our old
    form: "startup_nodes is required"); the conformance suite runs both versions' own parsers on this."""
    return {"type": "resp", "host": host_of(ctx, 0), "port": PORTS["valkey"]}


# the LMCache server flags kvbench sets from the plan (ports, chunk size, tiers): a plan's cache_server_args may not
LMCACHE_SERVER_OWN_FLAGS = frozenset(
    {"host", "port", "chunk-size", "l1-size-gb", "http-host", "http-port", "prometheus-port", "l2-adapter"}
)


@dataclass(frozen=True)
class CacheServer:
    """One LMCache server of the pool: where it runs and which engines (machine, index) connect to it."""

    machine: int
    index: int  # its place among the servers of its machine
    engines: tuple[tuple[int, int], ...]
    of_machine: int  # servers on its machine

    @property
    def zmq_port(self) -> int:
        return PORTS["lmcache_zmq"] + self.index

    @property
    def http_port(self) -> int:
        return PORTS["lmcache_http"] + self.index

    @property
    def name(self) -> str:
        return "lmcache" if self.index == 0 else f"lmcache-{self.index}"


def cache_servers(ctx: RenderContext) -> list[CacheServer]:
    """The pool's LMCache servers (issue 19, section 4.3 of the study): by default one on every machine, shared by
    the engines there; with ``sizing.engines_per_cache_server`` N, the pool's engines in placement order in groups
    of N, each group's server on the machine of its first engine (its other engines may connect from other
    machines: LMCache serves over TCP, it balances nothing, the router in front does)."""
    slots = [(s.machine, s.index) for s in engine_slots(ctx, False)]
    return group_engines(slots, len(ctx.machines), ctx.sizing.get("engines_per_cache_server"))


def group_engines(slots: Sequence[tuple[int, int]], machines: int, per: int | None) -> list[CacheServer]:
    """``slots``: the pool's engines as (machine, index) in placement order; ``per``: engines a server (None: every
    machine's engines share its one server)."""
    if not per:
        groups = [(m, tuple(s for s in slots if s[0] == m)) for m in range(machines)]
    else:
        groups = [(slots[i][0], tuple(slots[i : i + per])) for i in range(0, len(slots), per)]
    counts = [sum(1 for m, _ in groups if m == machine) for machine in range(machines)]
    seen = [0] * machines
    servers = []
    for machine, engines in groups:
        servers.append(CacheServer(machine, seen[machine], engines, counts[machine]))
        seen[machine] += 1
    return servers


def cache_server_of(ctx: RenderContext, slot: EngineSlot) -> tuple[str, int]:
    """The address (host, ZMQ port) of the LMCache server ``slot``'s engine connects to."""
    for server in cache_servers(ctx):
        if (slot.machine, slot.index) in server.engines:
            host = "127.0.0.1" if server.machine == slot.machine else host_of(ctx, server.machine)
            return host, server.zmq_port
    return "127.0.0.1", PORTS["lmcache_zmq"]


def lmcache_server(ctx: RenderContext, l2: list[dict[str, Any]], l1_gb: float, server: CacheServer) -> ProcessSpec:
    """stacks.md 1.12: the LMCache multi-process server (L1 CPU, L2 adapters), on its own ports. Several servers
    on one machine split its host memory and keep their disk records in a folder each."""
    if server.of_machine > 1:
        l1_gb /= server.of_machine
        l2 = [{**a, "base_path": f"{a['base_path']}/server-{server.index}"} if a.get("type") == "fs" else a for a in l2]
    # Mooncake's client requires the address the other machines reach this server's segment at
    l2 = [{**a, "local_hostname": host_of(ctx, server.machine)} if a.get("type") == "mooncake_store" else a for a in l2]
    argv = [
        "lmcache",
        "server",
        "--host",
        "0.0.0.0",
        "--port",
        str(server.zmq_port),
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
        str(server.http_port),
    ]
    for adapter in l2:
        argv += ["--l2-adapter", json.dumps(adapter, separators=(",", ":"))]
    argv += user_args(ctx.engine.cache_server_args)
    return ProcessSpec(
        name=server.name,
        role="lmcache",
        argv=argv,
        ports={"zmq": server.zmq_port, "http": server.http_port},
        health=("http", server.http_port, "/healthcheck"),
        # `lmcache server` serves its metrics on the HTTP port: it starts no Prometheus server of its own, so
        # --prometheus-port does nothing there (LMCache 0.5.1: http_server.py, start_prometheus_http_server=False)
        metrics=(server.http_port, "/metrics"),
        binary="lmcache",
        image=image_for(ctx, lmcache_image()),
    )


def lmcache_tiers(ctx: RenderContext) -> tuple[float, list[dict[str, Any]]]:
    l1 = float(ctx.sizing.get("host_memory_gb") or 20)
    l2: list[dict[str, Any]] = []
    if ctx.kv_tier == "nvme":
        direct = bool(ctx.sizing.get("disk_tier_direct_io", True))
        l2.append({"type": "fs", "base_path": ctx.sizing.get("disk_tier_path"), "use_odirect": direct})
    return l1, l2


def lmcache_mp_connector(ctx: RenderContext, slot: EngineSlot) -> list[str]:
    host, port = cache_server_of(ctx, slot)
    config = {
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"lmcache.mp.host": f"tcp://{host}", "lmcache.mp.port": port},
    }
    return ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]


def mooncake_extra_config(ctx: RenderContext, machine: int) -> str:
    """SGLang's Mooncake store settings for an engine on ``machine``. ``local_hostname`` is the address the other
    machines reach its segment at: SGLang's default is localhost (0.5.20 and 0.5.23 read it from this config; 0.5.23
    prefers MOONCAKE_LOCAL_HOSTNAME when that is set), which no other machine can use."""
    gb = float(ctx.sizing.get("shared_store_gb") or 0)
    return json.dumps(
        {
            "local_hostname": host_of(ctx, machine),
            "master_server_address": mooncake_master_address(ctx),
            "metadata_server": "P2PHANDSHAKE",
            "global_segment_size": f"{gb:g}gb",
            **mooncake_transport(ctx),
        },
        separators=(",", ":"),
    )


def router_process(
    ctx: RenderContext, argv: list[str], binary: str, image: str, health_path: str = "/health"
) -> ProcessSpec:
    port = PORTS["router"]
    return ProcessSpec(
        name="router",
        role="router",
        argv=argv,
        ports={"http": port},
        health=("http", port, health_path) if health_path else ("tcp", port, ""),
        binary=binary,
        image=image_for(ctx, image),
        serves_requests=True,
    )


def pd_router_argv(connector: str) -> list[str]:
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


def vllm_pd_router(
    ctx: RenderContext, slots: list[EngineSlot], connector: str, extra: list[str] | None = None
) -> ProcessSpec:
    argv = [
        *pd_router_argv(connector),
        "--prefill-policy",
        "cache_aware",
        "--decode-policy",
        "power_of_two",
    ]
    for s in slots:
        argv += ["--prefill" if s.role == "prefill" else "--decode", url_of(ctx, s)]
    return router_process(ctx, argv + (extra or []), "vllm-router", vllm_router_image())


def lmcache_pd_proxy(
    ctx: RenderContext, script: str, prefill: EngineSlot, decode: EngineSlot, extra: list[str], ports: dict[str, int]
) -> ProcessSpec:
    """LMCache's P/D proxy (an example script of the LMCache repository) on the head machine.

    Both scripts bind --host, default "localhost" (LMCache examples/disagg_prefill{,_mp}/disagg_proxy_server.py,
    parse_args), and disagg_prefill_mp serves the prefill engines' telemetry posts on the same host: bound to
    localhost, the posts from another machine are refused and every request waits for them forever.

    No LMCache image or wheel holds the script (the published images install the wheel, which has no examples), so
    it is a host file (``kvbench-agent --fetch-lmcache-examples`` puts LMCache's examples at the default folder),
    mounted read-only into the image that runs it."""
    examples = str(ctx.engine.args.get("lmcache_examples") or "/opt/lmcache/examples")
    argv = [
        "python3",
        f"{examples}/{script}",
        "--host",
        "0.0.0.0",
        "--port",
        str(PORTS["router"]),
        "--prefiller-host",
        host_of(ctx, prefill.machine),
        "--prefiller-port",
        str(prefill.port),
        "--decoder-host",
        host_of(ctx, decode.machine),
        "--decoder-port",
        str(decode.port),
        *extra,
    ]
    proxy = router_process(ctx, argv, "python3", lmcache_image(), health_path="")
    return proxy.model_copy(update={"ports": {**proxy.ports, **ports}, "host_code": [f"{examples}/{script}"]})


def with_lmcache_servers(ctx: RenderContext, out: Machines, l2: list[dict[str, Any]], l1_gb: float) -> Machines:
    """The pool's LMCache servers (``cache_servers``) first on their machines."""
    for server in reversed(cache_servers(ctx)):
        out.setdefault(server.machine, []).insert(0, lmcache_server(ctx, l2, l1_gb, server))
    return out


def mooncake_master_address(ctx: RenderContext) -> str:
    """The Mooncake master's RPC address: it runs on the pool's first machine."""
    return f"{host_of(ctx, 0)}:{PORTS['mooncake_rpc']}"


def mooncake_transport(ctx: RenderContext) -> dict[str, str]:
    """How a Mooncake client moves data: RDMA on the configured device, else TCP."""
    device = ctx.network.get("rdma_device")
    return {"protocol": "rdma" if device else "tcp", "device_name": device or ""}


def lmcache_mooncake_l2(ctx: RenderContext, rdma: bool = True) -> dict[str, Any]:
    """LMCache's ``mooncake_store`` L2 adapter: the pool's Mooncake store (shared_store_gb) behind every server.

    LMCache hands every key but its own, as is, to Mooncake's RealClient::setup_internal(ConfigDict), whose keys are
    Mooncake's, not SGLang's: ``master_server_addr`` (``master_server_address`` is ignored and the client connects
    to 127.0.0.1:50051), ``rdma_devices`` (not ``device_name``), and ``local_hostname``, required, which
    ``lmcache_server`` sets to its own machine's address (tools/conformance/recorded/mooncake.toml). ``rdma``: over
    the configured RDMA device when there is one, else TCP."""
    gb = float(ctx.sizing.get("shared_store_gb") or 0)
    device = ctx.network.get("rdma_device") if rdma else None
    return {
        "type": "mooncake_store",
        "master_server_addr": mooncake_master_address(ctx),
        "metadata_server": "P2PHANDSHAKE",
        "protocol": "rdma" if device else "tcp",
        **({"rdma_devices": device} if device else {}),
        "global_segment_size": int(gb * 2**30),
    }
