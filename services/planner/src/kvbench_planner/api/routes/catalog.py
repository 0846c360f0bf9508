"""The stack catalog and the orchestrators, with why each cannot be chosen for a query."""

from __future__ import annotations

from fastapi import APIRouter

from kvbench_planner.api.schemas import OrchestratorRow, StackRow
from kvbench_stacks.catalog import ORCHESTRATOR_LOCKS
from kvbench_stacks.query import stack_rows

router = APIRouter(tags=["catalog"])


@router.get("/v1/catalog/stacks")
async def stacks(engine: str | None = None, vendor: str | None = None, version: str | None = None) -> list[StackRow]:
    """Every stack; each one that cannot be chosen for the query says why."""
    return [StackRow.model_validate(row) for row in stack_rows(engine, vendor, version)]


@router.get("/v1/catalog/orchestrators")
async def orchestrators() -> list[OrchestratorRow]:
    rows = [OrchestratorRow(id="bare_metal", locked=False, why_not=None)]
    rows += [OrchestratorRow(id=k, locked=True, why_not=v) for k, v in ORCHESTRATOR_LOCKS.items()]
    return rows
