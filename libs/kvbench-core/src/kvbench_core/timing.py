"""Whether a job's TTFT and ITL can be trusted: the load generator's own lag and, on the simulated cluster, the
engines' pacing slip, held against stated thresholds.

A busy machine delays the client's reads (chunks waiting in the socket together share one receive stamp), its
scheduled sends and, for simulated engines, the writes of tokens that the model says are due. None of that is the
engine under test. The figures stay as measured; the report marks them unreliable with the reason, and the
job's validity says so, so a loaded machine gives flagged figures instead of silently wrong ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvbench_contracts.engine import SIM_LATE_BOUNDS_US, SIM_LATE_US, sim_late_counter
from kvbench_contracts.events import SEND_LATE_MS, ClientTiming

__all__ = [
    "TIMING_DEFINITION",
    "TIMING_THRESHOLDS",
    "engine_late_share",
    "engine_slip_p99_ms",
    "timing_verdict",
    "worst_client_timing",
]

TIMING_THRESHOLDS: dict[str, float] = {
    # the client's event loop: a timer firing this late at p99 delays one read or send in a hundred as much
    "loop_lag_p99_ms": 10.0,
    # content chunks whose gap from the previous chunk is zero: read together, so their ITL split is lost
    "merged_chunk_share": 0.02,
    # scheduled sends (request rate, trace) more than SEND_LATE_MS behind their schedule
    "sends_late_share": 0.05,
    # simulated engines: tokens written more than 5 ms after the model's due time
    "engine_late_token_share": 0.005,
    # the client's lag and the engines' slip at p99 (in engine time) against the p99 ITL they would distort: a
    # third of it at most, so a reliable p99 ITL is off by less than half of the true one
    "itl_noise_share": 1 / 3,
}

TIMING_DEFINITION = (
    "TTFT and ITL are unreliable when the load generator's event loop ran more than "
    f"{TIMING_THRESHOLDS['loop_lag_p99_ms']:g} ms late at p99, more than "
    f"{TIMING_THRESHOLDS['merged_chunk_share']:.0%} of content chunks arrived merged with the previous one (zero "
    f"gap), more than {TIMING_THRESHOLDS['sends_late_share']:.0%} of scheduled sends left over {SEND_LATE_MS:g} ms "
    "late, or "
    f"(simulated engines) more than {TIMING_THRESHOLDS['engine_late_token_share']:.1%} of tokens were written over "
    "5 ms after their modelled time, or the client's lag and the engines' slip at p99 (times the time scale) add up "
    f"to over {TIMING_THRESHOLDS['itl_noise_share']:.0%} of the p99 ITL they would distort"
)


def worst_client_timing(shards: Sequence[ClientTiming]) -> ClientTiming | None:
    """Several load generators' lag figures as one, the worst of each (a shard or worker that fell behind taints
    the pooled figures); sample counts add up."""
    if not shards:
        return None
    worst: dict[str, Any] = {}
    for field in ClientTiming.model_fields:
        values = [getattr(s, field) for s in shards if getattr(s, field) is not None]
        if values:
            worst[field] = sum(values) if field in ("loop_lag_samples", "sends_scheduled") else max(values)
    return ClientTiming.model_validate(worst)


def engine_late_share(deltas: dict[str, Any] | None) -> float | None:
    """The share of a window's simulated tokens written more than ``SIM_LATE_US`` late; None for real engines."""
    written = float((deltas or {}).get("sim_tokens_written") or 0.0)
    return float((deltas or {}).get(sim_late_counter(SIM_LATE_US)) or 0.0) / written if written else None


def engine_slip_p99_ms(deltas: dict[str, Any] | None) -> float | None:
    """The simulated engines' pacing slip at p99 over a window, interpolated within the kept lateness buckets as
    Prometheus' histogram_quantile does (an upper estimate: tokens written early count as 0 late); past the last
    bound, that bound. None for real engines (they have no pacer)."""
    written = float((deltas or {}).get("sim_tokens_written") or 0.0)
    if not written or deltas is None:
        return None
    rank = 0.99 * written
    lower_us, below_lower = 0.0, 0.0
    for bound in SIM_LATE_BOUNDS_US:
        late = deltas.get(sim_late_counter(bound))
        if late is None:
            return None
        on_time = written - float(late)
        if on_time >= rank:
            inside = on_time - below_lower
            fraction = (rank - below_lower) / inside if inside > 0 else 1.0
            return (lower_us + (bound - lower_us) * fraction) / 1e3
        lower_us, below_lower = float(bound), on_time
    return lower_us / 1e3


def timing_verdict(
    client: ClientTiming | None,
    merged_chunk_share: float | None,
    engine_late_token_share: float | None = None,
    *,
    itl_p99_ms: float | None = None,
    engine_slip_p99_ms: float | None = None,
    time_scale: float = 1.0,
) -> dict[str, Any]:
    """``{"reliable", "reasons", "figures"}`` for one job (or a pooled workload: pass the worst of its jobs).

    ``itl_p99_ms`` (engine time) with ``time_scale`` (engine seconds per wall second): the client's lag and the
    engines' slip are wall-clock delays, so a cluster paced faster than real time magnifies them in the figures."""
    reasons: list[str] = []
    limit = TIMING_THRESHOLDS
    lag = client.loop_lag_p99_ms if client is not None else None
    if lag is not None and lag > limit["loop_lag_p99_ms"]:
        reasons.append(
            f"the load generator's event loop ran {lag:.1f} ms late at p99 (threshold {limit['loop_lag_p99_ms']:g} "
            "ms): the client's machine was busy"
        )
    if merged_chunk_share is not None and merged_chunk_share > limit["merged_chunk_share"]:
        reasons.append(
            f"{merged_chunk_share:.1%} of content chunks were read together with the previous one (threshold "
            f"{limit['merged_chunk_share']:.0%}): the client read late, so ITL is split wrongly"
        )
    late = client.sends_late_share if client is not None else None
    if client is not None and late is not None and late > limit["sends_late_share"]:
        reasons.append(
            f"{late:.1%} of scheduled sends left more than {SEND_LATE_MS:g} ms late "
            f"(p99 {client.send_late_p99_ms or 0:.1f} ms; "
            f"threshold {limit['sends_late_share']:.0%}): the offered load was not the one asked for"
        )
    if engine_late_token_share is not None and engine_late_token_share > limit["engine_late_token_share"]:
        reasons.append(
            f"the simulated engines wrote {engine_late_token_share:.1%} of tokens more than 5 ms after their modelled "
            f"time (threshold {limit['engine_late_token_share']:.1%}): this machine's CPU, not the model"
        )
    noise_ms = time_scale * ((lag or 0.0) + (engine_slip_p99_ms or 0.0))
    measured_noise = lag is not None or engine_slip_p99_ms is not None
    if itl_p99_ms and measured_noise and noise_ms > limit["itl_noise_share"] * itl_p99_ms:
        parts = [f"the client's loop lag at p99 ({lag or 0.0:.1f} ms)"]
        if engine_slip_p99_ms is not None:
            parts.append(f"the simulated engines' pacing slip at p99 ({engine_slip_p99_ms:.1f} ms)")
        scaled = f", times the time scale {time_scale:g}," if time_scale != 1.0 else ""
        reasons.append(
            f"{' plus '.join(parts)}{scaled} come to {noise_ms:.1f} ms, over {limit['itl_noise_share']:.0%} of the "
            f"p99 ITL ({itl_p99_ms:.1f} ms): the tail of ITL is within this machine's timing noise"
        )
    return {
        "reliable": not reasons,
        "reasons": reasons,
        "figures": {
            "loop_lag_p99_ms": lag,
            "loop_lag_max_ms": client.loop_lag_max_ms if client is not None else None,
            "merged_chunk_share": merged_chunk_share,
            "sends_late_share": late,
            "engine_late_token_share": engine_late_token_share,
            "engine_slip_p99_ms": engine_slip_p99_ms,
            "itl_noise_ms": noise_ms if itl_p99_ms else None,
        },
    }
