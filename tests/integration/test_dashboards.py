"""Grafana dashboards: valid for the 11.6 schema, provisioned files in sync, and every panel's SQL, run against
the real PostgreSQL, returns the report's numbers."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from grafana_foundation_sdk.models.dashboard import Dashboard as DashboardModel

from kvbench_contracts.events import JobFinished, JobStarted, RunSubmitted
from kvbench_contracts.records import RequestRecord
from kvbench_reporter.dashboards import PANEL_SQL, build_dashboards
from kvbench_reporter.ingest import Ingestor
from kvbench_reporter.report import build_report
from kvbench_reporter.store import Store

ROOT = Path(__file__).resolve().parents[2]


def test_dashboards_are_grafana_11_6_json_and_the_provisioned_files_are_current() -> None:
    built = build_dashboards()
    assert set(built) == {"kvbench-run", "kvbench-overview"}
    for uid, data in built.items():
        assert data["schemaVersion"] == 41
        assert DashboardModel.from_json(data).uid == uid
        on_disk = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / f"{uid}.json").read_text())
        assert on_disk == data, "regenerate with: kvbench grafana export"
    sql = [t["rawSql"] for d in built.values() for p in d["panels"] for t in (p.get("targets") or []) if "rawSql" in t]
    assert sorted(sql) == sorted(PANEL_SQL.values())


def _records(job_id: str, workload: str, rng: random.Random, cached_share: float) -> list[RequestRecord]:
    out = []
    for i in range(200):
        start = rng.uniform(0, 60)
        ttft = rng.uniform(0.05, 0.8)
        e2e = ttft + rng.uniform(0.1, 2.0)
        ok = rng.random() > 0.05
        out.append(
            RequestRecord(
                request_id=f"{job_id}-{i}",
                job_id=job_id,
                workload=workload,
                start_s=start,
                ttft_s=ttft if ok else None,
                e2e_s=e2e if ok else None,
                chunk_times_s=[ttft, e2e] if ok else [],
                chunk_tokens=[1, 7] if ok else [],
                prompt_tokens=1000,
                output_tokens=8 if ok else 0,
                cached_tokens=int(1000 * cached_share),
                ok=ok,
                error=None if ok else "http_503",
            )
        )
    return out


@pytest.mark.integration
async def test_every_panel_query_runs_and_matches_the_report(fresh_database: str) -> None:
    store = await Store.open(fresh_database)

    async def nothing(_: str) -> None:
        return None

    ingestor = Ingestor(store, nothing)
    rng = random.Random(7)
    try:
        workloads = [
            {"name": n, "stack": "vllm-prefix-gpu", "strategy": "own_cache", "measurement": {"repeats": 2}}
            for n in ("off", "gpu")
        ]
        jobs: list[dict[str, Any]] = [
            {"job_id": f"{w}{r}", "workload": w, "stack": "vllm-prefix-gpu", "load_level": 4, "repeat": r}
            for w in ("off", "gpu")
            for r in range(2)
        ]
        events: list[Any] = [RunSubmitted(run_id="R", plan_name="p", plan={"workloads": workloads}, jobs=jobs)]
        for job in jobs:
            events.append(JobStarted(job_id=job["job_id"], run_id="R", workload=job["workload"], shard="lg"))
            events.append(
                JobFinished(
                    job_id=job["job_id"],
                    run_id="R",
                    workload=job["workload"],
                    shard="lg",
                    records=200,
                    load_duration_s=55,
                    warmup_s=5,
                    offered_load=4,
                    tokenizer="w",
                )
            )
        await ingestor.control(events)
        for job in jobs:
            await store.insert_records(
                "R", _records(job["job_id"], job["workload"], rng, 0.0 if job["workload"] == "off" else 0.9)
            )
        report = await build_report(store, "R")
        assert report is not None
        by_name = {w["name"]: w for w in report["workloads"]}
        conn = await asyncpg.connect(fresh_database)
        try:
            results = {name: await conn.fetch(sql.replace("$run_id", "R")) for name, sql in PANEL_SQL.items()}
        finally:
            await conn.close()
        compared = {r["workload"]: r for r in results["workloads_compared"]}
        for name, w in by_name.items():
            row = compared[name]
            assert row["requests_measured"] == w["requests_measured"]
            assert row["ttft_p50_ms"] == pytest.approx(w["ttft_ms"]["p50"])
            assert row["ttft_p90_ms"] == pytest.approx(w["ttft_ms"]["p90"])
            assert row["ttft_p99_ms"] == pytest.approx(w["ttft_ms"]["p99"])
            assert row["output_tokens_per_s"] == pytest.approx(w["output_tokens_per_s"])
            assert row["cache_hit_ratio"] == pytest.approx(w["cache_hit_ratio"])
        assert {r["workload"]: r["requests"] for r in results["requests"]} == {
            n: w["requests"] for n, w in by_name.items()
        }
        assert len(results["ttft_over_time"]) == sum(w["requests_measured"] for w in by_name.values())
        assert [r["run_id"] for r in results["runs"]] == ["R"]
    finally:
        await store.close()


@pytest.mark.integration
async def test_network_panels_turn_switch_reads_into_rates(fresh_database: str) -> None:
    """Three polls of a switch port during a run: the bits/s and pause-frames/s panels give the rate between
    consecutive polls (none across a counter reset), and the reads table counts good and failed reads."""
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    from kvbench_contracts.events import RunFinished, RunStarted  # noqa: PLC0415
    from kvbench_contracts.fabric import CounterSample, SwitchSampled, SwitchUnread  # noqa: PLC0415

    store = await Store.open(fresh_database)

    async def nothing(_: str) -> None:
        return None

    ingestor = Ingestor(store, nothing)
    try:
        t0 = datetime.now(UTC) - timedelta(minutes=5)
        await ingestor.control(
            [
                RunSubmitted(run_id="RN", plan_name="p", plan={"workloads": []}, jobs=[], occurred_at=t0),
                RunStarted(run_id="RN", occurred_at=t0),
            ]
        )

        def read(at_s: float, octets: int, pfc: int, epoch: str = "boot1") -> SwitchSampled:
            ns = int((t0 + timedelta(seconds=at_s)).timestamp() * 1e9)
            common = {"device": "leaf1", "device_kind": "switch", "port": "swp1", "ts_request_ns": ns,
                      "ts_response_ns": ns, "source": "snmp:test", "epoch": epoch}  # fmt: skip
            samples = [
                CounterSample.model_validate({**common, "counter": "if.in_octets", "value": octets, "unit": "octets"}),
                CounterSample.model_validate(
                    {**common, "counter": "pfc.requests", "qualifier": {"priority": 3}, "value": pfc, "unit": "frames"}
                ),
            ]
            return SwitchSampled(switch="leaf1", samples=samples, occurred_at=t0 + timedelta(seconds=at_s))

        await store.insert_switch_reads(
            [
                read(0, 1_000, 10),
                read(10, 12_501_000, 60),  # 12.5 MB in 10 s = 10 Mb/s; 50 pause frames = 5/s
                SwitchUnread(switch="leaf1", reason="timed out", occurred_at=t0 + timedelta(seconds=15)),
                read(20, 37_501_000, 260),  # 25 MB in 10 s = 20 Mb/s; 200 frames = 20/s
                read(30, 500, 0, epoch="boot2"),  # the switch rebooted: no rate across the reset
            ]
        )
        await ingestor.control([RunFinished(run_id="RN", status="succeeded", occurred_at=t0 + timedelta(seconds=40))])
        conn = await asyncpg.connect(fresh_database)
        try:
            bits = await conn.fetch(PANEL_SQL["switch_port_bits"].replace("$run_id", "RN"))
            pause = await conn.fetch(PANEL_SQL["switch_pause_frames"].replace("$run_id", "RN"))
            reads = await conn.fetch(PANEL_SQL["switch_reads"].replace("$run_id", "RN"))
        finally:
            await conn.close()
        assert [(r["metric"], round(r["value"])) for r in bits] == [
            ("leaf1 swp1 in", 10_000_000),
            ("leaf1 swp1 in", 20_000_000),
        ]
        assert [(r["metric"], round(r["value"])) for r in pause] == [
            ("leaf1 swp1 pfc.requests p3", 5),
            ("leaf1 swp1 pfc.requests p3", 20),
        ]
        assert [(r["switch"], r["good_reads"], r["failed_reads"], r["last_failure"]) for r in reads] == [
            ("leaf1", 4, 1, "timed out")
        ]
    finally:
        await store.close()
