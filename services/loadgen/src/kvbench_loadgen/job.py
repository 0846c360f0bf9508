"""One load job: closed-loop users (or a Poisson/gamma rate) against a stack's endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time

import aiohttp

from kvbench_contracts.commands import RunLoad
from kvbench_contracts.envelope import new_id
from kvbench_contracts.events import JobFailed, JobFinished, JobProgressed, JobStarted
from kvbench_contracts.records import RequestRecord
from kvbench_core.bus import Bus
from kvbench_loadgen.client import StreamResult, stream_completion
from kvbench_loadgen.prompts import TOKENIZER_NAME
from kvbench_loadgen.routing import Router
from kvbench_loadgen.settings import LoadgenSettings
from kvbench_loadgen.sink import RecordSink
from kvbench_loadgen.workload import SessionUser, UnsupportedShapeError, build_users

__all__ = ["JobRunner", "to_record"]

log = logging.getLogger(__name__)


def to_record(
    result: StreamResult,
    *,
    load_t0: float,
    job_id: str,
    workload: str,
    session_id: str | None,
    turn: int | None,
    prompt_tokens: int,
    shard: str,
) -> RequestRecord:
    chunk_times = [t - result.t0 for t in result.chunk_times]
    output_tokens = result.output_tokens if result.output_tokens is not None else sum(result.chunk_tokens)
    chunk_tokens = list(result.chunk_tokens)
    if output_tokens == len(chunk_tokens):
        chunk_tokens = [1] * len(chunk_tokens)
    return RequestRecord(
        request_id=new_id(),
        job_id=job_id,
        workload=workload,
        session_id=session_id,
        turn=turn,
        start_s=result.t0 - load_t0,
        ttft_s=chunk_times[0] if chunk_times else None,
        e2e_s=chunk_times[-1] if chunk_times else None,
        chunk_times_s=chunk_times,
        chunk_tokens=chunk_tokens,
        prompt_tokens=result.prompt_tokens if result.prompt_tokens is not None else prompt_tokens,
        output_tokens=output_tokens,
        cached_tokens=result.cached_tokens,
        ok=result.ok,
        error=result.error,
        shard=shard,
    )


class JobRunner:
    def __init__(self, bus: Bus, settings: LoadgenSettings) -> None:
        self._bus = bus
        self._settings = settings
        self.active: dict[str, asyncio.Task[None]] = {}
        self._run_of: dict[str, str] = {}

    def launch(self, command: RunLoad) -> None:
        if command.job_id in self.active:
            return  # redelivered while running
        self.active[command.job_id] = asyncio.create_task(self._run(command), name=f"job:{command.job_id}")
        self._run_of[command.job_id] = command.run_id

    def cancel_run(self, run_id: str) -> int:
        """Stop every job of a cancelled run; returns how many were running here."""
        jobs = [job for job, run in self._run_of.items() if run == run_id and job in self.active]
        for job in jobs:
            self.active[job].cancel()
        return len(jobs)

    async def _run(self, cmd: RunLoad) -> None:
        ids = {"run_id": cmd.run_id, "job_id": cmd.job_id}
        shard = self._settings.shard_id
        try:
            await self._drive(cmd, shard)
        except UnsupportedShapeError as exc:
            await self._bus.publish(JobFailed(job_id=cmd.job_id, run_id=cmd.run_id, reason=str(exc)))
        except asyncio.CancelledError:
            log.info("job cancelled", extra=ids)
            await self._bus.publish(JobFailed(job_id=cmd.job_id, run_id=cmd.run_id, reason="cancelled"))
        except Exception as exc:
            log.exception("job failed", extra=ids)
            await self._bus.publish(JobFailed(job_id=cmd.job_id, run_id=cmd.run_id, reason=f"load generator: {exc}"))
        finally:
            self.active.pop(cmd.job_id, None)
            self._run_of.pop(cmd.job_id, None)

    async def _drive(self, cmd: RunLoad, shard: str) -> None:
        traffic = cmd.traffic
        arrivals = traffic.get("arrivals") or {}
        rate_mode = arrivals.get("mode") == "request_rate"
        users = build_users(traffic, 64 if rate_mode else max(1, int(cmd.load_level)))
        router = Router(cmd.endpoints, cmd.routing)
        sink = RecordSink(
            self._bus,
            cmd.run_id,
            cmd.job_id,
            shard,
            self._settings.batch_interval_s,
            self._settings.batch_max_records,
        )
        done = {"requests": 0, "errors": 0}
        last_end = [0.0]  # when the last request ended: the load end of a job with no set length
        await self._bus.publish(JobStarted(job_id=cmd.job_id, run_id=cmd.run_id, workload=cmd.workload, shard=shard))
        log.info("job started", extra={"run_id": cmd.run_id, "job_id": cmd.job_id, "load_level": cmd.load_level})
        sink.start()
        load_t0 = time.monotonic()
        bounded = cmd.duration_s > 0  # 0: each user runs one session and the job ends when all are done
        deadline = load_t0 + cmd.duration_s if bounded else float("inf")
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:

            async def one_turn(user: SessionUser) -> None:
                prompt = user.next_prompt()
                endpoint = router.pick(user.session_id, " ".join(prompt[:64]))
                payload = {
                    "model": cmd.model,
                    "prompt": " ".join(prompt),
                    "max_tokens": user.output_tokens,
                    "ignore_eos": True,
                    "temperature": 0,
                }
                session_id, turn = user.session_id, user.turn
                result = await stream_completion(
                    session,
                    endpoint.base_url,
                    payload,
                    chat=False,
                    timeout_s=self._settings.request_timeout_s,
                )
                sink.add(
                    to_record(
                        result,
                        load_t0=load_t0,
                        job_id=cmd.job_id,
                        workload=cmd.workload,
                        session_id=session_id,
                        turn=turn,
                        prompt_tokens=len(prompt),
                        shard=shard,
                    )
                )
                done["requests"] += 1
                last_end[0] = max(last_end[0], time.monotonic() - load_t0)
                if result.ok:
                    user.record_turn(prompt, "".join(result.text))
                else:
                    done["errors"] += 1

            async def closed_loop_user(user: SessionUser) -> None:
                sent = 0
                while time.monotonic() < deadline and (bounded or sent < user.turns):
                    await one_turn(user)
                    sent += 1
                    if user.think_time_s > 0:
                        await asyncio.sleep(min(user.think_time_s, max(0.0, deadline - time.monotonic())))

            async def open_loop() -> None:
                rng = random.Random(cmd.seed)
                rate = max(cmd.load_level, 1e-6)
                shape = float(arrivals.get("burstiness", 1.0))
                cap = arrivals.get("max_concurrency")
                limit = asyncio.Semaphore(int(cap)) if cap else None
                in_flight: set[asyncio.Task[None]] = set()
                next_t = time.monotonic()
                i = 0
                while True:
                    gap = (
                        rng.gammavariate(shape, 1.0 / (rate * shape))
                        if arrivals.get("distribution") == "gamma"
                        else rng.expovariate(rate)
                    )
                    next_t += gap
                    if next_t >= deadline or (not bounded and i >= len(users)):
                        break
                    await asyncio.sleep(max(0.0, next_t - time.monotonic()))
                    user = users[i % len(users)]
                    i += 1

                    async def send(u: SessionUser = user) -> None:
                        if limit:
                            async with limit:
                                await one_turn(u)
                        else:
                            await one_turn(u)

                    task = asyncio.create_task(send())
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                if in_flight:
                    await asyncio.gather(*in_flight)

            async def progress() -> None:
                while True:
                    await asyncio.sleep(2.0)
                    await self._bus.publish(
                        JobProgressed(
                            job_id=cmd.job_id,
                            run_id=cmd.run_id,
                            elapsed_s=time.monotonic() - load_t0,
                            duration_s=cmd.duration_s,
                            requests_done=done["requests"],
                            errors=done["errors"],
                        )
                    )

            reporter = asyncio.create_task(progress())
            try:
                drivers = [open_loop()] if rate_mode else [closed_loop_user(u) for u in users]
                tasks = [asyncio.ensure_future(d) for d in drivers]
                _, pending = await asyncio.wait(
                    tasks, timeout=cmd.duration_s + self._settings.drain_timeout_s if bounded else None
                )
                for task in pending:  # requests still running past the drain time count as timeouts
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            finally:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporter
                await sink.close()
        await self._bus.publish(
            JobFinished(
                job_id=cmd.job_id,
                run_id=cmd.run_id,
                workload=cmd.workload,
                shard=shard,
                records=sink.published,
                load_duration_s=cmd.duration_s if cmd.duration_s > 0 else last_end[0],
                warmup_s=cmd.warmup_s,
                offered_load=cmd.load_level,
                tokenizer=TOKENIZER_NAME,
            )
        )
        log.info(
            "job finished",
            extra={
                "run_id": cmd.run_id,
                "job_id": cmd.job_id,
                "records": sink.published,
                "errors": done["errors"],
            },
        )
