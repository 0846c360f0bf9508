"""The report's measurement definitions (DESIGN.md section 6), as pure functions over records.

- Measured requests: start_s >= warm-up and, if ok, start_s + e2e_s <= load end; an error counts
  when its start_s lies in [warm-up, load end). Window = load end - warm-up.
- TTFT = c1 - t0; E2E = ck - t0; TPOT = (E2E - TTFT) / (N - 1) for N >= 2, one value per request.
- ITL: every chunk after the first, holding m tokens and arriving g after the previous one, adds
  m gaps of g/m; ICL is the raw chunk-gap distribution.
- Percentiles interpolate linearly between closest ranks (numpy's default).
- Throughput = output tokens of measured requests / window; goodput = measured requests meeting
  every SLO / window; good fraction = good / (successes + errors).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from kvbench_contracts.records import RequestRecord
from kvbench_core.columns import Columns

__all__ = [
    "DEFINITIONS",
    "Slo",
    "analyze",
    "analyze_columns",
    "analyze_grouped",
    "distributions",
    "figures",
    "select_measured",
    "summarize",
]

DEFINITIONS: dict[str, str] = {
    "measured": "requests that start after the warm-up and, if ok, end before the load end; errors that start "
    "in [warm-up, load end)",
    "window_s": "load end - warm-up",
    "ttft": "first non-empty content chunk - send time, per request",
    "tpot": "(E2E - TTFT) / (output tokens - 1), per request with at least 2 output tokens",
    "itl": "per-token gaps pooled over measured requests: a chunk of m tokens arriving g after the previous "
    "chunk adds m gaps of g/m; the first chunk adds none",
    "icl": "raw gaps between content chunks, pooled",
    "e2e": "last content chunk - send time",
    "percentiles": "linear interpolation between closest ranks (numpy default)",
    "output_tokens_per_s": "output tokens of measured requests / window",
    "goodput_rps": "measured requests meeting every SLO / window",
    "good_fraction": "good / (successes + errors)",
    "merged_chunk_share": "content chunks (after each request's first) whose gap from the previous chunk is zero: "
    "read in one read with it, so their split of the ITL is lost",
    "connections": "requests that opened a new connection before their send (the rest reused a kept-alive one), "
    "and the time the opening took; TTFT and E2E run from the request's write to the socket, so connection set-up "
    "is in neither",
    "clock": "load generator's monotonic clock",
}

PERCENTILES = (50, 90, 95, 99)
_SAME_READ_S = 1e-6  # chunks read together carry one receive stamp


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None


def summarize(
    values: Sequence[float] | np.ndarray[Any, Any], scale: float = 1.0, *, consume: bool = False
) -> dict[str, float | None]:
    """Mean, percentiles and count of ``values`` x ``scale``. ``consume``: ``values`` is the caller's own float array,
    no longer needed: scaled and reordered in place rather than copied (an hour of 64 simulated engines has 92
    million chunk gaps, and a fresh 740 MB array cost more in page faults than the arithmetic)."""
    arr = np.asarray(values, dtype=float)
    if consume and arr is values:
        np.multiply(arr, scale, out=arr)
    else:
        arr = arr * scale
    if arr.size == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}, "count": 0}
    out: dict[str, float | None] = {"mean": float(arr.mean())}  # before the percentiles reorder arr
    # arr is this function's own array (a new product, or consumed): partitioned in place, not copied once more
    pct = np.percentile(arr, PERCENTILES, overwrite_input=True)
    out.update({f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)})
    out["count"] = float(arr.size)
    return out


def select_measured(columns: Columns, warmup_s: float, load_duration_s: float) -> tuple[Columns, int]:
    """Measured successes (as columns) and the count of errors that started inside the window."""
    after = columns.start_s >= warmup_s
    e2e = np.nan_to_num(columns.e2e_s, nan=np.inf)
    measured = after & columns.ok & (columns.start_s + e2e <= load_duration_s)
    errors = after & ~columns.ok & (columns.start_s < load_duration_s)
    return columns.take(measured), int(errors.sum())


def _tpot_ms(c: Columns) -> np.ndarray[Any, Any]:
    defined = ~np.isnan(c.ttft_s) & ~np.isnan(c.e2e_s) & (c.output_tokens >= 2)
    return np.asarray((c.e2e_s[defined] - c.ttft_s[defined]) / (c.output_tokens[defined] - 1) * 1e3, dtype=float)


def _gaps(c: Columns) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(ICL chunk gaps, ITL per-token gaps): every chunk after a request's first adds its gap g once to ICL
    and m times g/m to ITL, m being its tokens."""
    total = c.chunk_times.size
    if total < 2:
        return np.zeros(0), np.zeros(0)
    later = np.ones(total, dtype=bool)
    lengths = np.diff(c.chunk_offsets)
    later[c.chunk_offsets[:-1][lengths > 0]] = False  # first chunks start a request: no gap
    keep = later[1:]
    icl = np.diff(c.chunk_times)[keep]
    tokens = c.chunk_tokens[1:]
    # one_token_each's view stays a view (selected, it would become 740 MB of ones for a simulated hour)
    tokens = tokens[keep] if tokens.strides != (0,) else np.broadcast_to(tokens[:1], icl.shape)
    if not tokens.size or int(tokens.max()) <= 1:
        # one token a chunk (the simulator's streams, most servers'): each gap is its own token's, so ITL is ICL.
        # The same array, not a copy: an hour of 64 simulated engines has 92 million chunks, 740 MB per copy
        return icl, icl
    tokens = np.where(tokens > 0, tokens, 1)
    return icl, np.repeat(icl / tokens, tokens)


def _good(c: Columns, slo: Slo) -> int:
    good = np.ones(len(c), dtype=bool)
    if slo.ttft_ms is not None:
        good &= ~np.isnan(c.ttft_s) & (np.nan_to_num(c.ttft_s, nan=np.inf) * 1e3 <= slo.ttft_ms)
    if slo.tpot_ms is not None:
        defined = ~np.isnan(c.ttft_s) & ~np.isnan(c.e2e_s) & (c.output_tokens >= 2)
        tpot = np.where(defined, (c.e2e_s - c.ttft_s) / np.maximum(c.output_tokens - 1, 1) * 1e3, 0.0)
        good &= ~defined | (tpot <= slo.tpot_ms)  # requests without a TPOT are not judged on it
    if slo.e2e_ms is not None:
        good &= ~np.isnan(c.e2e_s) & (np.nan_to_num(c.e2e_s, nan=np.inf) * 1e3 <= slo.e2e_ms)
    return int(good.sum())


def distributions(measured: Columns, points: int = 101) -> dict[str, list[float]]:
    """TTFT and ITL quantiles (ms) at ``points`` evenly spaced shares from 0 to 1: the CDFs the report draws."""
    _, itl = _gaps(measured)
    ttft = measured.ttft_s[~np.isnan(measured.ttft_s)]
    shares = np.linspace(0, 100, points)
    return {
        name: [float(v) for v in np.percentile(values * 1e3, shares)] if values.size else []
        for name, values in (("ttft_ms", ttft), ("itl_ms", itl))
    }


def figures(measured: Columns, errors: int, window_s: float, slo: Slo | None = None) -> dict[str, Any]:
    """Client-side figures of measured requests over a window (one job, or several jobs pooled)."""
    slo = slo or Slo()
    c = measured
    window = max(window_s, 1e-9)
    icl, itl = _gaps(c)  # new arrays of their own: consumed below, after what reads them unscaled
    merged_chunk_share = float((icl <= _SAME_READ_S).mean()) if icl.size else None
    itl_ms = summarize(itl, 1e3, consume=True)
    icl_ms = itl_ms if icl is itl else summarize(icl, 1e3, consume=True)
    good = _good(c, slo)
    output_tokens = int(c.output_tokens.sum())
    n = len(c)
    return {
        "requests_measured": n,
        "errors": errors,
        "window_s": window_s,
        "ttft_ms": summarize(c.ttft_s[~np.isnan(c.ttft_s)], 1e3),
        "tpot_ms": summarize(_tpot_ms(c)),
        "itl_ms": itl_ms,
        "icl_ms": icl_ms,
        "merged_chunk_share": merged_chunk_share,
        "e2e_ms": summarize(c.e2e_s[~np.isnan(c.e2e_s)], 1e3),
        "output_tokens_per_s": output_tokens / window,
        "request_rate": n / window,
        "goodput_rps": good / window,
        "good_fraction": good / (n + errors) if n or errors else None,
        "prompt_tokens": int(c.prompt_tokens.sum()),
        "cached_tokens": int(c.cached_tokens.sum()),
        "output_tokens": output_tokens,
        "connections": _connections(c),
    }


def _connections(c: Columns) -> dict[str, Any]:
    opened = c.connect_s[~np.isnan(c.connect_s)]
    return {
        "new": int(opened.size),
        "new_share": opened.size / len(c) if len(c) else None,
        "connect_ms": summarize(opened, 1e3),
    }


def analyze(
    records: Iterable[RequestRecord], warmup_s: float, load_duration_s: float, slo: Slo | None = None
) -> dict[str, Any]:
    """``kvbench report analyze``'s figures for one job's records."""
    return analyze_columns(Columns.from_records(list(records)), warmup_s, load_duration_s, slo)


def analyze_columns(
    columns: Columns, warmup_s: float, load_duration_s: float, slo: Slo | None = None
) -> dict[str, Any]:
    """``analyze`` for records already in columns (a batch simulation's million requests)."""
    measured, errors = select_measured(columns, warmup_s, load_duration_s)
    return {"requests_total": len(columns), **figures(measured, errors, load_duration_s - warmup_s, slo)}


def analyze_grouped(
    records: Iterable[RequestRecord],
    by: Literal["workload", "job"],
    warmup_s: float,
    load_duration_s: float | None,
    slo: Slo | None = None,
    windows: dict[str, tuple[float, float | None]] | None = None,
) -> list[dict[str, Any]]:
    """``kvbench report analyze``'s figures per workload or per job, never pooled across workloads.

    Record times are seconds after their own job's load start, so each job has its own window: [warm-up, load end],
    the load end being ``load_duration_s`` or, when not given, the job's last request end. A workload pools its
    jobs' measured requests over the sum of their windows (as the report does); two workloads that ran one after
    the other are never added up as if they ran together.
    """
    jobs: dict[str, list[RequestRecord]] = defaultdict(list)
    for record in records:
        jobs[record.job_id].append(record)
    groups: dict[str, list[tuple[Columns, int, float]]] = defaultdict(list)
    names: dict[str, str] = {}
    sent: dict[str, int] = defaultdict(int)
    for job_id, rows in jobs.items():
        # ``windows``: a job's own (warm-up, load end) as its report used them (an export's metadata)
        warmup, load_end = windows[job_id] if windows and job_id in windows else (warmup_s, load_duration_s)
        if load_end is None:
            load_end = max(r.start_s + (r.e2e_s or 0.0) for r in rows)
        measured, errors = select_measured(Columns.from_records(rows), warmup, load_end)
        key = rows[0].workload if by == "workload" else job_id
        names[key] = rows[0].workload
        sent[key] += len(rows)
        groups[key].append((measured, errors, max(0.0, load_end - warmup)))
    out = []
    for key, parts in groups.items():
        pooled = figures(
            Columns.concat([c for c, _, _ in parts]), sum(e for _, e, _ in parts), sum(w for _, _, w in parts), slo
        )
        label = {"name": key} if by == "workload" else {"job_id": key, "workload": names[key]}
        out.append({**label, "jobs": len(parts), "requests_total": sent[key], **pooled})
    return out
