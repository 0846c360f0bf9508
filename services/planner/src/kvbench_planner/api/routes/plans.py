"""Plan review: every refusal and warning at once, and the plan's schema."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from kvbench_contracts.plan import Plan
from kvbench_planner.api.deps import ReviewDep, review_response
from kvbench_planner.api.openapi import PLAN_BODY, REFUSED

router = APIRouter(tags=["plans"])


@router.post("/v1/plans/validate", openapi_extra=PLAN_BODY, responses=REFUSED)
async def validate(review: ReviewDep) -> JSONResponse:
    """Review a plan: every refusal and warning, and on success the expanded plan."""
    return review_response(review)


@router.get("/v1/plans/schema")
async def plan_schema() -> dict[str, Any]:
    return Plan.model_json_schema()
