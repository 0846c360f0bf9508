"""What FastAPI cannot infer for the OpenAPI document: the plan body (read raw, as YAML or JSON) and refusals."""

from __future__ import annotations

from typing import Any

from kvbench_contracts.plan import Plan
from kvbench_planner.api.schemas import ReviewOut

__all__ = ["BAD_SECRET", "PLAN_BODY", "PLAN_DEFS", "REFUSED", "UNKNOWN_NODES"]

# the plan's JSON Schema, with its definitions moved where OpenAPI resolves them
_PLAN_SCHEMA = Plan.model_json_schema(ref_template="#/components/schemas/{model}")
PLAN_DEFS: dict[str, Any] = _PLAN_SCHEMA.pop("$defs", {})
PLAN_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": _PLAN_SCHEMA},
            "application/yaml": {"schema": {"type": "string", "description": "The same plan as YAML"}},
        },
    }
}
REFUSED: dict[int | str, dict[str, Any]] = {
    200: {"model": ReviewOut, "description": "The review: valid, with its warnings and the expanded plan"},
    422: {"model": ReviewOut, "description": "Refused: one {workload, field, code, message, fix} entry per problem"},
    413: {"description": "The document is larger than 1 MB"},
}
UNKNOWN_NODES: dict[int | str, dict[str, Any]] = {422: {"description": "Unknown machines"}}
BAD_SECRET: dict[int | str, dict[str, Any]] = {422: {"description": "Bad name or value"}}
