"""Statistics the report states: repeat intervals, stability over time slices, drift of TTFT.

- Repeats: mean, sample standard deviation and a two-sided Student-t 95% interval (n - 1 degrees of freedom).
- Stability: the coefficient of variation of a per-slice figure over equal time slices of the window.
- Drift: the least-squares slope of per-slice median TTFT against time, flagged when its t statistic exceeds
  the 95% critical value (the slope differs from zero) and it moves TTFT by more than 10% over the window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvbench_core.columns import Columns

__all__ = ["T95", "drift", "repeat_interval", "slice_figures", "t_critical_95"]

# two-sided 95% critical values of Student's t, by degrees of freedom (standard tables)
T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    25: 2.060,
    30: 2.042,
    40: 2.021,
    60: 2.000,
    120: 1.980,
}


def t_critical_95(df: int) -> float:
    if df <= 0:
        return math.inf
    if df in T95:
        return T95[df]
    larger = [k for k in T95 if k > df]
    return T95[min(larger)] if larger else 1.960  # the next tabulated df is the conservative choice


def repeat_interval(values: Sequence[float | None]) -> dict[str, Any]:
    clean = [float(v) for v in values if v is not None]
    n = len(clean)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "ci95": None}
    mean = sum(clean) / n
    if n < 2:
        return {"n": n, "mean": mean, "std": None, "ci95": None}
    std = float(np.std(clean, ddof=1))
    half = t_critical_95(n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "ci95": [mean - half, mean + half]}


def slice_figures(measured: Columns, warmup_s: float, load_end_s: float, slices: int = 10) -> list[dict[str, Any]]:
    """Per time slice of the window (by request start): requests, output tokens/s, median TTFT, hit ratio."""
    window = load_end_s - warmup_s
    if window <= 0 or slices <= 0:
        return []
    width = window / slices
    index = np.clip(((measured.start_s - warmup_s) // width).astype(np.int64), 0, slices - 1)
    out = []
    for i in range(slices):
        mask = index == i
        ttft = measured.ttft_s[mask]
        ttft = ttft[~np.isnan(ttft)]
        prompt = int(measured.prompt_tokens[mask].sum())
        out.append(
            {
                "start_s": warmup_s + i * width,
                "end_s": warmup_s + (i + 1) * width,
                "requests": int(mask.sum()),
                "output_tokens_per_s": float(measured.output_tokens[mask].sum()) / width,
                "ttft_p50_ms": float(np.percentile(ttft, 50)) * 1e3 if ttft.size else None,
                "cache_hit_ratio": float(measured.cached_tokens[mask].sum()) / prompt if prompt else None,
            }
        )
    return out


def coefficient_of_variation(values: Sequence[float | None]) -> float | None:
    clean = [float(v) for v in values if v is not None]
    if len(clean) < 2 or sum(clean) == 0:
        return None
    return float(np.std(clean, ddof=1) / np.mean(clean))


def drift(times: Sequence[float], values: Sequence[float | None]) -> dict[str, Any]:
    pairs = [(t, float(v)) for t, v in zip(times, values, strict=True) if v is not None]
    if len(pairs) < 3:
        return {"slope_ms_per_s": None, "t": None, "significant": False, "relative_change": None}
    x = np.array([p[0] for p in pairs])
    y = np.array([p[1] for p in pairs])
    slope, intercept = np.polyfit(x, y, 1)
    residuals = y - (slope * x + intercept)
    dof = len(pairs) - 2
    sxx = float(((x - x.mean()) ** 2).sum())
    se = math.sqrt(float((residuals**2).sum()) / dof / sxx) if sxx > 0 and dof > 0 else 0.0
    t = float(slope / se) if se > 0 else (math.inf if slope else 0.0)
    change = float(slope * (x.max() - x.min()) / y.mean()) if y.mean() else None
    significant = abs(t) > t_critical_95(dof) and change is not None and abs(change) > 0.10
    return {"slope_ms_per_s": float(slope), "t": t, "significant": significant, "relative_change": change}
