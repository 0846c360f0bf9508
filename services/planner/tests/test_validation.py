from __future__ import annotations

from pathlib import Path
from typing import Any

from kvbench_planner.state import expand_jobs
from kvbench_planner.validation import review_plan, review_text


def plan(*workloads: dict[str, Any], **defaults: Any) -> dict[str, Any]:
    base = {
        "cluster": {"sim": {"machines": 2}},
        "traffic": {"shape": "synthetic_sessions", "duration_s": 600},
        "measurement": {"warmup_s": 60},
    }
    base.update(defaults)
    return {"version": 1, "name": "t", "defaults": base, "workloads": list(workloads)}


def codes(review: Any) -> list[str]:
    return [e.code for e in review.errors]


def test_demo_plan_is_valid_with_its_warnings() -> None:
    with open("examples/demo.yaml", "rb") as fh:
        review = review_text(fh.read())
    assert review.valid, review.as_dict()
    assert review.jobs == 9  # three workloads, three repeats
    assert {w.code for w in review.warnings} == {"short_window"}  # three repeats: no "preliminary" warning


def test_every_problem_is_reported_at_once_with_the_products_words() -> None:
    review = review_plan(
        plan(
            {"name": "a", "strategy": "split", "stack": "vllm-pd-nixl"},
            {"name": "b", "strategy": "shared_pool", "stack": "vllm-lmcache-valkey", "kv_tier": "gpu"},
            {"name": "b", "strategy": "own_cache", "stack": "vllm-prefix-gpu", "orchestrator": "dynamo"},
        )
    )
    found = codes(review)
    for code in (
        "round_robin_split",
        "missing_sizing_field",
        "needs_lmcache_server",
        "duplicate_workload_name",
        "orchestrator_locked",
    ):
        assert code in found, found
    by_code = {e.code: e for e in review.errors}
    assert by_code["round_robin_split"].message == "Round robin cannot route prefill and decode"
    assert by_code["round_robin_split"].fix == "In Routing, choose a prefill and decode routing policy."
    assert by_code["needs_lmcache_server"].message == "The stack needs an LMCache server on every node"
    assert not review.valid


def test_shared_pool_on_one_machine_and_one_engine_per_machine() -> None:
    review = review_plan(
        plan(
            {
                "name": "a",
                "strategy": "shared_pool",
                "stack": "vllm-lmcache-valkey",
                "kv_tier": "cpu_ram",
                "sizing": {"shared_store_gb": 10},
                "cluster": {"sim": {"machines": 1}},
            },
            {
                "name": "b",
                "strategy": "split_offload",
                "stack": "vllm-pd-nixl-lmcache",
                "kv_tier": "cpu_ram",
                "sizing": {"prefill_machines": 1, "gpus_per_machine": 2},
                "measurement": {"routing": "pd_aware"},
            },
        )
    )
    by_code = {e.code: e for e in review.errors}
    assert by_code["shared_pool_single_machine"].message == (
        "A shared KV pool shares KV between machines, and this group has one machine"
    )
    assert by_code["one_engine_per_machine"].fix == "Set GPUs per machine to the tensor parallel size."


def test_structural_errors_name_the_field() -> None:
    review = review_plan(
        plan({"name": "a", "strategy": "own_cache", "stack": "vllm-prefix-gpu", "measurment": {"repeats": 3}})
    )
    assert codes(review) == ["unknown_field"]
    assert review.errors[0].field == "workloads.0.measurment"
    assert review.errors[0].workload == "a"


def test_bad_documents_are_one_clear_issue() -> None:
    assert codes(review_text(b"version: [1")) == ["invalid_document"]
    assert codes(review_text(b"- a list")) == ["invalid_document"]
    assert codes(review_text(b"x" * 2_000_000)) == ["document_too_large"]


def test_ranges_and_shape_fields() -> None:
    review = review_plan(
        plan(
            {
                "name": "a",
                "strategy": "own_cache",
                "stack": "vllm-prefix-gpu",
                "measurement": {"load_duration_s": 600, "warmup_s": 400},
            },
        )
    )
    assert set(codes(review)) == {"field_not_for_shape", "warmup_too_long"}


def test_jobs_expand_in_a_stable_order() -> None:
    review = review_plan(
        plan(
            {
                "name": "a",
                "strategy": "own_cache",
                "stack": "vllm-prefix-gpu",
                "traffic": {"arrivals": {"mode": "closed_loop", "users": [2, 8]}},
                "measurement": {"repeats": 2},
            },
        )
    )
    assert review.plan is not None
    jobs = expand_jobs(review.plan)
    assert [(j.load_level, j.repeat) for j in jobs] == [(2, 0), (2, 1), (8, 0), (8, 1)]
    assert len({j.job_id for j in jobs}) == 4


def test_a_plan_without_a_sim_speed_takes_the_planners_and_one_with_keeps_its_own() -> None:
    from kvbench_contracts.plan import Plan  # noqa: PLC0415
    from kvbench_planner.conductor import sim_cluster  # noqa: PLC0415

    unset = Plan.model_validate(plan({"name": "a", "strategy": "own_cache", "stack": "vllm-prefix-gpu"}))
    sim = sim_cluster(unset.workloads[0], 20.0)
    assert sim is not None
    assert sim.speed == 20.0
    assert sim.machines == 2
    assert sim_cluster(unset.workloads[0], None) == sim.model_copy(update={"speed": 1.0})  # no default: real time
    stored = Plan.model_validate(unset.model_dump(mode="json"))  # the run state keeps the plan as JSON
    assert getattr(sim_cluster(stored.workloads[0], 20.0), "speed", None) == 20.0
    own = Plan.model_validate(
        plan({"name": "a", "strategy": "own_cache", "stack": "vllm-prefix-gpu"}, cluster={"sim": {"speed": 4}})
    )
    assert getattr(sim_cluster(own.workloads[0], 20.0), "speed", None) == 4.0
    real = Plan.model_validate(
        plan({"name": "a", "strategy": "own_cache", "stack": "vllm-prefix-gpu"}, cluster={"group": "g"})
    )
    assert sim_cluster(real.workloads[0], 20.0) is None


def test_missing_data_is_refused_at_review_with_the_field_and_how_to_get_it(tmp_path: Path) -> None:
    base = {"name": "a", "strategy": "own_cache", "stack": "vllm-prefix-gpu", "cluster": {"sim": {"machines": 1}}}
    missing = str(tmp_path / "no-such-dataset")
    review = review_plan(
        {"version": 1, "name": "t", "workloads": [{**base, "traffic": {"shape": "agentic_replay", "dataset": missing}}]}
    )
    assert not review.valid
    (problem,) = review.errors
    assert (problem.code, problem.field) == ("data_not_found", "traffic.dataset")
    assert "huggingface-cli download" in problem.fix
    trace = {"shape": "trace_replay", "trace": {"format": "mooncake", "path": str(tmp_path / "none.jsonl")}}
    review = review_plan({"version": 1, "name": "t", "workloads": [{**base, "traffic": trace}]})
    (problem,) = review.errors
    assert (problem.code, problem.field) == ("data_not_found", "traffic.trace.path")
    # present, they pass
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n')
    trace["trace"]["path"] = str(tmp_path / "t.jsonl")  # type: ignore[index]
    assert review_plan({"version": 1, "name": "t", "workloads": [{**base, "traffic": trace}]}).valid


def test_job_progress_follows_what_bounds_the_job_and_never_reaches_100_before_the_end() -> None:
    from kvbench_contracts.events import JobProgressed  # noqa: PLC0415
    from kvbench_planner.conductor import _job_progress  # noqa: PLC0415

    def event(elapsed: float, duration: float, done: int, expected: int | None = None) -> JobProgressed:
        return JobProgressed(job_id="j", run_id="r", elapsed_s=elapsed, duration_s=duration, requests_done=done,
                             errors=0, requests_expected=expected)  # fmt: skip

    # document_reuse: 59 s in, 100 of 400 visits done, no duration: a quarter, not 99%
    assert _job_progress(event(59.0, 0.0, 100, 400)) == 0.25
    assert _job_progress(event(200.0, 0.0, 400, 400)) == 0.99  # the last answers are still draining
    assert _job_progress(event(30.0, 60.0, 10)) == 0.5  # time-bounded: by time
    assert _job_progress(event(90.0, 60.0, 10)) == 0.99
    assert _job_progress(event(30.0, 0.0, 10)) == 0.0  # neither: unknown, never a false 99%
