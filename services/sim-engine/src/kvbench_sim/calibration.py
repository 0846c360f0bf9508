"""The simulator held against live runs on a real GPU (data/live): each measured case replayed in batch mode on
the simulated engine kvbench's simulated cluster starts for that stack, with the live run's cache sizes and
traffic, and the same figure taken (a round's median TTFT, or the median inter-token gap).

A case is either *fitted* (the GPU profile's efficiencies were chosen to match it: benchmarks/bench_calibration.py
fits them) or *held out* (never looked at by the fit: the figure that says how far the simulator can be trusted).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench_sim.batch import Cluster, Simulation
from kvbench_sim.stacks import layout_for
from kvbench_stacks import hardware
from kvbench_stacks.hardware import GpuSimulation
from kvbench_workloads.sources import build_source

__all__ = ["Case", "gpu_simulation", "live_cases", "simulate"]

MODEL = "Qwen/Qwen3-8B"  # the live runs' stand-in model has Qwen3-8B's shapes (random weights)
QUESTION_TOKENS = 16
# the first live run's fixed GPU KV cache (--kv-cache-memory-bytes 4 GiB)
SMALL_CACHE = 4 * 2**30
PAGE_CACHE = "the files were still in the page cache: read from memory, not the disk"
DROPPED = "page cache dropped before the restart: read from the disk"
WRITING = "the disk tier still writing round 1's records; those written read back from the page cache"


@dataclass(frozen=True)
class Case:
    """One measured figure of a live run, and how to replay it."""

    name: str
    family: str  # cold | gpu_hit | decode | host | disk | mixed
    stack: str
    measured_ms: float
    documents: int
    document_tokens: int
    rounds: int = 2
    output_tokens: int = 4
    users: int = 1
    round_no: int | None = 1  # the round whose median TTFT is the figure; None: the median inter-token gap
    tier: str = "gpu"
    sizing: dict[str, Any] = field(default_factory=dict)
    kv_cache_bytes: int | None = SMALL_CACHE
    after_restart: bool = False  # measured on a restarted stack, after a first pass of ``rounds`` rounds
    page_cache_dropped: bool = False  # before the restart (the disk tier then reads from the disk)
    fitted: bool = False
    note: str = ""

    @property
    def figure(self) -> str:
        return "ITL p50" if self.round_no is None else f"TTFT p50 r{self.round_no}"


def _per_document(rounds: dict[str, Any]) -> tuple[int, int]:
    first = rounds["round1"]
    documents = int(first["requests"])
    return documents, round(first["prompt_tokens"] / documents) - QUESTION_TOKENS


def live_cases(root: Path) -> list[Case]:
    """Every case of the live runs under ``root`` (data/live), fitted ones marked."""
    cases: list[Case] = []
    first = root / "2026-12-01-h200-vllm-0.25.1"
    tiers = {"vllm-native-cpu-offload": ("cpu_ram", {"host_memory_gb": 32}),
             "vllm-lmcache-mp": ("nvme", {"host_memory_gb": 20, "disk_tier_gb": 40})}  # fmt: skip
    for stack in ("vllm-prefix-off", "vllm-prefix-gpu", "vllm-native-cpu-offload", "vllm-lmcache-mp"):
        live = json.loads((first / f"live-{stack}.json").read_text())
        documents, tokens = _per_document(live["rounds"])
        tier, sizing = tiers.get(stack, ("gpu", {}))
        for round_no in (1, 2):
            reused = round_no == 2 and stack in tiers
            family = ("host" if stack == "vllm-native-cpu-offload" else "host_lmcache") if reused else "cold"
            cases.append(Case(f"12-01 {stack}", family, stack, live["rounds"][f"round{round_no}"]["ttft_ms_median"],
                              documents, tokens, round_no=round_no, tier=tier, sizing=sizing,
                              fitted=reused and stack == "vllm-native-cpu-offload"))  # fmt: skip
        if "after_restart" in live:
            cases.append(Case(f"12-01 {stack} restarted", "disk_page_cache", stack,
                              live["after_restart"]["rounds"]["round1"]["ttft_ms_median"], documents, tokens,
                              tier=tier, sizing=sizing, after_restart=True, fitted=True,
                              note=PAGE_CACHE))  # fmt: skip

    second = root / "2026-12-02-h200-vllm-0.25.1"
    gpu = json.loads((second / "live-calibration-gpu.json").read_text())
    # the calibration suite ran twice on one machine; of the first call only its printed medians came back
    earlier: dict[tuple[str, str], dict[str, Any]] = {}
    for line in (second / "run-calibration-first-call.txt").read_text().splitlines():
        row = json.loads(line)
        if "load" in row:
            earlier[row["run"], row["load"]] = row

    def both(run: str, load: str, value: float, round_no: int | None) -> float:
        """The mean of the two calls' medians (three requests a round: one call alone is noisy)."""
        row = earlier.get((run, load))
        if row is None:
            return value
        other = row["itl_ms_p50"] if round_no is None else row["rounds"][f"round{round_no}"][0]
        return (value + float(other)) / 2

    # fitted: cold at 2,000 and 8,000 tokens, GPU hits at 2,000 and 12,000; the first load after the engine
    # started (1,000 tokens) also pays the engine's warm-up
    fits = {(1200, 1), (4850, 1), (1200, 2), (7300, 2)}
    for words in (600, 1200, 2400, 4850, 7300):
        load = gpu[f"prefill-{words}w"]
        documents, tokens = _per_document(load["rounds"])
        for round_no, family in ((1, "cold"), (2, "gpu_hit")):
            note = "the engine's first requests since it started" if words == 600 and round_no == 1 else ""
            median = load["rounds"][f"round{round_no}"]["ttft_ms_median"]
            measured = both("calibration-gpu", f"prefill-{words}w", median, round_no)
            cases.append(Case(f"12-02 prefill {tokens:,} tokens", family, "vllm-prefix-gpu", measured, documents,
                              tokens, round_no=round_no, kv_cache_bytes=None, fitted=(words, round_no) in fits,
                              note=note))  # fmt: skip
    for users, fitted in ((1, True), (8, False), (32, False), (128, True)):
        load = gpu[f"decode-{users}"]
        documents, tokens = _per_document(load["rounds"])
        measured = both("calibration-gpu", f"decode-{users}", load["summary"]["itl_ms"]["p50"], None)
        cases.append(Case(f"12-02 decode batch {users}", "decode", "vllm-prefix-gpu", measured, documents, tokens,
                          rounds=1, output_tokens=256,
                          users=users, round_no=None, kv_cache_bytes=None, fitted=fitted))  # fmt: skip
    offload = json.loads((second / "live-calibration-cpu-offload.json").read_text())["offload-1200w"]
    documents, tokens = _per_document(offload["rounds"])
    for round_no, family in ((1, "cold"), (2, "host")):
        measured = both(
            "calibration-cpu-offload",
            "offload-1200w",
            offload["rounds"][f"round{round_no}"]["ttft_ms_median"],
            round_no,
        )
        cases.append(Case("12-02 cpu offload 2,000 tokens", family, "vllm-native-cpu-offload", measured, documents,
                          tokens,
                          round_no=round_no, tier="cpu_ram", sizing={"host_memory_gb": 32}))  # fmt: skip

    study_cache = 24 * 2**30
    alone = json.loads((second / "live-study-vllm-only.json").read_text())["study"]
    documents, tokens = _per_document(alone["rounds"])
    for round_no in (1, 2):
        cases.append(Case("12-02 study, vLLM alone", "cold", "vllm-prefix-gpu",
                          alone["rounds"][f"round{round_no}"]["ttft_ms_median"], documents, tokens,
                          round_no=round_no, kv_cache_bytes=study_cache))  # fmt: skip
    lmcache = json.loads((second / "live-study-lmcache.json").read_text())
    sizing = {"host_memory_gb": 9, "disk_tier_gb": 40}
    for round_no, family in ((1, "cold"), (2, "mixed")):
        cases.append(Case("12-02 study, LMCache", family, "vllm-lmcache-mp",
                          lmcache["study"]["rounds"][f"round{round_no}"]["ttft_ms_median"], documents, tokens,
                          round_no=round_no, tier="nvme", sizing=sizing, kv_cache_bytes=study_cache,
                          note=WRITING if round_no == 2 else ""))  # fmt: skip
    cases.append(Case("12-02 study, LMCache restarted", "disk", "vllm-lmcache-mp",
                      lmcache["after_restart"]["after_restart"]["rounds"]["round1"]["ttft_ms_median"], documents,
                      tokens, tier="nvme", sizing=sizing, kv_cache_bytes=study_cache, after_restart=True, fitted=True,
                      page_cache_dropped=True, note=DROPPED))  # fmt: skip
    return cases


@contextmanager
def gpu_simulation(gpu: str, simulation: GpuSimulation) -> Iterator[None]:
    """Simulate ``gpu`` with another profile for a while (the fit tries candidates through it)."""
    known = hardware.GPUS[gpu]
    hardware.GPUS[gpu] = known.model_copy(update={"sim": simulation})
    try:
        yield
    finally:
        hardware.GPUS[gpu] = known


def _traffic(case: Case, rounds: int) -> dict[str, Any]:
    documents = {"count": case.documents, "tokens": case.document_tokens, "question_tokens": QUESTION_TOKENS,
                 "output_tokens": case.output_tokens, "rounds": rounds, "order": "tile",
                 "measure_rounds": list(range(1, rounds + 1))}  # fmt: skip
    return {"shape": "document_reuse", "documents": documents, "arrivals": {"mode": "closed_loop"}}


def _pass(cluster: Cluster, case: Case, rounds: int, start_s: float) -> Simulation:
    source = build_source(_traffic(case, rounds), users=case.users, seed=0)
    sim = Simulation(cluster, source, mode="closed_loop", load_level=case.users, duration_s=0, start_s=start_s)
    sim.run()
    return sim


def simulate(case: Case, gpu: str = "H200", disk_gbps: float = 6.0) -> float:
    """The case's figure on the simulated engine, in ms."""
    args = {"kv-cache-memory-bytes": case.kv_cache_bytes} if case.kv_cache_bytes else {}
    workload = {"stack": case.stack, "model": MODEL, "kv_tier": case.tier, "sizing": case.sizing,
                "engine": {"name": "vllm", "args": args}}  # fmt: skip
    machine = {"machines": 1, "gpu": gpu, "gpus_per_machine": 1, "host_memory_gb": 128, "disk_gbps": disk_gbps}
    cluster = Cluster(layout_for(workload, machine), gpu, MODEL)
    sim = _pass(cluster, case, case.rounds, 0.0)
    rounds = case.rounds
    if case.after_restart:
        restarted_s = cluster.restart_stack(sim.now)
        if case.page_cache_dropped:
            for tier in {id(t): t for e in cluster.all_engines for t in e.tiers}.values():
                tier.drop_page_cache()
        sim = _pass(cluster, case, 1, restarted_s)
        rounds = 1
    records = sorted(sim.records, key=lambda r: r.start_s)
    if case.round_no is None:
        gaps = [b - a for r in records for a, b in zip(r.chunk_times_s, r.chunk_times_s[1:], strict=False)]
        return statistics.median(gaps) * 1e3
    size = len(records) // rounds
    chosen = records[(case.round_no - 1) * size : case.round_no * size]
    ttfts = sorted(r.ttft_s for r in chosen if r.ttft_s is not None)
    return ttfts[len(ttfts) // 2] * 1e3  # the upper median, as the live runs' summaries take it
