"""What the routes share: the services on the app's state as typed dependencies, the token check, the plan reader."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry, Counter

from kvbench_contracts.plan import acceptance_plan
from kvbench_contracts.problem import Problem
from kvbench_core.bus import Bus
from kvbench_core.metrics import metric_name
from kvbench_planner.conductor import Conductor
from kvbench_planner.registry import Registry
from kvbench_planner.settings import PlannerSettings
from kvbench_planner.validation import MAX_DOCUMENT_BYTES, Review, parse_document, review_plan

__all__ = [
    "AcceptanceReviewDep",
    "AsciiJSONResponse",
    "BusDep",
    "ConductorDep",
    "PlannerMetrics",
    "RegistryDep",
    "ReviewDep",
    "SettingsDep",
    "authorized",
    "refusal",
    "require_token",
    "review_response",
]

_bearer = HTTPBearer(auto_error=False)


@dataclass(frozen=True)
class PlannerMetrics:
    registry: CollectorRegistry
    submitted: Counter
    refused: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> PlannerMetrics:
        return cls(
            registry,
            Counter(metric_name("planner", "runs_submitted", "total"), "Runs accepted", registry=registry),
            Counter(metric_name("planner", "plans_refused", "total"), "Plans refused", registry=registry),
        )


def _settings(request: Request) -> PlannerSettings:
    settings: PlannerSettings = request.app.state.settings
    return settings


def _conductor(request: Request) -> Conductor:
    conductor: Conductor = request.app.state.conductor
    return conductor


def _registry(request: Request) -> Registry:
    machines: Registry = request.app.state.registry
    return machines


def _bus(request: Request) -> Bus:
    bus: Bus = request.app.state.bus
    return bus


def _metrics(request: Request) -> PlannerMetrics:
    metrics: PlannerMetrics = request.app.state.metrics
    return metrics


SettingsDep = Annotated[PlannerSettings, Depends(_settings)]
ConductorDep = Annotated[Conductor, Depends(_conductor)]
RegistryDep = Annotated[Registry, Depends(_registry)]
BusDep = Annotated[Bus, Depends(_bus)]
MetricsDep = Annotated[PlannerMetrics, Depends(_metrics)]


def require_token(
    settings: SettingsDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Mutating endpoints, and reads that show plans, machines or switches, need the bearer token from settings
    (when one is set)."""
    expected = settings.bearer_token()
    if expected is None:
        return
    # as bytes: compare_digest refuses non-ASCII str, and a token a client sends may be anything
    given = credentials.credentials.encode("utf-8", "surrogateescape") if credentials else b""
    if credentials is None or not secrets.compare_digest(given, expected.encode("utf-8")):
        raise HTTPException(status_code=401, detail="a valid bearer token is required (Authorization: Bearer ...)")


authorized = [Depends(require_token)]


class AsciiJSONResponse(JSONResponse):
    """Messages echo the user's input, which may hold lone surrogates: escape to ASCII so they always encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode()


def review_response(review: Review) -> JSONResponse:
    return AsciiJSONResponse(review.as_dict(), status_code=200 if review.valid else 422)


def refusal(status_code: int, field: str, code: str, message: str, fix: str) -> HTTPException:
    """A 4xx whose detail is one problem in the API's form."""
    return HTTPException(
        status_code=status_code, detail=[{"field": field, "code": code, "message": message, "fix": fix}]
    )


async def read_plan(request: Request, machines: RegistryDep) -> Review:
    """The request's plan reviewed against the registered groups and secrets (bounded in size before parsing)."""
    data, problem = parse_document(await _bounded_body(request))
    if problem is not None:
        return Review(None, [problem])
    return _reviewed(data, machines)


async def read_acceptance_plan(request: Request, machines: RegistryDep, workload: str | None = None) -> Review:
    """``POST /v1/accept?workload=NAME``: the request's plan made the acceptance test of one of its workloads
    (kvbench_contracts.plan.acceptance_plan), then reviewed as any plan."""
    data, problem = parse_document(await _bounded_body(request))
    if problem is None:
        data, problem = acceptance_plan(data, workload)
    if problem is not None:
        return Review(None, [problem])
    return _reviewed(data, machines)


async def _bounded_body(request: Request) -> bytes:
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > MAX_DOCUMENT_BYTES:
        raise HTTPException(status_code=413, detail=f"the plan is larger than {MAX_DOCUMENT_BYTES} bytes")
    # read at most the limit, whatever Content-Length says (or when there is none: a chunked body)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_DOCUMENT_BYTES:
            raise HTTPException(status_code=413, detail=f"the plan is larger than {MAX_DOCUMENT_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _reviewed(data: object, machines: Registry) -> Review:
    review = review_plan(data, machines.groups().get)
    if review.plan is not None:
        known = set(machines.secret_names())
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


ReviewDep = Annotated[Review, Depends(read_plan)]
AcceptanceReviewDep = Annotated[Review, Depends(read_acceptance_plan)]
