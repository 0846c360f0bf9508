"""A run's report: the five questions, computed from PostgreSQL with the definitions of DESIGN.md 6.

Did it work? (validity with reasons) · How fast? (per job, per test point with repeat intervals, TTFT by
concurrency) · Did distributed KV help? (prompt-token sources from engine counters, cross-checked with the
requests' cached_tokens; hit ratio over time; KV bytes moved) · What limited performance? (tier transfer rates,
break-even bandwidth, GPU power, capacity and cost) · What happened underneath? (events, samples, errors).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

import asyncpg
import numpy as np

from kvbench_contracts.engine import NORMALIZED_COUNTERS, PROMPT_TOKEN_SOURCES
from kvbench_contracts.envelope import utc_now
from kvbench_contracts.events import ClientTiming, EnginesRestarted, JobFinished, StackReady
from kvbench_core.analysis import DEFINITIONS, Slo, distributions, figures, select_measured
from kvbench_core.columns import Columns
from kvbench_core.compare import COMPARE_DEFINITION, choose_baseline, compare_to_baseline
from kvbench_core.stats import coefficient_of_variation, drift, repeat_interval, slice_figures
from kvbench_core.timing import (
    TIMING_DEFINITION,
    engine_late_share,
    engine_slip_p99_ms,
    timing_verdict,
    worst_client_timing,
)
from kvbench_reporter.acceptance import acceptance
from kvbench_reporter.accuracy import accuracy_gate
from kvbench_reporter.fabric import fabric_section
from kvbench_reporter.store import Store
from kvbench_reporter.tested import tested_summary
from kvbench_stacks.hardware import find_model

__all__ = ["COUNTERS", "build_report", "counter_deltas", "disk_tier_census", "records_complete"]

SHORT_WINDOW_S = 300.0
ERROR_BUDGET = 0.05
UNSTABLE_CV = 0.30
NO_PRICE_NOTE = (
    "no price table: set KVBENCH_REPORTER_PRICE_PER_GPU_HOUR on the reporter to USD per GPU-hour by GPU model, as "
    'JSON, e.g. \'{"L40S": 1.0, "H100": 2.5}\''
)
REPLAY_LAG_S = 0.5  # a trace replay later than this at p99 no longer has the trace's arrival pattern
COUNTERS = NORMALIZED_COUNTERS
SOURCES = PROMPT_TOKEN_SOURCES


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def window_steps(
    series: list[tuple[datetime, Any]], start: datetime, end: datetime, close_by: datetime | None, from_zero: bool
) -> list[Any]:
    """The samples of one engine's time-sorted ``series`` that span [start, end], to difference pairwise: the last
    sample at or before ``start`` (none: with ``from_zero`` the engine started inside the window and counts from
    zero, else its first sample is the baseline, as for an engine kvbench did not start), those inside,
    and the window's closing scrape, the first one after ``end`` and no later than ``close_by`` (the next job's
    start), which holds what the load's last seconds added (scrapes come every few seconds and a short phase, such
    as an acceptance test's, may fit between two). An engine id names a restarted engine too (an acceptance test's
    engines restarted alone, a stack restarted), so a count that falls is a new process counting from zero."""
    return [value for _, value in window_samples(series, start, end, close_by, from_zero)]


def window_samples(
    series: list[tuple[datetime, Any]], start: datetime, end: datetime, close_by: datetime | None, from_zero: bool
) -> list[tuple[datetime, Any]]:
    """``window_steps`` with each sample's time (a baseline from zero is dated ``start``)."""
    before = [(t, value) for t, value in series if t <= start]
    inside = [(t, value) for t, value in series if start < t <= end]
    closing = [(t, value) for t, value in series if end < t <= close_by][:1] if close_by is not None else []
    baseline = before[-1:] or ([(start, {})] if from_zero else [])
    return [*baseline, *inside, *closing]


def counted_span(
    times: list[datetime], counted: list[datetime], start: datetime, end: datetime
) -> dict[str, float] | None:
    """How much of [start, end] one engine's differenced samples (``counted``, from ``window_samples``) span, against
    its scrape cadence (the median gap of its ``times``). None for an engine that did not live through the window
    (another stack's, fetched with the margin). ``short``: the span falls short of the window by more than a scrape
    interval (the most that the window's edges between scrapes account for) and by more than a tenth of the window:
    the agent scraped late or stopped, and what the engine did in the gap is not counted."""
    if not times or not (any(start < t <= end for t in times) or (times[0] <= start and times[-1] > end)):
        return None
    # an engine that lived through the window has a sample inside it or a baseline before it: ``counted`` is not empty
    cadence = statistics.median_high([(b - a).total_seconds() for a, b in pairwise(times)] or [0.0])
    window = (end - start).total_seconds()
    span = (counted[-1] - counted[0]).total_seconds()
    return {
        "window_s": window,
        "counted_s": span,
        "from_s": (counted[0] - start).total_seconds(),
        "to_s": (counted[-1] - start).total_seconds(),
        "scrape_interval_s": cadence,
        "short": window - span > max(cadence, 0.1 * window),
    }


def _increase(steps: list[Any], key: str) -> float:
    """Prometheus's increase() over ``steps``: a count that falls is a new process's, counted from zero."""
    delta = 0.0
    for previous, current in pairwise(steps):
        now, was = float(current.get(key, 0.0)), float(previous.get(key, 0.0))
        delta += now - was if now >= was else now
    return delta


def _edge_reads(
    rows: list[asyncpg.Record], job_id: str | None, edges: tuple[str, str] = ("start", "end")
) -> dict[str, dict[str, asyncpg.Record]]:
    """Per engine, its reads on command at ``job_id``'s ``edges`` (its measured window's, or the job's own): the first
    at the opening edge, the last at the closing one (several load generator shards each say the window's edges)."""
    out: dict[str, dict[str, asyncpg.Record]] = defaultdict(dict)
    if job_id is None:
        return out
    opening, closing = edges
    for row in sorted(rows, key=lambda r: r["sampled_at"]):
        edge = row.get("edge")
        if row.get("job_id") != job_id or edge not in edges:
            continue
        if edge == opening:
            out[row["engine_id"]].setdefault("start", row)
        elif edge == closing:
            out[row["engine_id"]]["end"] = row
    return out


def _edge_span(start_row: asyncpg.Record, end_row: asyncpg.Record, start: datetime, end: datetime) -> dict[str, Any]:
    """How an engine's edge reads sit against the window: each read's distance from the window's edge as the report
    dates it, and from the moment the load generator said the edge (the read's own lateness)."""

    def late(row: asyncpg.Record) -> float | None:
        return (row["sampled_at"] - row["edge_at"]).total_seconds() if row.get("edge_at") is not None else None

    return {
        "window_s": (end - start).total_seconds(),
        "counted_s": (end_row["sampled_at"] - start_row["sampled_at"]).total_seconds(),
        "from_s": (start_row["sampled_at"] - start).total_seconds(),
        "to_s": (end_row["sampled_at"] - end).total_seconds(),
        "start_read_late_s": late(start_row),
        "end_read_late_s": late(end_row),
        "short": False,
    }


def counter_deltas(
    samples: list[asyncpg.Record],
    start: datetime,
    end: datetime,
    close_by: datetime | None = None,
    job_id: str | None = None,
    edges: tuple[str, str] = ("start", "end"),
) -> dict[str, Any]:
    """Normalized counters differenced over [start, end] per engine, then summed (never cumulative ratios). An engine
    read on command at both edges of ``job_id``'s window is differenced from its start read to its end read (with the
    periodic scrapes between, for a restart's reset); any other over the periodic scrapes around the window
    (``window_steps``). ``edge_reads``: each engine's reads and how far they were from the edges; ``short_coverage``:
    the engines whose samples span too little of the window (``counted_span``), so that their counts are low."""
    by_engine: dict[str, list[tuple[datetime, dict[str, float], list[dict[str, float]]]]] = defaultdict(list)
    role_of: dict[str, str] = {}
    reads = _edge_reads(samples, job_id, edges)
    edge_spans: list[dict[str, Any]] = []
    for row in samples:
        by_engine[row["engine_id"]].append((row["sampled_at"], _json(row["normalized"]) or {}, _json(row["gpus"])))
        role_of[row["engine_id"]] = row.get("role") or "both"
    totals = dict.fromkeys(COUNTERS, 0.0)
    by_role: dict[str, dict[str, float]] = {}
    kv_usage_max = 0.0
    power: list[float] = []
    util: list[float] = []
    short: list[dict[str, Any]] = []
    living: list[str] = []
    for engine_id, series in by_engine.items():
        series.sort(key=lambda item: item[0])
        read = reads.get(engine_id, {})
        span: dict[str, Any] | None
        if "start" in read and "end" in read and read["start"]["sampled_at"] < read["end"]["sampled_at"]:
            first, last = read["start"]["sampled_at"], read["end"]["sampled_at"]
            steps = [s for t, s, _ in series if first <= t <= last]
            span = _edge_span(read["start"], read["end"], start, end)
            edge_spans.append({"engine_id": engine_id, "role": role_of[engine_id], **span})
        else:
            counted = window_samples([(t, s) for t, s, _ in series], start, end, close_by, from_zero=False)
            steps = [s for _, s in counted]
            span = counted_span([t for t, _, _ in series], [t for t, _ in counted], start, end)
        if span is None:  # another stack's engine, sampled within the margin: none of its counts, nor its role
            continue
        living.append(engine_id)
        if span["short"]:
            short.append({"engine_id": engine_id, "role": role_of[engine_id], **span})
        role = by_role.setdefault(role_of[engine_id], dict.fromkeys(COUNTERS, 0.0))
        for key in COUNTERS:
            delta = _increase(steps, key)
            totals[key] += delta
            role[key] += delta
        for t, s, gpus in series:
            if start <= t <= end:
                kv_usage_max = max(kv_usage_max, float(s.get("kv_usage", 0.0)))
                power += [g["power_w"] for g in gpus if "power_w" in g]
                util += [g["utilization_pct"] for g in gpus if "utilization_pct" in g]
    return {
        "engines": sum(1 for engine_id in living if role_of[engine_id] not in ("cache_server", "kv_transfer")),
        **totals,
        "by_role": by_role,
        # engines whose scrapes span too little of the window: their counts (and the sums above) are low
        "short_coverage": short,
        # engines read on command at both edges of the window, and how far each read was from its edge
        "edge_reads": edge_spans,
        "kv_usage_max": kv_usage_max,
        "gpu_power_w_mean": sum(power) / len(power) if power else None,
        "gpu_utilization_pct_mean": sum(util) / len(util) if util else None,
    }


CROSS_INSTANCE_SERIES = "kvbench_sim_cross_instance_hit_tokens_total"
_COMPUTED_BY = re.compile(r'computed_by="([^"]*)"')


def cross_instance_hits(
    samples: list[asyncpg.Record], start: datetime, end: datetime, close_by: datetime | None = None
) -> dict[str, float]:
    """Prompt tokens one engine loaded from a shared tier that another engine computed, differenced over [start, end]:
    ``"COMPUTED_BY -> REUSED_BY"`` -> tokens. Simulated engines count them (their shared store knows who stored each
    chunk); no real engine or LMCache server says so, and then this is empty."""
    by_engine: dict[str, list[tuple[datetime, dict[str, float]]]] = defaultdict(list)
    for row in samples:
        raw = _json(row["samples"]) or {}
        found = {m.group(1): float(v) for k, v in raw.items() if k.startswith(CROSS_INSTANCE_SERIES)
                 and (m := _COMPUTED_BY.search(k))}  # fmt: skip
        if found:
            by_engine[row["engine_id"]].append((row["sampled_at"], found))
    out: dict[str, float] = {}
    for engine_id, series in by_engine.items():
        series.sort(key=lambda item: item[0])
        if not any(start <= t <= (close_by or end) for t, _ in series):
            continue  # another stack's engine of the same name (the samples are fetched by time, with a margin)
        steps = window_steps(series, start, end, close_by, from_zero=True)  # only simulated engines count these
        for owner in sorted({owner for step in steps for owner in step}):
            delta = _increase(steps, owner)
            if delta > 0:
                key = f"{owner} -> {engine_id}"
                out[key] = out.get(key, 0.0) + delta
    return out


def disk_tier_census(samples: list[asyncpg.Record], start: datetime, end: datetime) -> dict[str, Any] | None:
    """A local disk tier's files and bytes at a job's start and at its end, summed over engines (each machine's
    count rides on one engine's samples), and whether the bytes ever fell in between: eviction reclaimed space.
    None when no engine sample carried the tier's count."""
    by_engine: dict[str, list[tuple[datetime, float, float]]] = defaultdict(list)
    for row in samples:
        normalized = _json(row["normalized"]) or {}
        if "disk_tier_records" in normalized and "disk_tier_bytes" in normalized:
            by_engine[row["engine_id"]].append(
                (row["sampled_at"], float(normalized["disk_tier_records"]), float(normalized["disk_tier_bytes"]))
            )
    if not by_engine:
        return None
    # an engine with no count inside the job is another stack's (the samples are fetched by time, with a margin)
    serving = {e: sorted(series) for e, series in by_engine.items() if any(start <= t <= end for t, _, _ in series)}
    if not serving:
        return None
    out = {"records_before": 0.0, "records_after": 0.0, "bytes_before": 0.0, "bytes_after": 0.0}
    reclaimed = False
    for series in serving.values():
        first = ([x for x in series if x[0] <= start] or series[:1])[-1]
        last = ([x for x in series if x[0] <= end] or series[-1:])[-1]
        out["records_before"] += first[1]
        out["bytes_before"] += first[2]
        out["records_after"] += last[1]
        out["bytes_after"] += last[2]
        inside = [x for x in series if first[0] <= x[0] <= last[0]]
        reclaimed = reclaimed or any(b[2] < a[2] for a, b in pairwise(inside))
    return {**out, "reclaimed": reclaimed, "engines": len(serving)}


def stacks_started(events: list[asyncpg.Record], workload: str) -> list[dict[str, Any]]:
    """What each machine said of the workload's stacks as they came up (StackReady's facts: the attention block
    size its engine logged, what its disk tier already held, the engine's command line), in start order."""
    out = []
    for e in events:
        if e["schema"] != StackReady.SCHEMA:
            continue
        payload = _json(e["payload"]) or {}
        if payload.get("workload") == workload:
            facts = {str(k): str(v) for k, v in (payload.get("facts") or {}).items()}
            out.append({"at": e["occurred_at"].isoformat(), "node_id": payload.get("node_id"),
                        "deployment_id": payload.get("deployment_id"), "facts": facts})  # fmt: skip
    return out


async def records_complete(store: Store, run_id: str) -> bool:
    counts = await store.record_counts(run_id)
    for job in await store.jobs(run_id):
        expected = job["records_expected"]
        if expected is not None and counts.get(job["job_id"], 0) < expected:
            return False
    return True


def _label(job: Any) -> str:
    """A job as a person names it (workload · load · repeat from 1), its id beside it for look-ups."""
    label = job.get("label") if isinstance(job, dict) else None
    return f"{label} (job {job['job_id']})" if label else f"job {job['job_id']}"


def _slo(spec: dict[str, Any]) -> Slo:
    slo = (spec.get("measurement") or {}).get("slo") or {}
    return Slo(ttft_ms=slo.get("ttft_ms"), tpot_ms=slo.get("tpot_ms"), e2e_ms=slo.get("e2e_ms"))


def _achieved(
    spec: dict[str, Any], everything: Columns, measured: Columns, level: float, warmup: float, load_end: float
) -> dict[str, Any]:
    window = load_end - warmup
    arrivals = (spec.get("traffic") or {}).get("arrivals") or {}
    if arrivals.get("mode") == "request_rate":
        started = int(((everything.start_s >= warmup) & (everything.start_s < load_end)).sum())
        achieved = started / window if window > 0 else 0.0
        return {
            "mode": "request_rate",
            "offered_rps": level,
            "achieved_rps": achieved,
            "ratio": achieved / level if level else None,
        }
    busy = float(np.nansum(measured.e2e_s))
    return {
        "mode": "closed_loop",
        "offered_users": level,
        "achieved_concurrency": busy / window if window > 0 else 0.0,
        "definition": "achieved concurrency = summed E2E of measured requests / window (Little's law)",
    }


def job_request_tokens(everything: Columns) -> dict[str, float]:
    """Prompt and cached tokens of every request of a job (warm-up and late ones included): what the engines counted
    between the reads at the job's first request and its last answer."""
    return {
        "prompt_tokens": float(np.nansum(everything.prompt_tokens)),
        "cached_tokens": float(np.nansum(everything.cached_tokens)),
    }


def _job_span_counters(
    samples: list[asyncpg.Record], job: asyncpg.Record, window_end: datetime
) -> dict[str, Any] | None:
    """What the engines counted between their reads at the job's first request and its last answer (the planner's
    ReadEngines at job_start and job_end); None unless every engine was read at both."""
    finished = job["finished_at"] or window_end
    deltas = counter_deltas(samples, job["started_at"], finished, None, job["job_id"], ("job_start", "job_end"))
    engines = {s["engine_id"] for s in samples if s.get("job_id") == job["job_id"] and s.get("edge") == "job_start"}
    if not engines or len(deltas["edge_reads"]) < len(engines):
        return None
    prompt = float(deltas["prompt_tokens"])
    return {
        "prompt_tokens": prompt,
        "cached_tokens": prompt - float(deltas["prompt_tokens_recomputed"]),
        "reads": deltas["edge_reads"],
    }


def _job_figures(spec: dict[str, Any], job: asyncpg.Record, everything: Columns) -> tuple[dict[str, Any], Columns]:
    warmup, load_end = float(job["warmup_s"]), float(job["load_duration_s"])
    measured, errors = select_measured(everything, warmup, load_end)
    out = figures(measured, errors, load_end - warmup, _slo(spec))
    out["request_tokens"] = job_request_tokens(everything)
    slices = slice_figures(measured, warmup, load_end, slices=10)
    out["slices"] = slices
    out["stability_cv"] = coefficient_of_variation([s["output_tokens_per_s"] for s in slices if s["requests"]])
    out["drift"] = drift([s["start_s"] for s in slices], [s["ttft_p50_ms"] for s in slices])
    out["achieved"] = _achieved(spec, everything, measured, float(job["load_level"]), warmup, load_end)
    computed = measured.prompt_tokens - measured.cached_tokens
    usable = (computed >= 256) & ~np.isnan(measured.ttft_s) & (np.nan_to_num(measured.ttft_s) > 0)
    out["prefill_tokens_per_s_best"] = (
        float((computed[usable] / measured.ttft_s[usable]).max()) if usable.any() else None
    )
    # measured or not: after a (re)start of the stack, what the cold engines made the first user wait
    first = int(np.argmin(everything.start_s)) if len(everything) else None
    first_ttft = float(everything.ttft_s[first]) if first is not None else float("nan")
    out["first_request_ttft_ms"] = first_ttft * 1e3 if not np.isnan(first_ttft) else None
    return out, measured


TIER_WRITES_MIN_CHUNKS = 16  # fewer handed to a tier's writer in a window tells nothing


def _tier_writes(job: dict[str, Any]) -> tuple[bool, str] | None:
    """(invalid?, reason) when a job's offload tier (LMCache's L2: the disk) finished few or none of the writes
    handed to it: its reloads cannot have come from records that were never written."""
    counters = job.get("engine_counters") or {}
    submitted = float(counters.get("kv_store_chunks_submitted") or 0.0)
    completed = float(counters.get("kv_store_chunks_completed") or 0.0)
    if submitted < TIER_WRITES_MIN_CHUNKS:
        return None
    if completed == 0:
        return True, (
            f"{_label(job)}: the disk tier stored none of the {submitted:,.0f} chunks handed to it (LMCache's "
            "L2 writer completed 0), so nothing it reports was ever on disk. LMCache 0.5.1 fails O_DIRECT writes "
            "silently where the filesystem refuses them: set sizing.disk_tier_direct_io: false, or put the tier on "
            "a filesystem that accepts them"
        )
    if completed < 0.5 * submitted:
        return False, (
            f"{_label(job)}: the disk tier finished {completed:,.0f} of the {submitted:,.0f} chunk writes "
            "handed to it in the window; its writer is behind (or failing), so its share of the hits is uncertain"
        )
    return None


def _short_coverage(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list((job.get("engine_counters") or {}).get("short_coverage") or [])


def _short_coverage_reason(job_id: str, gap: dict[str, Any]) -> str:
    return (
        f"job {job_id}: engine {gap['engine_id']} ({gap['role']}) has counter samples over "
        f"{gap['counted_s']:.1f} s of the {gap['window_s']:.1f} s measured window (wall clock; scraped every "
        f"{gap['scrape_interval_s']:.1f} s): what it did outside them is not counted, so its engine counters and "
        "the prompt-token sources are low (its agent scraped late or stopped, or its samples were not stored)"
    )


def _validity(spec: dict[str, Any], jobs: list[dict[str, Any]], pooled: dict[str, Any]) -> dict[str, Any]:
    invalid: list[str] = []
    preliminary: list[str] = []
    failed = [j for j in jobs if j["status"] != "succeeded"]
    if failed:
        invalid.append(
            f"{len(failed)} of {len(jobs)} jobs did not succeed: "
            + "; ".join(f"{j['job_id']}: {j.get('reason') or j['status']}" for j in failed)
        )
    for j in jobs:
        invalid_or_not = _tier_writes(j)
        if invalid_or_not is not None:
            (invalid if invalid_or_not[0] else preliminary).append(invalid_or_not[1])
        expected = j.get("records_expected")
        if expected is not None and j["requests"] < expected:
            invalid.append(
                f"{_label(j)}: {j['requests']:,} of the {expected:,} records its load generators published are "
                "stored; the rest were lost or had not arrived when this report was built"
            )
    if pooled["requests_measured"] == 0:
        invalid.append("no request was measured (none started after the warm-up and ended before the load end)")
    attempts = pooled["requests_measured"] + pooled["errors"]
    if attempts and pooled["errors"] / attempts > ERROR_BUDGET:
        invalid.append(f"errors {pooled['errors']} of {attempts} exceed the {ERROR_BUDGET:.0%} error budget")
    for j in jobs:
        ach = j.get("achieved") or {}
        if ach.get("mode") == "request_rate" and ach.get("ratio") is not None and ach["ratio"] < 0.95:
            (invalid if ach["ratio"] < 0.90 else preliminary).append(
                f"{_label(j)} achieved {ach['achieved_rps']:.2f} of {ach['offered_rps']:.2f} requests/s "
                f"({ach['ratio']:.0%})"
            )
        lag = j.get("replay_lag_p99_s")
        if lag is not None and lag > REPLAY_LAG_S:
            preliminary.append(
                f"{_label(j)}: the replay fell behind its schedule (p99 lag {lag * 1e3:.0f} ms, "
                f"above {REPLAY_LAG_S * 1e3:.0f} ms)"
            )
        if j.get("skipped_arrivals"):
            preliminary.append(
                f"{_label(j)}: {j['skipped_arrivals']} arrivals found every session busy and none left to open"
            )
        timing = j.get("timing") or {}
        if timing.get("reliable") is False:
            preliminary.append(f"{_label(j)}: TTFT and ITL unreliable: " + "; ".join(timing["reasons"]))
        preliminary += [_short_coverage_reason(j["job_id"], gap) for gap in _short_coverage(j)]
        if j.get("stability_cv") is not None and j["stability_cv"] > UNSTABLE_CV:
            preliminary.append(
                f"{_label(j)}: throughput varies over time (CV {j['stability_cv']:.2f} "
                f"over 10 slices, above {UNSTABLE_CV})"
            )
        if (j.get("drift") or {}).get("significant"):
            preliminary.append(
                f"{_label(j)}: TTFT drifts ({j['drift']['relative_change']:+.0%} over the window, a significant slope)"
            )
    repeats = int((spec.get("measurement") or {}).get("repeats", 3))
    if repeats < 3:
        preliminary.append(f"{repeats} repeat(s): fewer than 3, so no confidence interval")
    windows = [j["window_s"] for j in jobs if j.get("window_s") is not None]
    if windows and min(windows) < SHORT_WINDOW_S:
        preliminary.append(f"measured window {min(windows):g} s is under {SHORT_WINDOW_S:g} s")
    verdict = "invalid" if invalid else "preliminary" if preliminary else "valid"
    return {"verdict": verdict, "reasons": invalid + preliminary}


def _test_points(
    jobs: list[dict[str, Any]],
    by_level: dict[float, list[Columns]],
    window_by_level: dict[float, float],
    spec: dict[str, Any],
) -> list[dict[str, Any]]:
    points = []
    for level in sorted({j["load_level"] for j in jobs}):
        done = [j for j in jobs if j["load_level"] == level and "ttft_ms" in j]
        pooled = figures(
            Columns.concat(by_level.get(level, [])),
            sum(j.get("errors", 0) for j in done),
            window_by_level.get(level, 0.0),
            _slo(spec),
        )
        points.append(
            {
                "load_level": level,
                "repeats": len(done),
                "ttft_ms": pooled["ttft_ms"],
                "tpot_ms": pooled["tpot_ms"],
                "output_tokens_per_s": pooled["output_tokens_per_s"],
                "across_repeats": {
                    "ttft_p50_ms": repeat_interval([j["ttft_ms"]["p50"] for j in done]),
                    "ttft_p99_ms": repeat_interval([j["ttft_ms"]["p99"] for j in done]),
                    "tpot_p50_ms": repeat_interval([j["tpot_ms"]["p50"] for j in done]),
                    "output_tokens_per_s": repeat_interval([j["output_tokens_per_s"] for j in done]),
                    "goodput_rps": repeat_interval([j["goodput_rps"] for j in done]),
                },
            }
        )
    return points


def _cross_instance(jobs: list[dict[str, Any]], prompt_tokens: float) -> dict[str, Any] | None:
    """The workload's cross-instance hits summed over its jobs: who computed what another engine reused (None when no
    engine counted any)."""
    pairs: dict[str, float] = defaultdict(float)
    for job in jobs:
        for pair, tokens in (job.get("cross_instance_hits") or {}).items():
            pairs[pair] += tokens
    if not pairs:
        return None
    total = sum(pairs.values())
    return {
        "definition": "prompt tokens an engine loaded from a shared tier (a shared LMCache server, a shared pool) that "
        "another engine had computed and stored, over the measured windows; counted by the simulated engines",
        "tokens": total,
        "share_of_prompt_tokens": total / prompt_tokens if prompt_tokens else None,
        "pairs": [
            {"computed_by": pair.split(" -> ")[0], "reused_by": pair.split(" -> ")[1], "tokens": tokens}
            for pair, tokens in sorted(pairs.items(), key=lambda item: -item[1])
        ],
    }


def _cache_server_view(counters: dict[str, float] | None) -> dict[str, float]:
    return {k: v for k, v in (counters or {}).items() if k.startswith("cache_server_")}


def _split_by_cache_server(tokens: dict[str, float], engine: dict[str, float]) -> str:
    """The engines' connector hits that they cannot attribute (vLLM before 0.32 behind LMCache), split between the
    host and disk tiers as the cache server itself counted its hits; ``tokens`` is changed in place. Returns what
    the report's ``source`` adds, empty when nothing was split."""
    host = engine.get("cache_server_hit_tokens_host", 0.0)
    disk = engine.get("cache_server_hit_tokens_disk", 0.0)
    unattributed = tokens.get("external_unattributed", 0.0)
    if not unattributed or host + disk <= 0:
        return ""
    share = disk / (host + disk)
    tokens["disk"] = tokens.get("disk", 0.0) + unattributed * share
    tokens["host_tier"] = tokens.get("host_tier", 0.0) + unattributed * (1 - share)
    tokens["external_unattributed"] = 0.0
    return "; the connector's hits split between host and disk as the LMCache server counted its own"


HIT_RATES = {
    # name: (hits, queries or None for hits + misses, what it is)
    "prefix_cache": ("prefix_cache_hits", "prefix_cache_queries", "tokens the GPU prefix cache found / was asked for"),
    "external": ("external_cache_hits", "external_cache_queries", "tokens the KV connector found / was asked for"),
    "kv_blocks": ("kv_blocks_reused", None, "KV cache blocks reused / reused + missed (TensorRT-LLM)"),
}


def _hit_rates(engine: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Each hit rate the engines count themselves, over the measured windows, with its own denominator (vLLM's
    queries, TensorRT-LLM's missed blocks), where the engines counted one."""
    out: dict[str, dict[str, Any]] = {}
    for name, (hits_key, queries_key, definition) in HIT_RATES.items():
        hits = engine.get(hits_key)
        queries = (
            engine.get(queries_key)
            if queries_key
            else (None if hits is None else hits + engine.get("kv_blocks_missed", 0.0))
        )
        if hits is None or not queries:
            continue
        out[name] = {"rate": hits / queries, "hits": hits, "queries": queries, "definition": definition}
    return out


def _sources(
    pooled: dict[str, Any],
    engine: dict[str, float] | None,
    roles: dict[str, dict[str, float]] | None = None,
    job_span: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Where prompt tokens came from. A split stack computes each prompt on a prefill engine and serves it from a
    decode engine: the headline counts it once, as the decode engines got it (``transferred``: from a prefill
    engine), and ``by_role`` gives each side's own sources."""
    split = bool(roles) and "prefill" in (roles or {}) and "decode" in (roles or {})
    if split and roles is not None:
        # the decode engines' sources, with the cache servers' own view beside them (their hits by tier)
        out = _sources(pooled, {**roles["decode"], **_cache_server_view(roles.get("cache_server"))}, None, job_span)
        out["source"] = "decode engines' counters over the measured windows (each prompt once; by_role: each side)"
        out["by_role"] = {
            role: {
                "prompt_tokens": counters.get("prompt_tokens", 0.0),
                "tokens": {name: counters.get(key, 0.0) for key, name in SOURCES.items()},
            }
            for role, counters in sorted(roles.items())
            if counters.get("prompt_tokens")
        }
        return out
    from_requests = {
        "cached": pooled["cached_tokens"],
        "recomputed": pooled["prompt_tokens"] - pooled["cached_tokens"],
        "prompt_tokens": pooled["prompt_tokens"],
    }
    if engine and engine.get("prompt_tokens"):
        tokens = {name: engine.get(key, 0.0) for key, name in SOURCES.items()}
        attribution = _split_by_cache_server(tokens, engine)
        total = engine["prompt_tokens"]
        cached = total - tokens["recomputed"]
        request_share = (
            from_requests["cached"] / from_requests["prompt_tokens"] if from_requests["prompt_tokens"] else 0
        )
        engine_share = cached / total
        # the exact check: the engines read at each job's first request and last answer (every request the engines
        # counted is one of the job's), against every request of those jobs; a window's edges cut through requests
        # in flight, which the engines count when they compute them and the window by when they started and ended
        exact = job_span if job_span and job_span.get("engine_prompt") and job_span.get("request_prompt") else None
        if exact:
            engine_share = exact["engine_cached"] / exact["engine_prompt"]
            request_share = exact["request_cached"] / exact["request_prompt"]
        return {
            "source": "engine counters over the measured windows" + attribution,
            "prompt_tokens": total,
            "tokens": tokens,
            "shares": {k: v / total for k, v in tokens.items()},
            "engine_hit_rates": _hit_rates(engine),
            "per_request": from_requests,
            "cross_check": {
                "engine_cached_share": engine_share,
                "request_cached_share": request_share,
                "difference": engine_share - request_share,
            },
            "cross_check_compared": "every request of the jobs against the engines read at each job's first request "
            f"and last answer ({exact['jobs']:.0f} job(s); engine prompt tokens {exact['engine_prompt']:,.0f}, "
            f"requests' {exact['request_prompt']:,.0f})"
            if exact
            else "the measured requests against the engine counters over the measured windows",
        }
    return {
        "source": "per-request usage.prompt_tokens_details.cached_tokens (no engine counters)",
        "prompt_tokens": from_requests["prompt_tokens"],
        "tokens": {"gpu_hit": from_requests["cached"], "recomputed": from_requests["recomputed"]},
        "per_request": from_requests,
        "cross_check": None,
    }


def _limits(
    spec: dict[str, Any],
    engine: dict[str, float] | None,
    window: float,
    best_prefill: float | None,
    goodput: float,
    output_tps: float,
    settings: dict[str, Any],
) -> dict[str, Any]:
    model = find_model(str(spec.get("model", "")))
    kv_bpt = int(model.kv_bytes_per_token) if model else None
    out: dict[str, Any] = {"kv_bytes_per_token": kv_bpt, "prefill_tokens_per_s_best": best_prefill}
    if kv_bpt and best_prefill:
        out["break_even_gbps"] = kv_bpt * best_prefill / 1e9
        out["break_even_definition"] = (
            "KV bytes per token x fastest observed prefill rate: a tier that loads "
            "slower than this loses to recomputing"
        )
    if engine and window > 0:
        out["tier_rates_gbps"] = {
            tier: (
                engine.get(f"kv_bytes_loaded_{tier}", 0.0) / window / 1e9,
                engine.get(f"kv_bytes_stored_{tier}", 0.0) / window / 1e9,
            )
            for tier in ("host", "disk", "remote")
        }
        out["tier_rates_definition"] = "(load, store) GB/s averaged over the measured windows"
        out["gpu_power_w_mean"] = engine.get("gpu_power_w_mean")
        out["gpu_utilization_pct_mean"] = engine.get("gpu_utilization_pct_mean")
    cluster = spec.get("cluster") or {}
    sim = cluster.get("sim") or {}
    sizing = spec.get("sizing") or {}
    machines = int(sim.get("machines") or 0) or None
    gpus_per = int(sizing.get("gpus_per_machine") or sim.get("gpus_per_machine") or 0) or None
    gpus = machines * gpus_per if machines and gpus_per else None
    capacity: dict[str, Any] = {"machines": machines, "gpus": gpus, "goodput_rps": goodput}
    target = settings.get("target_goodput_rps")
    if machines and goodput > 0:
        capacity["goodput_rps_per_machine"] = goodput / machines
        if target:
            capacity["target_goodput_rps"] = target
            capacity["machines_for_target"] = math.ceil(target / (goodput / machines))
    out["capacity"] = capacity
    prices = settings.get("price_per_gpu_hour") or {}
    price = prices.get(str(sim.get("gpu") or ""))
    if price and gpus and output_tps > 0:
        out["cost"] = {
            "usd_per_gpu_hour": price,
            "usd_per_million_output_tokens": gpus * price / (output_tps * 3600) * 1e6,
        }
    elif not prices:
        out["cost"] = {"note": NO_PRICE_NOTE}
    else:
        out["cost"] = {"note": f"no price for this pool's GPU ({sim.get('gpu') or 'unknown'}) in the price table"}
    return out


def _tier_verdicts(limits: dict[str, Any], sources: dict[str, Any], helped: str | None) -> list[dict[str, Any]]:
    """Each tier that loaded KV: its average load rate against the break-even bandwidth, and what that says."""
    break_even = limits.get("break_even_gbps")
    tokens = sources.get("tokens") or {}
    served = {
        "host": tokens.get("host_tier", 0.0),
        "disk": tokens.get("disk", 0.0),
        "remote": tokens.get("shared_store", 0.0),
    }
    out = []
    for tier, (load, store) in (limits.get("tier_rates_gbps") or {}).items():
        if not load and not store and not served.get(tier):
            continue
        if break_even is None:
            verdict = "no break-even bandwidth (unknown model or no prefill measured)"
        elif load >= break_even:
            verdict = "faster than recomputing: even its average load rate beats the break-even"
        elif served.get(tier) and helped == "helped":
            verdict = "faster than recomputing: TTFT improved against the baseline while it served prompt tokens"
        elif served.get(tier) and helped == "hurt":
            verdict = "slower than recomputing: TTFT got worse against the baseline while it served prompt tokens"
        else:
            verdict = "not shown: its average rate is below the break-even, and the average understates a tier's speed"
        out.append(
            {
                "tier": tier,
                "load_gbps": load,
                "store_gbps": store,
                "break_even_gbps": break_even,
                "prompt_tokens_served": served.get(tier, 0.0),
                "verdict": verdict,
            }
        )
    return out


async def build_report(store: Store, run_id: str, settings: dict[str, Any] | None = None) -> dict[str, Any] | None:
    settings = settings or {}
    run = await store.run(run_id)
    if run is None:
        return None
    workload_rows = await store.workloads(run_id)
    specs = {w["name"]: _json(w["spec"]) for w in workload_rows}
    stacks = {w["name"]: (w["stack"], w["strategy"]) for w in workload_rows}
    counts = await store.record_counts(run_id)
    per_workload: dict[str, list[dict[str, Any]]] = defaultdict(list)
    measured_by: dict[str, list[Columns]] = defaultdict(list)
    by_level: dict[str, dict[float, list[Columns]]] = defaultdict(lambda: defaultdict(list))
    window_by_level: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    errors_by: dict[str, int] = defaultdict(int)
    window_by: dict[str, float] = defaultdict(float)
    engine_totals: dict[str, dict[str, float]] = {}
    role_totals: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)  # workload -> role -> counters
    job_windows: list[dict[str, Any]] = []
    job_rows = await store.jobs(run_id)
    starts = sorted(job["started_at"] for job in job_rows if job["started_at"] is not None)
    for job in job_rows:
        name = job["workload"]
        spec = specs.get(name, {})
        status, reason = job["status"], job["reason"]
        if run["status"] in ("succeeded", "failed", "cancelled") and status in ("pending", "running"):
            # after the run ends a job's status is final: it never ran, or it was stopped with the run
            status = "not_run" if status == "pending" else "stopped"
            reason = reason or f"the run ended ({run['status']}) before this job finished"
        entry: dict[str, Any] = {
            "job_id": job["job_id"],
            # what a person calls the job (repeats counted from 1, as the console counts them)
            "label": f"{name} · load {float(job['load_level']):g} · repeat {int(job['repeat']) + 1}",
            "load_level": job["load_level"],
            "repeat": job["repeat"],
            "status": status,
            "reason": reason,
            "requests": counts.get(job["job_id"], 0),
            "records_expected": job["records_expected"],
            "tokenizer": job["tokenizer"],
            "shards": job["shards"],
            "skipped_arrivals": job["skipped_arrivals"],
            "replay_lag_p99_s": job["replay_lag_p99_s"],
            "time_scale": job["time_scale"],
            "warmup_s": job["warmup_s"],
            "load_duration_s": job["load_duration_s"],
            "load_notes": json.loads(job["notes"]) if isinstance(job["notes"], str) else list(job["notes"] or []),
        }
        if job["status"] == "succeeded" and job["load_duration_s"] is not None:
            job_figures, measured = _job_figures(spec, job, await store.job_columns(run_id, job["job_id"]))
            entry.update(job_figures)
            warmup, load_end = float(job["warmup_s"]), float(job["load_duration_s"])
            measured_by[name].append(measured)
            by_level[name][job["load_level"]].append(measured)
            window_by_level[name][job["load_level"]] += load_end - warmup
            errors_by[name] += entry["errors"]
            window_by[name] += load_end - warmup
            if job["started_at"] is not None:
                # record times are engine seconds: a simulated cluster paced faster than real time lived them in
                # fewer wall-clock seconds, and engine scrapes and switch reads carry wall-clock times
                scale = float(job["time_scale"] or 1.0)
                start = job["started_at"] + timedelta(seconds=warmup / scale)
                end = job["started_at"] + timedelta(seconds=load_end / scale)
                margin_end = end + timedelta(seconds=10)
                # the job's closing read comes after its last answer, which may be well after the window's end
                fetch_end = max(margin_end, (job["finished_at"] or end) + timedelta(seconds=10))
                samples = await store.engine_samples(run_id, job["started_at"] - timedelta(seconds=10), fetch_end)
                # an acceptance test's phases are short and the planner pauses after each for a closing scrape: it
                # may come after the window's end, but not after the next job began (other jobs end at their last
                # scrape inside, as the load of the next may follow at once)
                close_by = None
                if (spec.get("measurement") or {}).get("acceptance"):
                    close_by = min(next((t for t in starts if t > job["started_at"]), margin_end), margin_end)
                deltas = counter_deltas(samples, start, end, close_by, job["job_id"]) if samples else None
                entry["engine_counters"] = deltas
                entry["job_span_counters"] = _job_span_counters(samples, job, end) if samples else None
                entry["cross_instance_hits"] = cross_instance_hits(samples, start, end, close_by) if samples else {}
                entry["disk_tier"] = disk_tier_census(samples, job["started_at"], end) if samples else None
                if entry["disk_tier"] is not None and deltas and deltas.get("kv_store_chunks_evicted", 0.0) > 0:
                    entry["disk_tier"]["reclaimed"] = True  # the tier's writer says so itself (LMCache's L2)
                entry["timing"] = timing_verdict(
                    worst_client_timing([ClientTiming.model_validate(s) for s in (_json(job["client_timing"]) or [])]),
                    entry.get("merged_chunk_share"),
                    engine_late_share(deltas),
                    itl_p99_ms=(entry.get("itl_ms") or {}).get("p99"),
                    engine_slip_p99_ms=engine_slip_p99_ms(deltas),
                    time_scale=scale,
                )
                kv_keys = ("kv_bytes_transferred", "kv_bytes_loaded_remote", "kv_bytes_stored_remote")
                job_windows.append(
                    {
                        "job_id": job["job_id"],
                        "workload": name,
                        "began": job["started_at"],  # its load (warm-up included) began here
                        "start": start,
                        "end": end,
                        "kv_bytes": sum(deltas.get(k) or 0.0 for k in kv_keys) if deltas else None,
                    }
                )
                if deltas:
                    total = engine_totals.setdefault(name, defaultdict(float))
                    for key in COUNTERS:
                        total[key] += deltas[key]
                    for role, counters in deltas["by_role"].items():
                        summed = role_totals[name].setdefault(role, dict.fromkeys(COUNTERS, 0.0))
                        for key in COUNTERS:
                            summed[key] += counters[key]
                    for key in ("gpu_power_w_mean", "gpu_utilization_pct_mean", "kv_usage_max"):
                        if deltas.get(key) is not None:
                            total[key] = max(total.get(key, 0.0), deltas[key])
                    # engines whose counters were read over a job: the most any of the workload's jobs had
                    total["engines"] = max(total.get("engines", 0.0), float(deltas.get("engines") or 0))
                    total["jobs_with_counters"] = total.get("jobs_with_counters", 0.0) + 1
        per_workload[name].append(entry)

    workloads_out: list[dict[str, Any]] = []
    for name, jobs in per_workload.items():
        spec = specs.get(name, {})
        pooled_columns = Columns.concat(measured_by[name])
        pooled = figures(pooled_columns, errors_by[name], window_by[name], _slo(spec))
        engine = dict(engine_totals[name]) if name in engine_totals else None
        stack, strategy = stacks.get(name, ("", ""))
        prompt = pooled["prompt_tokens"]
        best = max((j.get("prefill_tokens_per_s_best") or 0.0 for j in jobs), default=0.0) or None
        spans = [j for j in jobs if j.get("job_span_counters")]
        job_span = {
            "jobs": float(len(spans)),
            "engine_prompt": sum(j["job_span_counters"]["prompt_tokens"] for j in spans),
            "engine_cached": sum(j["job_span_counters"]["cached_tokens"] for j in spans),
            "request_prompt": sum(j["request_tokens"]["prompt_tokens"] for j in spans),
            "request_cached": sum(j["request_tokens"]["cached_tokens"] for j in spans),
        }
        sources = _sources(pooled, engine, role_totals.get(name), job_span)
        if engine is not None:
            gaps = [{"job_id": j["job_id"], **gap} for j in jobs for gap in _short_coverage(j)]
            sources["counters_complete"] = not gaps
            sources["short_coverage"] = gaps
        hit_ratio = pooled["cached_tokens"] / prompt if prompt else None
        transferred = None
        if sources.get("by_role") and sources.get("prompt_tokens"):
            # a decode engine reports the prompt it was sent as cached: those tokens were transferred, not cached
            tokens = sources["tokens"]
            transferred = tokens.get("transferred", 0.0) / sources["prompt_tokens"]
            hits = sum(v for k, v in tokens.items() if k not in ("transferred", "recomputed"))
            hit_ratio = hits / sources["prompt_tokens"]
        workloads_out.append(
            {
                "name": name,
                "stack": stack,
                "strategy": strategy,
                "requests": sum(j["requests"] for j in jobs),
                "requests_measured": pooled["requests_measured"],
                "errors": pooled["errors"],
                "window_s": pooled["window_s"],
                "time_scale": max((float(j.get("time_scale") or 1.0) for j in jobs), default=1.0),
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
                "cache_hit_ratio": hit_ratio,
                "transferred_ratio": transferred,
                "test_points": _test_points(jobs, by_level[name], window_by_level[name], spec),
                "distributions": distributions(pooled_columns),
                "prompt_token_sources": sources,
                "hit_ratio_over_time": [
                    {"job_id": j["job_id"], "start_s": s["start_s"], "ratio": s["cache_hit_ratio"]}
                    for j in jobs
                    for s in j.get("slices", [])
                ],
                "kv_bytes_moved": {
                    k: engine.get(k, 0.0)
                    for k in ("kv_bytes_transferred", "kv_bytes_loaded_remote", "kv_bytes_stored_remote")
                }
                if engine
                else None,
                "engine_counters": engine,
                "cross_instance_hits": _cross_instance(jobs, sources.get("prompt_tokens") or prompt),
                "limits": _limits(
                    spec, engine, window_by[name], best, pooled["goodput_rps"], pooled["output_tokens_per_s"], settings
                ),
                "validity": _validity(spec, jobs, pooled),
                "timing": {
                    "reliable": all((j.get("timing") or {}).get("reliable", True) for j in jobs),
                    "reasons": [
                        f"{_label(j)}: {reason}" for j in jobs for reason in (j.get("timing") or {}).get("reasons", [])
                    ],
                },
                "jobs": jobs,
            }
        )
    plan = _json(run["plan"]) or {}
    order = [str(w.get("name")) for w in plan.get("workloads", []) if isinstance(w, dict)]
    workloads_out.sort(key=lambda w: order.index(w["name"]) if w["name"] in order else len(order))
    baseline = choose_baseline(
        [w["name"] for w in workloads_out], {w["name"]: w["strategy"] for w in workloads_out}, plan.get("baseline")
    )
    if baseline is not None:  # the baseline first, then the plan's order
        workloads_out.sort(key=lambda w: w["name"] != baseline)
    by_name = {w["name"]: w for w in workloads_out}
    for workload in workloads_out:
        if baseline is None:
            workload["comparison"] = {
                "baseline": None,
                "verdict": "no baseline",
                "note": "no own_cache workload and no plan baseline: nothing to compare with",
            }
        elif workload["name"] == baseline:
            workload["comparison"] = {"baseline": baseline, "is_baseline": True, "verdict": "baseline"}
        else:
            workload["comparison"] = compare_to_baseline(workload["jobs"], by_name[baseline]["jobs"], baseline)
        workload["limits"]["tiers"] = _tier_verdicts(
            workload["limits"], workload["prompt_token_sources"], workload["comparison"].get("verdict")
        )
    run_events = await store.events(run_id)
    resets: dict[str, dict[str, int]] = defaultdict(dict)  # job -> engine -> POST /reset_prefix_cache's status
    answers: dict[str, dict[str, str]] = defaultdict(dict)  # job -> session/turn -> digest (acceptance tests)
    for e in run_events:
        if e["schema"] == JobFinished.SCHEMA:
            payload = _json(e["payload"]) or {}
            resets[str(payload.get("job_id"))].update(payload.get("prefix_cache_reset") or {})
            answers[str(payload.get("job_id"))].update(payload.get("answers") or {})
    restarted = [_json(e["payload"]) or {} for e in run_events if e["schema"] == EnginesRestarted.SCHEMA]
    for workload in workloads_out:
        workload["stacks"] = stacks_started(run_events, workload["name"])
        spec = specs.get(workload["name"], {})
        if (spec.get("measurement") or {}).get("acceptance"):
            mine = {st.get("deployment_id") for st in workload["stacks"]}
            restarts = [r for r in restarted if r.get("deployment_id") in mine]
            workload["acceptance"] = acceptance(workload, resets, spec.get("model"), answers, restarts)
        if (spec.get("measurement") or {}).get("accuracy_gate"):
            gate = accuracy_gate(workload, by_name.get(baseline) if baseline else None, answers, spec.get("model"))
            workload["accuracy"] = gate
            if gate["passed"] is False:  # answers that differ beyond the rule: the result is not valid
                workload["validity"]["verdict"] = "invalid"
                workload["validity"]["reasons"].insert(0, f"accuracy gate: {gate['reason']}")
    inventories = await store.inventories(sorted({str(st["node_id"]) for w in workloads_out
                                                  for st in w["stacks"] if st.get("node_id")}))  # fmt: skip
    tested = tested_summary(workloads_out, specs, inventories)
    events = [
        {
            "at": e["occurred_at"].isoformat(),
            "schema": e["schema"],
            "node_id": e["node_id"],
            "job_id": e["job_id"],
            "subject": e["subject"],
        }
        for e in run_events
    ]
    fabric = await fabric_section(
        store,
        run_id,
        run["started_at"],
        run["finished_at"],
        configs=settings.get("switches"),
        jobs=job_windows,
        load_began=starts[0] if starts else None,
    )
    if not fabric["publish_gate"]["publishable"]:
        gate = fabric["publish_gate"]
        names = ", ".join(s["switch"] for s in gate["switches"])
        for workload in workloads_out:
            workload["validity"]["verdict"] = "invalid"
            workload["validity"]["reasons"].insert(0, f"{gate['code']}: {gate['message']} ({names}). {gate['fix']}")
    return {
        "run_id": run_id,
        "plan_name": run["plan_name"],
        "status": run["status"],
        "reasons": _json(run["reasons"]),
        "submitted_at": run["submitted_at"].isoformat(),
        "finished_at": run["finished_at"].isoformat() if run["finished_at"] else None,
        "generated_at": utc_now().isoformat(),
        "tested": tested,
        "definitions": {
            **DEFINITIONS,
            "workload_figures": "pool the measured requests of all the workload's jobs; throughput and rates use the "
            "sum of the jobs' windows",
            "requests": "every request sent by the workload's jobs (rows in request_records)",
            "engine_counters": "engine /metrics counters, normalised across engines, differenced per engine between "
            "its reads at the edges of each job's measured window (read on command as the load generator says the "
            "window starts and ends; edge_reads says how late each read was) and summed; an engine not read at both "
            "edges falls back to the periodic scrapes around the window. The cross-check compares every request of "
            "the jobs with the engines read before each job's first request and after its last answer",
            "across_repeats": "mean, sample standard deviation and two-sided Student-t 95% interval over the repeats "
            "of a test point",
            "timing": TIMING_DEFINITION,
            "comparison": COMPARE_DEFINITION,
            "distributions": "TTFT and ITL of the workload's measured requests at 101 evenly spaced quantiles (0 to "
            "100%), ms: the CDF charts",
            "stability_cv": "coefficient of variation of output tokens/s over 10 equal slices of the window",
            "drift": "least-squares slope of per-slice median TTFT; flagged when significant at 95% and above 10% "
            "over the window",
        },
        "baseline": baseline,
        "workloads": workloads_out,
        "fabric": fabric,
        "events": events,
    }
