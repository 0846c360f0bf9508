"""``kvbench load``: drive any OpenAI-compatible server with kvbench's traffic shapes, no bus, no database.

Records go to a JSON Lines file in the export format (DESIGN.md §6) as they complete; the summary is
computed from them with the report's own definitions (``kvbench report analyze`` gives the same figures
from the file later, with another warm-up or SLO).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

__all__ = ["add_load_parser", "cmd_load"]


def add_load_parser(sub: Any) -> None:
    p = sub.add_parser(
        "load",
        help="drive an OpenAI-compatible endpoint and write request records (no services needed)",
        description="Drive any OpenAI-compatible server with kvbench's traffic shapes and definitions.",
    )
    p.add_argument("--endpoint", action="append", required=True, metavar="URL", help="base URL; repeat for several")
    p.add_argument("--model", required=True)
    p.add_argument("--traffic", metavar="FILE.yaml", help="a plan's traffic section (or a file with `traffic:`)")
    shape = p.add_argument_group("shape flags (instead of --traffic)")
    shape.add_argument(
        "--shape",
        default="synthetic_sessions",
        choices=(
            "synthetic_sessions",
            "shared_prompt",
            "per_user_history",
            "agentic_replay",
            "trace_replay",
            "document_reuse",
        ),
    )
    shape.add_argument("--prefix-tokens", type=int)
    shape.add_argument("--groups", type=int)
    shape.add_argument("--turns", type=int)
    shape.add_argument("--input-tokens", type=int)
    shape.add_argument("--output-tokens", type=int)
    shape.add_argument("--think-time-s", type=float)
    shape.add_argument("--dataset", help="agentic_replay: parquet file/dir or Mooncake-style JSONL")
    shape.add_argument("--trace", metavar="FILE", help="trace_replay: the trace file")
    shape.add_argument("--trace-format", default="mooncake", choices=("mooncake", "azure", "servegen"))
    shape.add_argument("--time-scale", type=float, default=1.0)
    shape.add_argument("--jitter", action="store_true", help="spread requests that share a trace timestamp")
    shape.add_argument("--documents", type=int, help="document_reuse: how many documents")
    shape.add_argument("--document-tokens", type=int, default=8000)
    shape.add_argument("--rounds", type=int, default=2)
    load = p.add_argument_group("load")
    level = load.add_mutually_exclusive_group()
    level.add_argument("--users", type=int, help="closed loop: concurrent users")
    level.add_argument("--rate", type=float, help="open loop: requests/s")
    load.add_argument("--distribution", choices=("poisson", "gamma"), default="poisson")
    load.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson, lower = burstier)")
    load.add_argument("--max-concurrency", type=int)
    load.add_argument("--no-gaps", action="store_true", help="ignore think times, pre_gap and delay")
    load.add_argument("--duration-s", type=float, default=0.0, help="load length (0: until the sessions end)")
    load.add_argument("--warmup-s", type=float, default=0.0)
    load.add_argument("--routing", default="round_robin", choices=("round_robin", "session_affinity", "prefix_aware"))
    load.add_argument("--seed", type=int, default=0)
    load.add_argument(
        "--engine-speed",
        type=float,
        default=1.0,
        help="engine seconds per wall second (simulated engines started with --speed): durations, gaps and rates "
        "are paced, and records stamped, in engine seconds",
    )
    load.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    load.add_argument(
        "--preconnect",
        type=int,
        metavar="N",
        help="connections to open before the load starts (default: --users, or --max-concurrency; 0: none); "
        "connection set-up is reported apart from TTFT either way",
    )
    auth = p.add_argument_group("the endpoint's keys and headers")
    auth.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="a file holding the endpoint's API key, sent as 'Authorization: Bearer KEY' (default: the "
        "OPENAI_API_KEY variable; never given on the command line, where anyone on the machine could read it)",
    )
    auth.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: value'",
        help="a header sent with every request (repeat for several), e.g. a gateway's routing header",
    )
    auth.add_argument(
        "--session-header",
        metavar="NAME",
        help="send each request's session id in this header, for session-affinity routers (e.g. X-Session-ID)",
    )
    out = p.add_argument_group("output")
    out.add_argument("--records", required=True, metavar="FILE.jsonl")
    out.add_argument("--slo-ttft-ms", type=float)
    out.add_argument("--slo-tpot-ms", type=float)
    out.add_argument("--slo-e2e-ms", type=float)
    out.add_argument("--json", action="store_true", help="print the summary as JSON")
    out.add_argument("--quiet", action="store_true", help="no progress line")
    load.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="split the schedule over N processes (one per core), started together: shards of one job",
    )
    p.set_defaults(func=cmd_load)


def _traffic(args: argparse.Namespace) -> dict[str, Any]:
    from kvbench_contracts.plan import Traffic  # noqa: PLC0415

    if args.traffic:
        raw = yaml.safe_load(Path(args.traffic).read_text(encoding="utf-8")) or {}
        raw = raw.get("traffic", raw) if isinstance(raw, dict) else raw
    else:
        synthetic = {
            k: v
            for k, v in {
                "prefix_tokens": args.prefix_tokens,
                "groups": args.groups,
                "turns": args.turns,
                "input_tokens": args.input_tokens,
                "output_tokens": args.output_tokens,
                "think_time_s": args.think_time_s,
            }.items()
            if v is not None
        }
        raw = {"shape": args.shape, "synthetic": synthetic or None}
        if args.shape == "agentic_replay":
            raw["dataset"] = args.dataset
        if args.shape == "trace_replay":
            raw["trace"] = {
                "format": args.trace_format,
                "path": args.trace,
                "time_scale": args.time_scale,
                "jitter": args.jitter,
            }
        if args.shape == "document_reuse":
            raw["documents"] = {
                "count": args.documents or 10,
                "tokens": args.document_tokens,
                "rounds": args.rounds,
                "output_tokens": args.output_tokens or 16,
            }
    if args.users is not None:
        raw["arrivals"] = {"mode": "closed_loop", "users": [args.users]}
    elif args.rate is not None:
        raw["arrivals"] = {
            "mode": "request_rate",
            "rates": [args.rate],
            "distribution": args.distribution,
            "burstiness": args.burstiness,
        }
    if args.max_concurrency or args.no_gaps:
        arrivals = dict(raw.get("arrivals") or {})
        if args.max_concurrency:
            arrivals["max_concurrency"] = args.max_concurrency
        if args.no_gaps:
            arrivals["gaps"] = "none"
        raw["arrivals"] = arrivals
    return Traffic.model_validate(raw).model_dump(mode="json")


def server_base_url(url: str) -> str:
    """The server's root from what a user gives: with or without the OpenAI SDK's trailing ``/v1`` (requests go to
    ROOT/v1/completions and metrics to ROOT/metrics either way)."""
    base = url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


@dataclass(frozen=True)
class _Share:
    """One worker's part of the schedule: shard ``index`` of ``count`` (1 of 1 without --workers)."""

    index: int = 0
    count: int = 1

    def split(self, value: int | None) -> int | None:
        """A whole-run bound (max concurrency, connections) as this worker's part, rounded up."""
        return None if value is None else -(-value // self.count)


def _source(args: argparse.Namespace, traffic: dict[str, Any], share: _Share) -> tuple[Any, Any, float]:
    from kvbench_workloads.sources import build_source  # noqa: PLC0415

    arrivals = traffic["arrivals"]
    mode = arrivals["mode"]
    level = float(
        arrivals["users"][0] if mode == "closed_loop" else arrivals["rates"][0] if mode == "request_rate" else 1
    )
    source = build_source(
        traffic,
        users=int(level) if mode == "closed_loop" else 1,
        model=args.model,
        seed=args.seed,
        shard=share.index,
        shards=share.count,
        horizon_s=args.duration_s if args.duration_s > 0 else float("inf"),
    )
    return source, mode, level


async def _run(
    args: argparse.Namespace,
    traffic: dict[str, Any],
    out: Any,
    prepared: tuple[Any, Any, float],
    share: _Share = _Share(),
    start_at: float | None = None,
    progress: Any = None,
) -> tuple[Any, Any, int, Any]:
    """One driver over its share of the schedule; ``progress``: a worker's shared counters instead of a line."""
    from kvbench_contracts.events import EngineEndpoint  # noqa: PLC0415
    from kvbench_loadgen.entrypoints import DriveConfig, Driver, LagProbe, Router, client_timing  # noqa: PLC0415

    source, mode, level = prepared
    arrivals = traffic["arrivals"]
    endpoints = [
        EngineEndpoint(node_id="cli", engine_id=f"e{i}", base_url=base, metrics_url=base + "/metrics")
        for i, base in enumerate(server_base_url(url) for url in args.endpoint)
    ]
    config = DriveConfig(
        job_id="load",
        workload=traffic["shape"],
        model=args.model,
        mode=mode,
        load_level=level,
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        seed=args.seed,
        shard="cli" if share.count == 1 else f"cli-{share.index}",
        shards=share.count,
        distribution=arrivals.get("distribution", "poisson"),
        burstiness=float(arrivals.get("burstiness", 1.0)),
        max_concurrency=share.split(arrivals.get("max_concurrency")),
        honor_gaps=arrivals.get("gaps", "recorded") != "none",
        request_timeout_s=args.timeout_s,
        drain_timeout_s=min(args.timeout_s, 120.0),
        time_scale=args.engine_speed,
        preconnect=share.split(args.preconnect),
        start_at=start_at,
        headers=args.request_headers,
        session_header=args.session_header,
    )
    written = [0]

    def write(record: Any) -> None:
        out.write(record.model_dump_json() + "\n")
        written[0] += 1

    driver = Driver(config, source, Router(endpoints, args.routing), write)
    probe = LagProbe()
    async with probe:
        task = asyncio.ensure_future(driver.run())
        if progress is None:
            await _watch(args, driver, task)
        else:
            while not task.done():
                progress[2 * share.index], progress[2 * share.index + 1] = driver.result.requests, driver.result.errors
                await asyncio.wait([task], timeout=0.5)
    return task.result(), source, written[0], client_timing(probe, task.result().send_lateness_s)


def _progress_line(args: argparse.Namespace, elapsed_s: float, requests: int, errors: int, extra: str = "") -> None:
    span = f"/{args.duration_s:.0f}" if args.duration_s > 0 else ""
    sys.stderr.write(f"\r{elapsed_s:6.1f}{span} s · {requests:,} requests · {errors:,} errors{extra} ")
    sys.stderr.flush()


async def _watch(args: argparse.Namespace, driver: Any, task: asyncio.Future[Any]) -> None:
    while not task.done():
        await asyncio.wait([task], timeout=1.0)
        if not args.quiet and not task.done():
            _progress_line(args, driver.elapsed_s, driver.result.requests, driver.result.errors)
    if not args.quiet:
        sys.stderr.write("\n")


def _worker(
    args: argparse.Namespace,
    traffic: dict[str, Any],
    share: _Share,
    path: str,
    queue: Any,
    go: Any,
    start_at: Any,
    progress: Any,
) -> None:
    """One ``--workers`` process: build its share of the sessions, say it is ready, start at the shared moment."""
    import uvloop  # noqa: PLC0415

    try:
        prepared = _source(args, traffic, share)
    except (ValueError, FileNotFoundError) as exc:
        queue.put(("error", share.index, str(exc)))
        return
    # the driver and its HTTP client imported before "ready", not after the shared start: on a busy machine those
    # imports took seconds, and a worker that came up that late lost the arrivals scheduled before it
    import kvbench_loadgen.entrypoints  # noqa: F401, PLC0415

    queue.put(("ready", share.index, None))
    go.wait()
    try:
        with Path(path).open("w", encoding="utf-8", buffering=1 << 20) as out:
            result, source, written, client = uvloop.run(
                _run(args, traffic, out, prepared, share, start_at.value, progress)
            )
    except (ValueError, FileNotFoundError) as exc:
        queue.put(("error", share.index, str(exc)))
        return
    queue.put(("done", share.index, (result, client.model_dump(), written, source.tokenizer, source.notes)))


@dataclass
class _Outcome:
    result: Any
    tokenizer: str
    notes: list[str]
    written: int
    client: Any


def _drive_workers(args: argparse.Namespace, traffic: dict[str, Any], path: Path) -> _Outcome:
    """``--workers N``: one schedule split over N processes (shards of one job, as the planner's load generators
    are), started at one shared monotonic moment; their records are joined into one file and their figures into
    one result. Raises ValueError with the first worker's error."""
    import multiprocessing  # noqa: PLC0415
    from queue import Empty  # noqa: PLC0415

    from kvbench_contracts.events import ClientTiming  # noqa: PLC0415
    from kvbench_core.timing import worst_client_timing  # noqa: PLC0415

    count = args.workers
    ctx = multiprocessing.get_context("spawn")  # no inherited event loop or sockets
    queue, go = ctx.Queue(), ctx.Event()
    start_at, progress = ctx.Value("d", 0.0), ctx.Array("q", 2 * count, lock=False)
    parts = [path.with_name(f".{path.name}.worker{i}") for i in range(count)]
    procs = [
        ctx.Process(
            target=_worker,
            args=(args, traffic, _Share(i, count), str(parts[i]), queue, go, start_at, progress),
            daemon=True,
        )
        for i in range(count)
    ]
    for proc in procs:
        proc.start()
    done: dict[int, Any] = {}
    try:
        ready = 0
        while ready < count:
            try:
                kind, index, payload = queue.get(timeout=300)
            except Empty:
                raise ValueError("the load workers were not ready after 300 s (building their sessions)") from None
            if kind == "error":
                raise ValueError(payload)
            ready += 1
        # every worker has built its sessions: start together, a moment from now (time to open their connections)
        start_at.value = time.monotonic() + 0.5
        go.set()
        last = 0.0
        while len(done) < count:
            try:
                kind, index, payload = queue.get(timeout=1.0)
            except Empty:  # show progress, and notice a worker that died without a word
                dead = [i for i, proc in enumerate(procs) if not proc.is_alive() and i not in done]
                if dead and queue.empty():
                    raise ValueError(
                        f"load worker {dead[0]} exited ({procs[dead[0]].exitcode}) without a result"
                    ) from None
            else:
                if kind == "error":
                    raise ValueError(f"load worker {index}: {payload}")
                done[index] = payload
            now = time.monotonic()
            if not args.quiet and now - last >= 1.0:
                last = now
                elapsed = max(0.0, now - start_at.value) * args.engine_speed
                _progress_line(args, elapsed, sum(progress[0::2]), sum(progress[1::2]), f" · {count} workers")
        if not args.quiet:
            sys.stderr.write("\n")
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
    with path.open("wb") as out:
        for part in parts:
            with part.open("rb") as piece:
                shutil.copyfileobj(piece, out)
            part.unlink()
    results = [done[i][0] for i in range(count)]
    merged = results[0]
    for other in results[1:]:
        merged.requests += other.requests
        merged.errors += other.errors
        merged.skipped_arrivals += other.skipped_arrivals
        merged.late_arrivals += other.late_arrivals
        merged.replay_lags_s.extend(other.replay_lags_s)
        merged.send_lateness_s.extend(other.send_lateness_s)
        merged.abandoned = merged.abandoned or other.abandoned
    merged.warmup_s = min(r.warmup_s for r in results)
    merged.load_end_s = max(r.load_end_s for r in results)
    client = worst_client_timing([ClientTiming.model_validate(done[i][1]) for i in range(count)])
    return _Outcome(merged, done[0][3], list(done[0][4]), sum(done[i][2] for i in range(count)), client)


_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an HTTP token (RFC 9110)


def request_headers(given: list[str], key_file: str | None, key_variable: str | None) -> dict[str, str]:
    """The headers every request carries: each ``--header 'Name: value'``, and the API key as a bearer token (from
    --api-key-file, else OPENAI_API_KEY). A malformed one raises ValueError naming the flag."""
    out: dict[str, str] = {}
    for raw in given:
        name, sep, value = raw.partition(":")
        if not sep or not _HEADER_NAME.match(name.strip()) or "\n" in value or "\r" in value:
            raise ValueError(f"--header: {raw[:60]!r} is not 'Name: value' (e.g. --header 'X-Tenant: lab')")
        out[name.strip()] = value.strip()
    key = key_variable
    if key_file is not None:
        try:
            key = Path(key_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"--api-key-file: cannot read {key_file} ({exc.strerror})") from None
        if not key:
            raise ValueError(f"--api-key-file: {key_file} is empty")
    if key:
        out["Authorization"] = f"Bearer {key}"
    return out


def cmd_load(args: argparse.Namespace) -> int:
    from kvbench_contracts.events import SEND_LATE_MS  # noqa: PLC0415
    from kvbench_contracts.records import RequestRecord  # noqa: PLC0415
    from kvbench_core.analysis import Slo, analyze  # noqa: PLC0415
    from kvbench_core.timing import timing_verdict  # noqa: PLC0415

    try:
        traffic = _traffic(args)
    except (OSError, yaml.YAMLError) as exc:
        sys.stderr.write(f"error: --traffic: {exc}\n")
        return 2
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"])
            sys.stderr.write(f"error: traffic.{where}: {error['msg']}\n")
        return 2
    arrivals = traffic.get("arrivals") or {}
    if (arrivals.get("mode") == "closed_loop" and not arrivals.get("users")) or (
        arrivals.get("mode") == "request_rate" and not arrivals.get("rates")
    ):
        sys.stderr.write(
            "error: no load given: pass --users N (closed loop) or --rate R (requests/s), or arrivals with users or "
            "rates in --traffic\n"
        )
        return 2
    if not args.engine_speed > 0:
        sys.stderr.write("error: --engine-speed: must be above 0 (1 for real engines; a sim engine's --speed)\n")
        return 2
    try:
        args.request_headers = request_headers(args.header, args.api_key_file, os.environ.get("OPENAI_API_KEY"))
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if args.session_header is not None and not _HEADER_NAME.match(args.session_header):
        sys.stderr.write(f"error: --session-header: {args.session_header!r} is not a header name (e.g. X-Session-ID)\n")
        return 2
    if args.workers < 1:
        sys.stderr.write("error: --workers: must be at least 1 (one process per core at most is useful)\n")
        return 2
    path = Path(args.records)
    started = time.monotonic()
    try:
        if args.workers > 1:
            outcome = _drive_workers(args, traffic, path)
        else:
            with path.open("w", encoding="utf-8", buffering=1 << 20) as out:
                import uvloop  # noqa: PLC0415 (a dependency of the load generator: timestamps on a fast loop)

                prepared = _source(args, traffic, _Share())
                result, source, written, client = uvloop.run(_run(args, traffic, out, prepared))
                outcome = _Outcome(result, source.tokenizer, list(source.notes), written, client)
    except (ValueError, FileNotFoundError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        if path.exists() and path.stat().st_size == 0:
            path.unlink()  # bad input changes nothing: no empty records file left behind
        return 2
    result, written, client = outcome.result, outcome.written, outcome.client
    records = [RequestRecord.model_validate_json(line) for line in path.read_text(encoding="utf-8").splitlines()]
    # the load's end: the duration, or the last answer where the source ran out before it (a trace shorter than
    # --duration-s: its throughput is over the time it lasted, as `report analyze` of its records computes it)
    load_end = result.load_end_s or args.duration_s
    warmup = result.warmup_s
    figures = analyze(records, warmup, load_end, Slo(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2e_ms))
    lags = sorted(result.replay_lags_s)
    timing = timing_verdict(client, figures["merged_chunk_share"], itl_p99_ms=(figures.get("itl_ms") or {}).get("p99"))
    summary = {
        **figures,
        "client_timing": client.model_dump(),
        "timing": timing,
        "records_file": str(path),
        "records_written": written,
        "warmup_s": warmup,
        "load_end_s": load_end,
        "skipped_arrivals": result.skipped_arrivals,
        # scheduled inside the window but reached after its end (a client behind its schedule): not sent, counted
        "late_arrivals": result.late_arrivals,
        "replay_lag_p99_ms": 1000 * lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else None,
        "tokenizer": outcome.tokenizer,
        "notes": outcome.notes,
        "workers": args.workers,
        "wall_s": time.monotonic() - started,
    }
    if args.json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        from kvbench_cli.console import print_figures  # noqa: PLC0415

        print_figures(figures)
        sys.stdout.write(f"records: {written:,} in {path} · tokenizer: {outcome.tokenizer}\n")
        for note in outcome.notes:
            sys.stdout.write(f"note: {note}\n")
    failed = [r for r in records if not r.ok]
    if records and len(failed) == len(records):
        # nothing answered: an unreachable endpoint, a refused key, a wrong model name; say which and fail
        kinds: dict[str, int] = {}
        for record in failed:
            kinds[record.error or "unknown"] = kinds.get(record.error or "unknown", 0) + 1
        common = ", ".join(f"{kind} x{count}" for kind, count in sorted(kinds.items(), key=lambda kv: -kv[1]))
        sys.stderr.write(
            f"error: every one of {len(records)} requests to {', '.join(args.endpoint)} failed ({common}): check "
            "that the endpoint serves the OpenAI API there, the model name, and its key\n"
        )
        return 1
    if not timing["reliable"]:
        # stderr as well as the JSON: a run past the client's knee is never silent
        late = client.sends_late_share or 0.0
        sent = f": {late:.1%} of requests were sent more than {SEND_LATE_MS:g} ms late" if late else ""
        sys.stderr.write(
            f"warning: the client fell behind{sent}; figures marked unreliable ({'; '.join(timing['reasons'])})\n"
        )
    return 0
