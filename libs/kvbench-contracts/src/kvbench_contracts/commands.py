"""Commands (imperative) sent to services under kvbench.cmd."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from kvbench_contracts.envelope import Envelope
from kvbench_contracts.events import EngineEndpoint

__all__ = ["RunLoad", "StartStack", "StopStack"]


class StartStack(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.cmd.node.start_stack/1"
    SUBJECT: ClassVar[str] = "kvbench.cmd.node.{node_id}.start_stack"
    node_id: str
    run_id: str
    deployment_id: str = Field(description="Id of this stand-up of a workload's stack on this node")
    workload: str
    stack: str
    launcher: str = Field("sim", description="sim | process | docker")
    model: str
    engine: dict[str, Any] = Field(default_factory=dict)
    sizing: dict[str, Any] = Field(default_factory=dict)
    sim: dict[str, Any] | None = Field(None, description="Simulated cluster description, for the sim launcher")
    kv_tier: str = Field("gpu", description="KV Cache Storage Tier")
    network: dict[str, Any] = Field(default_factory=dict, description="transfer_backend, rdma_device")
    routing: str = Field("round_robin", description="Routing policy, for stacks that bring a router")
    pool: list[dict[str, Any]] = Field(
        default_factory=list, description="Every machine of the pool in order: {name, host, gpus, vendor}"
    )
    hf_token_secret: str | None = Field(None, description="Name of the stored secret with the HF token")


class StopStack(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.cmd.node.stop_stack/1"
    SUBJECT: ClassVar[str] = "kvbench.cmd.node.{node_id}.stop_stack"
    node_id: str
    run_id: str
    deployment_id: str


class RunLoad(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.cmd.loadgen.run/1"
    SUBJECT: ClassVar[str] = "kvbench.cmd.loadgen.run"
    run_id: str
    job_id: str
    workload: str
    model: str
    endpoints: list[EngineEndpoint]
    traffic: dict[str, Any] = Field(description="The workload's traffic section")
    load_level: float = Field(description="Users (closed loop) or requests/s")
    duration_s: float
    warmup_s: float
    routing: str = "round_robin"
    seed: int = 0
    shard_index: int = Field(0, ge=0, description="This command's shard of the job's users or sessions")
    shards: int = Field(1, ge=1, description="Load generators sharing the job; it ends when all have finished")
    working_set_ratio: float | None = Field(None, gt=0, description="Distinct contexts x KV / pool GPU KV capacity")
    time_scale: float = Field(
        1.0,
        gt=0,
        description="Engine seconds per wall-clock second (a simulated cluster's speed): the plan's durations, gaps "
        "and rates are engine seconds; the load generator paces in them and stamps records in them",
    )
