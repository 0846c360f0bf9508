"""Engine metrics mapped to one schema (reference/stacks.md: names per engine).

Counters (cumulative, differenced by the reporter over measured windows):
  prompt_tokens, prompt_tokens_gpu, prompt_tokens_host, prompt_tokens_disk, prompt_tokens_remote,
  prompt_tokens_transferred, prompt_tokens_recomputed, kv_bytes_loaded_host, kv_bytes_stored_host,
  kv_bytes_loaded_disk, kv_bytes_stored_disk, kv_bytes_loaded_remote, kv_bytes_stored_remote,
  prompt_tokens_external (a connector's hits the engine does not attribute), kv_bytes_transferred, kv_transfers,
  preemptions, sim_tokens_written and sim_tokens_late_over_<bound>us (simulator only)
Gauges: kv_usage (0..1)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

from kvbench_contracts.engine import (
    NORMALIZED_COUNTERS,
    NORMALIZED_GAUGES,
    SIM_KV_BYTES_SENT,
    SIM_LATE_BOUNDS_US,
    sim_late_counter,
)
from kvbench_node_agent import engine_metrics as m

__all__ = ["COUNTERS", "GAUGES", "engine_kind", "normalize"]

COUNTERS = NORMALIZED_COUNTERS
GAUGES = NORMALIZED_GAUGES

_LABELS = re.compile(r'(\w+)="([^"]*)"')

Samples = dict[str, float]
ExternalTier = Literal["host", "remote", "transferred"] | None


def _sum(samples: Samples, name: str, **labels: str) -> float | None:
    """Sum a series over every label set that matches ``labels``; None when the series is absent."""
    total: float | None = None
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        found = dict(_LABELS.findall(rest))
        if all(found.get(k) == v for k, v in labels.items()):
            total = (total or 0.0) + value
    return total


def _buckets(samples: Samples, name: str) -> dict[float, float]:
    """A histogram's bucket counts by bound as a number (a client may write 0.005 or 5e-03), summed over its other
    labels; one pass over the samples."""
    out: dict[float, float] = {}
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        le = next((_as_float(v) for k, v in _LABELS.findall(rest) if k == "le"), None)
        if le is not None:
            out[le] = out.get(le, 0.0) + value
    return out


def _as_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _at(samples: Samples, read: m.MetricRead, label: str, value: str) -> float | None:
    """A counter summed where ``label`` is ``value``, one of the values its read declares."""
    return _sum(samples, read.total, **read.label(label, value))


def _pool_kv(samples: Samples, read: m.MetricRead) -> float | None:
    """A series labelled by host pool: its kv pool, or the whole when it carries no pool label."""
    kv = _at(samples, read, "pool", "kv")
    return kv if kv is not None else _sum(samples, read.total)


def _first(samples: Samples, *candidates: tuple[str, dict[str, str]]) -> float | None:
    for name, labels in candidates:
        value = _sum(samples, name, **labels)
        if value is not None:
            return value
    return None


_EXTERNAL_KEYS = {
    "host": "prompt_tokens_host",
    "remote": "prompt_tokens_remote",
    "transferred": "prompt_tokens_transferred",
    None: "prompt_tokens_external",
}


def _vllm(s: Samples, external: ExternalTier = None) -> Samples:
    """``external``: where the engine's connector brings KV from, for a vLLM that counts those tokens only as
    external (before 0.32 there is no per-source counter); None: it cannot be told, and they stay unattributed."""
    out: Samples = {}
    prompt = _sum(s, m.VLLM_PROMPT.total)
    by_source = {
        src: _at(s, m.VLLM_CACHED_BY_SOURCE, "source", src) for src in m.VLLM_CACHED_BY_SOURCE.label_values("source")
    }
    if any(v is not None for v in by_source.values()):
        out["prompt_tokens_gpu"] = by_source["device"] or 0.0
        out["prompt_tokens_host"] = by_source["host"] or 0.0
        out["prompt_tokens_disk"] = by_source["disk"] or 0.0
        out["prompt_tokens_transferred"] = by_source["p2p"] or 0.0
        out["prompt_tokens_remote"] = by_source["external_unspecified"] or 0.0
        transferred = _at(s, m.VLLM_BY_SOURCE, "source", "external_kv_transfer")
        if transferred is not None and not out["prompt_tokens_transferred"]:
            # the cache tiers are named by source: what none of them accounts for came from a prefill engine
            attributed = out["prompt_tokens_host"] + out["prompt_tokens_disk"] + out["prompt_tokens_remote"]
            out["prompt_tokens_transferred"] = max(0.0, transferred - attributed)
    else:
        out["prompt_tokens_gpu"] = (
            _first(
                s,
                (m.VLLM_BY_SOURCE.total, m.VLLM_BY_SOURCE.label("source", "local_cache_hit")),
                (m.VLLM_PREFIX_HITS.total, {}),
            )
            or 0.0
        )
        # every token a KV connector brought (offload, LMCache, a shared store, a P/D transfer), in one counter
        brought = _first(
            s,
            (m.VLLM_BY_SOURCE.total, m.VLLM_BY_SOURCE.label("source", "external_kv_transfer")),
            (m.VLLM_EXTERNAL_HITS.total, {}),
        )
        if brought:
            out[_EXTERNAL_KEYS[external]] = brought
    if prompt is not None:
        out["prompt_tokens"] = prompt
        cached = sum(
            out.get(k, 0.0)
            for k in (
                "prompt_tokens_gpu",
                "prompt_tokens_host",
                "prompt_tokens_disk",
                "prompt_tokens_remote",
                "prompt_tokens_transferred",
                "prompt_tokens_external",
            )
        )
        local = _at(s, m.VLLM_BY_SOURCE, "source", "local_compute")
        out["prompt_tokens_recomputed"] = local if local is not None else max(0.0, prompt - cached)
    _put(out, "kv_bytes_loaded_host", _sum(s, m.VLLM_OFFLOAD_LOAD.total))
    _put(out, "kv_bytes_stored_host", _sum(s, m.VLLM_OFFLOAD_STORE.total))
    _put(out, "kv_bytes_loaded_disk", _sum(s, m.VLLM_TIER_READ.total))
    _put(out, "kv_bytes_stored_disk", _sum(s, m.VLLM_TIER_WRITE.total))
    _put(
        out,
        "kv_bytes_transferred",
        _first(s, (m.VLLM_NIXL_BYTES.sum, {}), (m.VLLM_MOONCAKE_BYTES.sum, {})),
    )
    _put(
        out,
        "kv_transfers",
        _first(s, (m.VLLM_NIXL_BYTES.count, {}), (m.VLLM_MOONCAKE_BYTES.count, {})),
    )
    # vLLM labels the store's operations load_get / save_put (and save_exists / lookup_exists, which move no KV)
    _put(out, "kv_bytes_loaded_remote", _at(s, m.VLLM_STORE_BYTES, "operation", "load_get"))
    _put(out, "kv_bytes_stored_remote", _at(s, m.VLLM_STORE_BYTES, "operation", "save_put"))
    _put(out, "prefix_cache_queries", _sum(s, m.VLLM_PREFIX_QUERIES.total))
    _put(out, "prefix_cache_hits", _sum(s, m.VLLM_PREFIX_HITS.total))
    _put(out, "external_cache_queries", _sum(s, m.VLLM_EXTERNAL_QUERIES.total))
    _put(out, "external_cache_hits", _sum(s, m.VLLM_EXTERNAL_HITS.total))
    _put(out, "preemptions", _sum(s, m.VLLM_PREEMPTIONS.total))
    _put(out, "kv_usage", _sum(s, m.VLLM_KV_USAGE.family))
    return out


def _sglang(s: Samples) -> Samples:
    out: Samples = {}
    for src, key in (
        ("device", "prompt_tokens_gpu"),
        ("host", "prompt_tokens_host"),
        ("storage", "prompt_tokens_remote"),
    ):
        _put(out, key, _at(s, m.SGLANG_CACHED, "cache_source", src))
    prompt = _sum(s, m.SGLANG_PROMPT.total)
    if prompt is not None:
        out["prompt_tokens"] = prompt
        total = _at(s, m.SGLANG_CACHED, "cache_source", "total")
        cached = (
            total
            if total is not None
            else sum(out.get(k, 0.0) for k in ("prompt_tokens_gpu", "prompt_tokens_host", "prompt_tokens_remote"))
        )
        out["prompt_tokens_recomputed"] = max(0.0, prompt - cached)
    _put(out, "kv_bytes_loaded_host", _sum(s, m.SGLANG_LOAD_BACK.total))
    _put(out, "kv_bytes_stored_host", _sum(s, m.SGLANG_BACKUP.total))
    # by host pool: the kv pool's tokens (a hybrid model's swa or mamba pools hold the same tokens' other state)
    _put(out, "kv_tokens_loaded_host", _pool_kv(s, m.SGLANG_LOAD_BACK_TOKENS))
    _put(out, "kv_tokens_stored_host", _pool_kv(s, m.SGLANG_BACKUP_TOKENS))
    _put(out, "kv_tokens_loaded_remote", _sum(s, m.SGLANG_PREFETCHED.total))
    _put(out, "kv_tokens_stored_remote", _sum(s, m.SGLANG_STORED.total))
    _put(out, "kv_tokens_evicted", _sum(s, m.SGLANG_EVICTED.total))
    _put(out, "host_tier_used_tokens", _sum(s, m.SGLANG_HOST_USED.family))
    _put(out, "host_tier_capacity_tokens", _sum(s, m.SGLANG_HOST_TOTAL.family))
    # sglang:kv_transfer_total_mb is MiB (srt/observability/req_time_stats.py: bytes / (1024 * 1024)), observed by
    # the prefill server as it sends (the decode side's transfers are its receipts)
    mib = _sum(s, m.SGLANG_TRANSFER_MB.sum)
    _put(out, "kv_bytes_transferred", mib * 1024 * 1024 if mib is not None else None)
    _put(out, "kv_transfers", _sum(s, m.SGLANG_TRANSFER_MB.count))
    _put(out, "preemptions", _sum(s, m.SGLANG_RETRACTED.total))
    _put(out, "kv_usage", _sum(s, m.SGLANG_TOKEN_USAGE.family))
    return out


_TRTLLM_TIERS = {"gpu": "prompt_tokens_gpu", "host": "prompt_tokens_host", "disk": "prompt_tokens_disk"}


def _trtllm(s: Samples) -> Samples:
    """TensorRT-LLM's MetricsCollector: prompt tokens served from the KV cache by the tier backing each cache level
    (``cache_tier`` gpu, host or disk; pages prefetched from disk to host count as host), else all of them as the
    GPU's; blocks reused and missed; bytes between GPU and host."""
    out: Samples = {}
    by_tier = {tier: _at(s, m.TRTLLM_CACHED_BY_TIER, "cache_tier", tier) for tier in _TRTLLM_TIERS}
    if any(v is not None for v in by_tier.values()):
        for tier, key in _TRTLLM_TIERS.items():
            out[key] = by_tier[tier] or 0.0
    else:
        _put(out, "prompt_tokens_gpu", _sum(s, m.TRTLLM_CACHED.total))
    prompt = _sum(s, m.TRTLLM_PROMPT.total)
    if prompt is not None:
        out["prompt_tokens"] = prompt
        cached = sum(out.get(k, 0.0) for k in _TRTLLM_TIERS.values())
        out["prompt_tokens_recomputed"] = max(0.0, prompt - cached)
    _put(out, "kv_blocks_reused", _sum(s, m.TRTLLM_BLOCKS_REUSED.total))
    _put(out, "kv_blocks_missed", _sum(s, m.TRTLLM_BLOCKS_MISSED.total))
    _put(out, "kv_bytes_loaded_host", _sum(s, m.TRTLLM_ONBOARD.total))
    _put(out, "kv_bytes_stored_host", _sum(s, m.TRTLLM_OFFLOAD.total))
    _put(out, "kv_usage", _sum(s, m.TRTLLM_KV_USAGE.family))
    return out


def _lmcache(s: Samples) -> Samples:
    """LMCache's own counters (real 0.5.1 texts in the tests; names checked against 0.5.1 and 0.5.6 by the
    conformance suite): the hits its MP server served by tier, which split the engines' unattributed connector hits
    (the server counts no prompt of its own, so nothing here is a prompt_tokens_* source), its L2 writes submitted
    and completed, and L2 records it evicted. OpenTelemetry exports a counter only once it moved: absent is 0."""
    out: Samples = {}
    hit = _sum(s, m.LMCACHE_HIT.total)
    l1, l2 = _sum(s, m.LMCACHE_HIT_L1.total), _sum(s, m.LMCACHE_HIT_L2.total)
    if hit is not None and (l1 is not None or l2 is not None):  # 0.5.6 splits its hits by tier itself
        out["cache_server_hit_tokens_host"] = l1 or 0.0
        out["cache_server_hit_tokens_disk"] = l2 or 0.0
    elif hit is not None:
        # 0.5.1: chunks served to the engines, some first prefetched from L2 into L1 (L1's own reads also count its
        # writes to L2, so they are no denominator); LMCache keeps only full chunks: the share of chunks is that of
        # tokens
        served = _sum(s, m.LMCACHE_CHUNKS_LOADED.total) or 0.0
        from_l2 = _sum(s, m.LMCACHE_L2_PREFETCHED.total) or 0.0
        disk = hit * min(1.0, from_l2 / served) if served else 0.0
        out["cache_server_hit_tokens_host"] = hit - disk
        out["cache_server_hit_tokens_disk"] = disk
    submitted = _sum(s, m.LMCACHE_L2_SUBMITTED.total)
    if submitted is not None:
        out["kv_store_chunks_submitted"] = submitted
        # absent, not 0, while no write has completed (LMCache 0.5.1 with every O_DIRECT write failing)
        out["kv_store_chunks_completed"] = _sum(s, m.LMCACHE_L2_COMPLETED.total) or 0.0
        out["kv_store_chunks_evicted"] = _sum(s, m.LMCACHE_L2_EVICTED.total) or 0.0
    if hit is None:  # the in-process connector's counters: hits, tier unknown
        _put(out, "prompt_tokens_remote", _sum(s, m.LMCACHE_CONNECTOR_HITS.total))
    _put(out, "kv_bytes_loaded_remote", _sum(s, m.LMCACHE_REMOTE_READ.total))
    _put(out, "kv_bytes_stored_remote", _sum(s, m.LMCACHE_REMOTE_WRITE.total))
    return out


def _nixl(s: Samples) -> Samples:
    out: Samples = {}
    _put(out, "kv_bytes_transferred", _sum(s, "agent_tx_bytes_total"))
    return out


def _put(out: Samples, key: str, value: float | None) -> None:
    if value is not None:
        out[key] = value


_KINDS: dict[str, Callable[[Samples], Samples]] = {
    "vllm": _vllm,
    "sglang": _sglang,
    "trtllm": _trtllm,
    "lmcache": _lmcache,
    "nixl": _nixl,
}


def engine_kind(samples: Samples) -> str | None:
    names = {k.partition("{")[0] for k in samples}
    if any(n.startswith("vllm:") for n in names):
        return "vllm"
    if any(n.startswith("sglang:") for n in names):
        return "sglang"
    if any(n.startswith("trtllm_") for n in names):
        return "trtllm"
    if any(n.startswith(("lmcache_mp", "lmcache:")) for n in names):
        return "lmcache"
    if any(n.startswith("agent_tx_bytes") for n in names):
        return "nixl"
    return None


def _sim_pacing(s: Samples) -> Samples:
    """The simulator's pacing slip, whatever engine it imitates: tokens written, and those later than each bound."""
    written = _sum(s, "kvbench_sim_token_lateness_seconds_count")
    if written is None:
        return {}
    out: Samples = {"sim_tokens_written": written}
    buckets = _buckets(s, "kvbench_sim_token_lateness_seconds_bucket")
    for bound in SIM_LATE_BOUNDS_US:
        on_time = buckets.get(bound / 1e6)
        if on_time is not None:
            out[sim_late_counter(bound)] = max(0.0, written - on_time)
    return out


def _sim_disk_tier(s: Samples) -> Samples:
    """What a simulated engine's disk tier holds (a real disk tier is counted on its machine by the agent)."""
    records = _sum(s, "kvbench_sim_tier_chunks", tier="disk")
    size = _sum(s, "kvbench_sim_tier_bytes", tier="disk")
    return {} if records is None or size is None else {"disk_tier_records": records, "disk_tier_bytes": size}


def _sim_pd_sent(s: Samples) -> Samples:
    """A simulated prefill engine's P/D bytes sent (for the simulated switch; no real engine counts them)."""
    sent = _sum(s, "kvbench_sim_pd_bytes_sent_total")
    return {} if sent is None else {SIM_KV_BYTES_SENT: sent}


def normalize(samples: Samples, kind: str | None = None, external: ExternalTier = None) -> Samples:
    """``external``: for vLLM, the tier its connector's unattributed hits come from (the stack says; see
    ``kvbench_stacks.catalog.StackSpec.external_hits_tier``)."""
    kind = kind or engine_kind(samples)
    sim = {**_sim_pacing(samples), **_sim_disk_tier(samples), **_sim_pd_sent(samples)}
    if kind == "vllm":
        return {**_vllm(samples, external), **sim}
    return {**(_KINDS[kind](samples) if kind in _KINDS else {}), **sim}
