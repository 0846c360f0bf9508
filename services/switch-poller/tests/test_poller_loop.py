"""The polling loop never dies of a failed round (a publish that times out while the bus is down): it keeps going,
backs off, and says so through ``failing_rounds`` (the service's health)."""

from __future__ import annotations

import asyncio

from kvbench_contracts.envelope import Envelope
from kvbench_contracts.fabric import SwitchConfig
from kvbench_core.sealing import SecretsKey
from kvbench_switch_poller.poller import Poller
from kvbench_switch_poller.reading import SwitchPoll


async def test_a_failing_round_is_survived_and_reported_until_one_succeeds() -> None:
    config = SwitchConfig(name="leaf1", address="10.0.0.1", snmp_version="2c", secret="leaf1-login")
    published: list[Envelope] = []
    outage = {"rounds": 2}
    seen_failing: list[int] = []

    async def publish(event: Envelope) -> None:
        if outage["rounds"] > 0:
            outage["rounds"] -= 1
            raise TimeoutError("nats: timeout")  # what a publish raises while the bus is down
        published.append(event)

    async def read(config: SwitchConfig, _: str) -> SwitchPoll:
        return SwitchPoll(switch=config.name, sys_name=config.name, uptime_ticks=1)

    key = SecretsKey(bytes(32))
    stored = {"leaf1-login": key.encrypt("c")}
    poller = Poller(lambda: {"leaf1": config.model_dump_json().encode()}, lambda: stored, publish, read, key.decrypt)
    stop = asyncio.Event()
    loop = asyncio.create_task(poller.run(0.01, stop))
    for _ in range(400):
        seen_failing.append(poller.failing_rounds)
        if published:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(loop, 5)
    assert published, "the loop died or never recovered"
    assert max(seen_failing) >= 1  # unhealthy while it failed
    assert poller.failing_rounds == 0  # healthy again once a round succeeded


async def test_one_switch_that_cannot_be_read_or_published_never_stops_the_others() -> None:
    good = SwitchConfig(name="leaf1", address="10.0.0.1", snmp_version="2c", secret="login")
    bad = SwitchConfig(name="leaf2", address="10.0.0.2", snmp_version="2c", secret="login")
    published: list[Envelope] = []

    async def publish(event: Envelope) -> None:
        published.append(event)

    async def read(config: SwitchConfig, _: str) -> SwitchPoll:
        if config.name == "leaf2":
            raise RuntimeError("nats: permissions violation")  # what a bad subject or a driver's bug raises
        return SwitchPoll(switch=config.name, sys_name=config.name, uptime_ticks=1)

    key = SecretsKey(bytes(32))
    stored = {"login": key.encrypt("c")}
    entries = {c.name: c.model_dump_json().encode() for c in (good, bad)}
    poller = Poller(lambda: entries, lambda: stored, publish, read, key.decrypt)
    await poller.poll_once()  # no exception: the round did not fail as a whole
    assert [getattr(e, "switch", None) for e in published] == ["leaf1"]
    assert poller.status["leaf2"].ok is False
    assert "permissions violation" in str(poller.status["leaf2"].error)
