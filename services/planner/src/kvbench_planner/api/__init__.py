"""The planner's REST API (FastAPI): one router per resource (``routes/``), typed dependencies (``deps``) and
response models (``schemas``), so /openapi.json describes requests and responses. No page loads assets from a CDN.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline

from kvbench_core.bus import Bus
from kvbench_core.metrics import new_registry
from kvbench_planner.api.deps import AsciiJSONResponse, PlannerMetrics
from kvbench_planner.api.openapi import PLAN_DEFS
from kvbench_planner.api.routes import catalog, machines, ops, plans, runs, secrets, switches
from kvbench_planner.conductor import CONTROL_EVENTS, BusUnavailableError, Conductor
from kvbench_planner.registry import Registry, SecretsKeyMissingError
from kvbench_planner.settings import PlannerSettings

__all__ = ["create_app"]

log = logging.getLogger("kvbench_planner")
ROUTERS = (ops.router, plans.router, runs.router, machines.router, secrets.router, switches.router, catalog.router)


def create_app(settings: PlannerSettings) -> FastAPI:
    metrics = PlannerMetrics.create(new_registry())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.bearer_token() is None:
            log.warning(
                "API authentication is disabled (KVBENCH_API_TOKEN is unset); "
                "fine for the embedded demo, not for a shared lab"
            )
        async with Bus.connect(
            settings.nats_url,
            name="planner",
            registry=metrics.registry,
            service="planner",
            auth=settings.nats_auth(),
            replicas=settings.nats_replicas,
        ) as bus:
            registry = await Registry(bus, settings.stored_secrets_key()).start()
            conductor = Conductor(bus, settings, registry)
            app.state.conductor, app.state.bus, app.state.registry = conductor, bus, registry
            bus.subscribe(
                CONTROL_EVENTS,
                conductor.on_event,
                durable="planner",
                stream="KVBENCH_CONTROL",
                batch=64,
                deliver_new=True,
            )
            await conductor.resume()
            try:
                yield
            finally:
                await conductor.close()
                await registry.stop()

    # /docs and /redoc from assets the fastapi-offline package ships: no page loads anything from a CDN
    app = FastAPIOffline(title="kvbench planner", version="0.1.0", lifespan=lifespan)
    app.state.settings, app.state.metrics = settings, metrics
    for router in ROUTERS:
        app.include_router(router)
    _describe_plan_body(app)

    @app.exception_handler(SecretsKeyMissingError)
    async def no_secrets_key(_: Request, exc: SecretsKeyMissingError) -> JSONResponse:
        problem = {
            "field": "KVBENCH_SECRETS_KEY_FILE",
            "code": "no_secrets_key",
            "message": "The planner holds no key to encrypt secrets with, so it stores none",
            "fix": "Give the planner (and the switch poller) KVBENCH_SECRETS_KEY_FILE, a file holding `openssl rand "
            "-base64 32`, or KVBENCH_SECRETS_KEY; `kvbench up` makes one.",
        }
        return AsciiJSONResponse({"detail": [problem]}, status_code=409)

    @app.exception_handler(BusUnavailableError)
    async def bus_unavailable(_: Request, exc: BusUnavailableError) -> JSONResponse:
        problem = {"field": "", **exc.problem.as_reason()}
        return AsciiJSONResponse({"detail": [problem]}, status_code=503, headers={"Retry-After": "10"})

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [
            {
                "field": ".".join(str(p) for p in e.get("loc", ())),
                "code": "invalid_field",
                "message": str(e.get("msg", "")),
                "fix": "Send a value of the documented type.",
            }
            for e in exc.errors()
        ]
        return AsciiJSONResponse({"detail": detail}, status_code=422)

    return app


def _describe_plan_body(app: FastAPI) -> None:
    """The plan is read raw (YAML or JSON), so its schema is added to the OpenAPI document by hand."""
    plain_openapi = app.openapi

    def openapi_with_plan() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = plain_openapi()
            schema.setdefault("components", {}).setdefault("schemas", {}).update(PLAN_DEFS)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi_with_plan  # type: ignore[method-assign]
