"""The switch-poller: reads each connected switch with a read-only login and publishes port counters.

Switches come from the ``kvbench_switches`` KV bucket (no credentials there: each names a stored secret in
``kvbench_secrets``). SNMP v2c/v3 is the first driver; a switch that cannot be read is published as unread
with the reason, which is what the publish gate checks.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack

from prometheus_client import Gauge
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from kvbench_core.bus import Bus
from kvbench_core.logging import configure_logging
from kvbench_core.metrics import metric_name, new_registry, ops_server
from kvbench_core.service import run_service
from kvbench_core.settings import SecretsKeySettings, load_settings
from kvbench_switch_poller.poller import Poller

__all__ = ["SwitchPollerSettings", "main", "run"]

log = logging.getLogger("kvbench_switch_poller")


class SwitchPollerSettings(SecretsKeySettings):
    model_config = SettingsConfigDict(env_prefix="KVBENCH_SWITCH_POLLER_", extra="ignore", frozen=True)

    ops_port: int = Field(0, ge=0, le=65535, description="Port of /healthz and /metrics (0 = any free port)")
    interval_s: float = Field(10.0, gt=0, le=3600, description="Polling period per switch")


async def run(settings: SwitchPollerSettings, stop: asyncio.Event) -> None:
    registry = new_registry()
    connected = Gauge(metric_name("switch_poller", "switches_connected", "count"), "Switches polled", registry=registry)
    async with AsyncExitStack() as stack:
        bus = await stack.enter_async_context(
            Bus.connect(
                settings.nats_url,
                name="switch-poller",
                registry=registry,
                service="switch_poller",
                auth=settings.nats_auth(),
                replicas=settings.nats_replicas,
            )
        )

        polling: list[Poller] = []  # the poller once it exists: a failing round makes the service unhealthy

        async def healthy() -> bool:
            return bus.nc.is_connected and not any(p.failing_rounds for p in polling)

        await stack.enter_async_context(ops_server(registry, settings.ops_port, healthy))
        switches = await bus.kv_mirror("kvbench_switches")
        secrets = await bus.kv_mirror("kvbench_secrets")
        stack.push_async_callback(switches.stop)
        stack.push_async_callback(secrets.stop)
        unread = Gauge(metric_name("switch_poller", "switches_unread", "count"), "Switches not read", registry=registry)
        key = settings.stored_secrets_key()
        if key is None:
            log.warning("no secrets key (KVBENCH_SECRETS_KEY_FILE): no switch login can be read")
        poller = Poller(switches.snapshot, secrets.snapshot, bus.publish, open_secret=key.decrypt if key else None)
        polling.append(poller)

        async def count() -> None:
            while not stop.is_set():
                connected.set(len(poller.status))
                unread.set(sum(1 for s in poller.status.values() if not s.ok))
                await asyncio.sleep(1.0)

        log.info("switch-poller ready", extra={"interval_s": settings.interval_s})
        counting = asyncio.create_task(count())
        try:
            await poller.run(settings.interval_s, stop)
        finally:
            counting.cancel()


def main() -> None:
    settings = load_settings(SwitchPollerSettings)
    configure_logging("switch-poller", settings.log_level, settings.log_json)
    run_service(lambda stop: run(settings, stop))
