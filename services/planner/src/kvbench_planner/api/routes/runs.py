"""Runs: submit a plan, follow it, cancel it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, HTTPException
from fastapi.responses import JSONResponse

from kvbench_planner.api.deps import (
    AcceptanceReviewDep,
    ConductorDep,
    MetricsDep,
    PlannerMetrics,
    ReviewDep,
    SettingsDep,
    authorized,
    refusal,
    review_response,
)
from kvbench_planner.api.openapi import PLAN_BODY, REFUSED
from kvbench_planner.api.schemas import RunCreated, RunDetail, RunSummary
from kvbench_planner.conductor import Conductor
from kvbench_planner.settings import PlannerSettings
from kvbench_planner.state import ACTIVE
from kvbench_planner.validation import Review

router = APIRouter(tags=["runs"])
log = logging.getLogger("kvbench_planner")
_NO_RUN: dict[int | str, dict[str, Any]] = {404: {"description": "No such run"}}
Route = TypeVar("Route", bound=Callable[..., Any])


def _submitting(path: str, created: str) -> Callable[[Route], Route]:
    """The route of a plan submission: its body, its refusals, and what a created run answers."""
    return router.post(
        path,
        status_code=201,
        openapi_extra=PLAN_BODY,
        dependencies=authorized,
        responses={
            **REFUSED,
            201: {"model": RunCreated, "description": created},
            429: {"description": "Too many runs pending or running (KVBENCH_PLANNER_MAX_ACTIVE_RUNS)"},
        },
    )


@_submitting("/v1/runs", "Accepted: the run's id and its warnings")
async def create_run(
    review: ReviewDep, conductor: ConductorDep, metrics: MetricsDep, settings: SettingsDep
) -> JSONResponse:
    return await _submit(review, conductor, metrics, settings)


@_submitting("/v1/accept", "The acceptance run's id and its warnings")
async def create_acceptance_run(
    review: AcceptanceReviewDep, conductor: ConductorDep, metrics: MetricsDep, settings: SettingsDep
) -> JSONResponse:
    """The store-and-reload acceptance test of one workload of the plan (``?workload=NAME`` when it has several):
    the same requests cold, warm, after emptying the engines' prefix cache and after restarting the stack; the
    run's report says, step by step, whether records were created in the external tier and reloaded from it."""
    return await _submit(review, conductor, metrics, settings)


async def _submit(
    review: Review, conductor: Conductor, metrics: PlannerMetrics, settings: PlannerSettings
) -> JSONResponse:
    if not review.valid or review.plan is None:
        metrics.refused.inc()
        return review_response(review)
    active = [s for s in conductor.runs.values() if s.status in ACTIVE]
    if len(active) >= settings.max_active_runs:
        metrics.refused.inc()
        raise refusal(
            429,
            "",
            "too_many_runs",
            f"{len(active)} runs are pending or running; this planner takes at most {settings.max_active_runs}",
            "Wait for one to end or cancel one (kvbench cancel RUN_ID), or raise KVBENCH_PLANNER_MAX_ACTIVE_RUNS.",
        )
    if review.plan.search is not None:
        metrics.refused.inc()
        raise refusal(
            422,
            "search",
            "search_not_on_cluster",
            "A plan that asks a question (search:) is answered by the simulator for now; the cluster runs plans "
            "that list their load levels and sizings",
            "Run kvbench sim search PLAN, then put its answer (best) into the plan and run that without search:.",
        )
    if review.plan.when_busy == "refuse" and (busy := conductor.busy_for(review.plan)):
        metrics.refused.inc()
        raise refusal(
            409,
            "when_busy",
            "machines_busy",
            "The machines this plan needs are busy: " + "; ".join(busy),
            "Run it again once they are free (kvbench runs lists what runs), or set when_busy: queue to wait for them.",
        )
    state = await conductor.submit(review.plan, review.machines)
    metrics.submitted.inc()
    log.info("run submitted", extra={"run_id": state.run_id, "plan": state.plan_name, "jobs": len(state.jobs)})
    created = RunCreated.model_validate(
        {"run_id": state.run_id, "jobs": len(state.jobs), "warnings": [w.as_dict() for w in review.warnings]}
    )
    return JSONResponse(created.model_dump(mode="json"), status_code=201)


@router.get("/v1/runs", dependencies=authorized)
async def list_runs(conductor: ConductorDep) -> list[RunSummary]:
    runs = sorted(conductor.runs.values(), key=lambda s: s.created_at, reverse=True)
    return [
        RunSummary(
            run_id=s.run_id,
            plan_name=s.plan_name,
            status=s.status,
            progress=round(s.progress, 4),
            created_at=s.created_at.isoformat(),
            queue=s.queue,
        )
        for s in runs
    ]


@router.get("/v1/runs/{run_id}", dependencies=authorized, responses=_NO_RUN)
async def get_run(run_id: str, conductor: ConductorDep) -> RunDetail:
    state = conductor.runs.get(run_id)
    if state is None:
        raise HTTPException(status_code=404, detail=f"no run {run_id}")
    return RunDetail.model_validate(state.public())


@router.post("/v1/runs/{run_id}/cancel", dependencies=authorized, responses=_NO_RUN)
async def cancel_run(run_id: str, conductor: ConductorDep) -> RunDetail:
    state = await conductor.cancel(run_id)
    if state is None:
        raise HTTPException(status_code=404, detail=f"no run {run_id}")
    return RunDetail.model_validate(state.public())
