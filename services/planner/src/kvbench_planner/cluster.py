"""Machines a workload runs on: a simulated cluster, a registered cluster group, or a cluster file."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kvbench_contracts.events import MachinePolicy
from kvbench_contracts.plan import SimCluster
from kvbench_stacks.hardware import gpu_spec

__all__ = ["ClusterFile", "Machine", "RdmaPort", "machines_from_sim"]


class RdmaPort(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    device: str = Field(description="RDMA device name, e.g. mlx5_0")
    state: str = Field(description="Port state as the agent read it: ACTIVE, DOWN, ...")


class Machine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Machine (node) name")
    vendor: str | None = Field(None, description="GPU vendor: nvidia or amd")
    gpu_model: str | None = Field(None, description="GPU model, e.g. L40S")
    gpus: int = Field(0, ge=0, description="GPU count")
    ram_gb: float = Field(0, ge=0, description="Host RAM, GB")
    rdma: list[RdmaPort] = Field(default_factory=list, description="RDMA ports and their state")
    simulated: bool = Field(False, description="A machine of a simulated cluster")
    policy: MachinePolicy | None = Field(
        None, description="What a plan may run or write there, from its agent's settings (older agents: unknown)"
    )


class ClusterFile(BaseModel):
    """``kvbench plan validate --cluster FILE``: ``{groups: {NAME: [machine, ...]}}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    groups: dict[str, list[Machine]] = Field(description="Cluster groups by name")


def machines_from_sim(sim: SimCluster) -> list[Machine]:
    spec = gpu_spec(sim.gpu)
    vendor = spec.vendor if spec else ("amd" if sim.gpu.upper().startswith("MI") else "nvidia")
    rdma = [RdmaPort(device="mlx5_0", state="ACTIVE")] if sim.rdma else []
    return [
        Machine(
            name=f"sim-{i}",
            vendor=vendor,
            gpu_model=sim.gpu,
            gpus=sim.gpus_per_machine,
            ram_gb=sim.host_memory_gb,
            rdma=rdma,
            simulated=True,
        )
        for i in range(sim.machines)
    ]


def machine_from_inventory(inventory: dict[str, Any]) -> Machine:
    return Machine(
        name=str(inventory.get("node_id")),
        vendor=inventory.get("vendor"),
        gpu_model=inventory.get("gpu_model"),
        gpus=int(inventory.get("gpus") or 0),
        ram_gb=float(inventory.get("ram_gb") or 0),
        rdma=[RdmaPort(device=str(p.get("device")), state=str(p.get("state"))) for p in inventory.get("rdma") or []],
        simulated=bool(inventory.get("simulated")),
        policy=MachinePolicy.model_validate(inventory["policy"]) if inventory.get("policy") else None,
    )
