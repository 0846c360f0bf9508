"""What a node agent hands a simulated process: one spec file per process, read once at start.

The node agent's ``sim`` launcher writes the spec as JSON in the deployment's directory and starts
``python -m kvbench_sim {serve|store|route} --spec FILE``; the simulator works out everything else (its tiers,
capacities, records signature) from the spec itself, so the agent imports nothing of the simulator.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvbench_contracts.plan import EngineSpec, SimCluster, Sizing

__all__ = ["SimEngineSpec", "SimRouterSpec", "SimRoutingPolicy", "SimStoreSpec", "SimWorkload"]

SimRoutingPolicy = Literal["round_robin", "session_affinity", "prefix_aware", "pd_aware"]


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SimWorkload(_Spec):
    """The parts of a workload that decide a simulated stack's engines and tiers."""

    stack: str = Field(description="Catalog stack id (one with a simulated form)")
    model: str
    engine: EngineSpec = Field(default_factory=EngineSpec)
    sizing: Sizing = Field(default_factory=Sizing)
    kv_tier: str = Field("gpu", description="KV Cache Storage Tier")


class SimEngineSpec(_Spec):
    """One simulated engine (``kvbench_sim serve --spec``)."""

    host: str = Field("127.0.0.1", description="The address it serves on")
    port: int = Field(ge=1, le=65535)
    workload: SimWorkload
    cluster: SimCluster = Field(default_factory=SimCluster)
    pd_role: Literal["prefill", "decode"] | None = Field(None, description="Split stacks: this engine's side")
    shared_store_url: str | None = Field(None, description="ws://HOST:PORT/ws of the pool's store process")
    records_dir: str | None = Field(None, description="Where this engine's file-backed tiers keep their records")
    engine_id: str | None = Field(
        None, description="How the engine names itself (the agent's engine id): who computed what another reused"
    )
    cache_server_url: str | None = Field(
        None,
        description="ws://HOST:PORT of the simulated LMCache server this engine shares with others (its L1 and disk "
        "tiers live there); None: the server's tiers are this engine's own",
    )
    cache_server_here: bool = Field(
        True, description="The shared server runs on this engine's machine: the engine reports its disk tier's census"
    )


class SimStoreSpec(_Spec):
    """The pool's shared store (``kvbench_sim store --spec``): its capacity and link follow from the workload."""

    host: str = Field("127.0.0.1", description="The address it serves on")
    port: int = Field(ge=1, le=65535)
    workload: SimWorkload
    cluster: SimCluster = Field(default_factory=SimCluster)
    records_dir: str | None = Field(
        None, description="A file-backed pool (a shared filesystem), or a cache server's disk: where its index is kept"
    )
    cache_server: int | None = Field(
        None,
        ge=0,
        description="Serve an LMCache server's tiers (its L1 and disk) for a group of engines, numbered as the "
        "recipe numbers the pool's servers; None: the pool's shared store",
    )


class SimRouterSpec(_Spec):
    """A split stack's router (``kvbench_sim route --spec``)."""

    host: str = Field("127.0.0.1", description="The address it serves on")
    port: int = Field(ge=1, le=65535)
    policy: SimRoutingPolicy = "pd_aware"
    engines: list[str] = Field(description="Base URLs of the decode engines")
    prefill: list[str] = Field(default_factory=list, description="Base URLs of the prefill engines")
