"""The full report of a run with N request records (goal: 1,000,000 records in under 10 s).

Method: embedded PostgreSQL; one run with 8 jobs over two workloads; records written with COPY (setup, not
timed); then ``build_report`` is timed, as the reporter runs it when a run ends.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

import asyncpg

from kvbench_contracts.events import JobFinished, JobStarted, RunSubmitted
from kvbench_contracts.records import RECORD_COLUMNS
from kvbench_core.columns import pack_floats, pack_ints
from kvbench_core.embedded import EmbeddedPostgres
from kvbench_reporter.ingest import Ingestor
from kvbench_reporter.report import build_report
from kvbench_reporter.store import Store

N = int(os.environ.get("KVBENCH_BENCH_RECORDS", "1000000"))


async def main() -> None:
    pg = EmbeddedPostgres.in_temp_dir().start()
    try:
        store = await Store.open(pg.dsn)
        jobs: list[dict[str, Any]] = [
            {"job_id": f"J{w}{r}", "workload": f"w{w}", "stack": "vllm-prefix-gpu", "load_level": 16, "repeat": r}
            for w in range(2)
            for r in range(4)
        ]
        workloads = [{"name": f"w{w}", "stack": "vllm-prefix-gpu", "strategy": "own_cache"} for w in range(2)]
        events: list[object] = [RunSubmitted(run_id="R", plan_name="bench", plan={"workloads": workloads}, jobs=jobs)]
        per_job = N // len(jobs)
        for job in jobs:
            events += [
                JobStarted(job_id=job["job_id"], run_id="R", workload=job["workload"], shard="s"),
                JobFinished(
                    job_id=job["job_id"],
                    run_id="R",
                    workload=job["workload"],
                    shard="s",
                    records=per_job,
                    load_duration_s=3600,
                    warmup_s=300,
                    offered_load=16,
                    tokenizer="words",
                ),
            ]
        await Ingestor(store, lambda _: asyncio.sleep(0)).control(events)  # type: ignore[arg-type]
        rng = random.Random(3)
        ones = pack_ints([1] * 16)
        conn = await asyncpg.connect(pg.dsn)
        t0 = time.perf_counter()
        for job in jobs:
            rows = []
            for i in range(per_job):
                ttft = rng.uniform(0.05, 1.0)
                chunks = [ttft + 0.025 * k for k in range(16)]
                rows.append(
                    (
                        job["job_id"],
                        f"r{i}",
                        "R",
                        job["workload"],
                        f"u{i % 16}",
                        i % 8,
                        300 + i * 0.01,
                        ttft,
                        chunks[-1],
                        pack_floats(chunks),
                        ones,
                        4096,
                        16,
                        2048,
                        True,
                        None,
                        "s",
                    )
                )
            await conn.copy_records_to_table("request_records", records=rows, columns=RECORD_COLUMNS)
        setup_s = time.perf_counter() - t0
        await conn.close()
        t0 = time.perf_counter()
        report = await build_report(store, "R")
        build_s = time.perf_counter() - t0
        assert report is not None
        measured = sum(w["requests_measured"] for w in report["workloads"])
        await store.close()
        print(f"records: {N:,} (16 chunk times each) in {len(jobs)} jobs; setup by COPY took {setup_s:.1f} s")
        print(f"full report: {build_s:.2f} s ({measured:,} measured requests) (goal: 1,000,000 records in < 10 s)")
    finally:
        pg.stop()


if __name__ == "__main__":
    asyncio.run(main())
