"""How fast the simulated engine runs, on one core.

Prints: the engine core stepped alone (simulated seconds, wall seconds, speed-up over real time, engine steps/s and
requests/s, for a closed loop of shared-prefix sessions on one simulated L40S engine; baseline in the same run: the
prefix cache off); server mode's token timing error; batch mode's simulated hour of 8 engines at 50 requests/s and of
64 engines at 400 requests/s, compiled, with the Python simulation as its baseline on the first minute (and the records
of all of them compared).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import random
import resource
import sys
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

from kvbench_sim.engine import Engine, SimRequest
from kvbench_sim.finished import FinishedRequests
from kvbench_sim.profiles import EngineConfig, load_profile


def run(prefix_caching: bool, users: int = 32, requests: int = 3000, seed: int = 0) -> dict[str, float]:
    engine = Engine(load_profile("L40S", "Qwen/Qwen3-8B", EngineConfig(prefix_caching=prefix_caching)), seed=seed)
    rng = random.Random(seed)
    prefixes = [[f"g{g}w{i}" for i in range(2048)] for g in range(8)]
    now, sent, done, steps = 0.0, 0, 0, 0
    in_flight = 0
    start = time.perf_counter()
    while done < requests:
        while in_flight < users and sent < requests:
            prompt = prefixes[sent % 8] + [f"q{sent}-{i}" for i in range(rng.randint(64, 256))]
            engine.add(SimRequest(f"r{sent}", prompt, 64, now))
            sent += 1
            in_flight += 1
        plan = engine.schedule()
        if plan is None:
            break
        now += plan.duration_s
        steps += 1
        for event in engine.complete(plan, now):
            if event.finished:
                done += 1
                in_flight -= 1
    wall = time.perf_counter() - start
    return {
        "simulated_s": now,
        "wall_s": wall,
        "speedup": now / wall,
        "steps_per_s": steps / wall,
        "requests_per_s": done / wall,
        "hit_ratio": engine.counters.prefix_hits / engine.counters.prefix_queries,
    }


@contextlib.contextmanager
def python_pool() -> Iterator[None]:
    """The engines with the block pool's Python reference instead of the compiled pool (the baseline)."""
    from kvbench_sim import blocks  # noqa: PLC0415

    compiled = blocks.BlockPool, blocks.chain_hashes
    blocks.BlockPool, blocks.chain_hashes = blocks.PyBlockPool, blocks.py_chain_hashes
    try:
        yield
    finally:
        blocks.BlockPool, blocks.chain_hashes = compiled


# pool_hour's sessions: 4 turns over 16 shared 1,024-token prefixes, 256 new tokens a turn, 64 out, history resent
POOL_TRAFFIC = {
    "shape": "synthetic_sessions",
    "synthetic": {"prefix_tokens": 1024, "groups": 16, "turns": 4, "input_tokens": 256, "output_tokens": 64},
}


def pool_hour(
    duration_s: float,
    machines: int = 8,
    rate: float = 50.0,
    reference_pool: bool = False,
    compiled: bool = True,
    digest: bool = False,
) -> dict[str, Any]:
    """Batch (what-if) mode, the whole path: ``machines`` simulated H100 engines serving Qwen3-8B, a Poisson
    ``rate`` requests/s of 4-turn sessions over 16 shared 1,024-token prefixes (256 new tokens a turn, 64 out,
    history resent), routed by session affinity. ``compiled``: the compiled batch simulation where it applies (it does
    here); False, or ``reference_pool`` (the block pool's Python reference), runs the Python simulation. ``digest``:
    with its records' digest (``records_digest``), to compare runs."""
    from kvbench_contracts.plan import Plan  # noqa: PLC0415
    from kvbench_sim.whatif import run_job  # noqa: PLC0415

    plan = Plan.model_validate(
        {
            "version": 1,
            "name": "bench",
            "defaults": {
                "cluster": {"sim": {"machines": machines, "gpu": "H100", "gpus_per_machine": 1}},
                "traffic": {
                    **POOL_TRAFFIC,
                    "arrivals": {"mode": "request_rate", "rates": [rate]},
                    "duration_s": duration_s,
                },
                "measurement": {"repeats": 1, "routing": "session_affinity"},
            },
            "workloads": [{"name": "w", "strategy": "own_cache", "stack": "vllm-prefix-gpu"}],
        }
    )
    # the simulation's own pace: from its first progress report (4,096 events in, set-up done) to its last (before
    # the figures), so neither the 64 engines' set-up nor the figures over the requests count in it
    marks: list[tuple[float, int]] = []

    def mark(_: float, finished_so_far: int) -> None:
        marks.append((time.perf_counter(), finished_so_far))

    start = time.perf_counter()
    with python_pool() if reference_pool else contextlib.nullcontext():
        figures, _, sim = run_job(
            plan.workloads[0], rate, 0, progress=mark, progress_every_s=0.0, compiled=compiled and not reference_pool
        )
    wall = time.perf_counter() - start
    (first_at, first_done), (last_at, last_done) = marks[0] if len(marks) > 1 else (start, 0), marks[-1]
    finished = sim.records
    # baseline in the same run: what the same requests held as RequestRecord objects (how runs kept them before)
    sample = min(len(finished), 2000)
    tracemalloc.start()
    as_records = [finished[i] for i in range(sample)]
    record_bytes = tracemalloc.get_traced_memory()[0] / max(1, len(as_records))
    tracemalloc.stop()
    return {
        "simulated_s": duration_s,
        "wall_s": wall,
        "records_digest": records_digest(finished) if digest else "",
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,  # the process's, so far
        "requests": len(finished),
        "simulation_us_per_request": (last_at - first_at) / max(1, last_done - first_done) * 1e6,
        "ttft_p50_ms": figures["ttft_ms"]["p50"],
        "bytes_per_request": finished.nbytes / max(1, len(finished)),
        "record_bytes_per_request": record_bytes,
    }


def records_digest(finished: FinishedRequests) -> str:
    """SHA-256 of every request's number, session, turn, start, chunk times, prompt and cached tokens and sources."""
    columns = finished.columns()
    digest = hashlib.sha256()
    for column in (columns.start_s, columns.chunk_times, columns.chunk_offsets, columns.prompt_tokens,
                   columns.cached_tokens):  # fmt: skip
        digest.update(column.tobytes())
    for i in range(len(finished)):
        digest.update(f"{finished.request_id(i)} {finished[i].session_id} {finished.sources(i)}".encode())
    return digest.hexdigest()[:16]


def hour_s(result: dict[str, Any]) -> float:
    """``pool_hour``'s simulation proper projected to one simulated hour (its set-up and figures left out)."""
    return float(result["simulation_us_per_request"] * result["requests"] * 3600 / result["simulated_s"] / 1e6)


def _drive(base: str, users: int, duration_s: float) -> None:
    import uvloop  # noqa: PLC0415

    from kvbench_contracts.events import EngineEndpoint  # noqa: PLC0415
    from kvbench_loadgen.driver import DriveConfig, Driver  # noqa: PLC0415
    from kvbench_loadgen.routing import Router  # noqa: PLC0415
    from kvbench_workloads.sources import build_source  # noqa: PLC0415

    traffic = {"shape": "shared_prompt", "synthetic": {"prefix_tokens": 256, "output_tokens": 256}}
    config = DriveConfig(
        job_id="b", workload="b", model="Qwen/Qwen3-8B", mode="closed_loop", load_level=users, duration_s=duration_s
    )
    router = Router([EngineEndpoint(node_id="n", engine_id="e", base_url=base, metrics_url=base)], "round_robin")
    uvloop.run(Driver(config, build_source(traffic, users=users), router, lambda _: None).run())


def _histogram_quantile(samples: dict[float, float], q: float) -> float:
    """Prometheus-style: linear inside the bucket that holds the q-th observation."""
    bounds = sorted(samples)
    total = samples[bounds[-1]]
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        if samples[bound] >= rank:
            inside = samples[bound] - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = bound, samples[bound]
    return bounds[-1]


def server_streams(users: int = 500, duration_s: float = 20.0) -> dict[str, float]:
    """Server mode: one simulated H100 engine process, paced to the wall clock, streaming to ``users`` concurrent
    closed-loop users (another process): how far from its virtual due time each token is written (early or late:
    the timing error) and how late (0 when early)."""
    import multiprocessing  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    from kvbench_core.procs import free_port, wait_port  # noqa: PLC0415

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "kvbench_sim", "serve", "--port", str(port), "--gpu", "H100", "--max-num-seqs", "512"],
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, timeout_s=30)
        base = f"http://127.0.0.1:{port}"
        client = multiprocessing.get_context("spawn").Process(target=_drive, args=(base, users, duration_s))
        client.start()
        client.join(duration_s + 120)
        text = urllib.request.urlopen(f"{base}/metrics").read().decode()
    finally:
        server.terminate()
        server.wait(10)
    buckets: dict[str, dict[float, float]] = {"lateness": {}, "timing_error": {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for name, histogram in buckets.items():
                if sample.name == f"kvbench_sim_token_{name}_seconds_bucket":
                    histogram[float(sample.labels["le"])] = sample.value
    return {
        "tokens": buckets["timing_error"].get(float("inf"), 0.0),
        "error_p50_ms": _histogram_quantile(buckets["timing_error"], 0.50) * 1e3,
        "error_p99_ms": _histogram_quantile(buckets["timing_error"], 0.99) * 1e3,
        "late_p99_ms": _histogram_quantile(buckets["lateness"], 0.99) * 1e3,
    }


def main() -> None:
    """``--batch-only``: batch mode's hours alone (what the H100 machine's host ran: it has no loopback load here)."""
    if "--batch-only" not in sys.argv[1:]:
        engine_core_and_server()
    batch_mode()


def engine_core_and_server() -> None:
    for label, caching in (("prefix cache on", True), ("baseline: prefix cache off", False)):
        r = run(caching)
        print(
            f"{label:28s} simulated {r['simulated_s']:8.1f} s in {r['wall_s']:6.2f} s wall "
            f"({r['speedup']:7.1f}x real time) · {r['steps_per_s']:8.0f} steps/s · "
            f"{r['requests_per_s']:7.0f} requests/s · hit ratio {r['hit_ratio']:.2f}"
        )
    streams = server_streams()
    print(
        f"server mode, 500 concurrent streams for 20 s: {streams['tokens']:,.0f} tokens · |written - due| p50 "
        f"{streams['error_p50_ms']:.2f} ms p99 {streams['error_p99_ms']:.2f} ms · lateness p99 "
        f"{streams['late_p99_ms']:.2f} ms (goal p99 < 5 ms)"
    )


def batch_mode() -> None:
    print(f"batch mode on {platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores")
    hour = float(os.environ.get("KVBENCH_BENCH_SIM_SECONDS", "3600"))
    p = pool_hour(hour)
    print(
        f"batch mode, 8 engines at 50 requests/s: {p['simulated_s']:,.0f} simulated s in {p['wall_s']:.1f} s wall "
        f"(goal for one hour: < 60 s) · {p['requests']:,} requests · TTFT p50 {p['ttft_p50_ms']:.1f} ms"
    )
    # the cluster-scale goal, measured whole (KVBENCH_BENCH_SIM_LARGE_SECONDS shortens it); its baselines, the
    # Python simulation (and with the block pool's Python reference too), on the first minute, projected to the hour
    window = float(os.environ.get("KVBENCH_BENCH_SIM_LARGE_SECONDS", "3600"))
    short = min(window, 60.0)
    big = pool_hour(window, machines=64, rate=400.0, digest=short == window)
    same_window = big if short == window else pool_hour(short, machines=64, rate=400.0, digest=True)
    reference = pool_hour(short, machines=64, rate=400.0, compiled=False, digest=True)
    python_pool = pool_hour(short, machines=64, rate=400.0, reference_pool=True, digest=True)
    hour_requests = big["requests"] * 3600 / big["simulated_s"]
    print(
        f"batch mode, 64 engines at 400 requests/s, compiled: {big['simulated_s']:,.0f} simulated s in "
        f"{big['wall_s']:.1f} s wall with set-up and figures (goal for one hour: < 60 s) · {big['requests']:,} "
        f"requests, {big['simulation_us_per_request']:.1f} us each in the simulation proper (the goal leaves "
        f"{60.0 / hour_requests * 1e6:.0f} us) · TTFT p50 {big['ttft_p50_ms']!r} ms · peak RSS "
        f"{big['peak_rss_gb']:.2f} GB (the process's)"
    )
    for label, r in (("the Python simulation", reference), ("and the block pool's Python reference", python_pool)):
        slower = r["simulation_us_per_request"] / same_window["simulation_us_per_request"]
        print(
            f"  baseline, {label}: {r['simulated_s']:,.0f} simulated s in {r['wall_s']:.1f} s wall · "
            f"{r['simulation_us_per_request']:.0f} us a request ({slower:.1f}x the compiled one's over the same "
            f"window) · one hour projected {hour_s(r):,.0f} s"
        )
    digests = {same_window["records_digest"], reference["records_digest"], python_pool["records_digest"]}
    if len(digests) != 1:
        raise SystemExit("the compiled simulation and the Python reference simulated different records")
    print(f"  the same {reference['requests']:,} records, bit for bit, all three ways (sha256 {digests.pop()})")
    print(
        f"  finished requests held: {big['bytes_per_request']:,.0f} B each as columns, against "
        f"{big['record_bytes_per_request']:,.0f} B as RequestRecord objects (baseline, same requests) · one hour's "
        f"{hour_requests / 1e6:.2f} million: {hour_requests * big['bytes_per_request'] / 1e9:.1f} GB against "
        f"{hour_requests * big['record_bytes_per_request'] / 1e9:.1f} GB"
    )


if __name__ == "__main__":
    main()
