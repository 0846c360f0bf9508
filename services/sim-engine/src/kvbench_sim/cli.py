"""``python -m kvbench_sim serve``: one simulated engine on one port (what the node agent starts)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

from aiohttp import web

from kvbench_sim import router, store
from kvbench_sim.engine import Engine
from kvbench_sim.profiles import EngineConfig, Profile, load_profile
from kvbench_sim.records import TierRecords, file_backed, keep_while_serving, tier_signature
from kvbench_sim.server import PacedEngine, build_app
from kvbench_sim.stacks import layout_for
from kvbench_sim.tiers import Link

__all__ = ["main"]

log = logging.getLogger("kvbench_sim")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvbench-sim", description="Simulated vLLM-compatible engine")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve one simulated engine over HTTP")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, required=True)
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
    serve.add_argument("--engine-id", default=None, help="name given to P/D peers (default: sim-PORT)")
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
        "--layout",
        default=None,
        help="JSON {workload: {stack, model, engine, sizing, kv_tier}, cluster: {...}}: engine settings and tiers "
        "of that catalog stack (what the node agent passes); overrides the engine flags above",
    )
    router.add_parser(sub)
    store.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s kvbench-sim %(message)s")
    if args.command == "route":
        router.main(args)
        return
    if args.command == "store":
        store.main(args)
        return
    try:
        profile = _profile(args)
        engine = Engine(profile, seed=args.seed)
    except (ValueError, KeyError) as exc:
        sys.stderr.write(f"kvbench-sim: {exc}\n")
        raise SystemExit(2) from None
    _serve(args, profile, engine)


def _profile(args: argparse.Namespace) -> Profile:
    if args.layout:
        spec = json.loads(args.layout)
        layout = layout_for(spec["workload"], spec.get("cluster") or {"gpu": args.gpu})
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


def _serve(args: argparse.Namespace, profile: Profile, engine: Engine) -> None:
    # the same line vLLM prints; the node agent reads the effective block size from it
    log.info("Setting attention block size to %d tokens", profile.block_size)
    log.info(
        "GPU KV cache size: %d tokens (%d blocks); prefix caching %s",
        engine.pool.num_blocks * profile.block_size,
        engine.pool.num_blocks,
        "on" if profile.engine.prefix_caching else "off",
    )
    link_gbps, setup_ms = 25.0, 1.0
    if args.layout:
        spec = json.loads(args.layout)
        layout = layout_for(spec["workload"], spec.get("cluster") or {"gpu": args.gpu})
        link_gbps, setup_ms = layout.link_gbps, layout.link_setup_ms
    link_gbps = args.pd_link_gbps or link_gbps
    setup_ms = args.pd_setup_ms if args.pd_setup_ms is not None else setup_ms
    transfer = Link("pd", link_gbps * 1e9) if args.pd_role == "decode" else None
    if args.pd_role:
        log.info("P/D %s engine; KV link %.1f GB/s, %.1f ms per transfer", args.pd_role, link_gbps, setup_ms)
    paced = PacedEngine(engine, speed=args.speed, transfer=transfer)
    flavor = args.flavor
    if args.layout and flavor is None:
        flavor = str((json.loads(args.layout)["workload"].get("engine") or {}).get("name", "vllm"))
    app = build_app(
        paced,
        args.model,
        seed=args.seed,
        flavor=flavor or "vllm",
        engine_id=args.engine_id or f"sim-{args.port}",
        pd_setup_s=setup_ms / 1e3,
    )
    shared = [t for t in engine.tiers if t.config.store_id]
    if args.shared_store:
        if not shared:
            sys.stderr.write("kvbench-sim: --shared-store: this stack has no shared tier\n")
            raise SystemExit(2)
        client = store.StoreClient(args.shared_store, shared[0], virtual_at=paced.virtual_at, wake=paced.wake)

        async def connect(_: web.Application) -> None:
            client.start()

        async def disconnect(_: web.Application) -> None:
            await client.stop()

        app.on_startup.append(connect)
        app.on_cleanup.append(disconnect)
    elif shared:
        log.info("the %s tier is this engine's own (no --shared-store given)", shared[0].name)
    if args.records_dir:
        _keep_records(app, engine, Path(args.records_dir), args.model, owned_shared=not args.shared_store)
    try:
        import uvloop  # noqa: PLC0415  (optional speed-up)

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    # stop within a second on SIGTERM even with streams open: an engine must not outlive its agent for long
    web.run_app(
        app, host=args.host, port=args.port, print=None, access_log=None, handle_signals=True, shutdown_timeout=1.0
    )


def _keep_records(app: web.Application, engine: Engine, directory: Path, model: str, owned_shared: bool) -> None:
    """Restore the file-backed tiers' records now; keep writing them while serving."""
    kept: list[TierRecords] = []
    for tier in engine.tiers:
        if file_backed(tier) and (owned_shared or not tier.config.store_id):
            records = TierRecords(directory, tier, tier_signature(tier, model))
            log.info("%s tier: %d records found in %s", tier.name, records.restore(), records.path)
            kept.append(records)
    if not kept:
        log.info("--records-dir: this stack has no file-backed tier; nothing to keep")
        return
    keep_while_serving(app, kept)
