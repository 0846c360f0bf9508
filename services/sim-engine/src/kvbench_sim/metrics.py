"""vLLM's metric names (reference/stacks.md section 0), so a simulated engine scrapes like a real one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvbench_sim.engine import Engine

MIB = 1024 * 1024  # SGLang's "mb" in sglang:kv_transfer_total_mb

__all__ = ["SglangMetrics", "VllmMetrics"]

_BYTE_BUCKETS = tuple(float(4**k * 1024) for k in range(3, 14))  # 64 KiB .. 64 GiB
_LAT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
)


class VllmMetrics:
    def __init__(self, model: str, engine_index: str = "0") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        self._lv = (model, engine_index)
        r = self.registry
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed", labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generation tokens", labels, registry=r)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, tokens", labels, registry=r)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, tokens", labels, registry=r)
        self.cached_by_source = Counter(
            "vllm:prompt_tokens_cached_by_source",
            "Cached prompt tokens by source",
            [*labels, "source"],
            registry=r,
        )
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions", labels, registry=r)
        self.success = Counter("vllm:request_success", "Finished requests", [*labels, "finished_reason"], registry=r)
        self.running = Gauge("vllm:num_requests_running", "Requests running", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting", labels, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV cache usage, 0..1", labels, registry=r)
        # vLLM's info gauge: the value is 1, the cache configuration is in the labels
        self.cache_config = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["block_size", "num_gpu_blocks", "enable_prefix_caching"],
            registry=r,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "TTFT (engine view)", labels, buckets=_LAT_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "E2E latency (engine view)",
            labels,
            buckets=_LAT_BUCKETS,
            registry=r,
        )
        # connector side (offload tiers, LMCache, stores): what the tiers served and moved
        self.external_queries = Counter(
            "vllm:external_prefix_cache_queries", "Tokens looked up in a KV connector", labels, registry=r
        )
        self.external_hits = Counter(
            "vllm:external_prefix_cache_hits", "Tokens a KV connector served", labels, registry=r
        )
        # bytes per tier, under the names the real connectors use: CPU offload, the tiering (disk) spec, a store
        self.offload_load_bytes = Counter(
            "vllm:kv_offload_load_bytes", "Bytes loaded from host memory", labels, registry=r
        )
        self.offload_store_bytes = Counter(
            "vllm:kv_offload_store_bytes", "Bytes stored to host memory", labels, registry=r
        )
        self.disk_read_bytes = Counter("vllm:kv_offload_tiering_read_bytes", "Bytes read from disk", labels, registry=r)
        self.disk_write_bytes = Counter(
            "vllm:kv_offload_tiering_write_bytes", "Bytes written to disk", labels, registry=r
        )
        self.store_bytes = Counter(
            "vllm:mooncake_store_operation_bytes", "Bytes moved to and from the shared store",
            [*labels, "operation", "status"], registry=r,
        )  # fmt: skip
        self.lmcache_hit = Counter("lmcache_mp:lookup_hit", "LMCache lookup hits, tokens", ["tier"], registry=r)
        self.by_source = Counter(
            "vllm:prompt_tokens_by_source", "Prompt tokens by where their KV came from", [*labels, "source"], registry=r
        )
        self.nixl_bytes = Histogram(
            "vllm:nixl_bytes_transferred", "Bytes of each P/D KV transfer", labels, buckets=_BYTE_BUCKETS, registry=r
        )
        self.nixl_time = Histogram(
            "vllm:nixl_xfer_time_seconds", "Time of each P/D KV transfer", labels, buckets=_LAT_BUCKETS, registry=r
        )
        self._last = (0, 0, 0, 0, 0)
        self._last_tiers: dict[str, float] = {}
        self._external = 0.0

    def _bytes(self, key: str, value: float) -> None:
        lv = self._lv
        direction, tier = key.split(":", 1)
        if tier == "host":
            (self.offload_load_bytes if direction == "load" else self.offload_store_bytes).labels(*lv).inc(value)
        elif tier == "disk":
            (self.disk_read_bytes if direction == "load" else self.disk_write_bytes).labels(*lv).inc(value)
        else:
            # vLLM's own labels (its Mooncake store connector counts bytes by operation and status): a "get"/"put"
            # the node agent's normaliser does not select left a simulated shared store's bytes uncounted, and the
            # simulated switch's ports idle
            self.store_bytes.labels(*lv, "load_get" if direction == "load" else "save_put", "ok").inc(value)

    def kv_transfer(self, size: float, seconds: float) -> None:
        """A P/D transfer that landed on this (decode) engine: its bytes and how long it took."""
        self.nixl_bytes.labels(*self._lv).observe(size)
        self.nixl_time.labels(*self._lv).observe(seconds)

    def describe_cache(self, engine: Engine) -> None:
        self.cache_config.labels(
            str(engine.block_size), str(engine.pool.num_blocks), str(engine.profile.engine.prefix_caching)
        ).set(1)

    def refresh(self, engine: Engine) -> None:
        """Move the counters up to the engine's totals (the engine core keeps plain integers)."""
        c = engine.counters
        now = (c.prompt_tokens, c.generation_tokens, c.prefix_queries, c.prefix_hits, c.preemptions)
        deltas = [a - b for a, b in zip(now, self._last, strict=True)]
        lv = self._lv
        self.prompt_tokens.labels(*lv).inc(deltas[0])
        self.generation_tokens.labels(*lv).inc(deltas[1])
        self.prefix_queries.labels(*lv).inc(deltas[2])
        self.prefix_hits.labels(*lv).inc(deltas[3])
        self.cached_by_source.labels(*lv, "device").inc(deltas[3])
        # vLLM's split of prompt tokens: GPU prefix hits, tokens a KV connector brought (P/D transfers and offload
        # or LMCache loads alike), and the rest, computed here
        external = float(sum(c.tier_hits.values()))
        new_external = max(0.0, external - self._external)
        self._external = external
        self.by_source.labels(*lv, "external_kv_transfer").inc(new_external)
        self.by_source.labels(*lv, "local_cache_hit").inc(deltas[3])
        self.by_source.labels(*lv, "local_compute").inc(max(0.0, deltas[0] - deltas[3] - new_external))
        self.preemptions.labels(*lv).inc(deltas[4])
        self._last = now
        if engine.tiers:
            self.external_queries.labels(*lv).inc(deltas[0] - deltas[3])
            totals = {
                **{f"hit:{k}": float(v) for k, v in c.tier_hits.items()},
                **{f"load:{k}": v for k, v in c.tier_load_bytes.items()},
                **{f"store:{k}": v for k, v in c.tier_store_bytes.items()},
            }
            step = {k: v - self._last_tiers.get(k, 0.0) for k, v in totals.items()}
            self._last_tiers = totals
            for key, value in step.items():
                if value <= 0:
                    continue
                if key.startswith("hit:"):
                    tier = key[4:]
                    self.external_hits.labels(*lv).inc(value)
                    if tier == "transferred":
                        continue  # a P/D transfer, not a cache tier: by_source above says so
                    source = {"host": "host", "disk": "disk"}.get(tier, "external_unspecified")
                    self.cached_by_source.labels(*lv, source).inc(value)
                    self.lmcache_hit.labels({"host": "l1", "disk": "l2"}.get(tier, tier)).inc(value)
                else:
                    self._bytes(key, value)
        self.running.labels(*lv).set(len(engine.running))
        self.waiting.labels(*lv).set(len(engine.waiting))
        self.kv_usage.labels(*lv).set(engine.pool.usage)


class SglangMetrics:
    """SGLang's metric names (reference/stacks.md: ``sglang:cached_tokens_total{cache_source}`` is the per-tier
    counter), for simulated SGLang stacks; the same interface as ``VllmMetrics``."""

    def __init__(self, model: str, engine_index: str = "0") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        self._lv = (model, engine_index)
        r = self.registry
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Prefill tokens processed", labels, registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens", "Generation tokens", labels, registry=r)
        self.cached = Counter("sglang:cached_tokens", "Cached prompt tokens", [*labels, "cache_source"], registry=r)
        self.hit_rate = Gauge("sglang:cache_hit_rate", "Prefix cache hit rate", labels, registry=r)
        self.token_usage = Gauge("sglang:token_usage", "KV pool usage, 0..1", labels, registry=r)
        self.running = Gauge("sglang:num_running_reqs", "Requests running", labels, registry=r)
        self.waiting = Gauge("sglang:num_queue_reqs", "Requests queued", labels, registry=r)
        self.retracted = Gauge("sglang:num_retracted_reqs", "Requests retracted (preempted)", labels, registry=r)
        # SGLang's counter of the same (sglang:num_retracted_requests_total); the gauge above is not cumulative
        self.retracted_total = Counter("sglang:num_retracted_requests", "Requests retracted", labels, registry=r)
        self.capacity = Gauge("sglang:max_total_num_tokens", "KV pool size, tokens", labels, registry=r)
        self.load_back = Counter("sglang:load_back_bytes", "Bytes loaded back from the host tier", labels, registry=r)
        self.backup = Counter("sglang:hicache_backup_bytes", "Bytes backed up to the host tier", labels, registry=r)
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds", "TTFT (engine view)", labels, buckets=_LAT_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "E2E latency (engine view)", labels, buckets=_LAT_BUCKETS, registry=r
        )
        self.success = Counter("sglang:num_requests", "Finished requests", [*labels, "finished_reason"], registry=r)
        self.transfer_mb = Histogram(
            "sglang:kv_transfer_total_mb",
            # MiB despite the name, as SGLang computes it (srt/observability/req_time_stats.py: bytes / (1024 * 1024))
            "MiB of each P/D KV transfer",
            labels,
            buckets=tuple(b / MIB for b in _BYTE_BUCKETS),
            registry=r,
        )
        self._last: dict[str, float] = {}

    def kv_transfer(self, size: float, seconds: float) -> None:
        self.transfer_mb.labels(*self._lv).observe(size / MIB)

    def describe_cache(self, engine: Engine) -> None:
        self.capacity.labels(*self._lv).set(engine.pool.num_blocks * engine.block_size)

    def _step(self, key: str, total: float) -> float:
        delta = total - self._last.get(key, 0.0)
        self._last[key] = total
        return max(0.0, delta)

    def refresh(self, engine: Engine) -> None:
        c, lv = engine.counters, self._lv
        self.prompt_tokens.labels(*lv).inc(self._step("prompt", c.prompt_tokens))
        self.generation_tokens.labels(*lv).inc(self._step("generation", c.generation_tokens))
        self.cached.labels(*lv, "device").inc(self._step("device", c.prefix_hits))
        for tier, tokens in c.tier_hits.items():
            source = "host" if tier == "host" else "storage"
            self.cached.labels(*lv, source).inc(self._step(f"tier:{tier}", tokens))
        cached_total = c.prefix_hits + sum(c.tier_hits.values())
        self.cached.labels(*lv, "total").inc(self._step("total", cached_total))
        self.load_back.labels(*lv).inc(self._step("load", c.tier_load_bytes.get("host", 0.0)))
        self.backup.labels(*lv).inc(self._step("store", c.tier_store_bytes.get("host", 0.0)))
        self.hit_rate.labels(*lv).set(cached_total / c.prompt_tokens if c.prompt_tokens else 0.0)
        self.token_usage.labels(*lv).set(engine.pool.usage)
        self.running.labels(*lv).set(len(engine.running))
        self.waiting.labels(*lv).set(len(engine.waiting))
        self.retracted.labels(*lv).set(c.preemptions)
        self.retracted_total.labels(*lv).inc(self._step("retracted", c.preemptions))
