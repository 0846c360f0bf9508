"""Every engine series the normaliser reads, with the type and the versions the engine's own code gives it.

One place for the names: normalize.py reads through these, and the conformance suite (tools/conformance) checks each
against the metric definitions in the engine's installed package, version by version (a name the engine does not
define at a version it is claimed for, or a gauge read as a counter, fails it). The label values the normaliser
selects a series by are declared here too (``labels``), and read only through ``MetricRead.label``: the suite checks
that the engine's source holds each label and value, so a renamed one (vLLM's Mooncake store operations are
``load_get``/``save_put``, never ``get``/``put``) fails it instead of reading as missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["READS", "MetricRead", "reads_of", "version_tuple"]

Kind = Literal["counter", "gauge", "histogram"]


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("+", maxsplit=1)[0].split(".") if p.isdigit())


@dataclass(frozen=True)
class MetricRead:
    engine: str  # vllm | sglang | trtllm | lmcache
    family: str  # the name the engine defines (prometheus_client adds _total to a counter's sample)
    kind: Kind
    use: str
    since: str | None = None  # the first checked version that defines it (older ones do not)
    # label name -> the values the normaliser selects this series by
    labels: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def label(self, name: str, value: str) -> dict[str, str]:
        """The selector ``{name: value}`` for one of the declared label values (a value not declared is a bug
        here, not a series that reads as absent)."""
        if value not in dict(self.labels).get(name, ()):
            raise KeyError(f"{self.family} declares no {name}={value!r}; add it to its labels")
        return {name: value}

    def label_values(self, name: str) -> tuple[str, ...]:
        return dict(self.labels)[name]

    @property
    def total(self) -> str:
        """The sample a counter is exposed as (a family that already ends in _total keeps one)."""
        return self.family if self.family.endswith("_total") else f"{self.family}_total"

    @property
    def sum(self) -> str:
        return f"{self.family}_sum"

    @property
    def count(self) -> str:
        return f"{self.family}_count"

    def defined_at(self, version: str) -> bool:
        return self.since is None or version_tuple(version) >= version_tuple(self.since)


READS: list[MetricRead] = []


def _read(
    engine: str,
    family: str,
    kind: Kind,
    use: str,
    since: str | None = None,
    labels: dict[str, tuple[str, ...]] | None = None,
) -> MetricRead:
    read = MetricRead(engine, family, kind, use, since, tuple((labels or {}).items()))
    READS.append(read)
    return read


def reads_of(engine: str) -> list[MetricRead]:
    return [r for r in READS if r.engine == engine]


# vLLM (vllm/v1/metrics/loggers.py, the KV connectors' metrics modules, vllm/v1/kv_offload)
VLLM_PROMPT = _read("vllm", "vllm:prompt_tokens", "counter", "prompt_tokens")
# first defined in 0.32.0 (by source: device/host/disk/p2p/external_unspecified). The `since` versions are read
# off each release's own source (0.25.1 to 0.33.0, tools/conformance/checks/metric_names.py); the suite checks them
# against the versions it installs.
VLLM_CACHED_BY_SOURCE = _read(
    "vllm",
    "vllm:prompt_tokens_cached_by_source",
    "counter",
    "cache hits by tier",
    since="0.32.0",
    labels={"source": ("device", "host", "disk", "p2p", "external_unspecified")},  # vllm CacheHitSource
)
VLLM_BY_SOURCE = _read(
    "vllm",
    "vllm:prompt_tokens_by_source",
    "counter",
    "local hits, connector hits, recompute",
    labels={"source": ("local_cache_hit", "external_kv_transfer", "local_compute")},
)
VLLM_PREFIX_HITS = _read("vllm", "vllm:prefix_cache_hits", "counter", "GPU prefix-cache hits (tokens)")
VLLM_PREFIX_QUERIES = _read("vllm", "vllm:prefix_cache_queries", "counter", "tokens asked of the GPU prefix cache")
VLLM_EXTERNAL_HITS = _read("vllm", "vllm:external_prefix_cache_hits", "counter", "connector hits (tokens)")
VLLM_EXTERNAL_QUERIES = _read(
    "vllm", "vllm:external_prefix_cache_queries", "counter", "tokens asked of the KV connector"
)
VLLM_OFFLOAD_LOAD = _read("vllm", "vllm:kv_offload_load_bytes", "counter", "bytes loaded from host memory")
VLLM_OFFLOAD_STORE = _read("vllm", "vllm:kv_offload_store_bytes", "counter", "bytes stored to host memory")
# the offload connector's disk tiering: first defined in 0.28.0 (not in 0.25.1 to 0.27.0)
VLLM_TIER_READ = _read(
    "vllm", "vllm:kv_offload_tiering_read_bytes", "counter", "bytes read from the disk tier", since="0.28.0"
)
VLLM_TIER_WRITE = _read(
    "vllm", "vllm:kv_offload_tiering_write_bytes", "counter", "bytes written to the disk tier", since="0.28.0"
)
VLLM_NIXL_BYTES = _read("vllm", "vllm:nixl_bytes_transferred", "histogram", "P/D bytes and transfers (NIXL)")
# the Mooncake P/D connector's own transfer histogram: first defined in 0.33.0 (not in 0.25.1 to 0.32.0)
VLLM_MOONCAKE_BYTES = _read(
    "vllm", "vllm:mooncake_bytes_transferred", "histogram", "P/D bytes and transfers (Mooncake)", since="0.33.0"
)
# operations load_get / save_put (and save_exists / lookup_exists, which move no KV)
VLLM_STORE_BYTES = _read(
    "vllm",
    "vllm:mooncake_store_operation_bytes_total",
    "counter",
    "remote store bytes",
    labels={"operation": ("load_get", "save_put")},
)
VLLM_PREEMPTIONS = _read("vllm", "vllm:num_preemptions", "counter", "preemptions")
VLLM_KV_USAGE = _read("vllm", "vllm:kv_cache_usage_perc", "gauge", "GPU KV usage")

# SGLang (sglang/srt/observability/metrics_collector.py)
SGLANG_CACHED = _read(
    "sglang",
    "sglang:cached_tokens_total",
    "counter",
    "hits by cache_source device/host/storage",
    labels={"cache_source": ("device", "host", "storage", "total")},
)
SGLANG_PROMPT = _read("sglang", "sglang:prompt_tokens_total", "counter", "prompt_tokens")
SGLANG_LOAD_BACK = _read("sglang", "sglang:load_back_bytes_total", "counter", "bytes loaded back from host memory")
SGLANG_BACKUP = _read("sglang", "sglang:hicache_backup_bytes_total", "counter", "bytes backed up to host memory")
# HiCache in tokens (0.5.20 and 0.5.23): host -> GPU and GPU -> host by host pool (kv, swa, mamba: the kv pool is
# read), host <-> storage (L3), GPU slots freed by eviction, and the host pool's use and capacity
_KV_POOL: dict[str, tuple[str, ...]] = {"pool": ("kv",)}
SGLANG_LOAD_BACK_TOKENS = _read(
    "sglang", "sglang:load_back_tokens_total", "counter", "tokens host -> GPU, by pool", labels=_KV_POOL
)
SGLANG_BACKUP_TOKENS = _read(
    "sglang", "sglang:hicache_backup_tokens_total", "counter", "tokens GPU -> host, by pool", labels=_KV_POOL
)
SGLANG_PREFETCHED = _read("sglang", "sglang:prefetched_tokens_total", "counter", "tokens storage (L3) -> host")
SGLANG_STORED = _read("sglang", "sglang:backuped_tokens_total", "counter", "tokens host -> storage (L3)")
SGLANG_EVICTED = _read("sglang", "sglang:evicted_tokens_total", "counter", "GPU KV slots freed by eviction")
SGLANG_HOST_USED = _read("sglang", "sglang:hicache_host_used_tokens", "gauge", "host pool tokens in use")
SGLANG_HOST_TOTAL = _read("sglang", "sglang:hicache_host_total_tokens", "gauge", "host pool capacity, tokens")
SGLANG_TRANSFER_MB = _read("sglang", "sglang:kv_transfer_total_mb", "histogram", "P/D megabytes and transfers")
# a counter of retracted requests; sglang:num_retracted_reqs is a gauge (the requests retracted now)
SGLANG_RETRACTED = _read("sglang", "sglang:num_retracted_requests_total", "counter", "preemptions")
SGLANG_TOKEN_USAGE = _read("sglang", "sglang:token_usage", "gauge", "GPU KV usage")

# TensorRT-LLM (tensorrt_llm/metrics/collector.py, MetricsCollector; read off NVIDIA/TensorRT-LLM at commit 050f80d,
# no wheel installs here: tools/conformance/recorded/trtllm.toml keeps the families with their types, and the agent's
# tests hold these reads to it). The per-request counters need `return_perf_metrics: true` in the engine's config.
TRTLLM_PROMPT = _read("trtllm", "trtllm_prompt_tokens_total", "counter", "prompt_tokens")
TRTLLM_CACHED = _read("trtllm", "trtllm_prompt_cached_tokens_total", "counter", "prompt tokens served from KV cache")
TRTLLM_CACHED_BY_TIER = _read(
    "trtllm",
    "trtllm_prompt_cache_hit_tokens_total",
    "counter",
    "the same by cache_level and cache_tier gpu/host/disk",
    labels={"cache_tier": ("gpu", "host", "disk")},
)
TRTLLM_BLOCKS_REUSED = _read("trtllm", "trtllm_kv_cache_reused_blocks", "counter", "KV cache blocks reused")
TRTLLM_BLOCKS_MISSED = _read("trtllm", "trtllm_kv_cache_missed_blocks", "counter", "KV cache blocks missed")
TRTLLM_ONBOARD = _read("trtllm", "trtllm_kv_cache_onboard_bytes_total", "counter", "bytes host -> GPU")
TRTLLM_OFFLOAD = _read("trtllm", "trtllm_kv_cache_offload_bytes_total", "counter", "bytes GPU -> host")
TRTLLM_KV_USAGE = _read("trtllm", "trtllm_kv_cache_utilization", "gauge", "GPU KV usage")

# LMCache: the MP server's OpenTelemetry instruments (lmcache/v1/mp_observability/subscribers/metrics/*.py), named as
# OpenTelemetry's Prometheus exporter writes them (dots to underscores, the unit appended), and the in-process
# connector's prometheus_client counters (lmcache/observability.py). 0.5.1 and 0.5.6 are the checked versions.
LMCACHE_HIT = _read("lmcache", "lmcache_mp_lookup_hit_tokens", "counter", "tokens the MP server served (L1 + L2)")
LMCACHE_HIT_L1 = _read(
    "lmcache", "lmcache_mp_lookup_hit_l1_tokens", "counter", "of those, from L1 (RAM)", since="0.5.6"
)
LMCACHE_HIT_L2 = _read(
    "lmcache", "lmcache_mp_lookup_hit_l2_tokens", "counter", "of those, from L2 (disk)", since="0.5.6"
)
LMCACHE_CHUNKS_LOADED = _read("lmcache", "lmcache_mp_num_chunks_loaded", "counter", "chunks loaded into engines")
LMCACHE_L2_PREFETCHED = _read(
    "lmcache", "lmcache_mp_l2_prefetch_load_completed_chunks", "counter", "chunks prefetched from L2 (0.5.1's split)"
)
LMCACHE_L2_SUBMITTED = _read(
    "lmcache", "lmcache_mp_l2_store_submitted_objects_chunks", "counter", "L2 writes submitted"
)
LMCACHE_L2_COMPLETED = _read("lmcache", "lmcache_mp_l2_store_completed_objects_chunks", "counter", "L2 writes done")
LMCACHE_L2_EVICTED = _read("lmcache", "lmcache_mp_l2_evicted_objects_chunks", "counter", "L2 records evicted")
LMCACHE_CONNECTOR_HITS = _read("lmcache", "lmcache:num_hit_tokens", "counter", "in-process connector hits")
LMCACHE_REMOTE_READ = _read("lmcache", "lmcache:num_remote_read_bytes", "counter", "bytes read from a remote backend")
LMCACHE_REMOTE_WRITE = _read(
    "lmcache", "lmcache:num_remote_write_bytes", "counter", "bytes written to a remote backend"
)
