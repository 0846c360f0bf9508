"""Scrape an engine's Prometheus text into flat ``name{labels} -> value`` samples."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kvbench_contracts.engine import SIM_LATE_BOUNDS_US

__all__ = ["ENGINE_PREFIXES", "parse_samples"]

ENGINE_PREFIXES = ("vllm:", "sglang:", "lmcache:", "lmcache_mp", "trtllm_", "kvbench_sim", "agent_", "master_")
# histogram buckets are dropped (they multiply a scrape's size) except the ones a normalised counter reads
KEPT_BUCKETS: dict[str, frozenset[float]] = {
    "kvbench_sim_token_lateness_seconds_bucket": frozenset(bound / 1e6 for bound in SIM_LATE_BOUNDS_US)
}


def _kept_bucket(name: str, le: str | None) -> bool:
    bounds = KEPT_BUCKETS.get(name)
    return bounds is not None and le is not None and float(le) in bounds


def parse_samples(text: str, prefixes: tuple[str, ...] = ENGINE_PREFIXES) -> dict[str, float]:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(prefixes) or sample.name.endswith("_created"):
                continue
            if sample.name.endswith("_bucket") and not _kept_bucket(sample.name, sample.labels.get("le")):
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k not in ("model_name",))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return values
