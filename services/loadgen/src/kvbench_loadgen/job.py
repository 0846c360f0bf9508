"""One load job (or one shard of it): a source of sessions driven against a stack's endpoints, records
published in batches, progress every 2 s."""

from __future__ import annotations

import asyncio
import logging
import math
import time

from kvbench_contracts.commands import RunLoad
from kvbench_contracts.events import JobFailed, JobFinished, JobProgressed, JobStarted, JobWindowEdge
from kvbench_contracts.node import shard_key, shards_of_job
from kvbench_core.bus import Bus
from kvbench_loadgen.capacity import pool_kv_capacity_tokens
from kvbench_loadgen.driver import DriveConfig, Driver, to_record
from kvbench_loadgen.lag import LagProbe, client_timing
from kvbench_loadgen.reset import reset_note, reset_prefix_caches
from kvbench_loadgen.routing import Router
from kvbench_loadgen.settings import LoadgenSettings
from kvbench_loadgen.sink import RecordSink
from kvbench_workloads.shapes.agentic import DatasetNotFoundError
from kvbench_workloads.sources import UnsupportedShapeError, build_source

__all__ = ["JobRunner", "to_record"]

log = logging.getLogger(__name__)


class JobRunner:
    def __init__(self, bus: Bus, settings: LoadgenSettings) -> None:
        self._bus = bus
        self._settings = settings
        self.active: dict[str, asyncio.Task[None]] = {}
        self._run_of: dict[str, str] = {}

    def launch(self, command: RunLoad) -> None:
        key = shard_key(command.job_id, command.shard_index)
        if key in self.active:
            return  # redelivered while running
        self.active[key] = asyncio.create_task(self._run(command), name=f"job:{key}")
        self._run_of[key] = command.run_id

    def cancel_run(self, run_id: str) -> int:
        """Stop every job of a cancelled run; returns how many were running here."""
        jobs = [job for job, run in self._run_of.items() if run == run_id and job in self.active]
        for job in jobs:
            self.active[job].cancel()
        return len(jobs)

    async def _run(self, cmd: RunLoad) -> None:
        ids = {"run_id": cmd.run_id, "job_id": cmd.job_id, "shard_index": cmd.shard_index}
        key = shard_key(cmd.job_id, cmd.shard_index)
        try:
            await self._drive(cmd, self._settings.shard_id)
        except (UnsupportedShapeError, DatasetNotFoundError, FileNotFoundError, ValueError) as exc:
            log.warning("job refused", extra={**ids, "reason": str(exc)})
            await self._bus.publish(
                JobFailed(job_id=cmd.job_id, run_id=cmd.run_id, shard_index=cmd.shard_index, reason=str(exc))
            )
        except asyncio.CancelledError:
            log.info("job cancelled", extra=ids)
            await self._bus.publish(
                JobFailed(job_id=cmd.job_id, run_id=cmd.run_id, shard_index=cmd.shard_index, reason="cancelled")
            )
        except Exception as exc:
            log.exception("job failed", extra=ids)
            await self._bus.publish(
                JobFailed(
                    job_id=cmd.job_id, run_id=cmd.run_id, shard_index=cmd.shard_index, reason=f"load generator: {exc}"
                )
            )
        finally:
            self.active.pop(key, None)
            self._run_of.pop(key, None)

    async def _drive(self, cmd: RunLoad, shard: str) -> None:
        beside = sorted(index + 1 for index in shards_of_job(self.active, cmd.job_id) if index != cmd.shard_index)
        traffic = cmd.traffic.model_dump(mode="json")
        arrivals = traffic.get("arrivals") or {}
        mode = str(arrivals.get("mode", "closed_loop"))
        capacity = await pool_kv_capacity_tokens(cmd.endpoints) if cmd.working_set_ratio else None
        source = await asyncio.to_thread(  # reading a data set or trace must not stall other jobs' timing
            build_source,
            traffic,
            users=max(1, int(cmd.load_level)) if mode == "closed_loop" else 1,
            model=cmd.model,
            seed=cmd.seed,
            shard=cmd.shard_index,
            shards=cmd.shards,
            working_set_ratio=cmd.working_set_ratio,
            capacity_tokens=capacity,
            horizon_s=cmd.duration_s if cmd.duration_s > 0 else math.inf,
        )
        sink = RecordSink(
            self._bus,
            cmd.run_id,
            cmd.job_id,
            shard,
            self._settings.batch_interval_s,
            self._settings.batch_max_records,
        )
        config = DriveConfig(
            job_id=cmd.job_id,
            workload=cmd.workload,
            model=cmd.model,
            mode="request_rate" if mode == "request_rate" else "trace" if mode == "trace" else "closed_loop",
            load_level=cmd.load_level,
            duration_s=cmd.duration_s,
            warmup_s=cmd.warmup_s,
            seed=cmd.seed,
            shard=shard,
            shards=cmd.shards,
            distribution=str(arrivals.get("distribution", "poisson")),
            burstiness=float(arrivals.get("burstiness", 1.0)),
            max_concurrency=arrivals.get("max_concurrency"),
            honor_gaps=arrivals.get("gaps", "recorded") != "none",
            request_timeout_s=self._settings.request_timeout_s,
            drain_timeout_s=self._settings.drain_timeout_s,
            time_scale=cmd.time_scale,
            keep_answers=cmd.keep_answers,
        )
        reset = await reset_prefix_caches(cmd.endpoints, cmd.reset_route) if cmd.reset_prefix_cache else {}
        edges: list[asyncio.Task[None]] = []

        def window_edge(edge: str) -> None:
            # said at once, its wall-clock moment taken now: the planner has the engines read on it
            said = JobWindowEdge(job_id=cmd.job_id, run_id=cmd.run_id, shard_index=cmd.shard_index,
                                 edge="start" if edge == "start" else "end", at=time.time())  # fmt: skip
            edges.append(asyncio.create_task(self._bus.publish(said)))

        driver = Driver(config, source, Router(cmd.endpoints, cmd.routing), sink.add, window_edge)
        await self._bus.publish(JobStarted(job_id=cmd.job_id, run_id=cmd.run_id, workload=cmd.workload, shard=shard))
        log.info(
            "job started",
            extra={"run_id": cmd.run_id, "job_id": cmd.job_id, "load_level": cmd.load_level, "notes": source.notes},
        )
        sink.start()

        async def progress() -> None:
            while True:
                await asyncio.sleep(2.0)
                await self._bus.publish(
                    JobProgressed(
                        job_id=cmd.job_id,
                        run_id=cmd.run_id,
                        elapsed_s=driver.elapsed_s,
                        duration_s=cmd.duration_s,
                        requests_done=driver.result.requests,
                        errors=driver.result.errors,
                        requests_expected=source.requests_expected,
                    )
                )

        reporter = asyncio.create_task(progress())
        try:
            async with LagProbe() as probe:
                result = await driver.run()
        finally:
            reporter.cancel()
            await asyncio.gather(reporter, *edges, return_exceptions=True)
            await sink.close()
        lags = sorted(result.replay_lags_s)
        notes = list(source.notes)
        if beside:
            notes.append(
                f"shard {cmd.shard_index + 1} of {cmd.shards} ran on load generator {shard} beside shard(s) "
                f"{', '.join(map(str, beside))} of the same job (no other load generator was free to take it): they "
                "shared one client's CPU, and their records carry one load generator id"
            )
        if cmd.reset_prefix_cache:
            notes.append(reset_note(reset, cmd.reset_route))
        if result.abandoned:
            notes.append(
                "some requests still in flight at the end of the drain time did not answer cancellation and were "
                "left without a record; the engines may have stalled"
            )
        if cmd.time_scale != 1.0:
            notes.append(
                f"the engines ran {cmd.time_scale:g}x faster than real time: durations, gaps and rates were paced in "
                f"engine seconds and every time recorded is in engine seconds (wall-clock x {cmd.time_scale:g})"
            )
        await self._bus.publish(
            JobFinished(
                job_id=cmd.job_id,
                run_id=cmd.run_id,
                workload=cmd.workload,
                shard=shard,
                records=sink.published,
                load_duration_s=result.load_end_s,
                warmup_s=result.warmup_s,
                offered_load=cmd.load_level,
                tokenizer=source.tokenizer,
                shard_index=cmd.shard_index,
                shards=cmd.shards,
                skipped_arrivals=result.skipped_arrivals,
                replay_lag_p99_s=lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else None,
                notes=notes,
                time_scale=cmd.time_scale,
                client_timing=client_timing(probe, result.send_lateness_s),
                prefix_cache_reset=reset,
                answers=result.answers,
            )
        )
        log.info(
            "job finished",
            extra={"run_id": cmd.run_id, "job_id": cmd.job_id, "records": sink.published, "errors": result.errors},
        )
