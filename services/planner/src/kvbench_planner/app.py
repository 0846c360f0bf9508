"""The planner's REST API (FastAPI). OpenAPI at /openapi.json; no page loads assets from a CDN."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from kvbench_contracts.fabric import SwitchConfig, SwitchSpec
from kvbench_contracts.plan import Plan
from kvbench_contracts.problem import Problem
from kvbench_core.bus import Bus
from kvbench_core.metrics import metric_name, new_registry
from kvbench_planner.conductor import CONTROL_EVENTS, Conductor
from kvbench_planner.registry import NAME_PATTERN, Registry
from kvbench_planner.settings import PlannerSettings
from kvbench_planner.validation import MAX_DOCUMENT_BYTES, Review, parse_document, review_plan
from kvbench_stacks.catalog import ORCHESTRATOR_LOCKS
from kvbench_stacks.query import stack_rows

__all__ = ["create_app"]

log = logging.getLogger("kvbench_planner")

# the plan's JSON Schema, with its definitions moved where OpenAPI resolves them
_PLAN_SCHEMA = Plan.model_json_schema(ref_template="#/components/schemas/{model}")
_PLAN_DEFS: dict[str, Any] = _PLAN_SCHEMA.pop("$defs", {})
_PLAN_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": _PLAN_SCHEMA},
            "application/yaml": {"schema": {"type": "string", "description": "The same plan as YAML"}},
        },
    }
}
_REFUSED: dict[int | str, dict[str, Any]] = {
    422: {"description": "Refused: one {workload, field, code, message, fix} entry per problem"},
    413: {"description": "The document is larger than 1 MB"},
}
_UNKNOWN_NODES: dict[int | str, dict[str, Any]] = {422: {"description": "Unknown machines"}}
_BAD_SECRET: dict[int | str, dict[str, Any]] = {422: {"description": "Bad name or value"}}
_bearer = HTTPBearer(auto_error=False)


class ClusterGroupIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN.pattern, description="Group name: lowercase letters, digits, dashes")
    nodes: list[str] = Field(min_length=1, max_length=256, description="Node ids of registered machines")


class SwitchIn(SwitchSpec):
    """A switch to connect: where to read it and a read-only login (stored as a secret, never returned)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    credential: SecretStr = Field(
        min_length=1, description="Read-only login: the v2c community, or SNMPv3 'user:authkey:privkey'"
    )


class SecretIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: SecretStr = Field(min_length=1, max_length=8192, description="The secret; it is never returned")


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


class AsciiJSONResponse(JSONResponse):
    """Messages echo the user's input, which may hold lone surrogates: escape to ASCII so they always encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode()


def _review_response(review: Review) -> JSONResponse:
    return AsciiJSONResponse(review.as_dict(), status_code=200 if review.valid else 422)


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
            machines = await Registry(bus).start()
            conductor = Conductor(bus, settings, machines)
            app.state.conductor, app.state.bus, app.state.registry = conductor, bus, machines
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
                await machines.stop()

    app = FastAPI(title="kvbench planner", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings
    plain_openapi = app.openapi

    def openapi_with_plan() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = plain_openapi()
            schema.setdefault("components", {}).setdefault("schemas", {}).update(_PLAN_DEFS)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi_with_plan  # type: ignore[method-assign]

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

    def conductor_of(request: Request) -> Conductor:
        conductor: Conductor = request.app.state.conductor
        return conductor

    def registry_of(request: Request) -> Registry:
        machines: Registry = request.app.state.registry
        return machines

    async def read_plan(request: Request) -> Review:
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > MAX_DOCUMENT_BYTES:
            raise HTTPException(status_code=413, detail=f"the plan is larger than {MAX_DOCUMENT_BYTES} bytes")
        body = await request.body()
        data, problem = parse_document(body)
        if problem is not None:
            return Review(None, [problem])
        groups = registry_of(request).groups()
        review = review_plan(data, groups.get)
        if review.plan is not None:
            known = set(registry_of(request).secret_names())
            for w in review.plan.workloads:
                if w.hf_token_secret and w.hf_token_secret not in known:
                    review.errors.append(
                        Problem(
                            code="unknown_secret",
                            message=f"There is no secret {w.hf_token_secret!r}",
                            fix="Store the Hugging Face token with PUT /v1/secrets/{name}.",
                            field="hf_token_secret",
                            workload=w.name,
                        )
                    )
            if review.errors:
                review.plan, review.expanded = None, None
        return review

    @app.get("/healthz", tags=["ops"])
    async def healthz(request: Request) -> dict[str, bool]:
        bus: Bus = request.app.state.bus
        return {"ok": bus.nc.is_connected}

    @app.get("/metrics", tags=["ops"], response_class=Response)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/plans/validate", tags=["plans"], openapi_extra=_PLAN_BODY, responses=_REFUSED)
    async def validate(request: Request) -> JSONResponse:
        """Review a plan: every refusal and warning, and on success the expanded plan."""
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
        responses=_REFUSED,
    )
    async def create_run(request: Request) -> JSONResponse:
        review = await read_plan(request)
        if not review.valid or review.plan is None:
            refused.inc()
            return _review_response(review)
        state = await conductor_of(request).submit(review.plan, review.machines)
        submitted.inc()
        log.info("run submitted", extra={"run_id": state.run_id, "plan": state.plan_name, "jobs": len(state.jobs)})
        return JSONResponse(
            {"run_id": state.run_id, "jobs": len(state.jobs), "warnings": [w.as_dict() for w in review.warnings]},
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
        """Machines whose agent is heartbeating now, with their inventory."""
        return list(registry_of(request).live_nodes().values())

    @app.get("/v1/cluster-groups", tags=["cluster groups"])
    async def list_groups(request: Request) -> list[dict[str, Any]]:
        machines = registry_of(request)
        live = machines.live_nodes()
        explicit = machines.explicit_groups()
        return [
            {
                "name": name,
                "declared_by": "api" if name in explicit else "agents",
                "machines": [{**m.model_dump(), "up": m.name in live} for m in group],
            }
            for name, group in sorted(machines.groups().items())
        ]

    @app.post(
        "/v1/cluster-groups",
        tags=["cluster groups"],
        status_code=201,
        dependencies=[Depends(require_token)],
        responses=_UNKNOWN_NODES,
    )
    async def create_group(group: ClusterGroupIn, request: Request) -> dict[str, Any]:
        machines = registry_of(request)
        known = machines.inventories()
        unknown = [n for n in group.nodes if n not in known]
        if unknown:
            raise HTTPException(
                status_code=422,
                detail=[
                    {
                        "field": "nodes",
                        "code": "unknown_node",
                        "message": f"No machine registered as {', '.join(unknown)}",
                        "fix": "Start the agent on each machine (GET /v1/nodes lists them), then create the group.",
                    }
                ],
            )
        await machines.put_group(group.name, sorted(set(group.nodes)))
        return {"name": group.name, "nodes": sorted(set(group.nodes))}

    @app.delete(
        "/v1/cluster-groups/{name}",
        tags=["cluster groups"],
        status_code=204,
        dependencies=[Depends(require_token)],
        responses={404: {"description": "No such group"}},
    )
    async def delete_group(name: str, request: Request) -> Response:
        if not await registry_of(request).delete_group(name):
            raise HTTPException(status_code=404, detail=f"no cluster group {name} created through the API")
        return Response(status_code=204)

    @app.get("/v1/secrets", tags=["secrets"])
    async def list_secrets(request: Request) -> list[dict[str, str]]:
        """Names only: a secret's value is never returned."""
        return [{"name": n} for n in registry_of(request).secret_names()]

    @app.put(
        "/v1/secrets/{name}",
        tags=["secrets"],
        status_code=204,
        dependencies=[Depends(require_token)],
        responses=_BAD_SECRET,
    )
    async def put_secret(name: str, secret: SecretIn, request: Request) -> Response:
        if not NAME_PATTERN.match(name):
            raise HTTPException(
                status_code=422,
                detail=[
                    {
                        "field": "name",
                        "code": "invalid_field",
                        "message": "A secret name uses lowercase letters, digits and dashes",
                        "fix": "Rename the secret, e.g. hf-token.",
                    }
                ],
            )
        await registry_of(request).put_secret(name, secret.value.get_secret_value())
        log.info("secret stored", extra={"entry": name})
        return Response(status_code=204)

    @app.delete(
        "/v1/secrets/{name}",
        tags=["secrets"],
        status_code=204,
        dependencies=[Depends(require_token)],
        responses={404: {"description": "No such secret"}},
    )
    async def delete_secret(name: str, request: Request) -> Response:
        if not await registry_of(request).delete_secret(name):
            raise HTTPException(status_code=404, detail=f"no secret {name}")
        return Response(status_code=204)

    @app.get("/v1/switches", tags=["switches"])
    async def list_switches(request: Request) -> dict[str, Any]:
        """Connected switches (never their credentials) and the switches the machines' LLDP found, so you know
        which ones to connect."""
        registry = registry_of(request)
        return {
            "connected": [c.model_dump(exclude={"secret"}) for c in registry.switches()],
            "discovered": registry.discovered_switches(),
        }

    @app.post("/v1/switches", tags=["switches"], status_code=201, dependencies=[Depends(require_token)])
    async def connect_switch(switch: SwitchIn, request: Request) -> dict[str, Any]:
        config = SwitchConfig(
            **switch.model_dump(exclude={"credential"}),
            secret=Registry.switch_secret_name(switch.name),
        )
        stored = await registry_of(request).put_switch(config, switch.credential.get_secret_value())
        log.info("switch connected", extra={"switch": switch.name, "address": switch.address})
        return stored.model_dump(exclude={"secret"})

    @app.delete(
        "/v1/switches/{name}",
        tags=["switches"],
        status_code=204,
        dependencies=[Depends(require_token)],
        responses={404: {"description": "No such switch"}},
    )
    async def disconnect_switch(name: str, request: Request) -> Response:
        if not await registry_of(request).delete_switch(name):
            raise HTTPException(status_code=404, detail=f"no switch {name}")
        return Response(status_code=204)

    @app.get("/v1/catalog/stacks", tags=["catalog"])
    async def stacks(
        engine: str | None = None, vendor: str | None = None, version: str | None = None
    ) -> list[dict[str, Any]]:
        """Every stack; each one that cannot be chosen for the query says why."""
        return stack_rows(engine, vendor, version)

    @app.get("/v1/catalog/orchestrators", tags=["catalog"])
    async def orchestrators() -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = [{"id": "bare_metal", "locked": False, "why_not": None}]
        rows += [{"id": k, "locked": True, "why_not": v} for k, v in ORCHESTRATOR_LOCKS.items()]
        return rows

    return app
