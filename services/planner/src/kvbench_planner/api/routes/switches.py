"""Switches: connect one with a read-only login (kept as a secret), list what is connected and discovered."""

from __future__ import annotations

import logging

from fastapi import APIRouter, HTTPException, Response

from kvbench_contracts.fabric import SwitchConfig, SwitchSpec
from kvbench_planner.api.deps import RegistryDep, authorized
from kvbench_planner.api.schemas import Switches, SwitchIn
from kvbench_planner.registry import Registry

router = APIRouter(tags=["switches"])
log = logging.getLogger("kvbench_planner")


@router.get("/v1/switches", dependencies=authorized)
async def list_switches(machines: RegistryDep) -> Switches:
    """Connected switches (never their credentials) and the switches the machines' LLDP found, so you know
    which ones to connect."""
    return Switches(
        connected=[SwitchSpec.model_validate(c.model_dump(exclude={"secret"})) for c in machines.switches()],
        discovered=machines.discovered_switches(),
    )


@router.post("/v1/switches", status_code=201, dependencies=authorized)
async def connect_switch(switch: SwitchIn, machines: RegistryDep) -> SwitchSpec:
    config = SwitchConfig(**switch.model_dump(exclude={"credential"}), secret=Registry.switch_secret_name(switch.name))
    stored = await machines.put_switch(config, switch.credential.get_secret_value())
    log.info("switch connected", extra={"switch": switch.name, "address": switch.address})
    return SwitchSpec.model_validate(stored.model_dump(exclude={"secret"}))


@router.delete(
    "/v1/switches/{name}",
    status_code=204,
    dependencies=authorized,
    responses={404: {"description": "No such switch"}},
)
async def disconnect_switch(name: str, machines: RegistryDep) -> Response:
    if not await machines.delete_switch(name):
        raise HTTPException(status_code=404, detail=f"no switch {name}")
    return Response(status_code=204)
