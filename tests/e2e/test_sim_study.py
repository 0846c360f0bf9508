"""The LMCache study, shrunk, through every service on simulated engines, against batch (what-if) mode."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvbench_contracts.plan import Plan
from kvbench_sim.whatif import run_plan

from .runs import served_report

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PLAN = Path(__file__).resolve().parents[2] / "examples" / "lmcache-study-small.yaml"


def test_served_study_gives_the_batch_modes_ratio(nats_url: str, fresh_database: str, tmp_path: Path) -> None:
    plan_text = PLAN.read_text()
    batch = run_plan(Plan.model_validate(yaml.safe_load(plan_text)))
    by_name = {w["name"]: w["test_points"][0]["jobs"][0] for w in batch["workloads"]}
    batch_ratio = by_name["vllm-only"]["ttft_ms"]["p50"] / by_name["lmcache"]["ttft_ms"]["p50"]
    assert 1.8 <= batch_ratio <= 2.1

    report = served_report(plan_text, 1, nats_url, fresh_database, tmp_path / "kvbench")
    served = {w["name"]: w for w in report["workloads"]}
    assert served["vllm-only"]["requests_measured"] == served["lmcache"]["requests_measured"] == 200
    served_ratio = served["vllm-only"]["ttft_ms"]["p50"] / served["lmcache"]["ttft_ms"]["p50"]
    # engines paced 20x real time, reported in engine seconds: the served figures are batch mode's own, or the
    # report says this machine could not keep the pace (a busy CPU delays the simulated engines' writes)
    reliable = all(served[name]["timing"]["reliable"] for name in ("vllm-only", "lmcache"))
    if reliable:
        assert served_ratio == pytest.approx(batch_ratio, rel=0.10)
    for name in ("vllm-only", "lmcache"):
        assert served[name]["time_scale"] == 20.0
        if reliable:
            assert served[name]["ttft_ms"]["p50"] == pytest.approx(by_name[name]["ttft_ms"]["p50"], rel=0.15)
        else:
            assert served[name]["timing"]["reasons"] or served[name]["validity"]["verdict"] != "valid"
    sources = served["lmcache"]["prompt_token_sources"]["tokens"]
    assert sources.get("disk", 0) > 0.7 * sum(sources.values())  # 80% of the prompt tokens come from disk
    # the life of the disk records (the study's §5.5): the tier starts empty, ends holding what the job stored, and
    # nothing was evicted under its 500 GB cap; the GPU-only stack has no disk tier to show (the other stack's
    # engines, sampled just after its job, are not counted as its own)
    (job,) = served["lmcache"]["jobs"]
    disk = job["disk_tier"]
    assert disk["records_before"] == 0
    assert disk["records_after"] > 0
    assert disk["bytes_after"] / disk["records_after"] >= 256 * 10_240  # a 256-token chunk of the model's KV, at least
    assert disk["reclaimed"] is False
    assert served["vllm-only"]["jobs"][0]["disk_tier"] is None
    # what the stacks said as they came up: the attention block size the engine reported, where the disk records live
    (started,) = served["lmcache"]["stacks"]
    assert started["facts"]["attention_block_size"]
    assert "disk_records" in started["facts"]
    assert all("disk_records" not in st["facts"] for st in served["vllm-only"]["stacks"])
    assert served["vllm-only"]["stacks"]
