"""Scrape an engine's Prometheus text into flat ``name{labels} -> value`` samples."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["ENGINE_PREFIXES", "parse_samples"]

ENGINE_PREFIXES = ("vllm:", "sglang:", "lmcache:", "lmcache_mp", "trtllm_", "kvbench_sim", "agent_", "master_")


def parse_samples(text: str, prefixes: tuple[str, ...] = ENGINE_PREFIXES) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(prefixes) or sample.name.endswith(("_created", "_bucket")):
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k not in ("model_name",))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return values
