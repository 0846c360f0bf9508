from __future__ import annotations

import asyncio
import logging
import time
from contextlib import AsyncExitStack, suppress

from prometheus_client import Gauge

from kvbench_contracts.commands import RunLoad
from kvbench_contracts.envelope import Envelope
from kvbench_contracts.events import RunCancelled, RunFinished
from kvbench_contracts.node import LoadgenHeartbeat
from kvbench_core.bus import Bus
from kvbench_core.logging import configure_logging
from kvbench_core.metrics import metric_name, new_registry, ops_server
from kvbench_core.service import run_service
from kvbench_core.settings import load_settings
from kvbench_loadgen.job import JobRunner
from kvbench_loadgen.placement import ShardPlacement
from kvbench_loadgen.settings import LoadgenSettings

__all__ = ["main", "run"]

log = logging.getLogger("kvbench_loadgen")


async def run(settings: LoadgenSettings, stop: asyncio.Event) -> None:
    registry = new_registry()
    active = Gauge(metric_name("loadgen", "active_jobs", "count"), "Jobs running", registry=registry)
    async with AsyncExitStack() as stack:
        bus = await stack.enter_async_context(
            Bus.connect(
                settings.nats_url,
                name=f"loadgen-{settings.shard_id}",
                registry=registry,
                service="loadgen",
                auth=settings.nats_auth(),
                replicas=settings.nats_replicas,
            )
        )
        await stack.enter_async_context(ops_server(registry, settings.ops_port))
        runner = JobRunner(bus, settings)
        # a peer's heartbeat can be a beat old: a shard waits two beats for a free peer before it runs here
        placement = ShardPlacement(bus, settings.shard_id, wait_s=2 * settings.heartbeat_s)
        shards_changed = asyncio.Event()

        async def on_command(command: Envelope) -> None:
            if isinstance(command, RunLoad):
                await placement.claim(command, runner.active)  # raises LeaveForOthers for a free peer to take it
                runner.launch(command)  # acked at once; progress and the end arrive as events
                active.set(len(runner.active))
                shards_changed.set()  # the heartbeat says so now: a peer deciding where a shard goes reads it

        async def on_cancelled(event: Envelope) -> None:
            if isinstance(event, RunCancelled):
                stopped = runner.cancel_run(event.run_id)
                log.info("run cancelled", extra={"run_id": event.run_id, "jobs_stopped": stopped})

        async def on_finished(event: Envelope) -> None:
            # every ending stops its load: a failed run's engines are torn down, and a load generator still
            # driving them would only pour error records into the database
            if isinstance(event, RunFinished):
                stopped = runner.cancel_run(event.run_id)
                if stopped:
                    log.info("run ended, its load stopped", extra={"run_id": event.run_id, "jobs_stopped": stopped,
                                                                   "status": event.status})  # fmt: skip

        bus.subscribe([RunLoad], on_command, durable="loadgen", filter_subject="kvbench.cmd.loadgen.>", batch=1)
        # every load generator hears every cancel (its own durable), and stops the jobs it runs
        bus.subscribe(
            [RunCancelled],
            on_cancelled,
            durable=f"loadgen-{settings.shard_id}-cancels",
            filter_subject=RunCancelled.subject_filter(),
            deliver_new=True,
        )
        bus.subscribe(
            [RunFinished],
            on_finished,
            durable=f"loadgen-{settings.shard_id}-endings",
            filter_subject=RunFinished.subject_filter(),
            deliver_new=True,
        )
        beating = asyncio.create_task(_heartbeats(bus, settings, runner, stop, shards_changed))
        await stop.wait()
        await beating
        for task in list(runner.active.values()):
            task.cancel()
        if runner.active:
            await asyncio.gather(*runner.active.values(), return_exceptions=True)
        # gone now, not at the key's TTL: the planner fails a job whose shard this ran at once, and a peer deciding
        # where a shard goes does not wait for this one
        with suppress(Exception):
            await (await bus.kv("kvbench_loadgens")).delete(settings.shard_id)


async def _heartbeats(
    bus: Bus, settings: LoadgenSettings, runner: JobRunner, stop: asyncio.Event, changed: asyncio.Event
) -> None:
    """The shards this load generator runs, every few seconds and as soon as it takes one: the planner notices a
    lost one within the key's TTL (and a restarted one at its first heartbeat) instead of at the job's timeout, and
    peers see which jobs it runs. A bus that fails is waited out."""
    while not stop.is_set():
        changed.clear()
        try:
            kv = await bus.kv("kvbench_loadgens")
            beat = LoadgenHeartbeat(loadgen_id=settings.shard_id, at=time.time(), shards=sorted(runner.active))
            await kv.put(settings.shard_id, beat.model_dump_json().encode())
        except Exception as exc:
            log.warning("heartbeat failed", extra={"loadgen_id": settings.shard_id, "error": str(exc)[:200]})
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(changed.wait())]
        await asyncio.wait(waits, timeout=settings.heartbeat_s, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits:
            waiting.cancel()


def main() -> None:
    settings = load_settings(LoadgenSettings)
    configure_logging("loadgen", settings.log_level, settings.log_json)
    run_service(lambda stop: run(settings, stop), use_uvloop=True)
