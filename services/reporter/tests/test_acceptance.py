"""The acceptance test's judge (kvbench accept): each step from the run's own figures, the first failure named."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvbench_reporter.acceptance import acceptance


def _job(repeat: int, counters: Mapping[str, float], ttft: float, disk: dict[str, Any] | None = None) -> dict[str, Any]:
    prompt = sum(v for k, v in counters.items() if k.startswith("prompt_tokens_"))
    return {
        "job_id": f"J{repeat}",
        "repeat": repeat,
        "status": "succeeded",
        "requests_measured": 40,
        "errors": 0,
        "ttft_ms": {"p50": ttft},
        "engine_counters": {"prompt_tokens": prompt, **counters},
        "disk_tier": disk,
    }


def _workload(reset: Mapping[str, float], restart: Mapping[str, float]) -> dict[str, Any]:
    disk = {"records_before": 0, "records_after": 120, "bytes_before": 0, "bytes_after": 4e9, "reclaimed": False}
    return {
        "name": "lmcache", "stack": "vllm-lmcache-mp",
        "stacks": [{"facts": {"engine0.attention_block_size": "2144"}}],
        "jobs": [
            _job(0, {"prompt_tokens_recomputed": 320_000, "kv_bytes_stored_disk": 4e9}, 1320.0, disk),
            _job(1, {"prompt_tokens_gpu": 256_000, "prompt_tokens_recomputed": 64_000}, 340.0, disk),
            _job(2, reset, 470.0, {**disk, "records_before": 120}),
            _job(3, restart, 710.0, disk),
        ],
    }  # fmt: skip


def test_a_stack_whose_engines_cannot_empty_their_prefix_cache_fails_step_4_with_the_fix() -> None:
    reloaded = {"prompt_tokens_host": 250_000, "prompt_tokens_recomputed": 70_000}
    from_disk = {"prompt_tokens_disk": 250_000, "prompt_tokens_recomputed": 70_000}
    judged = acceptance(_workload(reloaded, from_disk), {"J2": {"e0": 404}}, "m")
    assert judged["passed"] is False
    assert judged["verdict"].startswith("failed at step 4")
    assert "VLLM_SERVER_DEV_MODE=1" in judged["verdict"]
    assert judged["steps"][3]["evidence"].startswith("e0: HTTP 404")
    passed = acceptance(_workload(reloaded, from_disk), {"J2": {"e0": 200}}, "m")
    assert passed["verdict"] == "passed"
    assert passed["passes"]["reset"]["external_hit_rate"] == 250_000 / 320_000


def test_gpu_hits_after_the_reset_or_no_disk_reload_after_the_restart_fail_their_steps() -> None:
    gpu = {"prompt_tokens_gpu": 250_000, "prompt_tokens_recomputed": 70_000}  # the reset did not take
    recomputed = {"prompt_tokens_recomputed": 320_000}  # the disk records did not survive the restart
    judged = acceptance(_workload(gpu, recomputed), {"J2": {"e0": 200}}, "m")
    failed = [s["step"] for s in judged["steps"] if s["status"] == "failed"]
    assert failed == [5, 7]
    assert judged["verdict"].startswith("failed at step 5")
    # an LMCache server's own count splits the engines' unattributed hits between its tiers
    unattributed = {"prompt_tokens_external": 200_000, "prompt_tokens_recomputed": 120_000,
                    "cache_server_hit_tokens_host": 50.0, "cache_server_hit_tokens_disk": 150.0}  # fmt: skip
    judged = acceptance(_workload(unattributed, unattributed), {"J2": {"e0": 200}}, "m")
    assert judged["passes"]["restart"]["tokens"] == {"host_tier": 50_000, "disk": 150_000, "recomputed": 120_000}
    assert judged["passed"] is True


def test_a_phase_that_did_not_run_fails_the_test() -> None:
    workload = _workload({"prompt_tokens_host": 1.0}, {"prompt_tokens_disk": 1.0})
    workload["jobs"][3]["status"] = "failed"
    assert acceptance(workload, {"J2": {"e0": 200}}, "m")["verdict"] == "failed: the restart pass did not complete"


def test_answers_of_the_reloaded_passes_are_compared_with_the_cold_pass_one_by_one() -> None:
    """Step 8: the same requests in every pass (one seed), greedy decoding: a dense model's reloaded answers must be
    identical to the cold pass's; a hybrid Mamba/GDN model may differ in a stated share (10%)."""
    reloaded = {"prompt_tokens_host": 250_000, "prompt_tokens_recomputed": 70_000}
    from_disk = {"prompt_tokens_disk": 250_000, "prompt_tokens_recomputed": 70_000}
    cold = {f"d{i}-r1-v{i}/0": f"{i:016x}" for i in range(40)}
    one_off = {**cold, "d3-r1-v3/0": "ffffffffffffffff"}
    same = {"J0": cold, "J1": cold, "J2": cold, "J3": cold}
    judged = acceptance(_workload(reloaded, from_disk), {"J2": {"e0": 200}}, "Qwen/Qwen3-8B", same)
    assert judged["steps"][7]["status"] == "passed"
    assert "reset: 40 of 40 identical" in judged["steps"][7]["evidence"]
    assert judged["verdict"] == "passed"

    differs = {**same, "J3": one_off}
    dense = acceptance(_workload(reloaded, from_disk), {"J2": {"e0": 200}}, "Qwen/Qwen3-8B", differs)
    assert dense["verdict"].startswith("failed at step 8")
    assert "restart: 39 of 40 identical" in dense["steps"][7]["evidence"]
    assert "2.5% of a reloaded pass's answers differ" in dense["verdict"]
    hybrid = acceptance(_workload(reloaded, from_disk), {"J2": {"e0": 200}}, "nvidia/Qwen3.6-35B-A3B-NVFP4", differs)
    assert hybrid["steps"][7]["status"] == "passed"  # 1 of 40 within the hybrid's 10%
    assert "up to 10% may differ" in hybrid["steps"][7]["evidence"]

    unknown = acceptance(_workload(reloaded, from_disk), {"J2": {"e0": 200}}, "Qwen/Qwen3-8B", {})
    assert unknown["steps"][7]["status"] == "not checked"
    assert unknown["verdict"] == "passed"  # said, not claimed: a step not checked fails nothing


def test_a_step_failing_only_on_counts_with_a_gap_is_not_checked_and_the_test_is_inconclusive() -> None:
    """The reset pass's engine was sampled over 3 of its 20 s: nothing counted as loaded from the tier is no proof
    that nothing was. The step is not checked, and the verdict says so instead of failing the stack."""
    recomputed = {"prompt_tokens_recomputed": 40_000}
    from_disk = {"prompt_tokens_disk": 250_000, "prompt_tokens_recomputed": 70_000}
    workload = _workload(recomputed, from_disk)
    gap = {"engine_id": "n0-engine-0", "role": "both", "window_s": 20.0, "counted_s": 3.0, "from_s": -1.0,
           "to_s": 2.0, "scrape_interval_s": 2.0}  # fmt: skip
    workload["jobs"][2]["engine_counters"]["short_coverage"] = [gap]
    judged = acceptance(workload, {"J2": {"e0": 200}}, "m")
    step5 = judged["steps"][4]
    assert step5["status"] == "not checked"
    assert "reset pass's engine counters are incomplete (samples of n0-engine-0 over 3.0 of 20.0 s)" in step5["reason"]
    assert judged["passed"] is False
    assert judged["verdict"].startswith("inconclusive: step 5")
    # the same gap under counts that show the reload: what was counted happened, and the step passes
    workload = _workload(from_disk, from_disk)
    workload["jobs"][2]["engine_counters"]["short_coverage"] = [gap]
    assert acceptance(workload, {"J2": {"e0": 200}}, "m")["verdict"] == "passed"
    # without the gap the same counts fail the step, as before
    assert acceptance(_workload(recomputed, from_disk), {"J2": {"e0": 200}}, "m")["verdict"].startswith(
        "failed at step 5"
    )


def test_a_stack_with_no_tier_outside_the_gpu_fails_step_3_whatever_the_counts() -> None:
    workload = _workload({"prompt_tokens_host": 1.0}, {"prompt_tokens_disk": 1.0})
    cold = workload["jobs"][0]
    cold["engine_counters"] = {"prompt_tokens": 320_000.0, "prompt_tokens_recomputed": 320_000.0, "short_coverage": [
        {"engine_id": "e", "role": "both", "window_s": 20.0, "counted_s": 3.0, "scrape_interval_s": 2.0}]}  # fmt: skip
    cold["disk_tier"] = None
    assert acceptance(workload, {"J2": {"e0": 200}}, "m")["steps"][2]["status"] == "not checked"
    workload["stack"] = "vllm-prefix-gpu"
    judged = acceptance(workload, {"J2": {"e0": 200}}, "m")
    assert judged["verdict"].startswith("failed at step 3")
