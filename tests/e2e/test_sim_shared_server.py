"""Two served simulated engines on two machines sharing one LMCache server (issue 19, the study's section 4.3), against
each with its own: the shared server serves one engine what the other computed, and the report says who computed
what the other reused."""

from __future__ import annotations

from pathlib import Path

import pytest

from .runs import served_report

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# documents visited twice, round robin over two engines; an odd count sends each document's second visit to the
# other engine, so only a shared server can serve it from what the first engine computed; long answers keep each
# measured window several engine scrapes long
PLAN = """
version: 1
name: shared-lmcache-server-served
defaults:
  model: Qwen/Qwen3-8B
  engine: {name: vllm}
  cluster: {sim: {machines: 2, gpu: L40S, gpus_per_machine: 1, host_memory_gb: 256, nic_gbps: 100, speed: 4.0}}
  kv_tier: cpu_ram
  traffic:
    shape: document_reuse
    documents: {count: 9, tokens: 4000, output_tokens: 256, rounds: 2, order: tile, measure_rounds: [2]}
    arrivals: {mode: closed_loop, users: [2]}
  measurement: {repeats: 1, routing: round_robin}
workloads:
  - {name: own-servers, strategy: spill, stack: vllm-lmcache-mp,
     sizing: {host_memory_gb: 64, engines_per_cache_server: 1}}
  - {name: one-shared-server, strategy: spill, stack: vllm-lmcache-mp,
     sizing: {host_memory_gb: 64, engines_per_cache_server: 2}}
"""


def test_served_engines_on_two_machines_share_one_lmcache_server(
    nats_url: str, fresh_database: str, tmp_path: Path
) -> None:
    report = served_report(PLAN, 2, nats_url, fresh_database, tmp_path / "kvbench")
    served = {w["name"]: w for w in report["workloads"]}
    own, shared = served["own-servers"], served["one-shared-server"]
    # round 2's nine visits; the measured window is the round's span in time, so with two users a straggler of
    # round 1 may fall inside it
    assert 9 <= own["requests_measured"] <= 10
    assert 9 <= shared["requests_measured"] <= 10
    # with a server each, a document's second visit finds nothing on the other engine's server
    assert own["cross_instance_hits"] is None
    assert own["cache_hit_ratio"] < 0.2
    # shared: each engine reused what the other computed, and the report names both directions
    cross = shared["cross_instance_hits"]
    assert cross is not None, shared["engine_counters"]
    engines = {st["node_id"]: st for st in shared["stacks"]}
    assert len(engines) == 2
    pairs = {(p["computed_by"].split("-e")[0], p["reused_by"].split("-e")[0]) for p in cross["pairs"]}
    first, second = sorted(engines)
    assert pairs == {(first, second), (second, first)}, cross
    assert cross["share_of_prompt_tokens"] > 0.7  # nearly every measured prompt was the other engine's work
    assert shared["cache_hit_ratio"] > 0.7
    # TTFT: the shared server's loads beat recomputing, where this machine kept the engines' pace (else the report
    # says the timing is unreliable)
    if own["timing"]["reliable"] and shared["timing"]["reliable"]:
        assert shared["ttft_ms"]["p50"] < 0.7 * own["ttft_ms"]["p50"]
    else:
        assert any(not w["timing"]["reliable"] and w["timing"]["reasons"] for w in (own, shared))
    # one server, on the first machine; the other machine's engine says where it connects
    facts = [st["facts"].get("cache_server", "") for st in shared["stacks"]]
    assert sum("(simulated) here" in f for f in facts) == 1, facts
    assert sum(f.startswith("shared, on ") for f in facts) == 1, facts
