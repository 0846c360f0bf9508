"""The pool's GPU KV capacity in tokens, read from the engines' own metrics.

vLLM publishes ``vllm:cache_config_info`` whose labels carry ``num_gpu_blocks`` and ``block_size``;
SGLang publishes ``sglang:max_total_num_tokens``. The working-set ratio is turned into a number of
distinct contexts from this figure, so it must come from the engines that will serve the load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kvbench_contracts.events import EngineEndpoint

__all__ = ["capacity_from_metrics", "pool_kv_capacity_tokens"]


def capacity_from_metrics(text: str) -> int | None:
    """GPU KV tokens of one engine from its Prometheus text, or None when it does not say."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                blocks, size = sample.labels.get("num_gpu_blocks"), sample.labels.get("block_size")
                if blocks not in (None, "", "None") and size not in (None, "", "None"):
                    return int(float(blocks)) * int(float(size))
            if sample.name == "sglang:max_total_num_tokens":
                return int(sample.value)
    return None


async def pool_kv_capacity_tokens(endpoints: Sequence[EngineEndpoint], timeout_s: float = 5.0) -> int | None:
    """Summed over the engines that hold decode KV (not routers or prefill-only engines); None if any is silent."""
    holders = [e for e in endpoints if e.role in ("both", "decode")]
    if not holders:
        return None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:

        async def one(url: str) -> int | None:
            try:
                async with http.get(url) as response:
                    return capacity_from_metrics(await response.text()) if response.status == 200 else None
            except (aiohttp.ClientError, TimeoutError):
                return None

        found = await asyncio.gather(*(one(e.metrics_url) for e in holders))
    return None if any(v is None for v in found) else sum(v for v in found if v is not None)
