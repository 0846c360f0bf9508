"""`kvbench load --workers N`: one open-loop schedule split over N processes, against mock servers.

Method: as many mock-server processes as workers (each its own port; every worker spreads its requests over all of
them round robin), 16-token prompts and outputs with no injected delay, so the client is the bottleneck. Each row
offers more than N workers can send (``KVBENCH_BENCH_RATE_PER_WORKER`` x N requests/s, default 4,000) for 4 s
and counts what was sent in the window and how late (the share of sends more than 5 ms behind schedule); a
worker's capacity is what one worker achieves in the same run. Goal (issue 18): aggregate >= 0.9 x N x one
worker's. The figure means something only where the machine has a core for every worker and server: the table
says how many this machine has. Workers to try: ``KVBENCH_BENCH_WORKER_COUNTS`` (default "1,2").
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from aiohttp import web

from kvbench_core.procs import free_port, wait_port
from kvbench_loadgen.mock_server import MockServer, MockTiming

COUNTS = [int(n) for n in os.environ.get("KVBENCH_BENCH_WORKER_COUNTS", "1,2").split(",")]
RATE_PER_WORKER = float(os.environ.get("KVBENCH_BENCH_RATE_PER_WORKER", "4000"))
DURATION_S = 4.0


def serve(port: int) -> None:
    app = MockServer(MockTiming(ttft_s=0.0, itl_s=0.0), keep_log=False).app()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=4096)


def run(workers: int, endpoints: list[str], folder: Path) -> dict[str, float]:
    rate = RATE_PER_WORKER * workers
    command = [
        sys.executable, "-c", "from kvbench_cli.main import main; main()", "load", "--model", "mock",
        "--shape", "shared_prompt", "--prefix-tokens", "16", "--output-tokens", "16", "--rate", f"{rate:g}",
        "--duration-s", f"{DURATION_S:g}", "--records", str(folder / f"w{workers}.jsonl"), "--workers",
        str(workers), "--json", "--quiet", "--timeout-s", "30",
    ]  # fmt: skip
    for endpoint in endpoints:
        command += ["--endpoint", endpoint]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"kvbench load --workers {workers} failed: {done.stderr[-2000:]}")
    summary = json.loads(done.stdout)
    starts = [json.loads(line)["start_s"] for line in (folder / f"w{workers}.jsonl").read_text().splitlines()]
    sent = sum(1 for s in starts if s < DURATION_S)
    return {
        "offered": rate,
        "achieved": sent / DURATION_S,
        "late_share": summary["client_timing"].get("sends_late_share") or 0.0,
        "errors": summary["errors"],
    }


def main() -> None:
    ctx = multiprocessing.get_context("spawn")
    servers, endpoints = [], []
    for _ in range(max(COUNTS)):
        port = free_port()
        proc = ctx.Process(target=serve, args=(port,), daemon=True)
        proc.start()
        wait_port(port)
        servers.append(proc)
        endpoints.append(f"http://127.0.0.1:{port}")
    print(
        f"kvbench load --workers: {os.cpu_count()} cores here, {len(endpoints)} mock servers; offered "
        f"{RATE_PER_WORKER:,.0f} requests/s per worker for {DURATION_S:g} s"
    )
    print(f"{'workers':>7} {'offered/s':>10} {'achieved/s':>11} {'late >5ms':>10} {'errors':>7} {'vs N x one':>11}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            one = None
            for workers in COUNTS:
                row = run(workers, endpoints, Path(tmp))
                one = one or (row["achieved"] if workers == 1 else None)
                scaling = f"{row['achieved'] / (workers * one):.2f}" if one else "-"
                print(
                    f"{workers:>7} {row['offered']:>10,.0f} {row['achieved']:>11,.0f} {row['late_share']:>10.1%} "
                    f"{row['errors']:>7,.0f} {scaling:>11}"
                )
    finally:
        for proc in servers:
            proc.terminate()


if __name__ == "__main__":
    main()
