"""The bus against a real NATS JetStream: dedup, redelivery after a dead consumer, poison messages."""

from __future__ import annotations

import asyncio
import uuid
from typing import ClassVar

import nats
import pytest
from nats.js.api import ConsumerConfig

from kvbench_contracts.envelope import Envelope
from kvbench_contracts.streams import StreamSpec
from kvbench_core.bus import Bus
from kvbench_core.metrics import new_registry

pytestmark = pytest.mark.integration


class Happened(Envelope):
    SCHEMA: ClassVar[str] = "kvtest.happened/1"
    SUBJECT: ClassVar[str] = "kvtest.{scope}.{item}.happened"
    scope: str
    item: str
    value: int = 0


async def _stream(bus: Bus) -> tuple[str, str]:
    scope = uuid.uuid4().hex[:10]
    name = f"KVTEST_{scope}"
    await bus.ensure_streams([StreamSpec(name, (f"kvtest.{scope}.>",), "limits", max_age_s=600)])
    return scope, name


async def _wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def test_republished_event_is_stored_once(nats_url: str) -> None:
    async with Bus.connect(nats_url, name="t-dedup") as bus:
        scope, stream = await _stream(bus)
        event = Happened(scope=scope, item="a", value=1)
        await bus.publish(event)
        await bus.publish(event)  # a retry after a lost ack: same Nats-Msg-Id
        await bus.publish(Happened(scope=scope, item="a", value=1))  # a new fact, new id
        info = await bus.js.stream_info(stream)
        assert info.state.messages == 2


async def test_message_is_redelivered_after_a_consumer_dies_without_acking(nats_url: str) -> None:
    async with Bus.connect(nats_url, name="t-redeliver") as bus:
        scope, stream = await _stream(bus)
        durable = f"d{scope}"
        # a consumer that takes the message and dies before acking
        dying = await nats.connect(nats_url)
        js = dying.jetstream()
        psub = await js.pull_subscribe(
            f"kvtest.{scope}.>", durable=durable, stream=stream, config=ConsumerConfig(ack_wait=1.0, max_deliver=5)
        )
        await bus.publish(Happened(scope=scope, item="x", value=7))
        taken = await psub.fetch(1, timeout=5)
        assert len(taken) == 1
        await dying.close()

        seen: list[Happened] = []

        async def handler(event: Envelope) -> None:
            assert isinstance(event, Happened)
            seen.append(event)

        bus.subscribe([Happened], handler, durable=durable, stream=stream)
        await _wait_for(lambda: len(seen) == 1)
        assert seen[0].value == 7
        await asyncio.sleep(1.5)  # acked this time: no further delivery
        assert len(seen) == 1


async def test_poison_messages_are_terminated_and_counted(nats_url: str) -> None:
    registry = new_registry()
    async with Bus.connect(nats_url, name="t-poison", registry=registry, service="test") as bus:
        scope, stream = await _stream(bus)
        durable = f"p{scope}"
        await bus.js.publish(f"kvtest.{scope}.bad.happened", b"{not json")
        await bus.js.publish(f"kvtest.{scope}.bad.happened", b'{"schema": "kvtest.happened/1", "value": "NaN?"}')
        await bus.publish(Happened(scope=scope, item="good", value=1))
        seen: list[Envelope] = []

        async def handler(event: Envelope) -> None:
            seen.append(event)

        bus.subscribe([Happened], handler, durable=durable, stream=stream)
        await _wait_for(lambda: len(seen) == 1)
        await _wait_for(
            lambda: registry.get_sample_value("kvbench_test_bus_poison_messages_total", {"durable": durable}) == 2.0
        )
        info = await bus.js.consumer_info(stream, durable)
        assert info.num_ack_pending == 0
        assert info.num_redelivered == 0


async def test_handler_error_is_retried_with_backoff(nats_url: str) -> None:
    async with Bus.connect(nats_url, name="t-retry") as bus:
        scope, stream = await _stream(bus)
        attempts: list[int] = []

        async def flaky(event: Envelope) -> None:
            attempts.append(1)
            if len(attempts) == 1:
                raise RuntimeError("transient")

        bus.subscribe([Happened], flaky, durable=f"r{scope}", stream=stream)
        await bus.publish(Happened(scope=scope, item="y"))
        await _wait_for(lambda: len(attempts) == 2)
        await asyncio.sleep(1.0)
        assert len(attempts) == 2
