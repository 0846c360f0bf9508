"""A live run of kvbench's own stacks on a real GPU machine (docs/live.md): each stack's recipe is rendered by
kvbench_stacks, started by the node agent's process launcher (health waited for as the agent does), driven by
`kvbench load` with the LMCache study's document-reuse shape, and its real /metrics scraped before and after the
load and normalised by the agent's normaliser. One JSON per stack, and the engines' logs, go to $OUT.

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
import time
import urllib.request
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
# the stacks in the order, each with its tier and sizing: a 4 GiB GPU KV cache (29,120 tokens on this
# model) that 8 x 8,000-token documents overflow, so reuse needs a tier beyond the GPU
LMCACHE_DISK = "/tmp/lmcache-l2"  # noqa: S108 (a lent machine's scratch disk)
STACKS: dict[str, tuple[str, dict[str, Any]]] = {
    "vllm-prefix-off": ("gpu", {}),
    "vllm-prefix-gpu": ("gpu", {}),
    "vllm-native-cpu-offload": ("cpu_ram", {"host_memory_gb": 32}),
    # the LMCache study's stack: an LMCache 0.5.1 MP server (L1 20 GB RAM, L2 on local disk) beside vLLM; O_DIRECT
    # off, as LMCache failed every O_DIRECT write on this machine
    "vllm-lmcache-mp": (
        "nvme",
        {
            "host_memory_gb": 20,
            "disk_tier_path": LMCACHE_DISK,
            "disk_tier_gb": 40,
            "disk_tier_direct_io": False,
        },
    ),
}
RESTARTED = ("vllm-lmcache-mp",)  # stacks whose records outlive a restart: run once more after one
ENGINE_ARGS = {
    "load-format": "dummy",  # random weights: no model download (the Hub is not reachable)
    "served-model-name": NAME,
    "max-model-len": 16384,
    "gpu-memory-utilization": 0.85,
    "kv-cache-memory-bytes": 4 * 2**30,
}


def metrics_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (the engine we just started)
        return str(response.read().decode())


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in NORMALIZED_COUNTERS if k in after or k in before}


def kvbench_load(base_url: str, records: Path, documents: int, tokens: int, rounds: int = 2) -> dict[str, Any]:
    command = [
        sys.executable, "-c", "from kvbench_cli.main import main; main()", "load", "--endpoint", base_url,
        "--model", NAME, "--shape", "document_reuse", "--documents", str(documents), "--document-tokens",
        str(tokens), "--rounds", str(rounds), "--output-tokens", "4", "--users", "1", "--records", str(records),
        "--json", "--quiet",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"kvbench load failed: {done.stderr[-3000:]}")
    return dict(json.loads(done.stdout))


def by_round(records: Path, rounds: int) -> dict[str, Any]:
    """TTFT and cached tokens of each round (one user: requests in send order, each round an equal share)."""
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
    }


def gpu_count() -> int:
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return max(1, sum(1 for line in done.stdout.splitlines() if line.startswith("GPU ")))


async def one_stack(stack: str, model: str, out: Path, documents: int, tokens: int, tp: int = 1) -> dict[str, Any]:
    """``tp``: GPUs per engine (tensor parallel); a machine with more GPUs than that runs several engines, as the
    recipe lays them out, and the load goes to the first."""
    tier, sizing = STACKS[stack]
    engine = EngineSpec(version="0.25.1", tensor_parallel_size=tp, args=ENGINE_ARGS)
    gpus = gpu_count()
    if gpus < tp:
        raise RuntimeError(f"{stack} with tensor parallel size {tp} needs {tp} GPUs; this machine has {gpus}")
    machine = PoolMachine(name="gpu", host="127.0.0.1", gpus=gpus)
    ctx = RenderContext.for_pool(stack, model, engine, tier, Sizing(**sizing), NetworkSpec(), [machine], "round_robin")
    specs = render(ctx)["gpu"]
    launcher = ProcessLauncher("process", "gpu", "127.0.0.1", out / "state", health_timeout_s=420)
    if sizing.get("disk_tier_path"):
        await asyncio.to_thread(fresh_dir, Path(sizing["disk_tier_path"]))
    hint = CATALOG[stack].external_hits_tier("both")
    servers = [f"http://127.0.0.1:{s.metrics[0]}{s.metrics[1]}" for s in specs if s.role == "lmcache" and s.metrics]
    result: dict[str, Any] = {"stack": stack, "argv": [" ".join(s.argv) for s in specs]}
    passes = [("", 2), ("after_restart", 1)] if stack in RESTARTED else [("", 2)]
    for tag, rounds in passes:
        started = time.monotonic()
        deployment = await launcher.start_specs(f"live-{stack}{tag}", "live", stack, specs)
        part: dict[str, Any] = {"healthy_after_s": round(time.monotonic() - started, 1), "facts": deployment.facts}
        try:
            endpoint = deployment.endpoints[0]
            urls = [endpoint.metrics_url, *servers]
            before = [parse_samples(await asyncio.to_thread(metrics_text, url)) for url in urls]
            records = out / f"records-{stack}{tag}.jsonl"
            summary = await asyncio.to_thread(kvbench_load, endpoint.base_url, records, documents, tokens, rounds)
            texts = [await asyncio.to_thread(metrics_text, url) for url in urls]
            for index, text in enumerate(texts):
                (out / f"metrics-{stack}{tag}-{index}.txt").write_text(text)
            part["normalized_delta"] = [
                delta(normalize(b, external=hint), normalize(parse_samples(t), external=hint))
                for b, t in zip(before, texts, strict=True)
            ]
            part["rounds"] = by_round(records, rounds)
            part["load"] = {k: summary.get(k) for k in ("requests_total", "errors", "ttft_ms", "itl_ms", "timing",
                                                        "connections", "tokenizer", "wall_s")}  # fmt: skip
            if sizing.get("disk_tier_path"):
                part["disk_tier"] = await asyncio.to_thread(disk_usage, Path(sizing["disk_tier_path"]))
        finally:
            await launcher.stop(deployment)
            for process in deployment.processes:
                shutil.copy(process.log_path, out / f"engine-{stack}{tag}-{process.name}.log")
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="/tmp/model")  # noqa: S108 (where live.sh unpacks the stand-in model)
    parser.add_argument("--stacks", default=",".join(STACKS))
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per engine (needs that many)")
    # words: the stand-in tokenizer makes about 1.65 tokens of each, so ~8,000-token documents (gpu-vllm.md's size)
    parser.add_argument("--document-tokens", type=int, default=4850)
    args = parser.parse_args()
    out = Path(os.environ.get("OUT", "live-out"))
    out.mkdir(parents=True, exist_ok=True)
    for stack in args.stacks.split(","):
        try:
            result = asyncio.run(
                one_stack(stack, args.model, out, args.documents, args.document_tokens, args.tensor_parallel_size)
            )
        except Exception as exc:  # one stack failing leaves the others to run; the error is the result
            result = {"stack": stack, "error": f"{type(exc).__name__}: {exc}"[-4000:]}
        (out / f"live-{stack}.json").write_text(json.dumps(result, indent=2))
        brief = {k: result.get(k) for k in ("stack", "healthy_after_s", "rounds", "error")}
        sys.stdout.write(json.dumps(brief) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
