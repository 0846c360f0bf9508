"""The load generator's streaming client against the mock server: requests/s and timing error.

Method: the mock server (another process, its own core) injects TTFT and inter-token gaps and records, on the
monotonic clock, when it wrote each chunk; the client (one core) records when each chunk arrived. TTFT error =
client-observed TTFT - (server's first write - client send), i.e. what the client adds on top of the network;
ITL error = client-observed gap - server's gap, per chunk. Goals (issue 5): >= 2,000 requests/s on one core;
TTFT error <= 1 ms p50 / 5 ms p99 and ITL error <= 1 ms p99 at 50 streams.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from kvbench_core.embedded import free_port, wait_port
from kvbench_loadgen.client import stream_completion
from kvbench_loadgen.mock_server import MockServer, MockTiming


def serve(port: int, ttft_s: float, itl_s: float, results: Any) -> None:
    server = MockServer(MockTiming(ttft_s=ttft_s, itl_s=itl_s))

    async def dump(_: web.Request) -> web.Response:
        return web.json_response({"received": server.received, "sent": server.sent})

    app = server.app()
    app.add_routes([web.get("/dump", dump)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


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
        p = lambda v, q: float(np.percentile(v, q)) if v else float("nan")  # noqa: E731
        print(
            f"{label}: {streams} streams, {len(ok)}/{len(results)} ok ({matched} matched to the server's log), "
            f"{len(ok) / elapsed:,.0f} requests/s; "
            f"TTFT error p50 {p(ttft_err, 50):.2f} ms p99 {p(ttft_err, 99):.2f} ms; "
            f"ITL error p99 {p(itl_err, 99):.2f} ms"
        )


def aiohttp_get(url: str) -> str:
    async def fetch() -> str:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return await response.text()

    return asyncio.run(fetch())


if __name__ == "__main__":
    main()
