"""A load generator that stops says so on the bus at once: its heartbeat key is removed as it exits, instead of
lingering for the bucket's TTL, during which the planner would still count it alive and a peer would wait for it."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvbench_core.bus import Bus
from kvbench_loadgen.service import run
from kvbench_loadgen.settings import LoadgenSettings

pytestmark = pytest.mark.integration


async def _alive(url: str) -> set[str]:
    async with Bus.connect(url, name="probe") as bus:
        return set(await bus.kv_values("kvbench_loadgens"))


def test_a_stopped_load_generator_leaves_the_heartbeat_bucket_at_once(nats_url: str) -> None:
    async def scenario() -> None:
        fields = {"KVBENCH_NATS_URL": nats_url, "shard_id": "lg-stopping", "heartbeat_s": 1.0}
        settings = LoadgenSettings.model_validate(fields)
        stop = asyncio.Event()
        service = asyncio.create_task(run(settings, stop))
        deadline = time.monotonic() + 20
        while "lg-stopping" not in await _alive(nats_url):
            assert time.monotonic() < deadline, "the load generator never wrote its heartbeat"
            assert not service.done(), service.exception()
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.wait_for(service, 20)
        stopped_at = time.monotonic()
        assert "lg-stopping" not in await _alive(nats_url)
        assert time.monotonic() - stopped_at < 5  # well inside the bucket's 15 s TTL

    asyncio.run(scenario())
