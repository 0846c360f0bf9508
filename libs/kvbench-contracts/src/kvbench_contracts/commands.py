"""Commands (imperative) sent to services under kvbench.cmd."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from kvbench_contracts.envelope import Envelope
from kvbench_contracts.events import EngineEndpoint, WindowEdge
from kvbench_contracts.plan import EngineSpec, NetworkSpec, SimCluster, Sizing, Traffic

__all__ = ["PoolMachine", "ReadEngines", "RestartEngines", "RunLoad", "StartStack", "StopStack"]


class PoolMachine(BaseModel):
    """One machine of a workload's pool, as every agent of the pool renders the stack's recipe for it. A wire model:
    it tolerates fields it does not know (a newer planner's, sent to an agent not yet updated)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    host: str = Field(description="Address the other machines reach it at")
    gpus: int = Field(ge=0)
    vendor: str = "nvidia"
    gpu_model: str | None = Field(None, description="As its inventory says (L40S, MI300X): some images are per GPU")


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
    # the plan's own (validated) models: an incompatible change to one of them is a new schema version
    engine: EngineSpec = Field(default_factory=EngineSpec)
    sizing: Sizing = Field(default_factory=Sizing)
    sim: SimCluster | None = Field(None, description="Simulated cluster description, for the sim launcher")
    kv_tier: str = Field("gpu", description="KV Cache Storage Tier")
    network: NetworkSpec = Field(default_factory=NetworkSpec, description="transfer_backend, rdma_device")
    routing: str = Field("round_robin", description="Routing policy, for stacks that bring a router")
    pool: list[PoolMachine] = Field(default_factory=list, description="Every machine of the pool, in order")
    hf_token_secret: str | None = Field(None, description="Name of the stored secret with the HF token")
    open_reset_route: bool = Field(
        False,
        description="The engines serve their development-only route that empties the prefix cache (vLLM: "
        "VLLM_SERVER_DEV_MODE=1): the acceptance test's reset step needs it, nothing else",
    )
    hf_token_sealed: str | None = Field(
        None,
        description="That token sealed to this machine's agent (its public key from its inventory): only that agent "
        "opens it; the stream holding the command holds ciphertext",
    )
    expires_at: datetime | None = Field(
        None,
        description="Not acted on after this (UTC): the planner waits no longer for the stack, so a command read late "
        "(an agent restarted hours after, a run cancelled meanwhile) starts no engine",
    )


class StopStack(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.cmd.node.stop_stack/1"
    SUBJECT: ClassVar[str] = "kvbench.cmd.node.{node_id}.stop_stack"
    node_id: str
    run_id: str
    deployment_id: str


class RestartEngines(Envelope):
    """Restart a deployment's engine processes alone, keeping its cache servers and stores (the acceptance test's
    reset step, for an engine with no call that empties its prefix cache)."""

    SCHEMA: ClassVar[str] = "kvbench.cmd.node.restart_engines/1"
    SUBJECT: ClassVar[str] = "kvbench.cmd.node.{node_id}.restart_engines"
    node_id: str
    run_id: str
    deployment_id: str


class ReadEngines(Envelope):
    """Read every engine (and cache server) of a deployment now, at an edge of a job's measured window: its counters
    at the instant the window starts or ends (EngineSampled with ``edge``)."""

    SCHEMA: ClassVar[str] = "kvbench.cmd.node.read_engines/1"
    SUBJECT: ClassVar[str] = "kvbench.cmd.node.{node_id}.read_engines"
    node_id: str
    run_id: str
    deployment_id: str
    job_id: str
    edge: WindowEdge
    edge_at: float = Field(description="When the edge was, on the load generator (Unix seconds)")


class RunLoad(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.cmd.loadgen.run/1"
    SUBJECT: ClassVar[str] = "kvbench.cmd.loadgen.run"
    run_id: str
    job_id: str
    workload: str
    model: str
    endpoints: list[EngineEndpoint]
    traffic: Traffic = Field(description="The workload's traffic section")
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
    keep_answers: bool = Field(
        False,
        description="The acceptance test: report a digest of every answer (JobFinished.answers), so the reloaded "
        "passes can be compared with the cold one answer for answer",
    )
    reset_prefix_cache: bool = Field(
        False,
        description="Before the load, empty each engine's local prefix cache (POST reset_route, external records "
        "kept): the acceptance test's reset phase",
    )
    reset_route: str = Field(
        "/reset_prefix_cache",
        pattern=r"^/[a-z_]+$",
        description="The engine's own route that empties its prefix cache (vLLM /reset_prefix_cache, SGLang "
        "/flush_cache)",
    )
