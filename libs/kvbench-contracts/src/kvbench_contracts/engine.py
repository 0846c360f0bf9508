"""kvbench's engine-neutral counters: the node agent maps each engine's /metrics to these names and the
reporter differences them over measured windows (a contract between the two)."""

from __future__ import annotations

__all__ = [
    "NORMALIZED_COUNTERS",
    "NORMALIZED_GAUGES",
    "PROMPT_TOKEN_SOURCES",
    "SIM_KV_BYTES_SENT",
    "SIM_LATE_BOUNDS_US",
    "SIM_LATE_US",
    "sim_late_counter",
]

# the simulated engines' pacing slip (kvbench_sim_token_lateness_seconds, whose buckets include these bounds): the
# normalised counters keep, for each bound, the tokens written more than that long after the model's due time, so
# the reporter can bound a window's p99 slip; a real engine has none of them
SIM_LATE_BOUNDS_US: tuple[int, ...] = (500, 1000, 2000, 3000, 4000, 5000)
SIM_LATE_US = 5000  # "late": the share of tokens past this bound is held against a threshold


# what a simulated P/D prefill engine put on the wire for decode engines to pull. Real engines count a transfer on the
# decode side only (vLLM's NIXL and Mooncake connectors), so this is no report counter: the simulated leaf switch
# counts it into the prefill machine's port, as a real switch sees those bytes leave it
SIM_KV_BYTES_SENT = "sim_kv_bytes_sent"


def sim_late_counter(bound_us: int) -> str:
    """The normalised counter of tokens written more than ``bound_us`` after their modelled time."""
    return f"sim_tokens_late_over_{bound_us}us"


# cumulative counters
NORMALIZED_COUNTERS: tuple[str, ...] = (
    "prompt_tokens",
    "prompt_tokens_gpu",
    "prompt_tokens_host",
    "prompt_tokens_disk",
    "prompt_tokens_remote",
    "prompt_tokens_transferred",
    "prompt_tokens_external",
    "prompt_tokens_recomputed",
    "kv_bytes_loaded_host",
    "kv_bytes_stored_host",
    "kv_bytes_loaded_disk",
    "kv_bytes_stored_disk",
    "kv_bytes_loaded_remote",
    "kv_bytes_stored_remote",
    "kv_bytes_transferred",
    "kv_transfers",
    # the same movements in tokens where an engine counts tokens (SGLang's HiCache): host -> GPU, GPU -> host,
    # storage -> host (prefetched), host -> storage, and GPU KV slots freed by eviction
    "kv_tokens_loaded_host",
    "kv_tokens_stored_host",
    "kv_tokens_loaded_remote",
    "kv_tokens_stored_remote",
    "kv_tokens_evicted",
    # chunks handed to an offload tier's writer (LMCache's L2) and those it finished writing: a tier that completes
    # none of them stored nothing, however its hits look (LMCache fails its O_DIRECT writes silently)
    "kv_store_chunks_submitted",
    "kv_store_chunks_completed",
    "kv_store_chunks_evicted",  # records the tier's writer evicted (LMCache's L2): eviction reclaimed space
    # a cache server's own view of the hits it served (LMCache MP: L1 in RAM, L2 on disk): it splits the engines'
    # unattributed connector hits by tier, never adds to them
    "cache_server_hit_tokens_host",
    "cache_server_hit_tokens_disk",
    # the engines' own hit-rate denominators: tokens their GPU prefix cache was asked for and found (vLLM), tokens
    # their KV connector was asked for and found (vLLM's external prefix cache), and cache blocks reused and missed
    # (TensorRT-LLM counts blocks, not tokens)
    "prefix_cache_queries",
    "prefix_cache_hits",
    "external_cache_queries",
    "external_cache_hits",
    "kv_blocks_reused",
    "kv_blocks_missed",
    "preemptions",
    "sim_tokens_written",
    *(sim_late_counter(bound) for bound in SIM_LATE_BOUNDS_US),
)
# what an engine holds at the instant: GPU KV usage (0..1); a local disk tier's files and bytes
# (counted on the machine by the agent, or reported by a simulated engine); a host tier's tokens in use and capacity
# (SGLang's HiCache)
NORMALIZED_GAUGES: tuple[str, ...] = (
    "kv_usage",
    "disk_tier_records",
    "disk_tier_bytes",
    "host_tier_used_tokens",
    "host_tier_capacity_tokens",
)

# where a prompt token came from: counter -> the report's name for the source
PROMPT_TOKEN_SOURCES: dict[str, str] = {
    "prompt_tokens_gpu": "gpu_hit",
    "prompt_tokens_host": "host_tier",
    "prompt_tokens_disk": "disk",
    "prompt_tokens_remote": "shared_store",
    "prompt_tokens_transferred": "transferred",
    # a connector's hits that the engine does not attribute (vLLM before 0.32, LMCache's host and disk together)
    "prompt_tokens_external": "external_unattributed",
    "prompt_tokens_recomputed": "recomputed",
}
