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
STACKS: dict[str, tuple[str, dict[str, Any]]] = {
    "vllm-prefix-off": ("gpu", {}),
    "vllm-prefix-gpu": ("gpu", {}),
    "vllm-native-cpu-offload": ("cpu_ram", {"host_memory_gb": 32}),
}
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


def kvbench_load(base_url: str, records: Path, documents: int, tokens: int) -> dict[str, Any]:
    command = [
        sys.executable, "-c", "from kvbench_cli.main import main; main()", "load", "--endpoint", base_url,
        "--model", NAME, "--shape", "document_reuse", "--documents", str(documents), "--document-tokens",
        str(tokens), "--rounds", "2", "--output-tokens", "4", "--users", "1", "--records", str(records), "--json",
        "--quiet",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"kvbench load failed: {done.stderr[-3000:]}")
    return dict(json.loads(done.stdout))


def by_round(records: Path) -> dict[str, Any]:
    """TTFT of each round (one user: requests in send order, the first half is round 1)."""
    rows = sorted((json.loads(line) for line in records.read_text().splitlines()), key=lambda r: r["start_s"])
    half = len(rows) // 2
    out: dict[str, Any] = {}
    for name, part in (("round1", rows[:half]), ("round2", rows[half:])):
        ttfts = sorted(r["ttft_s"] * 1e3 for r in part if r["ttft_s"] is not None)
        cached = [r["cached_tokens"] or 0 for r in part]
        out[name] = {
            "requests": len(part),
            "ttft_ms_median": ttfts[len(ttfts) // 2] if ttfts else None,
            "ttft_ms": [round(t, 1) for t in ttfts],
            "cached_tokens": sum(cached),
            "prompt_tokens": sum(r["prompt_tokens"] for r in part),
        }
    return out


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
    started = time.monotonic()
    result: dict[str, Any] = {"stack": stack, "argv": [" ".join(s.argv) for s in specs]}
    deployment = await launcher.start_specs(f"live-{stack}", "live", stack, specs)
    try:
        result["healthy_after_s"] = round(time.monotonic() - started, 1)
        result["facts"] = deployment.facts
        endpoint = deployment.endpoints[0]
        before = parse_samples(await asyncio.to_thread(metrics_text, endpoint.metrics_url))
        records = out / f"records-{stack}.jsonl"
        summary = await asyncio.to_thread(kvbench_load, endpoint.base_url, records, documents, tokens)
        raw_after = await asyncio.to_thread(metrics_text, endpoint.metrics_url)
        (out / f"metrics-{stack}.txt").write_text(raw_after)
        after = parse_samples(raw_after)
        hint = CATALOG[stack].external_hits_tier("both")
        result["normalized_delta"] = delta(normalize(before, external=hint), normalize(after, external=hint))
        result["rounds"] = by_round(records)
        result["load"] = {k: summary.get(k) for k in ("requests_total", "errors", "ttft_ms", "itl_ms", "timing",
                                                      "connections", "tokenizer", "wall_s")}  # fmt: skip
    finally:
        await launcher.stop(deployment)
        for process in deployment.processes:
            shutil.copy(process.log_path, out / f"engine-{stack}-{process.name}.log")
    result["total_s"] = round(time.monotonic() - started, 1)
    return result


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
