"""Secrets (a Hugging Face token, switch logins): stored, listed by name, never returned."""

from __future__ import annotations

import logging

from fastapi import APIRouter, HTTPException, Response

from kvbench_planner.api.deps import RegistryDep, authorized, refusal
from kvbench_planner.api.openapi import BAD_SECRET
from kvbench_planner.api.schemas import SecretIn, SecretName
from kvbench_planner.registry import NAME_PATTERN

router = APIRouter(tags=["secrets"])
log = logging.getLogger("kvbench_planner")


@router.get("/v1/secrets", dependencies=authorized)
async def list_secrets(machines: RegistryDep) -> list[SecretName]:
    """Names only: a secret's value is never returned."""
    return [SecretName(name=n) for n in machines.secret_names()]


@router.put("/v1/secrets/{name}", status_code=204, dependencies=authorized, responses=BAD_SECRET)
async def put_secret(name: str, secret: SecretIn, machines: RegistryDep) -> Response:
    if not NAME_PATTERN.match(name):
        raise refusal(
            422,
            "name",
            "invalid_field",
            "A secret name uses lowercase letters, digits and dashes",
            "Rename the secret, e.g. hf-token.",
        )
    await machines.put_secret(name, secret.value.get_secret_value())
    log.info("secret stored", extra={"entry": name})
    return Response(status_code=204)


@router.delete(
    "/v1/secrets/{name}", status_code=204, dependencies=authorized, responses={404: {"description": "No such secret"}}
)
async def delete_secret(name: str, machines: RegistryDep) -> Response:
    if not await machines.delete_secret(name):
        raise HTTPException(status_code=404, detail=f"no secret {name}")
    return Response(status_code=204)
