"""The switch-poller: reads each connected switch with a read-only login and publishes port counters.

This first version carries the service's lifecycle (bus, ops server, settings, switch list) and polls no
driver yet; the SNMP and gNMI drivers arrive with the fabric work. With no switch connected it idles.
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
from kvbench_core.settings import ServiceSettings, load_settings

__all__ = ["SwitchPollerSettings", "main", "run"]

log = logging.getLogger("kvbench_switch_poller")


class SwitchPollerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="KVBENCH_SWITCH_POLLER_", extra="ignore", frozen=True)

    ops_port: int = Field(0, ge=0, le=65535, description="Port of /healthz and /metrics (0 = any free port)")
    interval_s: float = Field(10.0, gt=0, le=3600, description="Polling period per switch")


async def run(settings: SwitchPollerSettings, stop: asyncio.Event) -> None:
    registry = new_registry()
    connected = Gauge(metric_name("switch_poller", "switches_connected", "count"), "Switches polled", registry=registry)
    async with AsyncExitStack() as stack:
        bus = await stack.enter_async_context(
            Bus.connect(settings.nats_url, name="switch-poller", registry=registry, service="switch_poller")
        )

        async def healthy() -> bool:
            return bus.nc.is_connected

        await stack.enter_async_context(ops_server(registry, settings.ops_port, healthy))
        connected.set(0)
        log.info("switch-poller ready; no switch connected", extra={"interval_s": settings.interval_s})
        await stop.wait()


def main() -> None:
    settings = load_settings(SwitchPollerSettings)
    configure_logging("switch-poller", settings.log_level, settings.log_json)
    run_service(lambda stop: run(settings, stop))
