"""Did it help? Each workload against the run's baseline: speed-ups with a 95% interval across repeats and a
plain verdict.

A speed-up is always "higher is better": baseline TTFT / workload TTFT, workload throughput / baseline
throughput. Repeats are paired by (load level, repeat index), which ran in the same order under the same plan.
Ratios are averaged on a log scale (a 2x gain and a 2x loss cancel; one lucky repeat cannot drag the mean past
the others): the speed-up is the geometric mean of the paired ratios and its interval is Student's t over their
logarithms, exponentiated. The verdict reads the interval: above 1 is "helped",
below 1 is "hurt", across 1 is "no significant difference"; fewer than two pairs is "not enough repeats to say".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from kvbench_core.stats import repeat_interval

__all__ = ["COMPARE_DEFINITION", "FIGURES", "Verdict", "choose_baseline", "compare_to_baseline"]

Verdict = Literal["helped", "no significant difference", "hurt", "not enough repeats to say", "no valid result"]

# name -> (how a job holds it, True when lower is better)
FIGURES: dict[str, tuple[tuple[str, ...], bool]] = {
    "ttft_p50": (("ttft_ms", "p50"), True),
    "ttft_p99": (("ttft_ms", "p99"), True),
    "output_tokens_per_s": (("output_tokens_per_s",), False),
    "goodput_rps": (("goodput_rps",), False),
}

COMPARE_DEFINITION = (
    "speed-up against the baseline workload (the plan's baseline, else its first own_cache workload), higher is "
    "better: baseline TTFT / TTFT, throughput / baseline throughput; jobs paired by load level and repeat; "
    "geometric mean of the paired ratios and the exponentiated Student-t 95% interval of their logarithms; helped "
    "when the interval lies above 1, hurt when below, no significant difference when it spans 1, not enough "
    "repeats to say with fewer than 2 pairs; the headline verdict is TTFT p50's"
)


def choose_baseline(names_in_order: Sequence[str], strategies: Mapping[str, str], named: str | None) -> str | None:
    if named and named in names_in_order:
        return named
    return next((n for n in names_in_order if strategies.get(n) == "own_cache"), None)


def _value(job: Mapping[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = job
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, int | float) and not math.isnan(value) else None


# pairs below which no interval is stated: with two, Student's t has one degree of freedom and its 95% interval spans
# orders of magnitude (0.00-152,676,502x was printed), which says nothing; the report calls such results preliminary
MIN_PAIRS_FOR_INTERVAL = 3


def _geometric_interval(ratios: list[float | None]) -> dict[str, Any]:
    """Geometric mean of the ratios and the exponentiated Student-t 95% interval of their logarithms (from three
    pairs on)."""
    logs = repeat_interval([math.log(r) if r is not None else None for r in ratios])
    if logs["mean"] is None:
        return logs
    if logs["n"] < MIN_PAIRS_FOR_INTERVAL:
        logs = {**logs, "ci95": None}
    return {
        "n": logs["n"],
        "mean": math.exp(logs["mean"]),
        "log_std": logs["std"],
        "ci95": [math.exp(logs["ci95"][0]), math.exp(logs["ci95"][1])] if logs["ci95"] else None,
    }


def _verdict(interval: dict[str, Any]) -> Verdict:
    if interval["ci95"] is None:
        return "not enough repeats to say"
    low, high = interval["ci95"]
    if low > 1.0:
        return "helped"
    if high < 1.0:
        return "hurt"
    return "no significant difference"


def compare_to_baseline(
    jobs: Sequence[Mapping[str, Any]], baseline_jobs: Sequence[Mapping[str, Any]], baseline: str
) -> dict[str, Any]:
    """The workload's speed-ups over the baseline's, per figure, and one headline verdict."""
    base = {(j["load_level"], j["repeat"]): j for j in baseline_jobs if j.get("status") == "succeeded"}
    pairs = [
        (j, base[key])
        for j in jobs
        if j.get("status") == "succeeded" and (key := (j["load_level"], j["repeat"])) in base
    ]
    speedups: dict[str, Any] = {}
    for name, (path, lower_is_better) in FIGURES.items():
        ratios: list[float | None] = []
        for mine, theirs in pairs:
            a, b = _value(mine, path), _value(theirs, path)
            if a is None or b is None or a <= 0 or b <= 0:
                ratios.append(None)
                continue
            ratios.append(b / a if lower_is_better else a / b)
        interval = _geometric_interval(ratios)
        speedups[name] = {**interval, "verdict": _verdict(interval) if interval["n"] else "no valid result"}
    headline: Verdict = speedups["ttft_p50"]["verdict"] if pairs else "no valid result"
    return {"baseline": baseline, "pairs": len(pairs), "speedup": speedups, "verdict": headline}
