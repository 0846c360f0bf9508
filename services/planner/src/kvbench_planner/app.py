"""The planner's REST API (FastAPI). OpenAPI at /openapi.json; no page loads assets from a CDN."""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Annotated, Any

import nats.js.errors
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kvbench_contracts.plan import Plan
from kvbench_core.bus import Bus
from kvbench_core.metrics import metric_name, new_registry
from kvbench_planner.catalog import CATALOG
from kvbench_planner.conductor import CONTROL_EVENTS, Conductor
from kvbench_planner.settings import PlannerSettings
from kvbench_planner.validation import Review, parse_document, review_plan

__all__ = ["create_app"]

log = logging.getLogger("kvbench_planner")

_PLAN_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": Plan.model_json_schema()},
            "application/yaml": {"schema": {"type": "string", "description": "The same plan as YAML"}},
        },
    }
}


_bearer = HTTPBearer(auto_error=False)


def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Mutating endpoints need the bearer token from settings (when one is set)."""
    settings: PlannerSettings = request.app.state.settings
    if settings.api_token is None:
        return
    expected = settings.api_token.get_secret_value()
    if credentials is None or not secrets.compare_digest(credentials.credentials, expected):
        raise HTTPException(status_code=401, detail="a valid bearer token is required (Authorization: Bearer ...)")


def _review_response(review: Review) -> JSONResponse:
    return JSONResponse(review.as_dict(), status_code=200 if review.valid else 422)


def create_app(settings: PlannerSettings) -> FastAPI:
    registry = new_registry()
    submitted = Counter(metric_name("planner", "runs_submitted", "total"), "Runs accepted", registry=registry)
    refused = Counter(metric_name("planner", "plans_refused", "total"), "Plans refused", registry=registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.api_token is None:
            log.warning(
                "API authentication is disabled (KVBENCH_PLANNER_API_TOKEN is unset); "
                "fine for the embedded demo, not for a shared lab"
            )
        async with Bus.connect(settings.nats_url, name="planner", registry=registry, service="planner") as bus:
            conductor = Conductor(bus, settings)
            app.state.conductor = conductor
            app.state.bus = bus
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

    app = FastAPI(title="kvbench planner", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings

    def conductor_of(request: Request) -> Conductor:
        conductor: Conductor = request.app.state.conductor
        return conductor

    async def read_plan(request: Request) -> Review:
        body = await request.body()
        data, problem = parse_document(body)
        if problem is not None:
            return Review(None, [problem])
        return review_plan(data)

    @app.get("/healthz", tags=["ops"])
    async def healthz(request: Request) -> dict[str, bool]:
        bus: Bus = request.app.state.bus
        return {"ok": bus.nc.is_connected}

    @app.get("/metrics", tags=["ops"], response_class=Response)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post(
        "/v1/plans/validate",
        tags=["plans"],
        openapi_extra=_PLAN_BODY,
        responses={422: {"description": "The plan is refused; one entry per problem"}},
    )
    async def validate(request: Request) -> JSONResponse:
        return _review_response(await read_plan(request))

    @app.get("/v1/plans/schema", tags=["plans"])
    async def plan_schema() -> dict[str, Any]:
        return Plan.model_json_schema()

    @app.post(
        "/v1/runs",
        tags=["runs"],
        status_code=201,
        openapi_extra=_PLAN_BODY,
        dependencies=[Depends(require_token)],
        responses={422: {"description": "The plan is refused; one entry per problem"}},
    )
    async def create_run(request: Request) -> JSONResponse:
        review = await read_plan(request)
        if not review.valid or review.plan is None:
            refused.inc()
            return _review_response(review)
        state = await conductor_of(request).submit(review.plan)
        submitted.inc()
        log.info("run submitted", extra={"run_id": state.run_id, "plan": state.plan_name, "jobs": len(state.jobs)})
        return JSONResponse(
            {
                "run_id": state.run_id,
                "jobs": len(state.jobs),
                "warnings": [w.as_dict() for w in review.warnings],
            },
            status_code=201,
        )

    @app.get("/v1/runs", tags=["runs"])
    async def list_runs(request: Request) -> list[dict[str, Any]]:
        runs = sorted(conductor_of(request).runs.values(), key=lambda s: s.created_at, reverse=True)
        return [
            {
                "run_id": s.run_id,
                "plan_name": s.plan_name,
                "status": s.status,
                "progress": round(s.progress, 4),
                "created_at": s.created_at.isoformat(),
            }
            for s in runs
        ]

    @app.get("/v1/runs/{run_id}", tags=["runs"], responses={404: {"description": "No such run"}})
    async def get_run(run_id: str, request: Request) -> dict[str, Any]:
        state = conductor_of(request).runs.get(run_id)
        if state is None:
            raise HTTPException(status_code=404, detail=f"no run {run_id}")
        return state.public()

    @app.post(
        "/v1/runs/{run_id}/cancel",
        tags=["runs"],
        dependencies=[Depends(require_token)],
        responses={404: {"description": "No such run"}},
    )
    async def cancel_run(run_id: str, request: Request) -> dict[str, Any]:
        state = await conductor_of(request).cancel(run_id)
        if state is None:
            raise HTTPException(status_code=404, detail=f"no run {run_id}")
        return state.public()

    @app.get("/v1/nodes", tags=["nodes"])
    async def nodes(request: Request) -> list[dict[str, Any]]:
        bus: Bus = request.app.state.bus
        kv = await bus.kv("kvbench_nodes")
        out: list[dict[str, Any]] = []
        with contextlib.suppress(nats.js.errors.NoKeysError):
            for key in sorted(await kv.keys()):
                with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                    entry = await kv.get(key)
                    if entry.value:
                        out.append(json.loads(entry.value))
        return out

    @app.get("/v1/catalog/stacks", tags=["catalog"])
    async def stacks(engine: str | None = None, vendor: str | None = None) -> list[dict[str, Any]]:
        rows = []
        for spec in CATALOG.values():
            row = asdict(spec)
            why = []
            if engine and spec.engine != engine:
                why.append(f"runs on {spec.engine}, not {engine}")
            if vendor and vendor not in spec.vendors:
                why.append(f"does not run on {vendor}")
            row["selectable"] = not why
            row["why_not"] = "; ".join(why) or None
            rows.append(row)
        return rows

    return app
