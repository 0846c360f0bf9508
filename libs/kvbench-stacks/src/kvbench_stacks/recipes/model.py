"""What a recipe renders: the processes of a stack, per machine, in start order."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvbench_contracts.commands import PoolMachine
from kvbench_contracts.plan import EngineSpec, NetworkSpec, Sizing

__all__ = ["EngineSettings", "PoolMachine", "ProcessSpec", "RenderContext", "Role"]

Role = Literal["engine", "prefill", "decode", "router", "store", "master", "lmcache"]


class ProcessSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Unique on its machine: engine-0, router, lmcache, valkey, ...")
    role: Role
    argv: list[str] = Field(description="Command line; {run_dir} is replaced by the deployment's directory")
    env: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict, description="Config files written to {run_dir} first")
    ports: dict[str, int] = Field(default_factory=dict, description="Every port the process listens on")
    health: tuple[Literal["http", "tcp"], int, str] = Field(description="(kind, port, path)")
    metrics: tuple[int, str] | None = Field(None, description="(port, path) of its Prometheus metrics")
    telemetry: list[tuple[int, str]] = Field(
        default_factory=list,
        description="Further Prometheus endpoints (port, path) of the process: NIXL's telemetry exporter, whose "
        "agent counts the KV bytes a transfer moves where the engine counts none",
    )
    gpus: list[int] = Field(default_factory=list)
    binary: str = Field(description="Executable that must exist for the process launcher")
    image: str | None = Field(None, description="Container image for the docker launcher")
    host_code: list[str] = Field(
        default_factory=list,
        description="Host files it runs that neither its image nor a package holds (LMCache's P/D proxy scripts): "
        "checked before anything starts; the docker launcher mounts each one's folder read-only at the same path",
    )
    serves_requests: bool = Field(False, description="Load generators send requests here")


class EngineSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = "vllm"
    version: str | None = None
    tensor_parallel_size: int = 1
    args: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)  # the plan's engine.env, as the machines' operators allow it
    cache_server_args: dict[str, Any] = Field(default_factory=dict)  # the LMCache server's, after kvbench's own


class RenderContext(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    stack: str
    model: str
    engine: EngineSettings = Field(default_factory=EngineSettings)
    kv_tier: str = "gpu"
    sizing: dict[str, Any] = Field(default_factory=dict)
    network: dict[str, Any] = Field(default_factory=dict)
    machines: list[PoolMachine] = Field(min_length=1)
    routing: str = "round_robin"
    open_reset_route: bool = Field(
        False, description="Engines serve their development-only prefix-cache reset (the acceptance test's reset step)"
    )
    model_path: str | None = Field(
        None,
        description="Where the machine holds the model (a local folder the agent resolved), served under `model`; "
        "None: the engine resolves `model` itself",
    )

    @property
    def model_source(self) -> str:
        """What the engine loads: the machine's own folder, else the model's id."""
        return self.model_path or self.model

    @classmethod
    def for_pool(cls, stack: str, model: str, engine: EngineSpec, kv_tier: str, sizing: Sizing, network: NetworkSpec,
                 machines: list[PoolMachine], routing: str, open_reset_route: bool = False,
                 model_path: str | None = None) -> RenderContext:  # fmt: skip
        """The context of a workload's pool from the plan's own models (what the planner reviews and an agent
        starts alike)."""
        return cls(
            open_reset_route=open_reset_route,
            model_path=model_path,
            stack=stack,
            model=model,
            engine=EngineSettings.model_validate(engine.model_dump()),
            kv_tier=kv_tier,
            sizing=sizing.model_dump(mode="json"),
            network=network.model_dump(mode="json"),
            machines=machines,
            routing=routing,
        )
