"""``python -m kvbench_sim serve``: one simulated engine on one port (what the node agent starts)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from kvbench_contracts.sim import SimEngineSpec, SimRouterSpec, SimStoreSpec
from kvbench_sim import router, store
from kvbench_sim.engine import Engine
from kvbench_sim.profiles import EngineConfig, Profile, cache_server_tier, load_profile
from kvbench_sim.records import TierRecords, file_backed, keep_while_serving, tier_signature
from kvbench_sim.server import PacedEngine, build_app
from kvbench_sim.stacks import SimLayout, layout_for
from kvbench_sim.store import StoreClient, StoreTierPlan
from kvbench_sim.tiers import Link, Tier

__all__ = ["main"]

log = logging.getLogger("kvbench_sim")

S = TypeVar("S", bound=BaseModel)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvbench-sim", description="Simulated vLLM-compatible engine")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve one simulated engine over HTTP")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=None, help="required unless --spec gives it")
    serve.add_argument("--model", default="Qwen/Qwen3-8B")
    serve.add_argument("--gpu", default="L40S")
    serve.add_argument("--tensor-parallel-size", type=int, default=1)
    serve.add_argument("--no-enable-prefix-caching", dest="prefix_caching", action="store_false")
    serve.add_argument("--block-size", type=int, default=None)
    serve.add_argument("--max-num-seqs", type=int, default=256)
    serve.add_argument("--max-num-batched-tokens", type=int, default=8192)
    serve.add_argument("--gpu-memory-utilization", type=float, default=None)
    serve.add_argument("--kv-cache-gb", type=float, default=None)
    serve.add_argument("--speed", type=float, default=1.0, help="virtual seconds per wall-clock second")
    serve.add_argument("--seed", type=int, default=0)
    serve.add_argument("--flavor", choices=("vllm", "sglang"), default=None, help="metric names (default: vllm)")
    serve.add_argument(
        "--pd-role",
        choices=("prefill", "decode"),
        default=None,
        help="P/D split: a prefill engine answers with kv_transfer_params; a decode engine pulls prompts' KV",
    )
    serve.add_argument("--pd-link-gbps", type=float, default=None, help="decode side: GB/s of the KV link")
    serve.add_argument("--pd-setup-ms", type=float, default=None, help="decode side: fixed cost of each transfer")
    serve.add_argument(
        "--engine-id",
        default=None,
        help="name given to P/D peers and to the engines sharing its tiers (default: sim-PORT)",
    )
    serve.add_argument(
        "--cache-server",
        default=None,
        help="ws://HOST:PORT of a simulated LMCache server (kvbench_sim store --spec, cache_server) whose L1 and disk "
        "this engine shares with others (default: they are this engine's own)",
    )
    serve.add_argument(
        "--shared-store",
        default=None,
        help="ws://HOST:PORT/ws of the shared store process (kvbench_sim store) behind this stack's shared tier",
    )
    serve.add_argument(
        "--records-dir",
        default=None,
        help="directory where this engine's file-backed tiers (a disk tier; a shared filesystem it owns) keep their "
        "records, so a restarted engine finds them",
    )
    serve.add_argument(
        "--spec",
        type=Path,
        default=None,
        help="a SimEngineSpec JSON file (what the node agent writes): the catalog stack's engine settings and tiers, "
        "port, P/D role, shared store and records; overrides the flags above",
    )
    router.add_parser(sub)
    store.add_parser(sub)
    return parser


def read_spec(path: Path, model: type[S]) -> S:
    """A spec file the node agent wrote, validated once; a bad one ends the process with the reason."""
    try:
        return model.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError) as exc:
        sys.stderr.write(f"kvbench-sim: --spec {path}: {exc}\n")
        raise SystemExit(2) from None


def _apply_router_spec(args: argparse.Namespace) -> argparse.Namespace:
    if args.spec is not None:
        spec = read_spec(args.spec, SimRouterSpec)
        args.host, args.port, args.policy = spec.host, spec.port, spec.policy
        args.engine, args.prefill = spec.engines, spec.prefill
    if args.port is None:
        sys.stderr.write("kvbench-sim route: --port or --spec is required\n")
        raise SystemExit(2)
    return args


def _apply_store_spec(args: argparse.Namespace) -> argparse.Namespace:
    """With --spec, the store works out its own capacity, link and records signature from the stack's shared tier
    (the same layout every engine of the pool computes)."""
    if args.spec is not None:
        spec = read_spec(args.spec, SimStoreSpec)
        layout = layout_for(spec.workload.model_dump(), spec.cluster.model_dump())
        if spec.cache_server is not None:
            return _apply_cache_server_spec(args, spec, layout)
        shared = [t for t in layout.engine.tiers if t.store_id and not cache_server_tier(t)]
        if not shared:
            sys.stderr.write(f"kvbench-sim store: stack {spec.workload.stack} has no shared tier\n")
            raise SystemExit(2)
        profile = load_profile(spec.cluster.gpu, spec.workload.model, layout.engine)
        tier = Tier(shared[0], profile.block_size, profile.model.kv_bytes_per_token, profile.state_bytes_per_block)
        args.host, args.port, args.capacity_chunks = spec.host, spec.port, tier.capacity_chunks
        args.bandwidth_gbps, args.speed = shared[0].bw_gbps, spec.cluster.speed or 1.0
        if spec.records_dir and file_backed(tier):
            args.records_dir = spec.records_dir
            args.records_signature = json.dumps(tier_signature(tier, spec.workload.model))
        log.info("shared store for %s: %s", spec.workload.stack, shared[0].store_id)
    if args.port is None or args.capacity_chunks is None:
        sys.stderr.write("kvbench-sim store: --port and --capacity-chunks, or --spec, are required\n")
        raise SystemExit(2)
    return args


def _apply_cache_server_spec(args: argparse.Namespace, spec: SimStoreSpec, layout: SimLayout) -> argparse.Namespace:
    """A simulated LMCache server: the tiers of the stack's layout that live in the server (its L1, its disk), one
    index and link each, shared by the engines of its group; its disk keeps its records as the engines' would."""
    profile = load_profile(spec.cluster.gpu, spec.workload.model, layout.engine)
    plans = []
    for config in (t for t in layout.engine.tiers if cache_server_tier(t)):
        tier = Tier(config, profile.block_size, profile.model.kv_bytes_per_token, profile.state_bytes_per_block)
        kept = spec.records_dir if file_backed(tier) else None
        plans.append(StoreTierPlan(config.name, tier.capacity_chunks, config.bw_gbps, kept,
                                   tier_signature(tier, spec.workload.model) if kept else None))  # fmt: skip
    if not plans:
        sys.stderr.write(f"kvbench-sim store: stack {spec.workload.stack} has no LMCache server tiers\n")
        raise SystemExit(2)
    args.host, args.port, args.speed, args.tier_plans = spec.host, spec.port, spec.cluster.speed or 1.0, plans
    log.info(
        "LMCache server %d for %s: tiers %s", spec.cache_server, spec.workload.stack, ", ".join(p.name for p in plans)
    )
    return args


def _apply_engine_spec(args: argparse.Namespace) -> SimLayout | None:
    """With --spec, the spec decides port, model, GPU, speed, role, store and records; returns its layout."""
    if args.spec is None:
        if args.port is None:
            sys.stderr.write("kvbench-sim serve: --port or --spec is required\n")
            raise SystemExit(2)
        return None
    spec = read_spec(args.spec, SimEngineSpec)
    args.host, args.port, args.model, args.gpu = spec.host, spec.port, spec.workload.model, spec.cluster.gpu
    args.speed = spec.cluster.speed or 1.0
    args.pd_role, args.shared_store, args.records_dir = spec.pd_role, spec.shared_store_url, spec.records_dir
    args.engine_id = spec.engine_id or args.engine_id
    args.cache_server, args.cache_server_here = spec.cache_server_url, spec.cache_server_here
    args.flavor = args.flavor or spec.workload.engine.name
    return layout_for(spec.workload.model_dump(), spec.cluster.model_dump())


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s kvbench-sim %(message)s")
    if args.command == "route":
        router.main(_apply_router_spec(args))
        return
    if args.command == "store":
        store.main(_apply_store_spec(args))
        return
    try:
        layout = _apply_engine_spec(args)
        profile = _profile(args, layout)
        engine = Engine(profile, seed=args.seed)
    except (ValueError, KeyError) as exc:
        sys.stderr.write(f"kvbench-sim: {exc}\n")
        raise SystemExit(2) from None
    _serve(args, profile, engine, layout)


def _profile(args: argparse.Namespace, layout: SimLayout | None) -> Profile:
    if layout is not None:
        # a split stack's prefill engines may differ from its decode engines (decode-side offload)
        config = layout.prefill if args.pd_role == "prefill" and layout.prefill is not None else layout.engine
        return load_profile(args.gpu, args.model, config)
    return load_profile(
        args.gpu,
        args.model,
        EngineConfig(
            block_size=args.block_size,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            gpu_memory_utilization=args.gpu_memory_utilization,
            prefix_caching=args.prefix_caching,
            tensor_parallel_size=args.tensor_parallel_size,
            kv_cache_gb=args.kv_cache_gb,
        ),
    )


def _serve(args: argparse.Namespace, profile: Profile, engine: Engine, layout: SimLayout | None) -> None:
    # the same line vLLM prints; the node agent reads the effective block size from it
    log.info("Setting attention block size to %d tokens", profile.block_size)
    log.info(
        "GPU KV cache size: %d tokens (%d blocks); prefix caching %s",
        engine.pool.num_blocks * profile.block_size,
        engine.pool.num_blocks,
        "on" if profile.engine.prefix_caching else "off",
    )
    link_gbps, setup_ms = 25.0, 1.0
    if layout is not None:
        link_gbps, setup_ms = layout.link_gbps, layout.link_setup_ms
    link_gbps = args.pd_link_gbps or link_gbps
    setup_ms = args.pd_setup_ms if args.pd_setup_ms is not None else setup_ms
    transfer = Link("pd", link_gbps * 1e9) if args.pd_role == "decode" else None
    if args.pd_role:
        log.info("P/D %s engine; KV link %.1f GB/s, %.1f ms per transfer", args.pd_role, link_gbps, setup_ms)
    paced = PacedEngine(engine, speed=args.speed, transfer=transfer)
    flavor = args.flavor
    clients: list[StoreClient] = []  # shared stores' clients (made below): healthy once each has its index or no store
    app = build_app(
        paced,
        args.model,
        seed=args.seed,
        flavor=flavor or "vllm",
        engine_id=args.engine_id or f"sim-{args.port}",
        pd_setup_s=setup_ms / 1e3,
        # engines sharing a server on another machine leave its disk's census to the engine beside it
        uncounted_tiers=frozenset(("disk",))
        if args.cache_server and not getattr(args, "cache_server_here", True)
        else frozenset(),
        ready=lambda: all(client.settled.is_set() for client in clients),
    )
    engine.name = args.engine_id or f"sim-{args.port}"
    shared = [t for t in engine.tiers if t.config.store_id and not cache_server_tier(t.config)]
    if args.shared_store:
        if not shared:
            sys.stderr.write("kvbench-sim: --shared-store: this stack has no shared tier\n")
            raise SystemExit(2)
        clients.append(StoreClient(args.shared_store, shared[0], paced.virtual_at, paced.wake, engine.name))
    elif shared:
        log.info("the %s tier is this engine's own (no --shared-store given)", shared[0].name)
    served_tiers = [t for t in engine.tiers if cache_server_tier(t.config)]
    if args.cache_server:
        if not served_tiers:
            sys.stderr.write("kvbench-sim: --cache-server: this stack has no LMCache server tiers\n")
            raise SystemExit(2)
        base = args.cache_server.rstrip("/")
        clients += [
            StoreClient(f"{base}/ws/{t.name}", t, paced.virtual_at, paced.wake, engine.name) for t in served_tiers
        ]
        log.info("%s: the LMCache server's %s tiers are shared at %s", engine.name,
                 ", ".join(t.name for t in served_tiers), base)  # fmt: skip
    if clients:

        async def connect(_: web.Application) -> None:
            for client in clients:
                client.start()

        async def disconnect(_: web.Application) -> None:
            for client in clients:
                await client.stop()

        app.on_startup.append(connect)
        app.on_cleanup.append(disconnect)
    remote = {id(c.tier) for c in clients}
    if args.records_dir:
        _keep_records(app, [t for t in engine.tiers if id(t) not in remote], Path(args.records_dir), args.model)
    try:
        import uvloop  # noqa: PLC0415  (optional speed-up)

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    # stop within a second on SIGTERM even with streams open: an engine must not outlive its agent for long
    web.run_app(
        app, host=args.host, port=args.port, print=None, access_log=None, handle_signals=True, shutdown_timeout=1.0
    )


def _keep_records(app: web.Application, tiers: list[Tier], directory: Path, model: str) -> None:
    """Restore the file-backed tiers' records now (those this engine holds, not a store process's); keep writing
    them while serving."""
    kept: list[TierRecords] = []
    for tier in tiers:
        if file_backed(tier):
            records = TierRecords(directory, tier, tier_signature(tier, model))
            log.info("%s tier: %d records found in %s", tier.name, records.restore(), records.path)
            kept.append(records)
    if not kept:
        log.info("--records-dir: this stack has no file-backed tier of its own; nothing to keep")
        return
    keep_while_serving(app, kept)
