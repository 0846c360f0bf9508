"""A run's report: the five questions, computed from PostgreSQL with the definitions of DESIGN.md 6."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from kvbench_contracts.envelope import utc_now
from kvbench_contracts.records import RequestRecord
from kvbench_core.analysis import DEFINITIONS, Slo, figures, select_measured
from kvbench_reporter.store import Store

__all__ = ["ENGINE_COUNTERS", "build_report", "counter_deltas", "records_complete"]

SHORT_WINDOW_S = 300.0
ERROR_BUDGET = 0.05

# normalised name -> engine series (vLLM names; summed over engines)
ENGINE_COUNTERS = {
    "prompt_tokens": "vllm:prompt_tokens_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "gpu_hit_tokens": "vllm:prefix_cache_hits_total",
}


def _series(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def counter_deltas(samples: list[asyncpg.Record], start: datetime, end: datetime) -> dict[str, Any]:
    """Counters differenced over [start, end] per engine, then summed (never cumulative ratios)."""
    by_engine: dict[str, list[tuple[datetime, dict[str, float]]]] = defaultdict(list)
    for row in samples:
        raw = row["samples"]
        by_engine[row["engine_id"]].append((row["sampled_at"], json.loads(raw) if isinstance(raw, str) else raw))
    totals = dict.fromkeys(ENGINE_COUNTERS, 0.0)
    engines = 0
    for series in by_engine.values():
        before = [s for t, s in series if t <= start] or [series[0][1]]
        after = [s for t, s in series if t <= end] or [series[-1][1]]
        first, last = before[-1], after[-1]
        engines += 1
        for key, name in ENGINE_COUNTERS.items():
            totals[key] += max(0.0, _series(last, name) - _series(first, name))
    totals["recomputed_tokens"] = max(0.0, totals["prompt_tokens"] - totals["gpu_hit_tokens"])
    return {"engines": engines, **totals}


async def records_complete(store: Store, run_id: str) -> bool:
    counts = await store.record_counts(run_id)
    for job in await store.jobs(run_id):
        expected = job["records_expected"]
        if expected is not None and counts.get(job["job_id"], 0) < expected:
            return False
    return True


def _slo(spec: dict[str, Any]) -> Slo:
    slo = (spec.get("measurement") or {}).get("slo") or {}
    return Slo(ttft_ms=slo.get("ttft_ms"), tpot_ms=slo.get("tpot_ms"), e2e_ms=slo.get("e2e_ms"))


def _validity(spec: dict[str, Any], jobs: list[dict[str, Any]], pooled: dict[str, Any]) -> dict[str, Any]:
    reasons: list[str] = []
    verdict = "valid"
    failed = [j for j in jobs if j["status"] != "succeeded"]
    if failed:
        verdict = "invalid"
        reasons.append(
            f"{len(failed)} of {len(jobs)} jobs did not succeed: "
            + "; ".join(f"{j['job_id']}: {j.get('reason') or j['status']}" for j in failed)
        )
    if pooled["requests_measured"] == 0:
        verdict = "invalid"
        reasons.append("no request was measured (none started after the warm-up and ended before the load end)")
    attempts = pooled["requests_measured"] + pooled["errors"]
    if attempts and pooled["errors"] / attempts > ERROR_BUDGET:
        verdict = "invalid"
        reasons.append(f"errors {pooled['errors']} of {attempts} exceed the {ERROR_BUDGET:.0%} error budget")
    repeats = int((spec.get("measurement") or {}).get("repeats", 3))
    if verdict == "valid" and repeats < 3:
        verdict = "preliminary"
        reasons.append(f"{repeats} repeat(s): fewer than 3, so no confidence interval")
    windows = [j["window_s"] for j in jobs if j.get("window_s") is not None]
    if windows and min(windows) < SHORT_WINDOW_S:
        if verdict == "valid":
            verdict = "preliminary"
        reasons.append(f"measured window {min(windows):g} s is under {SHORT_WINDOW_S:g} s")
    return {"verdict": verdict, "reasons": reasons}


async def build_report(store: Store, run_id: str) -> dict[str, Any] | None:
    run = await store.run(run_id)
    if run is None:
        return None
    specs = {w["name"]: json.loads(w["spec"]) for w in await store.workloads(run_id)}
    stacks = {w["name"]: (w["stack"], w["strategy"]) for w in await store.workloads(run_id)}
    counts = await store.record_counts(run_id)
    per_workload: dict[str, list[dict[str, Any]]] = defaultdict(list)
    pooled_records: dict[str, list[RequestRecord]] = defaultdict(list)
    pooled_errors: dict[str, int] = defaultdict(int)
    pooled_window: dict[str, float] = defaultdict(float)
    engine_totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for job in await store.jobs(run_id):
        name = job["workload"]
        spec = specs.get(name, {})
        entry: dict[str, Any] = {
            "job_id": job["job_id"],
            "load_level": job["load_level"],
            "repeat": job["repeat"],
            "status": job["status"],
            "reason": job["reason"],
            "requests": counts.get(job["job_id"], 0),
            "tokenizer": job["tokenizer"],
        }
        if job["status"] == "succeeded" and job["load_duration_s"] is not None:
            warmup, load_end = float(job["warmup_s"]), float(job["load_duration_s"])
            records = await store.records(job["job_id"])
            measured, errors = select_measured(records, warmup, load_end)
            entry.update(figures(measured, errors, load_end - warmup, _slo(spec)))
            pooled_records[name].extend(measured)
            pooled_errors[name] += errors
            pooled_window[name] += load_end - warmup
            if job["started_at"] is not None:
                start = job["started_at"] + timedelta(seconds=warmup)
                end = job["started_at"] + timedelta(seconds=load_end)
                samples = await store.engine_samples(run_id, start - timedelta(seconds=10), end + timedelta(seconds=10))
                deltas = counter_deltas(samples, start, end) if samples else None
                entry["engine_counters"] = deltas
                if deltas:
                    for key, value in deltas.items():
                        engine_totals[name][key] += float(value)
        per_workload[name].append(entry)

    workloads_out: list[dict[str, Any]] = []
    for name, jobs in per_workload.items():
        spec = specs.get(name, {})
        pooled = figures(pooled_records[name], pooled_errors[name], pooled_window[name], _slo(spec))
        prompt = pooled["prompt_tokens"]
        stack, strategy = stacks.get(name, ("", ""))
        engine = dict(engine_totals[name]) if name in engine_totals else None
        workloads_out.append(
            {
                "name": name,
                "stack": stack,
                "strategy": strategy,
                "requests": sum(j["requests"] for j in jobs),
                "requests_measured": pooled["requests_measured"],
                "errors": pooled["errors"],
                "window_s": pooled["window_s"],
                "ttft_ms": pooled["ttft_ms"],
                "tpot_ms": pooled["tpot_ms"],
                "itl_ms": pooled["itl_ms"],
                "icl_ms": pooled["icl_ms"],
                "e2e_ms": pooled["e2e_ms"],
                "output_tokens_per_s": pooled["output_tokens_per_s"],
                "request_rate": pooled["request_rate"],
                "goodput_rps": pooled["goodput_rps"],
                "good_fraction": pooled["good_fraction"],
                "prompt_tokens": prompt,
                "cached_prompt_tokens": pooled["cached_tokens"],
                "cache_hit_ratio": pooled["cached_tokens"] / prompt if prompt else None,
                "prompt_token_sources": {
                    "gpu_hit": pooled["cached_tokens"],
                    "recomputed": prompt - pooled["cached_tokens"],
                    "source": "per-request usage.prompt_tokens_details.cached_tokens of measured requests",
                },
                "engine_counters": engine,
                "validity": _validity(spec, jobs, pooled),
                "jobs": jobs,
            }
        )
    events = [
        {
            "at": e["occurred_at"].isoformat(),
            "schema": e["schema"],
            "node_id": e["node_id"],
            "job_id": e["job_id"],
            "subject": e["subject"],
        }
        for e in await store.events(run_id)
    ]
    return {
        "run_id": run_id,
        "plan_name": run["plan_name"],
        "status": run["status"],
        "reasons": json.loads(run["reasons"]) if isinstance(run["reasons"], str) else run["reasons"],
        "submitted_at": run["submitted_at"].isoformat(),
        "finished_at": run["finished_at"].isoformat() if run["finished_at"] else None,
        "generated_at": utc_now().isoformat(),
        "definitions": {
            **DEFINITIONS,
            "workload_figures": "pool the measured requests of all the workload's jobs; throughput and rates use "
            "the sum of the jobs' windows",
            "requests": "every request sent by the workload's jobs (rows in request_records)",
            "engine_counters": "engine /metrics counters differenced over each job's measured window per engine "
            "and summed (samples every few seconds, so window edges are approximate)",
        },
        "workloads": workloads_out,
        "events": events,
    }
