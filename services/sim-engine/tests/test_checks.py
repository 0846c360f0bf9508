"""The simulator's behaviour checks (simulator.md section 5 and issue 4), in batch mode."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvbench_contracts.plan import Plan, Workload
from kvbench_sim.batch import Cluster, Simulation
from kvbench_sim.profiles import EngineConfig, known_gpus, known_models, load_profile
from kvbench_sim.stacks import layout_for
from kvbench_sim.timing import StepTimer
from kvbench_sim.whatif import measured_sources, run_job
from kvbench_stacks.hardware import find_model, gpu_spec
from kvbench_workloads.sessions import ReplaySession, Session, Turn
from kvbench_workloads.sources import Source

STUDY_DOCS = {"count": 665, "tokens": 8000, "rounds": 2, "order": "tile", "measure_rounds": [2]}


def _workload(stack: str, *, cluster: dict[str, Any], traffic: dict[str, Any], **extra: Any) -> Workload:
    plan = Plan.model_validate(
        {
            "version": 1,
            "name": "check",
            "defaults": {"cluster": {"sim": cluster}, "traffic": traffic, "measurement": {"repeats": 1}},
            "workloads": [{"name": "w", "strategy": "own_cache", "stack": stack, **extra}],
        }
    )
    return plan.workloads[0]


def _study(stack: str, **extra: Any) -> Workload:
    return _workload(
        stack,
        model="nvidia/Qwen3.6-35B-A3B-NVFP4",
        cluster={"machines": 1, "gpu": "GB10", "gpus_per_machine": 1, "host_memory_gb": 121},
        traffic={"shape": "document_reuse", "documents": STUDY_DOCS, "arrivals": {"mode": "closed_loop", "users": [1]}},
        **extra,
    )


LMCACHE = {"kv_tier": "nvme", "sizing": {"host_memory_gb": 20, "disk_tier_gb": 500, "disk_tier_path": "/mnt/nvme"}}


def _first_request_after_restart(cluster: Cluster, workload: Workload, at_s: float) -> tuple[float, dict[str, int]]:
    for engine in cluster.all_engines:
        engine.restart(at_s)
    doc = Workload.model_validate(
        {
            **workload.model_dump(),
            "traffic": {**workload.traffic.model_dump(), "documents": {**STUDY_DOCS, "rounds": 1}},
        }
    )
    from kvbench_workloads.sources import build_source  # noqa: PLC0415

    source = build_source(doc.traffic.model_dump(mode="json"), users=1)
    first = source.next_session(0)
    assert first is not None
    it = iter([first])
    sim = Simulation(
        cluster, Source("document_reuse", lambda _: next(it, None), [0], True), mode="closed_loop",
        load_level=1, duration_s=0, start_s=at_s,
    )  # fmt: skip
    records = sim.run()
    return (records[0].ttft_s or 0.0), records.sources(0)


def test_the_lmcache_study_is_reproduced() -> None:
    """GB10, 665 x 8,000-token documents, two rounds, one user (reference/lmcache-study.md)."""
    only, only_cluster, only_sim = run_job(_study("vllm-prefix-gpu"), 1, 0)
    lmc, lmc_cluster, lmc_sim = run_job(_study("vllm-lmcache-mp", **LMCACHE), 1, 0)
    assert only["requests_measured"] == lmc["requests_measured"] == 665  # round 2 only
    assert only["ttft_ms"]["p50"] == pytest.approx(1279, rel=0.15)
    assert lmc["ttft_ms"]["p50"] == pytest.approx(655, rel=0.15)
    assert 1.8 <= only["ttft_ms"]["p50"] / lmc["ttft_ms"]["p50"] <= 2.1
    assert only["prompt_token_sources"]["gpu_hit"] == 0  # the cycle overflows the GPU cache: LRU hits nothing
    assert lmc["prompt_token_sources"]["disk_tier"] > 0.75 * 665 * 8000  # and L1 too: the hits come from disk
    # after a restart, with the disk records kept
    cold, cold_sources = _first_request_after_restart(only_cluster, _study("vllm-prefix-gpu"), only_sim.now + 60)
    warm, warm_sources = _first_request_after_restart(
        lmc_cluster, _study("vllm-lmcache-mp", **LMCACHE), lmc_sim.now + 60
    )
    assert cold == pytest.approx(8.51, rel=0.25)
    assert warm == pytest.approx(2.61, rel=0.25)
    assert cold_sources.get("device", 0) == 0
    assert set(warm_sources) <= {"disk", "recomputed"}  # GPU and host tiers died with the engine


def _cyclic(stack: str, count: int, **extra: Any) -> dict[str, Any]:
    workload = _workload(
        stack,
        cluster={"machines": 1, "gpu": "L40S", "gpus_per_machine": 1, "host_memory_gb": 256},
        traffic={
            "shape": "document_reuse",
            "documents": {"count": count, "tokens": 8000, "rounds": 2, "measure_rounds": [2], "output_tokens": 4},
            "arrivals": {"mode": "closed_loop", "users": [1]},
        },
        sizing={"host_memory_gb": 100},
        **extra,
    )
    return run_job(workload, 1, 0)[0]


def test_a_working_set_that_fits_the_gpu_gains_nothing_from_offload() -> None:
    gpu, offload = _cyclic("vllm-prefix-gpu", 10), _cyclic("vllm-native-cpu-offload", 10)
    assert gpu["prompt_token_sources"]["gpu_hit"] > 0
    assert offload["ttft_ms"]["p50"] == pytest.approx(gpu["ttft_ms"]["p50"], rel=0.05)


def test_a_cycle_between_gpu_and_gpu_plus_host_gains_about_prefill_over_load() -> None:
    profile = load_profile("L40S", "Qwen/Qwen3-8B")
    capacity_docs = profile.gpu_kv_blocks * profile.block_size // 8016
    count = capacity_docs * 2  # more than the GPU holds, far less than GPU + 100 GB of host memory
    gpu, offload = _cyclic("vllm-prefix-gpu", count), _cyclic("vllm-native-cpu-offload", count)
    assert gpu["prompt_token_sources"]["gpu_hit"] == 0
    assert offload["prompt_token_sources"]["host_tier"] > 0.9 * count * 7680
    timer = StepTimer(profile)
    prefill = timer.step_s([(8016, 0)], 0, 0)
    hit = (8016 - 1) // 16 * 16  # at least one token is computed
    load = hit * profile.model.kv_bytes_per_token / (profile.gpu.host_link_gbps * 1e9)
    expected = prefill / (load + timer.step_s([(8016 - hit, hit)], 0, 0))
    gain = gpu["ttft_ms"]["p50"] / offload["ttft_ms"]["p50"]
    assert gain > 3
    assert gain == pytest.approx(expected, rel=0.3)


def test_a_tier_slower_than_break_even_makes_ttft_worse_than_recomputing() -> None:
    def run(stack: str, **extra: Any) -> dict[str, Any]:
        workload = _workload(
            stack,
            cluster={"machines": 1, "gpu": "H200", "gpus_per_machine": 1, "host_memory_gb": 64, "disk_gbps": 0.5},
            # long answers pace the user so the disk's background writes (~4 s a document) keep up: round 2 finds
            # its documents on disk
            traffic={
                "shape": "document_reuse",
                "documents": {"count": 120, "tokens": 8000, "rounds": 2, "measure_rounds": [2], "output_tokens": 800},
                "arrivals": {"mode": "closed_loop", "users": [1]},
            },
            **extra,
        )
        return run_job(workload, 1, 0)[0]

    recompute = run("vllm-prefix-off")
    slow_disk = run("vllm-lmcache-mp", kv_tier="nvme", sizing={"host_memory_gb": 1, "disk_tier_gb": 500})
    # break-even for Qwen3-8B on H200 is ~4 GB/s (calibration.md); this disk path moves 0.3 GB/s
    assert slow_disk["prompt_token_sources"]["disk_tier"] > 0.5 * 120 * 8000
    assert slow_disk["ttft_ms"]["p50"] > 2 * recompute["ttft_ms"]["p50"]


def _mixed_source(with_long: bool) -> Source:
    """Eight chats (short prompts, long answers) from the start, and, if asked, a 16k-token prompt every 0.5 s."""

    def session(name: str, prompt_tokens: int, output_tokens: int, at_s: float) -> Session:
        words = " ".join(f"{name}w{k}" for k in range(prompt_tokens))
        turn = Turn(prompt=words, messages=None, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
        s = ReplaySession(name, [turn])
        s.start_at_s = at_s
        return s

    sessions = [session(f"chat{i}", 200, 600, 0.0) for i in range(8)]
    if with_long:
        sessions += [session(f"long{i}", 16_000, 1, 0.2 + 0.5 * i) for i in range(8)]
    sessions.sort(key=lambda s: s.start_at_s or 0.0)
    it = iter(sessions)
    return Source("trace_replay", lambda _u: next(it, None), [0], finite=True)


def _itl_p99_of_chats(stack: str, with_long: bool) -> float:
    cluster_spec = {"machines": 2, "gpu": "H100", "gpus_per_machine": 1}
    workload = _workload(
        stack,
        cluster=cluster_spec,
        traffic={"shape": "synthetic_sessions"},
        sizing={"prefill_machines": 1} if "-pd-" in stack else {},
    )
    layout = layout_for(workload.model_dump(mode="json"), cluster_spec)
    if "-pd-" not in stack:  # one colocated engine, against the P/D pair's one decode engine
        layout = type(layout)(layout.engine, 1)
    cluster = Cluster(layout, "H100", "Qwen/Qwen3-8B")
    records = Simulation(cluster, _mixed_source(with_long), mode="trace", load_level=1, duration_s=0).run()
    gaps = [
        b - a
        for r in records
        if (r.session_id or "").startswith("chat")
        for a, b in itertools.pairwise(r.chunk_times_s)
    ]
    return statistics.quantiles(gaps, n=100)[98] * 1e3


def test_long_prefills_raise_itl_on_a_colocated_engine_and_not_on_a_pd_decode_engine() -> None:
    colocated_quiet = _itl_p99_of_chats("vllm-prefix-off", with_long=False)
    colocated = _itl_p99_of_chats("vllm-prefix-off", with_long=True)
    pd = _itl_p99_of_chats("vllm-pd-nixl", with_long=True)
    assert colocated > 3 * colocated_quiet  # a 16k prefill chunk shares the decode steps
    assert pd == pytest.approx(colocated_quiet, rel=0.25)  # the decode engine never runs a long prefill


def test_measured_sources_add_up_to_the_prompt_tokens() -> None:
    workload = _study("vllm-lmcache-mp", **LMCACHE)
    figures, _, sim = run_job(workload, 1, 0)
    sources = measured_sources(sim, figures["warmup_s"], figures["load_end_s"])
    assert sum(sources.values()) == figures["prompt_tokens"]


def test_a_plans_jobs_share_their_stack_as_the_planner_runs_them() -> None:
    """Batch mode runs a workload's jobs one after another on one cluster: with cache_state empty the second job
    starts on a restarted stack (the study's restart figures come out of the plan: the first request waits ~8.5 s
    cold, ~2.6 s with LMCache's disk records kept); with warm nothing is restarted."""
    from kvbench_sim.whatif import run_plan  # noqa: PLC0415

    def plan(cache_state: str) -> Plan:
        study = {"shape": "document_reuse", "documents": STUDY_DOCS, "arrivals": {"mode": "closed_loop", "users": [1]}}
        return Plan.model_validate(
            {
                "version": 1,
                "name": "restarts",
                "defaults": {
                    "model": "nvidia/Qwen3.6-35B-A3B-NVFP4",
                    "cluster": {"sim": {"machines": 1, "gpu": "GB10", "gpus_per_machine": 1, "host_memory_gb": 121}},
                    "traffic": study,
                    "measurement": {"repeats": 2, "cache_state": cache_state},
                },
                "workloads": [
                    {"name": "vllm-only", "strategy": "own_cache", "stack": "vllm-prefix-gpu"},
                    {"name": "lmcache", "strategy": "spill", "stack": "vllm-lmcache-mp", **LMCACHE},
                ],
            }
        )

    jobs = {w["name"]: w["test_points"][0]["jobs"] for w in run_plan(plan("empty"))["workloads"]}
    assert [j["cache_state"] for j in jobs["lmcache"]] == ["fresh", "restarted"]
    assert jobs["vllm-only"][0]["first_request_ttft_ms"] == pytest.approx(8510, rel=0.25)  # a new engine is cold
    assert jobs["vllm-only"][1]["first_request_ttft_ms"] == pytest.approx(8510, rel=0.25)
    assert jobs["lmcache"][1]["first_request_ttft_ms"] == pytest.approx(2610, rel=0.25)  # its disk records remain
    for name in jobs:  # the measured round is the same either way
        assert jobs[name][1]["ttft_ms"]["p50"] == pytest.approx(jobs[name][0]["ttft_ms"]["p50"], rel=0.02)

    warm = run_plan(plan("warm"))["workloads"][1]["test_points"][0]["jobs"]
    assert [j["cache_state"] for j in warm] == ["fresh", "warm"]
    assert warm[1]["first_request_ttft_ms"] < 1000  # no cold start: the first document comes from disk


def test_a_restarted_stack_loses_a_memory_store_and_keeps_a_shared_filesystem() -> None:
    from kvbench_sim.records import file_backed  # noqa: PLC0415

    traffic = {"shape": "document_reuse", "documents": {"count": 4, "tokens": 4000, "rounds": 1},
               "arrivals": {"mode": "closed_loop", "users": [1]}}  # fmt: skip
    cluster_spec = {"machines": 2, "gpu": "H100", "gpus_per_machine": 1}
    for stack, kept in (("vllm-mooncake-store", False), ("vllm-native-shared-fs", True)):
        workload = _workload(stack, cluster=cluster_spec, traffic=traffic, sizing={"host_memory_gb": 10})
        _, cluster, sim = run_job(workload, 1, 0)
        shared = next(t for t in cluster.engines[0].tiers if t.config.store_id)
        assert file_backed(shared) is kept
        held = shared.chunks
        assert held > 0
        serving = cluster.restart_stack(sim.now)
        assert serving >= sim.now
        assert shared.chunks == (held if kept else 0)
        assert all(t.chunks == 0 for e in cluster.all_engines for t in e.tiers if t.name == "host")


def test_every_example_plan_with_a_simulated_cluster_runs_in_batch_mode() -> None:
    """What `kvbench sim run` is first given: the shipped examples (the demo's shared store once failed here)."""
    from pathlib import Path  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    from kvbench_sim.whatif import run_plan  # noqa: PLC0415

    examples = Path(__file__).resolve().parents[3] / "examples"
    for name in ("demo.yaml", "pd-split-small.yaml", "lmcache-study-small.yaml"):
        report = run_plan(Plan.model_validate(yaml.safe_load((examples / name).read_text())))
        for workload in report["workloads"]:
            for point in workload["test_points"]:
                assert all(job["requests_measured"] > 0 for job in point["jobs"]), (name, workload["name"])


def test_an_engine_waiting_on_a_slow_store_still_takes_new_requests_at_once() -> None:
    """LMCache's disk tier writes at 0.3 GB/s: each 4,000-token prompt (590 MB) takes ~2 s to store, in the
    background. The next request must not wait for it (it used to: an idle engine woke only when the store landed)."""
    workload = _workload(
        "vllm-lmcache-mp",
        cluster={"machines": 1, "gpu": "H100", "gpus_per_machine": 1, "host_memory_gb": 256},
        traffic={
            "shape": "document_reuse",
            "documents": {"count": 5, "tokens": 4000, "rounds": 1},
            "arrivals": {"mode": "closed_loop", "users": [1]},
        },
        **LMCACHE,
    )
    figures, _, sim = run_job(workload, 1, 0)
    ttfts = [r.ttft_s or 0.0 for r in sorted(sim.records, key=lambda r: r.start_s)]
    assert len(ttfts) == 5
    assert max(ttfts[1:]) < 1.5 * ttfts[0], ttfts  # each is a prefill, no store's wait
    assert figures["transfers_bytes"]["disk_store"] > 0


def test_every_simulated_gpu_and_model_of_the_hardware_table_makes_a_profile() -> None:
    assert "A100" not in known_gpus()  # in the table for the fit check, with no simulator profile
    for gpu in known_gpus():
        for model in known_models():
            profile = load_profile(gpu, model, EngineConfig(tensor_parallel_size=8))
            spec, facts = gpu_spec(gpu), find_model(model)
            assert spec is not None
            assert facts is not None
            assert profile.gpu.mem_gb == spec.mem_gb
            assert profile.model.weight_bytes == facts.weight_bytes
    with pytest.raises(ValueError, match="unknown GPU 'A100'"):
        load_profile("A100", "Qwen/Qwen3-8B")


def test_engines_sharing_one_lmcache_server_reuse_what_the_others_computed() -> None:
    """Issue 19 (the study's section 4.3) on the simulated cluster, examples/lmcache-shared-server.yaml: four engines
    each with its own server never reuse another's documents (round robin sends a document's second visit to the
    next engine); sharing one server, almost every measured prompt token comes from what another instance computed,
    with who computed what; across two machines the server's link is the network and runs busier and slower."""
    from kvbench_sim.whatif import run_plan  # noqa: PLC0415

    path = Path(__file__).resolve().parents[3] / "examples" / "lmcache-shared-server.yaml"
    plan = Plan.model_validate(yaml.safe_load(path.read_text()))
    jobs = {w["name"]: w["test_points"][0]["jobs"][0] for w in run_plan(plan)["workloads"]}
    own, shared, spread = jobs["own-servers"], jobs["one-shared-server"], jobs["shared-across-machines"]
    assert own["cross_instance_tokens"] == {}
    assert len(own["cache_servers"]) == 4
    assert all(len(s["engines"]) == 1 for s in own["cache_servers"])
    measured = sum(shared["prompt_token_sources"].values())
    assert sum(shared["cross_instance_tokens"].values()) > 0.9 * measured
    assert set(shared["cross_instance_tokens"]) == {"e0->e1", "e1->e2", "e2->e3", "e3->e0"}
    assert shared["ttft_ms"]["p50"] < own["ttft_ms"]["p50"] / 3
    assert spread["cache_servers"][0]["busy_share"] > shared["cache_servers"][0]["busy_share"]
    assert shared["ttft_ms"]["p50"] < spread["ttft_ms"]["p50"] < own["ttft_ms"]["p50"]
    # eight instances outgrow one server reached over the network: its link is busy most of the job, and the reuse
    # that made four sharing one 8x faster than recomputing is worth little
    crowded = jobs["eight-share-one"]
    assert crowded["cache_servers"][0]["busy_share"] > 0.7
    assert crowded["ttft_ms"]["p50"] > 0.75 * own["ttft_ms"]["p50"]
    # with no engines_per_cache_server, as the recipe: each machine's engines share its one server
    default = plan.model_copy(update={"workloads": [plan.workloads[2].model_copy(update={
        "sizing": plan.workloads[2].sizing.model_copy(update={"engines_per_cache_server": None})})]})  # fmt: skip
    (by_machine,) = [w["test_points"][0]["jobs"][0] for w in run_plan(default)["workloads"]]
    assert sorted(s["engines"] for s in by_machine["cache_servers"]) == [["e0", "e1"], ["e2", "e3"]]


def test_a_long_simulation_tells_how_far_it_is() -> None:
    """An hour of 64 engines takes minutes: run_plan says which job it simulates as each starts, then how far into
    it (virtual seconds, requests finished) while it runs, and the plan's share done, which only grows."""
    from kvbench_sim.whatif import SimProgress, run_plan  # noqa: PLC0415

    plan = Plan.model_validate(
        {
            "version": 1,
            "name": "long",
            "defaults": {
                "cluster": {"sim": {"machines": 2, "gpu": "H100", "gpus_per_machine": 1}},
                "traffic": {
                    "shape": "synthetic_sessions",
                    "synthetic": {
                        "prefix_tokens": 256,
                        "groups": 4,
                        "turns": 2,
                        "input_tokens": 64,
                        "output_tokens": 16,
                    },
                    "arrivals": {"mode": "request_rate", "rates": [20, 40]},
                    "duration_s": 60,
                },
                "measurement": {"repeats": 1, "warmup_s": 5},
            },
            "workloads": [{"name": "w", "strategy": "own_cache", "stack": "vllm-prefix-gpu"}],
        }
    )
    told: list[SimProgress] = []
    report = run_plan(plan, progress=told.append, progress_every_s=0.0)
    starts = [t for t in told if t.simulated_s == 0.0 and t.requests == 0]
    assert [(t.job, t.jobs_done, t.jobs) for t in starts] == [
        ("w: load 20, repeat 1/1", 0, 2),
        ("w: load 40, repeat 1/1", 1, 2),
    ]
    inside = [t for t in told if t not in starts]
    assert {t.job for t in inside} == {"w: load 20, repeat 1/1", "w: load 40, repeat 1/1"}  # told within each job
    done = [t.done for t in told]
    assert done == sorted(done)
    assert done[0] >= 0.0
    assert done[-1] <= 1.0
    last_of_first = [t for t in inside if t.jobs_done == 0][-1]
    assert last_of_first.requests == report["workloads"][0]["test_points"][0]["jobs"][0]["requests_total"]  # its end
    assert last_of_first.simulated_s >= 60.0
    assert last_of_first.line().startswith(
        f"w: load 20, repeat 1/1 · {last_of_first.simulated_s:,.0f} of 60 simulated s"
    )
    assert "job 1 of 2" in last_of_first.line()
    assert last_of_first.short() == f"w: load 20, repeat 1/1 · {last_of_first.simulated_s:,.0f}/60 s"


@pytest.mark.parametrize("stack", ["vllm-prefix-gpu", "vllm-native-cpu-offload", "vllm-pd-nixl", "sglang-radix"])
def test_the_compiled_pool_simulates_what_the_python_reference_simulates(
    stack: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engines with the compiled block pool and hashes, then with the Python reference: every request's record
    (times, cached tokens) and where its prompt tokens came from are the same, bit for bit, and so are the figures.
    Sessions over shared prefixes on a pool small enough to evict; a host tier (its chunk hashes too), P/D and
    SGLang's radix cache (its own page size)."""
    from kvbench_sim import blocks  # noqa: PLC0415

    workload = _workload(
        stack,
        cluster={"machines": 2, "gpu": "L40S", "gpus_per_machine": 1},
        traffic={
            "shape": "synthetic_sessions",
            "synthetic": {"prefix_tokens": 2048, "groups": 160, "turns": 3, "input_tokens": 200, "output_tokens": 24},
            "arrivals": {"mode": "request_rate", "rates": [30]},
            "duration_s": 40,
        },
        measurement={"repeats": 1, "warmup_s": 5, "routing": "session_affinity"},
    )

    def simulate() -> tuple[list[str], dict[str, Any], int]:
        figures, cluster, sim = run_job(workload, 30, 0)
        records = sim.records
        rows = [records[i].model_dump_json() + repr(sorted(records.sources(i).items())) for i in range(len(records))]
        return rows, figures, sum(e.pool.evictions for e in cluster.all_engines)

    compiled = simulate()
    monkeypatch.setattr(blocks, "BlockPool", blocks.PyBlockPool)
    monkeypatch.setattr(blocks, "chain_hashes", blocks.py_chain_hashes)
    reference = simulate()
    assert len(compiled[0]) > 500
    assert compiled[2] > 0  # blocks were evicted: the free order mattered
    assert compiled[0] == reference[0]
    assert compiled[1] == reference[1]
    assert compiled[2] == reference[2]
