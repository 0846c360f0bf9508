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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvbench_contracts.records import RequestRecord

__all__ = ["DEFINITIONS", "Slo", "analyze", "figures", "select_measured", "summarize"]

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
    "clock": "load generator's monotonic clock",
}

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None


def summarize(values: Sequence[float] | np.ndarray[Any, Any], scale: float = 1.0) -> dict[str, float | None]:
    arr = np.asarray(values, dtype=float) * scale
    if arr.size == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}, "count": 0}
    pct = np.percentile(arr, PERCENTILES)
    out: dict[str, float | None] = {"mean": float(arr.mean())}
    out.update({f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)})
    out["count"] = float(arr.size)
    return out


def _tpot(r: RequestRecord) -> float | None:
    if r.ttft_s is None or r.e2e_s is None or r.output_tokens < 2:
        return None
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)


def _meets(r: RequestRecord, slo: Slo) -> bool:
    if slo.ttft_ms is not None and (r.ttft_s is None or r.ttft_s * 1e3 > slo.ttft_ms):
        return False
    if slo.tpot_ms is not None:
        tpot = _tpot(r)
        if tpot is not None and tpot * 1e3 > slo.tpot_ms:
            return False
    return not (slo.e2e_ms is not None and (r.e2e_s is None or r.e2e_s * 1e3 > slo.e2e_ms))


def select_measured(
    records: Iterable[RequestRecord], warmup_s: float, load_duration_s: float
) -> tuple[list[RequestRecord], int]:
    """Measured successes and the count of errors that started inside the window."""
    measured: list[RequestRecord] = []
    errors = 0
    for r in records:
        if r.start_s < warmup_s:
            continue
        if r.ok:
            if r.e2e_s is not None and r.start_s + r.e2e_s <= load_duration_s:
                measured.append(r)
        elif r.start_s < load_duration_s:
            errors += 1
    return measured, errors


def figures(measured: Sequence[RequestRecord], errors: int, window_s: float, slo: Slo | None = None) -> dict[str, Any]:
    """Client-side figures of measured requests over a window (one job, or several jobs pooled)."""
    slo = slo or Slo()
    window = max(window_s, 1e-9)
    ttft = [r.ttft_s for r in measured if r.ttft_s is not None]
    e2e = [r.e2e_s for r in measured if r.e2e_s is not None]
    tpot = [t for t in (_tpot(r) for r in measured) if t is not None]
    itl: list[float] = []
    icl: list[float] = []
    for r in measured:
        times, tokens = r.chunk_times_s, r.chunk_tokens
        for i in range(1, len(times)):
            gap = times[i] - times[i - 1]
            icl.append(gap)
            m = tokens[i] if i < len(tokens) and tokens[i] > 0 else 1
            itl.extend([gap / m] * m)
    good = sum(1 for r in measured if _meets(r, slo))
    output_tokens = sum(r.output_tokens for r in measured)
    return {
        "requests_measured": len(measured),
        "errors": errors,
        "window_s": window_s,
        "ttft_ms": summarize(ttft, 1e3),
        "tpot_ms": summarize(tpot, 1e3),
        "itl_ms": summarize(itl, 1e3),
        "icl_ms": summarize(icl, 1e3),
        "e2e_ms": summarize(e2e, 1e3),
        "output_tokens_per_s": output_tokens / window,
        "request_rate": len(measured) / window,
        "goodput_rps": good / window,
        "good_fraction": good / (len(measured) + errors) if measured or errors else None,
        "prompt_tokens": sum(r.prompt_tokens for r in measured),
        "cached_tokens": sum(r.cached_tokens or 0 for r in measured),
        "output_tokens": output_tokens,
    }


def analyze(
    records: Iterable[RequestRecord], warmup_s: float, load_duration_s: float, slo: Slo | None = None
) -> dict[str, Any]:
    """``kvbench report analyze``'s figures for one job's records."""
    all_records = list(records)
    measured, errors = select_measured(all_records, warmup_s, load_duration_s)
    return {"requests_total": len(all_records), **figures(measured, errors, load_duration_s - warmup_s, slo)}
