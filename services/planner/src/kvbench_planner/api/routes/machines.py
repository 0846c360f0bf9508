"""The machines: agents heartbeating now, and the cluster groups plans run on."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Response

from kvbench_contracts.node import Heartbeat
from kvbench_core.naming import natural_key
from kvbench_planner.api.deps import RegistryDep, authorized, refusal
from kvbench_planner.api.openapi import UNKNOWN_NODES
from kvbench_planner.api.schemas import ClusterGroupCreated, ClusterGroupIn, ClusterGroupOut, GroupMachine

router = APIRouter()


@router.get("/v1/nodes", tags=["nodes"], dependencies=authorized)
async def nodes(machines: RegistryDep) -> list[Heartbeat]:
    """Machines whose agent is heartbeating now, with their inventory."""
    return list(machines.live_nodes().values())


@router.get("/v1/cluster-groups", tags=["cluster groups"], dependencies=authorized)
async def list_groups(machines: RegistryDep) -> list[ClusterGroupOut]:
    live = machines.live_nodes()
    explicit = machines.explicit_groups()
    return [
        ClusterGroupOut(
            name=name,
            declared_by="api" if name in explicit else "agents",
            machines=[GroupMachine(**m.model_dump(), up=m.name in live) for m in group],
        )
        for name, group in sorted(machines.groups().items())
    ]


@router.post(
    "/v1/cluster-groups", tags=["cluster groups"], status_code=201, dependencies=authorized, responses=UNKNOWN_NODES
)
async def create_group(group: ClusterGroupIn, machines: RegistryDep) -> ClusterGroupCreated:
    known = machines.inventories()
    unknown = [n for n in group.nodes if n not in known]
    if unknown:
        raise refusal(
            422,
            "nodes",
            "unknown_node",
            f"No machine registered as {', '.join(unknown)}",
            "Start the agent on each machine (GET /v1/nodes lists them), then create the group.",
        )
    nodes = sorted(set(group.nodes), key=natural_key)
    await machines.put_group(group.name, nodes)
    return ClusterGroupCreated(name=group.name, nodes=nodes)


@router.delete(
    "/v1/cluster-groups/{name}",
    tags=["cluster groups"],
    status_code=204,
    dependencies=authorized,
    responses={404: {"description": "No such group"}},
)
async def delete_group(name: str, machines: RegistryDep) -> Response:
    if not await machines.delete_group(name):
        raise HTTPException(status_code=404, detail=f"no cluster group {name} created through the API")
    return Response(status_code=204)
