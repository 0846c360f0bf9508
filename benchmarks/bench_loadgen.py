"""The load generator's streaming client against the mock server: requests/s and timing error.

Method: the mock server (another process, its own core) injects TTFT and inter-token gaps and records, on the
monotonic clock, when it wrote each chunk; the client (one core) records when each chunk arrived. TTFT error =
client-observed TTFT - (server's first write - client send), i.e. what the client adds on top of the network;
ITL error = client-observed gap - server's gap, per chunk. Goals (issue 5): >= 2,000 requests/s on one core;
TTFT error <= 1 ms p50 / 5 ms p99 and ITL error <= 1 ms p99 at 50 streams.

Then the whole driver (what `kvbench load` and the service run): a Poisson rate of 2,000 requests/s for 5 s
(achieved share of the target); 1,000 closed-loop users on slow streams (TTFT 500 ms, 16 tokens 100 ms apart)
in a separate process (how long until the server has seen all 1,000 requests, TTFT error, the process's peak
RSS); and `kvbench load`'s start-up: from exec to the server reading its first request. Every process here
shares the machine's CLOCK_MONOTONIC, so server and client times compare directly.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import time
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from kvbench_core.procs import free_port, wait_port
from kvbench_loadgen.client import stream_completion
from kvbench_loadgen.mock_server import MockServer, MockTiming

# open-loop rows (requests/s); KVBENCH_BENCH_RATES="1000,2000,3000,4000" on a machine with more cores
RATES = [float(r) for r in os.environ.get("KVBENCH_BENCH_RATES", "1000,2000,3000").split(",")]


def pin(cpu: int | None) -> None:
    """Keep this process on one core (the server on one, the client on another), where the machine has it."""
    if cpu is not None and (os.cpu_count() or 1) > cpu:
        os.sched_setaffinity(0, {cpu})


def serve(port: int, ttft_s: float, itl_s: float, results: Any, cpu: int | None = None) -> None:
    pin(cpu)
    server = MockServer(MockTiming(ttft_s=ttft_s, itl_s=itl_s))

    async def dump(_: web.Request) -> web.Response:
        return web.json_response({"received": server.received, "sent": server.sent})

    async def forget(_: web.Request) -> web.Response:
        server.received.clear()
        server.sent.clear()
        return web.json_response({})

    app = server.app()
    app.add_routes([web.get("/dump", dump), web.get("/forget", forget)])
    # a backlog for 1,000 connections opened at once (the default 128 turns the rest into 1 s SYN retries)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=4096)


async def drive(base: str, streams: int, requests: int, output_tokens: int) -> tuple[float, list[dict[str, Any]]]:
    results: list[dict[str, Any]] = []
    counter = {"n": 0}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def user() -> None:
            while counter["n"] < requests:
                counter["n"] += 1
                rid = f"r{counter['n']}"
                result = await stream_completion(
                    session,
                    base,
                    {"model": "mock", "prompt": "hi", "max_tokens": output_tokens},
                    chat=False,
                    timeout_s=60,
                    headers={"X-Request-Id": rid},
                )
                results.append({"id": rid, "t0": result.t0, "chunks": result.chunk_times, "ok": result.ok})

        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(streams)))
        return time.perf_counter() - t0, results


def main() -> None:
    ctx = multiprocessing.get_context("spawn")
    for streams, requests, ttft, itl, label in (
        (50, 4000, 0.0, 0.0, "throughput, no injected delay"),
        (50, 1000, 0.05, 0.01, "timing, TTFT 50 ms, ITL 10 ms"),
    ):
        port = free_port()
        proc = ctx.Process(target=serve, args=(port, ttft, itl, None), daemon=True)
        proc.start()
        wait_port(port)
        base = f"http://127.0.0.1:{port}"
        elapsed, results = asyncio.run(drive(base, streams, requests, 16))
        truth = json.loads(aiohttp_get(f"{base}/dump"))
        proc.terminate()
        ok = [r for r in results if r["ok"]]
        ttft_err, itl_err = [], []
        matched = 0
        for r in ok:
            sent = truth["sent"].get(r["id"])
            if not sent or len(sent) != len(r["chunks"]):
                continue
            matched += 1
            ttft_err.append((r["chunks"][0] - sent[0]) * 1e3)
            itl_err += [
                ((r["chunks"][i] - r["chunks"][i - 1]) - (sent[i] - sent[i - 1])) * 1e3 for i in range(1, len(sent))
            ]

        def p(values: list[float], q: float) -> float:
            return float(np.percentile(values, q)) if values else float("nan")

        print(
            f"{label}: {streams} streams, {len(ok)}/{len(results)} ok ({matched} matched to the server's log), "
            f"{len(ok) / elapsed:,.0f} requests/s; "
            f"TTFT error p50 {p(ttft_err, 50):.2f} ms p99 {p(ttft_err, 99):.2f} ms; "
            f"ITL error p99 {p(itl_err, 99):.2f} ms"
        )


def drive_process(
    base: str,
    mode: str,
    level: float,
    duration_s: float,
    out: Any,
    preconnect: int | None = None,
    cpu: int | None = None,
) -> None:
    """The driver in its own process (so its memory is its own), reporting records and peak RSS."""
    import resource  # noqa: PLC0415

    pin(cpu)
    import uvloop  # noqa: PLC0415

    from kvbench_contracts.events import EngineEndpoint  # noqa: PLC0415
    from kvbench_loadgen.driver import DriveConfig, Driver  # noqa: PLC0415
    from kvbench_loadgen.routing import Router  # noqa: PLC0415
    from kvbench_workloads.sources import build_source  # noqa: PLC0415

    traffic = {"shape": "shared_prompt", "synthetic": {"prefix_tokens": 16, "output_tokens": 16}}
    users = int(level) if mode == "closed_loop" else 1
    source = build_source(traffic, users=users)
    config = DriveConfig(
        job_id="b",
        workload="b",
        model="mock",
        mode="request_rate" if mode == "request_rate" else "closed_loop",
        load_level=level,
        duration_s=duration_s,
        preconnect=preconnect,
    )
    # what a record's use needs, kept as it arrives: like `kvbench load` (which writes each record out) and the
    # service (which publishes them in batches), the driver's process does not hold every record object
    records: list[tuple[Any, ...]] = []

    def keep(r: Any) -> None:
        records.append((r.start_s, r.ttft_s, r.ok, r.request_id, r.connect_s))

    bases = base.split(",")  # several servers: round robin over them
    endpoints = [EngineEndpoint(node_id="n", engine_id=f"e{i}", base_url=b, metrics_url=b) for i, b in enumerate(bases)]
    router = Router(endpoints, "round_robin")
    driver = Driver(config, source, router, keep)
    result = uvloop.run(driver.run())
    out.put(
        {
            "t0": driver.load_t0,
            "records": records,
            "requests": result.requests,
            "lateness_s": list(result.send_lateness_s),
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    )


def driver_benchmarks() -> None:
    ctx = multiprocessing.get_context("spawn")

    def with_server(ttft: float, itl: float, cpu: int | None = None) -> tuple[Any, str]:
        port = free_port()
        proc = ctx.Process(target=serve, args=(port, ttft, itl, None, cpu), daemon=True)
        proc.start()
        wait_port(port)
        return proc, f"http://127.0.0.1:{port}"

    # open loop, the client alone on core 0 and mock servers on the other cores (up to 4, round robin: one Python
    # server on one core tops out near 3,000 streamed requests/s, so on a 2-core machine the server limits the top
    # row): how many requests leave on schedule (within 1 ms) and what the client adds to TTFT (the servers' own
    # logs are the truth)
    out = ctx.Queue()
    cores = os.cpu_count() or 1
    for rate in RATES:
        servers = [with_server(0.0, 0.0, cpu=1 + i if cores > 1 else None) for i in range(max(1, min(4, cores - 1)))]
        bases = ",".join(base for _, base in servers)
        client = ctx.Process(target=drive_process, args=(bases, "request_rate", rate, 5.0, out, None, 0))
        client.start()
        got = out.get(timeout=120)
        client.join()
        sent_by_id: dict[str, list[float]] = {}
        for proc, base in servers:
            sent_by_id.update(json.loads(aiohttp_get(f"{base}/dump"))["sent"])
            proc.terminate()
        sent_in_window = sum(1 for start, *_ in got["records"] if start < 5.0)
        lateness = np.asarray(got["lateness_s"]) * 1e3
        on_time = float((lateness <= 1.0).mean()) if lateness.size else float("nan")
        err = [
            (ttft - (sent_by_id[rid][0] - (got["t0"] + start))) * 1e3
            for start, ttft, ok, rid, _ in got["records"]
            if ok and ttft is not None and rid in sent_by_id
        ]
        print(
            f"driver, Poisson {rate:,.0f} requests/s for 5 s, {len(servers)} server(s): {sent_in_window / 5.0:,.0f} "
            f"requests/s sent ({sent_in_window / (rate * 5):.1%} of the target), {on_time:.1%} within 1 ms of "
            f"schedule (goal >= 99%; lateness p99 {np.percentile(lateness, 99):.2f} ms), TTFT error p50 "
            f"{np.percentile(err, 50):.2f} ms p99 {np.percentile(err, 99):.2f} ms (goal p99 <= 1) over {len(err):,} "
            f"matched; {sum(1 for r in got['records'] if r[4] is not None):,} new connections"
        )
    # 1,000 slow streams: connections opened on demand (each request's set-up shown apart, and what TTFT would be
    # if it still included it, as before) and opened ahead of the load (the default: the plan's 1,000 users)
    for preconnect, label in ((0, "opened on demand"), (None, "opened ahead")):
        server, base = with_server(0.5, 0.1)
        client = ctx.Process(target=drive_process, args=(base, "closed_loop", 1000, 0.0, out, preconnect))
        client.start()
        got = out.get(timeout=300)
        client.join()
        truth = json.loads(aiohttp_get(f"{base}/dump"))
        server.terminate()
        received = sorted(truth["received"].values())
        opened_s = received[-1] - got["t0"] if received else float("nan")
        err, with_connect, connects = [], [], []
        for start, ttft, ok, request_id, connect in got["records"]:
            sent = truth["sent"].get(request_id)
            if connect is not None:
                connects.append(connect * 1e3)
            if ok and ttft is not None and sent:  # client TTFT minus (server's first write - client send)
                error = (ttft - (sent[0] - (got["t0"] + start))) * 1e3
                err.append(error)
                with_connect.append(error + (connect or 0.0) * 1e3)
        connect_text = (
            f"{len(connects):,} new connections, connect p50 {np.percentile(connects, 50):.1f} ms p99 "
            f"{np.percentile(connects, 99):.1f} ms"
            if connects
            else "no new connection during the load"
        )
        print(
            f"driver, 1,000 slow streams (TTFT 500 ms, 16 x 100 ms), connections {label}: all {len(received):,} "
            f"requests at the server {opened_s:.2f} s after the load start (goal <= 1 s); TTFT error p50 "
            f"{np.percentile(err, 50):.2f} ms p99 {np.percentile(err, 99):.2f} ms (goal p50 <= 5) over {len(err):,} "
            f"matched; {connect_text}; counting set-up in TTFT (the old definition) p50 "
            f"{np.percentile(with_connect, 50):.1f} ms p99 {np.percentile(with_connect, 99):.1f} ms; "
            f"client peak RSS {got['rss_mb']:.0f} MB (goal < 150)"
        )


def startup() -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    proc = ctx.Process(target=serve, args=(port, 0.0, 0.0, None), daemon=True)
    proc.start()
    wait_port(port)
    base = f"http://127.0.0.1:{port}"
    times = []
    for _ in range(3):
        with tempfile.NamedTemporaryFile(suffix=".jsonl") as records:
            t0 = time.monotonic()
            command = [sys.executable, "-c", "from kvbench_cli.entry import main; main()", "load"]
            command += ["--endpoint", base, "--model", "mock", "--users", "1", "--shape", "shared_prompt"]
            command += ["--records", records.name, "--quiet", "--json"]
            subprocess.run(
                command,
                check=True,
                capture_output=True,
            )
            truth = json.loads(aiohttp_get(f"{base}/dump"))
            first = min(v for k, v in truth["received"].items())
            times.append(first - t0)
            aiohttp_get(f"{base}/forget")
    proc.terminate()
    print(f"kvbench load start-up (exec to first request at the server): {', '.join(f'{t:.2f}' for t in times)} s "
          "(goal < 1 s)")  # fmt: skip


def aiohttp_get(url: str) -> str:
    async def fetch() -> str:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return await response.text()

    return asyncio.run(fetch())


if __name__ == "__main__":
    main()
    driver_benchmarks()
    startup()
