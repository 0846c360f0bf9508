"""A Prometheus registry per service and a small ops HTTP server (/healthz, /metrics)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["HealthCheck", "metric_name", "new_registry", "ops_server"]

HealthCheck = Callable[[], Awaitable[bool]]


def new_registry() -> CollectorRegistry:
    """A fresh registry, never the process-global one, so tests and in-process services never collide."""
    return CollectorRegistry(auto_describe=True)


def metric_name(service: str, thing: str, unit: str) -> str:
    """House rule: ``kvbench_<service>_<thing>_<unit>``."""
    return f"kvbench_{service.replace('-', '_')}_{thing}_{unit}"


@asynccontextmanager
async def ops_server(
    registry: CollectorRegistry,
    port: int,
    health: HealthCheck | None = None,
    host: str = "127.0.0.1",
    extra_routes: list[web.RouteDef] | None = None,
) -> AsyncIterator[web.AppRunner]:
    async def healthz(_: web.Request) -> web.Response:
        ok = await health() if health else True
        return web.json_response({"ok": ok}, status=200 if ok else 503)

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/metrics", metrics), *(extra_routes or [])])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        yield runner
    finally:
        await runner.cleanup()
