"""The compiled batch simulation against the Python reference: the same records, bit for bit, and the same engines
after (clocks, counters, pools, unused jitter), on workloads chosen to reach every path of it."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvbench_sim import _pool, fastpath
from kvbench_sim.batch import Cluster, Simulation, SimulationStalledError
from kvbench_sim.profiles import ColdStart, EngineConfig, TierConfig
from kvbench_sim.stacks import SimLayout
from kvbench_workloads.sources import build_source

HOUR_SHAPE = {"prefix_tokens": 1024, "groups": 16, "turns": 4, "input_tokens": 256, "output_tokens": 64}


@dataclass(frozen=True)
class Case:
    engines: int = 4
    gpu: str = "H100"
    model: str = "Qwen/Qwen3-8B"
    engine: dict[str, Any] = field(default_factory=dict)
    routing: str = "session_affinity"
    synthetic: dict[str, Any] = field(default_factory=lambda: HOUR_SHAPE)
    shape: str = "synthetic_sessions"
    rate: float = 60.0  # requests/s; closed loop: users
    mode: str = "request_rate"
    duration_s: float = 20.0
    seed: int = 0
    simulation: dict[str, Any] = field(default_factory=dict)


CASES = {
    # the benchmark's hour, shorter and smaller
    "hour_shape": Case(),
    # a GPU cache too small for the load: preemptions, recomputed prompts, evictions, step-by-step decode
    "preemption": Case(
        engines=2, engine={"kv_cache_gb": 0.6}, rate=30, duration_s=15, synthetic={**HOUR_SHAPE, "output_tokens": 400}
    ),
    "round_robin_think_time": Case(
        routing="round_robin", synthetic={**HOUR_SHAPE, "think_time_s": 0.7, "input_tokens": 37, "turns": 5}
    ),
    "least_queued_no_gaps": Case(
        routing="pd_aware", synthetic={**HOUR_SHAPE, "think_time_s": 2.0}, simulation={"honor_gaps": False}
    ),
    "prefix_aware": Case(routing="prefix_aware", synthetic={**HOUR_SHAPE, "prefix_tokens": 100, "groups": 5}),
    "prefix_cache_off": Case(engine={"prefix_caching": False}, routing="round_robin"),
    "concurrency_cap": Case(engines=2, simulation={"max_concurrency": 5}),
    "one_engine_per_user_history": Case(engines=1, shape="per_user_history", rate=10),
    "shared_prompt": Case(shape="shared_prompt", rate=80, duration_s=10),
    # a serving path in front of the engine (H200's intake time), a cold start with first-use penalties
    "intake_and_cold_start": Case(
        gpu="H200", engine={"cold_start": ColdStart(fixed_s=2.0, first_request_s=0.5, first_use_ms_per_token=0.3)}
    ),
    # a mixture-of-experts model with its own block size, and tensor parallelism
    "moe_hybrid_blocks": Case(gpu="GB10", model="nvidia/Qwen3.6-35B-A3B-NVFP4", engines=2, rate=8),
    "tensor_parallel": Case(model="Qwen/Qwen3-32B", engine={"tensor_parallel_size": 2}, engines=2, rate=20),
    "odd_block_size_and_seed": Case(engine={"block_size": 7, "max_num_seqs": 8}, seed=7, rate=40),
    "closed_loop": Case(mode="closed_loop", rate=24, synthetic={**HOUR_SHAPE, "think_time_s": 0.4}),
    "closed_loop_no_gaps_capped": Case(
        mode="closed_loop",
        rate=12,
        engines=2,
        synthetic={**HOUR_SHAPE, "think_time_s": 3.0},
        simulation={"honor_gaps": False, "max_concurrency": 7},
    ),
    "closed_loop_one_session_each": Case(mode="closed_loop", rate=30, duration_s=0, routing="round_robin"),
}


def _cluster(case: Case) -> Cluster:
    layout = SimLayout(engine=EngineConfig(**case.engine), engines=case.engines)
    return Cluster(layout, case.gpu, case.model, seed=case.seed, routing=case.routing)


def _simulation(case: Case, cluster: Cluster, compiled: bool, start_s: float = 0.0) -> Simulation:
    traffic = {"shape": case.shape, "synthetic": case.synthetic}
    users = int(case.rate) if case.mode == "closed_loop" else 1
    source = build_source(traffic, users=users, seed=case.seed)
    return Simulation(
        cluster, source, mode=case.mode, load_level=case.rate, duration_s=case.duration_s, seed=case.seed,
        start_s=start_s, compiled=compiled, **case.simulation,
    )  # fmt: skip


def _records(sim: Simulation) -> list[Any]:
    finished = sim.records
    return [(finished[i], finished.sources(i)) for i in range(len(finished))]


def _engines(cluster: Cluster) -> list[Any]:
    return [
        (
            e.clock_s, vars(e.counters), e._first_step_pending, sorted(e._seen_shapes), e.timer._jitter,
            e.pool.free_blocks, e.pool.evictions, e.pool.free_order(), e.has_work(),
        )
        for e in cluster.all_engines
    ]  # fmt: skip


def _run(case: Case, compiled: bool) -> tuple[Simulation, Cluster]:
    cluster = _cluster(case)
    sim = _simulation(case, cluster, compiled)
    sim.run()
    return sim, cluster


@pytest.mark.parametrize("name", list(CASES))
def test_the_compiled_simulation_gives_the_references_records_and_engines(name: str) -> None:
    case = CASES[name]
    reference, reference_cluster = _run(case, compiled=False)
    compiled, compiled_cluster = _run(case, compiled=True)
    assert fastpath.unsupported(compiled) is None
    assert len(reference.records) > 20
    assert _records(compiled) == _records(reference)
    assert compiled.now == reference.now
    assert compiled_cluster.rr_next == reference_cluster.rr_next
    assert _engines(compiled_cluster) == _engines(reference_cluster)
    if name == "preemption":
        assert sum(e.counters.preemptions for e in reference_cluster.engines) > 0
        assert sum(e.pool.evictions for e in reference_cluster.engines) > 0
    if name == "intake_and_cold_start":
        assert min(records.start_s + (records.ttft_s or 0) for records, _ in _records(reference)) > 2.0


def test_a_cluster_goes_on_to_its_next_job_the_same_either_way() -> None:
    """Three jobs on one cluster (a first, a warm one, one after a restart), each run compiled or not: every job sees
    what the one before left (caches, clocks, jitter, cold starts), whichever ran it."""
    case = Case(engines=2, rate=30, duration_s=10, engine={"cold_start": ColdStart(fixed_s=1.0, first_request_s=0.2)})
    runs = []
    for compiled in ((True, False, True), (False, True, False), (False, False, False)):
        cluster = _cluster(case)
        first = _simulation(case, cluster, compiled[0])
        first.run()
        warm = _simulation(case, cluster, compiled[1], start_s=first.now)
        warm.run()
        restarted = _simulation(case, cluster, compiled[2], start_s=cluster.restart_stack(warm.now))
        restarted.run()
        runs.append((_records(first), _records(warm), _records(restarted), _engines(cluster)))
    assert runs[0] == runs[1] == runs[2]
    warm_hits = [sources.get("device", 0) for _, sources in runs[0][1][:5]]
    assert min(warm_hits) >= 1024  # the warm job's first turns hit the prefixes the first job left


def test_what_the_compiled_simulation_does_not_run_goes_to_python() -> None:
    case = Case(engines=2, rate=20, duration_s=5)
    trace = Simulation(
        _cluster(case), build_source({"shape": "synthetic_sessions", "synthetic": HOUR_SHAPE}, users=2),
        mode="trace", load_level=1, duration_s=5,
    )  # fmt: skip
    assert "arrivals trace" in (fastpath.unsupported(trace) or "")
    tiered = Cluster(
        SimLayout(engine=EngineConfig(tiers=(TierConfig(name="host", capacity_gb=10, bw_gbps=20),)), engines=1),
        "H100", "Qwen/Qwen3-8B",
    )  # fmt: skip
    assert "tiers" in (fastpath.unsupported(_simulation(case, tiered, True)) or "")
    documents = build_source({"shape": "document_reuse", "documents": {"count": 3, "tokens": 100}}, users=1)
    doc_sim = Simulation(_cluster(case), documents, mode="request_rate", load_level=5, duration_s=5)
    assert "document_reuse" in (fastpath.unsupported(doc_sim) or "")
    assert len(doc_sim.run()) > 0  # run by the reference


@pytest.mark.parametrize("compiled", [True, False])
def test_a_request_no_engine_can_hold_fails_the_run_with_the_fix(compiled: bool) -> None:
    """Its third turn (2,392 tokens and 300 out) needs more KV blocks than the engine holds: it would wait for good,
    and the requests behind it too; the run says so rather than leaving them out of the figures."""
    case = Case(
        engines=2, engine={"kv_cache_gb": 0.3}, rate=20, duration_s=15, synthetic={**HOUR_SHAPE, "output_tokens": 300}
    )
    cluster = _cluster(case)
    with pytest.raises(SimulationStalledError, match=r"requests never finished: .* 2,136 tokens .* holds 2,032 tokens"):
        _simulation(case, cluster, compiled).run()


def test_an_error_raised_in_a_call_back_to_python_ends_the_compiled_run_with_it() -> None:
    """The compiled loop calls Python back (progress here; sessions, routing, hashlib, the arrival gaps): what such a
    call raises (Ctrl-C too) stops the run and reaches the caller as it was raised."""
    told: list[tuple[float, int]] = []

    def progress(simulated_s: float, finished: int) -> None:
        told.append((simulated_s, finished))
        if len(told) == 3:
            raise KeyboardInterrupt

    case = Case(duration_s=120)  # some 40,000 events: a report every 4,096
    sim = _simulation(case, _cluster(case), compiled=True)
    sim._progress, sim._progress_every_s = progress, 0.0
    with pytest.raises(KeyboardInterrupt):
        sim.run()
    assert [t for t, _ in told] == sorted(t for t, _ in told)
    assert 0 < told[0][1] <= told[1][1] <= told[2][1]  # finished requests so far, flushed or not


def test_the_compiled_module_is_built_from_the_sources_beside_it() -> None:
    """The extension is optional (an image without a C compiler runs the Python reference), so a build that fails in
    an editable install leaves the older module beside its sources, running code that is no longer theirs."""
    module = Path(_pool.__file__)
    sources = [*module.parent.glob("_*.c"), *module.parent.glob("_*.h")]
    assert {p.name for p in sources} >= {"_pool.c", "_batch.c", "_pool.h"}
    stale = [p.name for p in sources if p.stat().st_mtime > module.stat().st_mtime]
    assert not stale, f"{module.name} is older than {stale}: rebuild it (make env) and read the compiler's errors"


@pytest.mark.parametrize("key", ["", "u0-s0/t0", "u123456-s0/t3", "é/t1", "x" * 300])
def test_the_compiled_words_are_pythons_random_bytes(key: str) -> None:
    for n in (0, 1, 3, 4, 5, 8, 255, 256, 1001):
        assert _pool.random_bytes(key, n) == random.Random(key).randbytes(n)
