"""A live run of kvbench's own stacks on a real GPU machine (docs/live.md): each stack's recipe is rendered by
kvbench_stacks, started by the node agent's process launcher (health waited for as the agent does), driven by
`kvbench load` with the LMCache study's document-reuse shape, and its real /metrics scraped before and after the
load and normalised by the agent's normaliser. One JSON per run, the engines' logs, records and /metrics texts go
to $OUT (and, with LIVE_ARCHIVE set, into one archive after every run). Suites: `stacks` (the issue's four
stacks), `calibration` (the simulator's cases: prefill cold and from the prefix cache at five lengths, decode at
four batch sizes, host memory at a second length), `study` (the LMCache study scaled to this machine).

Run on the GPU machine by tools/live/live.sh (which sets up vLLM and the environment); not by CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench_contracts.commands import PoolMachine
from kvbench_contracts.engine import NORMALIZED_COUNTERS
from kvbench_contracts.plan import EngineSpec, NetworkSpec, Sizing
from kvbench_node_agent.launchers.process import ProcessLauncher
from kvbench_node_agent.normalize import normalize
from kvbench_node_agent.scrape import parse_samples
from kvbench_stacks.catalog import CATALOG
from kvbench_stacks.recipes import RenderContext, render

NAME = "qwen3-8b-dummy"
LMCACHE_DISK = "/tmp/lmcache-l2"  # noqa: S108 (a lent machine's scratch disk)
# the study's LMCache server: L1 in RAM, L2 on local disk; O_DIRECT off, as LMCache failed every O_DIRECT write on
# this machine
LMCACHE_SIZING = {
    "host_memory_gb": 20,
    "disk_tier_path": LMCACHE_DISK,
    "disk_tier_gb": 40,
    "disk_tier_direct_io": False,
}
ENGINE_ARGS: dict[str, Any] = {
    "load-format": "dummy",  # random weights: no model download (the Hub is not reachable)
    "served-model-name": NAME,
    "max-model-len": 16384,
    "gpu-memory-utilization": 0.85,
    # a 4 GiB GPU KV cache (29,120 tokens on this model) that 8 x 8,000-token documents overflow, so reuse needs a
    # tier beyond the GPU; a run that wants the whole GPU sets it to None
    "kv-cache-memory-bytes": 4 * 2**30,
}
# words: the stand-in tokenizer makes about 1.65 tokens of each, so ~8,000-token documents (gpu-vllm.md's size)
DOCUMENT_WORDS = 4850


@dataclass(frozen=True)
class Load:
    """One `kvbench load` of the document_reuse shape: ``documents`` of ``words`` each, visited ``rounds`` times in
    tile order by ``users`` closed-loop users. The engine's prefix cache is emptied before it (documents of the same
    index share their first words across loads)."""

    name: str
    documents: int = 8
    words: int = DOCUMENT_WORDS
    rounds: int = 2
    output_tokens: int = 4
    users: int = 1


@dataclass(frozen=True)
class LiveRun:
    """One stack started once, its loads run in order; ``restart``: once more after every process restarted, on
    the same data (a stack whose records outlive a restart)."""

    name: str
    stack: str
    tier: str = "gpu"
    sizing: dict[str, Any] = field(default_factory=dict)
    engine_args: dict[str, Any] = field(default_factory=dict)  # over ENGINE_ARGS; None drops an argument
    loads: tuple[Load, ...] = (Load("documents"),)
    restart: Load | None = None


# the study, scaled to this machine (reference/lmcache-study.md: 665 x 8,000 tokens, 63 GB of KV against a 55 GiB
# GPU cache, L1 20 GB): 24 GiB of GPU cache (174,000 tokens) against 24 documents of ~8,000 tokens (28 GB, 1.1x
# the cache), L1 9 GB (the study's share of its working set); one user, round 2 measured
STUDY_CACHE = {"kv-cache-memory-bytes": 24 * 2**30}
STUDY_LOAD = Load("study", documents=24)
SUITES: dict[str, tuple[LiveRun, ...]] = {
    # the first live run (data/live/2026-12-01-h200-vllm-0.25.1): the stacks in order
    "stacks": (
        LiveRun("vllm-prefix-off", "vllm-prefix-off"),
        LiveRun("vllm-prefix-gpu", "vllm-prefix-gpu"),
        LiveRun("vllm-native-cpu-offload", "vllm-native-cpu-offload", "cpu_ram", {"host_memory_gb": 32}),
        LiveRun("vllm-lmcache-mp", "vllm-lmcache-mp", "nvme", LMCACHE_SIZING, restart=Load("after_restart", rounds=1)),
    ),
    # the simulator's calibration cases: prefill cold and from the GPU prefix cache at five lengths (three documents
    # each, visited twice), decode steps at four batch sizes (every user's one request at once, 256 tokens out)
    "calibration": (
        LiveRun(
            "calibration-gpu",
            "vllm-prefix-gpu",
            engine_args={"kv-cache-memory-bytes": None},
            loads=(
                *(Load(f"prefill-{w}w", documents=3, words=w) for w in (600, 1200, 2400, 4850, 7300)),
                *(
                    Load(f"decode-{u}", documents=u, words=120, rounds=1, output_tokens=256, users=u)
                    for u in (1, 8, 32, 128)
                ),
            ),
        ),
        # host memory at another length than the first run's (~2,000-token documents overflowing the 4 GiB cache)
        LiveRun(
            "calibration-cpu-offload",
            "vllm-native-cpu-offload",
            "cpu_ram",
            {"host_memory_gb": 32},
            loads=(Load("offload-1200w", documents=24, words=1200),),
        ),
    ),
    "study": (
        LiveRun("study-vllm-only", "vllm-prefix-gpu", engine_args=STUDY_CACHE, loads=(STUDY_LOAD,)),
        LiveRun(
            "study-lmcache",
            "vllm-lmcache-mp",
            "nvme",
            {**LMCACHE_SIZING, "host_memory_gb": 9},
            engine_args=STUDY_CACHE,
            loads=(STUDY_LOAD,),
            restart=Load("after_restart", documents=24, rounds=1),
        ),
    ),
}


def metrics_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (the engine we just started)
        return str(response.read().decode())


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in NORMALIZED_COUNTERS if k in after or k in before}


def kvbench_load(base_url: str, records: Path, load: Load) -> dict[str, Any]:
    command = [
        sys.executable, "-c", "from kvbench_cli.main import main; main()", "load", "--endpoint", base_url,
        "--model", NAME, "--shape", "document_reuse", "--documents", str(load.documents), "--document-tokens",
        str(load.words), "--rounds", str(load.rounds), "--output-tokens", str(load.output_tokens), "--users",
        str(load.users), "--records", str(records), "--json", "--quiet",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"kvbench load failed: {done.stderr[-3000:]}")
    return dict(json.loads(done.stdout))


def by_round(records: Path, rounds: int) -> dict[str, Any]:
    """TTFT and cached tokens of each round (tile order: requests in send order, each round an equal share)."""
    rows = sorted((json.loads(line) for line in records.read_text().splitlines()), key=lambda r: r["start_s"])
    size = len(rows) // rounds
    return {f"round{n + 1}": round_summary(rows[n * size : (n + 1) * size]) for n in range(rounds)}


def round_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ttfts = sorted(r["ttft_s"] * 1e3 for r in rows if r["ttft_s"] is not None)
    return {
        "requests": len(rows),
        "ttft_ms_median": ttfts[len(ttfts) // 2] if ttfts else None,
        "ttft_ms": [round(t, 1) for t in ttfts],
        "cached_tokens": sum(r["cached_tokens"] or 0 for r in rows),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "output_tokens": sum(r["output_tokens"] or 0 for r in rows),
    }


def gpu_count() -> int:
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return max(1, sum(1 for line in done.stdout.splitlines() if line.startswith("GPU ")))


def reset_prefix_cache(base_url: str) -> int:
    """vLLM's POST /reset_prefix_cache (served with VLLM_SERVER_DEV_MODE=1, which live.sh sets): the HTTP status."""
    request = urllib.request.Request(base_url.rstrip("/") + "/reset_prefix_cache", method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (the engine we just started)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def engine_args(run: LiveRun) -> dict[str, Any]:
    merged = {**ENGINE_ARGS, **run.engine_args}
    return {k: v for k, v in merged.items() if v is not None}


async def one_run(run: LiveRun, model: str, out: Path, tp: int = 1) -> dict[str, Any]:
    """``tp``: GPUs per engine (tensor parallel); a machine with more GPUs than that runs several engines, as the
    recipe lays them out, and the load goes to the first."""
    engine = EngineSpec(version="0.25.1", tensor_parallel_size=tp, args=engine_args(run))
    gpus = gpu_count()
    if gpus < tp:
        raise RuntimeError(f"{run.stack} with tensor parallel size {tp} needs {tp} GPUs; this machine has {gpus}")
    machine = PoolMachine(name="gpu", host="127.0.0.1", gpus=gpus)
    ctx = RenderContext.for_pool(
        run.stack, model, engine, run.tier, Sizing(**run.sizing), NetworkSpec(), [machine], "round_robin"
    )
    specs = render(ctx)["gpu"]
    launcher = ProcessLauncher("process", "gpu", "127.0.0.1", out / "state", health_timeout_s=420)
    disk = Path(run.sizing["disk_tier_path"]) if run.sizing.get("disk_tier_path") else None
    if disk is not None:
        await asyncio.to_thread(fresh_dir, disk)
    hint = CATALOG[run.stack].external_hits_tier("both")
    servers = [f"http://127.0.0.1:{s.metrics[0]}{s.metrics[1]}" for s in specs if s.role == "lmcache" and s.metrics]
    result: dict[str, Any] = {"run": run.name, "stack": run.stack, "argv": [" ".join(s.argv) for s in specs]}
    passes = [("", run.loads), ("after_restart", (run.restart,))] if run.restart else [("", run.loads)]
    for tag, loads in passes:
        if tag and disk is not None:
            result["before_restart"] = {
                "disk_tier": await asyncio.to_thread(settled_usage, disk),
                # the records are read from the disk, not from the page cache the first pass left warm
                "page_cache_dropped": await asyncio.to_thread(drop_page_cache),
            }
        started = time.monotonic()
        deployment = await launcher.start_specs(f"live-{run.name}{tag}", "live", run.stack, specs)
        part: dict[str, Any] = {"healthy_after_s": round(time.monotonic() - started, 1), "facts": deployment.facts}
        try:
            endpoint = deployment.endpoints[0]
            urls = [endpoint.metrics_url, *servers]
            for load in loads:
                assert load is not None
                entry: dict[str, Any] = {"load": load.__dict__}
                if not tag:  # after a restart the caches are what the restart left
                    entry["reset_prefix_cache"] = await asyncio.to_thread(reset_prefix_cache, endpoint.base_url)
                before = [parse_samples(await asyncio.to_thread(metrics_text, url)) for url in urls]
                records = out / f"records-{run.name}{tag}-{load.name}.jsonl"
                summary = await asyncio.to_thread(kvbench_load, endpoint.base_url, records, load)
                texts = [await asyncio.to_thread(metrics_text, url) for url in urls]
                for index, text in enumerate(texts):
                    (out / f"metrics-{run.name}{tag}-{load.name}-{index}.txt").write_text(text)
                entry["normalized_delta"] = [
                    delta(normalize(b, external=hint), normalize(parse_samples(t), external=hint))
                    for b, t in zip(before, texts, strict=True)
                ]
                entry["rounds"] = by_round(records, load.rounds)
                kept = ("requests_total", "errors", "ttft_ms", "itl_ms", "timing", "connections", "tokenizer", "wall_s")
                entry["summary"] = {k: summary.get(k) for k in kept}
                part[load.name] = entry
                sys.stdout.write(json.dumps({"run": run.name + tag, "load": load.name, "rounds": {
                    k: (v["ttft_ms_median"], v["cached_tokens"], v["prompt_tokens"]) for k, v in entry["rounds"].items()
                }, "itl_ms_p50": (summary.get("itl_ms") or {}).get("p50")}) + "\n")  # fmt: skip
                sys.stdout.flush()
            if disk is not None:
                part["disk_tier"] = await asyncio.to_thread(settled_usage, disk)
        finally:
            await launcher.stop(deployment)
            for process in deployment.processes:
                shutil.copy(process.log_path, out / f"engine-{run.name}{tag}-{process.name}.log")
        part["total_s"] = round(time.monotonic() - started, 1)
        if tag:
            result[tag] = part
        else:
            result.update(part)
    return result


def fresh_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def disk_usage(path: Path) -> dict[str, int]:
    """What a disk tier holds: its records' files and bytes."""
    files = [f for f in path.rglob("*") if f.is_file()]
    return {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}


def settled_usage(path: Path, quiet_s: float = 5.0, limit_s: float = 180.0) -> dict[str, Any]:
    """The disk tier once its asynchronous writes have stopped (no change for ``quiet_s``), and how long that took."""
    started = time.monotonic()
    last, since = disk_usage(path), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() - started < limit_s:
        time.sleep(1.0)
        now = disk_usage(path)
        if now != last:
            last, since = now, time.monotonic()
    return {**last, "settled_after_s": round(time.monotonic() - started, 1)}


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="/tmp/model")  # noqa: S108 (where live.sh unpacks the stand-in model)
    parser.add_argument("--suite", choices=sorted(SUITES), default="stacks")
    parser.add_argument("--runs", default="", help="comma-separated run names of the suite (default: all)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per engine (needs that many)")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", "live-out"))
    out.mkdir(parents=True, exist_ok=True)
    archive = os.environ.get("LIVE_ARCHIVE")
    wanted = set(filter(None, args.runs.split(",")))
    for run in SUITES[args.suite]:
        if wanted and run.name not in wanted:
            continue
        try:
            result = asyncio.run(one_run(run, args.model, out, args.tensor_parallel_size))
        except Exception as exc:  # one run failing leaves the others to run; the error is the result
            result = {"run": run.name, "stack": run.stack, "error": f"{type(exc).__name__}: {exc}"[-4000:]}
        (out / f"live-{run.name}.json").write_text(json.dumps(result, indent=2))
        if archive:  # the machine returns a few files a call: everything so far in one, after every run
            with tarfile.open(archive, "w:gz") as tar:
                tar.add(out, arcname=out.name)
        brief = {k: result.get(k) for k in ("run", "healthy_after_s", "error")}
        sys.stdout.write(json.dumps(brief) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
