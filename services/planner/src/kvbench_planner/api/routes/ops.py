"""Health and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kvbench_planner.api.deps import BusDep, MetricsDep
from kvbench_planner.api.schemas import Health

router = APIRouter(tags=["ops"])


@router.get("/healthz")
async def healthz(bus: BusDep) -> Health:
    return Health(ok=bus.nc.is_connected)


@router.get("/metrics", response_class=Response)
async def metrics(planner: MetricsDep) -> Response:
    return Response(generate_latest(planner.registry), media_type=CONTENT_TYPE_LATEST)
