"""``kvbench sim run PLAN.yaml``: every workload, load level and repeat of a plan in batch mode, reported with
the report's own definitions (no services, no sleeping)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvbench_contracts.plan import Plan, Workload
from kvbench_core.analysis import DEFINITIONS, Slo, analyze_columns
from kvbench_core.stats import repeat_interval
from kvbench_sim.batch import Cluster, Simulation, SimulationStalledError
from kvbench_sim.engine import Engine
from kvbench_sim.stacks import layout_for
from kvbench_workloads.sources import build_source

__all__ = ["SimProgress", "measured_sources", "run_job", "run_plan"]


@dataclass(frozen=True)
class SimProgress:
    """Where ``run_plan`` is: the job it simulates, how far into it, and the whole plan's share done."""

    job: str  # "WORKLOAD: load L, repeat R/N"
    jobs_done: int
    jobs: int
    simulated_s: float  # virtual seconds of this job so far
    span_s: float | None  # the job's load duration (None: until its traffic ends)
    requests: int  # finished so far in this job
    wall_s: float  # since the plan started

    @property
    def done(self) -> float:
        """The plan's share done, 0..1: finished jobs, plus this job's share of its load duration."""
        inside = min(1.0, self.simulated_s / self.span_s) if self.span_s else 0.0
        return min(1.0, (self.jobs_done + inside) / max(1, self.jobs))

    def short(self) -> str:
        """For a progress bar beside it: the job and its virtual seconds."""
        span = f"/{self.span_s:,.0f}" if self.span_s else ""
        return f"{self.job} · {self.simulated_s:,.0f}{span} s"

    def line(self) -> str:
        span = f" of {self.span_s:,.0f}" if self.span_s else ""
        text = (
            f"{self.job} · {self.simulated_s:,.0f}{span} simulated s · {self.requests:,} requests · "
            f"job {self.jobs_done + 1} of {self.jobs} · {self.wall_s:,.0f} s wall"
        )
        done = self.done
        if 0.02 <= done < 1.0:  # the rate so far, once there is one to go by
            text += f", about {self.wall_s * (1 - done) / done:,.0f} s left"
        return text


Progress = Callable[[SimProgress], None]
SOURCE_NAMES = {"host": "host_tier", "disk": "disk_tier", "shared": "shared_store", "transferred": "transferred"}


def measured_sources(sim: Simulation, warmup_s: float, load_end_s: float) -> dict[str, int]:
    """Prompt tokens of the measured requests by where they came from (GPU hit, tiers, a prefill engine,
    recomputed): the engines' own per-request accounting, summed over the measured window."""
    out: dict[str, int] = {"gpu_hit": 0, "recomputed": 0}
    finished = sim.records
    measured = (finished.starts_s() >= warmup_s) & ~(finished.ends_s() > load_end_s)
    for source, tokens in finished.source_totals(measured).items():
        key = "gpu_hit" if source == "device" else SOURCE_NAMES.get(source, source)
        out[key] = out.get(key, 0) + tokens
    return out


def run_job(
    workload: Workload,
    load_level: float,
    repeat: int,
    *,
    cluster: Cluster | None = None,
    start_s: float = 0.0,
    progress: Callable[[float, int], None] | None = None,
    progress_every_s: float = 1.0,
    compiled: bool = True,
) -> tuple[dict[str, Any], Cluster, Simulation]:
    """One job in virtual time; returns its figures, and the cluster (to continue or restart it). ``progress`` and
    ``compiled``: see ``Simulation``."""
    if workload.cluster.sim is None:
        raise ValueError(f"workload {workload.name}: batch mode needs a simulated cluster (cluster.sim)")
    sim_cluster = workload.cluster.sim.model_dump()
    spec = workload.model_dump(mode="json")
    layout = layout_for(spec, sim_cluster)
    if cluster is None:
        cluster = Cluster(layout, sim_cluster["gpu"], workload.model, seed=repeat, routing=workload.measurement.routing)
    traffic = workload.traffic.model_dump(mode="json")
    arrivals = traffic["arrivals"]
    mode = arrivals["mode"]
    duration = workload.effective_load_duration_s()
    capacity = sum(e.pool.num_blocks * e.block_size for e in cluster.engines)
    source = build_source(
        traffic,
        users=max(1, int(load_level)) if mode == "closed_loop" else 1,
        seed=repeat,
        working_set_ratio=workload.measurement.working_set_ratio,
        capacity_tokens=capacity,
        horizon_s=duration if duration > 0 else math.inf,
    )
    sim = Simulation(
        cluster,
        source,
        mode=mode,
        load_level=load_level,
        duration_s=duration,
        seed=repeat,
        honor_gaps=arrivals.get("gaps", "recorded") != "none",
        distribution=arrivals.get("distribution", "poisson"),
        burstiness=float(arrivals.get("burstiness", 1.0)),
        max_concurrency=arrivals.get("max_concurrency"),
        job_id=f"{workload.name}-{load_level:g}-{repeat}",
        workload=workload.name,
        start_s=start_s,
        progress=progress,
        progress_every_s=progress_every_s,
        compiled=compiled,
    )
    cross_before, servers_before = _cross_hits(cluster.all_engines), cluster.cache_servers()
    try:
        finished = sim.run()
    except SimulationStalledError as exc:
        raise SimulationStalledError(f"workload {workload.name}, load {load_level:g}: {exc}") from None
    warmup = workload.effective_warmup_s()
    load_end = duration if duration > 0 else float(finished.ends_s().max(initial=0.0))
    if sim.measure_span:
        warmup, load_end = sim.measure_span
    slo = workload.measurement.slo
    figures = analyze_columns(finished.columns(), warmup, load_end, Slo(slo.ttft_ms, slo.tpot_ms, slo.e2e_ms))
    engines = [*cluster.engines, *cluster.prefill]
    # the earliest sent (argmin: the first on a tie)
    first = int(np.argmin(finished.starts_s())) if len(finished) else None
    first_ttft = finished.ttft_s(first) if first is not None else None
    figures.update(
        {
            "load_level": load_level,
            "repeat": repeat,
            # measured or not: after a (re)start, what the cold engine made the first user wait
            "first_request_ttft_ms": first_ttft * 1e3 if first_ttft is not None else None,
            "warmup_s": warmup,
            "load_end_s": load_end,
            "virtual_end_s": sim.now,
            "prompt_token_sources": measured_sources(sim, warmup, load_end),
            "transfers_bytes": {
                **{
                    f"{tier}_load": sum(e.counters.tier_load_bytes.get(tier, 0.0) for e in engines)
                    for tier in ("host", "disk", "shared")
                },
                **{
                    f"{tier}_store": sum(e.counters.tier_store_bytes.get(tier, 0.0) for e in engines)
                    for tier in ("host", "disk", "shared")
                },
                "pd": cluster.pd_link.bytes_moved,
            },
            # shared LMCache servers: tokens one instance computed and another reused, and each server's load
            "cross_instance_tokens": _minus(_cross_hits(engines), cross_before),
            "cache_servers": _servers(servers_before, cluster.cache_servers(), sim.now - start_s),
            "notes": source.notes,
        }
    )
    return figures, cluster, sim


def _teller(
    progress: Progress, started: float, job: str, jobs_done: int, jobs: int, span_s: float | None
) -> Callable[[float, int], None]:
    """What a job's simulation calls with its virtual seconds and finished requests: ``progress`` told in full."""

    def tell(simulated_s: float, requests: int) -> None:
        progress(SimProgress(job, jobs_done, jobs, simulated_s, span_s, requests, time.monotonic() - started))

    return tell


def _cross_hits(engines: list[Engine]) -> dict[str, int]:
    out: dict[str, int] = {}
    for engine in engines:
        for pair, tokens in engine.counters.cross_hits.items():
            out[pair] = out.get(pair, 0) + tokens
    return dict(sorted(out.items()))


def _minus(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def _servers(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], span_s: float
) -> list[dict[str, Any]]:
    """This job's share of each shared server's traffic, and how busy its link was over the job."""
    rows = []
    for store, row in after.items():
        earlier = before.get(store, {})
        moved = row["link_bytes"] - earlier.get("link_bytes", 0.0)
        rows.append({
            "server": store,
            "engines": row["engines"],
            "bytes_moved": row["bytes_moved"] - earlier.get("bytes_moved", 0.0),
            "busy_share": moved / (row["link_bytes_per_s"] * span_s) if span_s > 0 else 0.0,
        })  # fmt: skip
    return rows


def _summary(values: list[float | None]) -> dict[str, Any]:
    return repeat_interval(values)


def run_plan(plan: Plan, progress: Progress | None = None, progress_every_s: float = 1.0) -> dict[str, Any]:
    """Every workload on its own simulated cluster; its jobs one after another on that cluster, as the planner
    runs them: before every job but the first, ``cache_state: empty`` restarts the stack (``restart_stack``) and
    ``warm`` keeps every cache. ``progress``: told as each job starts, then every ``progress_every_s`` of wall time
    while it runs."""
    workloads = []
    started = time.monotonic()
    jobs_total = sum(len(w.traffic.arrivals.load_levels()) * w.measurement.repeats for w in plan.workloads)
    jobs_done = 0
    for workload in plan.workloads:
        points: list[dict[str, Any]] = []
        cluster: Cluster | None = None
        end_s = 0.0
        index = 0  # the job's place in the workload's run (Workload.cache_start)
        for level in workload.traffic.arrivals.load_levels():
            jobs: list[dict[str, Any]] = []
            for repeat in range(workload.measurement.repeats):
                name = f"{workload.name}: load {level:g}, repeat {repeat + 1}/{workload.measurement.repeats}"
                span = workload.effective_load_duration_s() or None
                tell = _teller(progress, started, name, jobs_done, jobs_total, span) if progress else None
                if tell is not None:
                    tell(0.0, 0)
                state, start_s = workload.cache_start(index), end_s
                index += 1
                if state == "restarted" and cluster is not None:
                    start_s = cluster.restart_stack(end_s)
                figures, cluster, sim = run_job(
                    workload, level, repeat, cluster=cluster, start_s=start_s,
                    progress=tell, progress_every_s=progress_every_s,
                )  # fmt: skip
                figures["cache_state"] = state
                end_s = sim.now
                jobs_done += 1
                jobs.append(figures)
            points.append(
                {
                    "load_level": level,
                    "jobs": jobs,
                    "across_repeats": {
                        "ttft_p50_ms": _summary([j["ttft_ms"]["p50"] for j in jobs]),
                        "ttft_p99_ms": _summary([j["ttft_ms"]["p99"] for j in jobs]),
                        "tpot_p50_ms": _summary([j["tpot_ms"]["p50"] for j in jobs]),
                        "output_tokens_per_s": _summary([j["output_tokens_per_s"] for j in jobs]),
                    },
                }
            )
        workloads.append(
            {
                "name": workload.name,
                "stack": workload.stack,
                "strategy": workload.strategy,
                "model": workload.model,
                "test_points": points,
            }
        )
    return {
        "plan_name": plan.name,
        "mode": "simulated, batch (virtual time)",
        "definitions": DEFINITIONS,
        "workloads": workloads,
    }
