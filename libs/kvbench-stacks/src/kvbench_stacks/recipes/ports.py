"""Fixed, documented ports per machine, chosen so no two processes of any stack collide.

Defaults that clash in the engines' own docs (reference/stacks.md 1.12): LMCache's HTTP port and the
Mooncake HTTP metadata server both default to 8080; LMCache's and NIXL's Prometheus both default to 9090.
kvbench moves each to its own port.
"""

from __future__ import annotations

__all__ = ["PORTS", "engine_port"]

PORTS = {
    "router": 8000,
    "engine_base": 8100,  # engine i serves its API and /metrics on 8100 + i
    "lmcache_zmq": 5555,
    "lmcache_http": 8180,  # not LMCache's 8080 (Mooncake metadata)
    "mooncake_rpc": 50051,
    "mooncake_metrics": 9003,
    "mooncake_http_metadata": 8090,
    "valkey": 6379,
    "nixl_side_channel_base": 5600,
    "nixl_telemetry": 9290,
    "pd_bootstrap_base": 8998,  # vLLM Mooncake / SGLang disaggregation bootstrap, + engine index
    "lmcache_pd_proxy": 7500,
    "lmcache_pd_init_base": 7300,
    "lmcache_pd_alloc_base": 7400,
    "lmcache_telemetry": 5768,
    "mori_discovery": 36367,
    "mori_handshake_base": 6300,
    "mori_notify_base": 6400,
}


def engine_port(index: int) -> int:
    return PORTS["engine_base"] + index
