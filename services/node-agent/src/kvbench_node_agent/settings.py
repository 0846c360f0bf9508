from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from kvbench_contracts.events import MachinePolicy
from kvbench_core.settings import ServiceSettings

__all__ = ["NodeAgentSettings"]


class NodeAgentSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="KVBENCH_NODE_AGENT_", extra="ignore", frozen=True)

    node_id: str = Field(pattern=r"^[A-Za-z0-9_-]+$", description="Stable id of this machine")
    group: str | None = Field(
        None, pattern=r"^[a-z0-9][a-z0-9-]{0,62}$", description="Cluster group this machine registers into"
    )
    simulated: bool = Field(False, description="This agent is one machine of a simulated cluster")
    sim_switch: str | None = Field(None, description="Simulated machines: the simulated leaf switch they are cabled to")
    ops_port: int = Field(0, ge=0, le=65535, description="Port of /healthz and /metrics (0 = any free port)")
    heartbeat_s: float = Field(3.0, gt=0, le=60, description="Heartbeat period; the KV TTL is 15 s")
    state_dir: str = Field(".kvbench/node-agent", description="Engine logs and runtime files")
    engine_health_timeout_s: float = Field(120.0, gt=0, description="How long an engine may take to answer /health")
    scrape_interval_s: float = Field(2.0, gt=0, description="Engine /metrics scrape period during a deployment")
    address: str | None = Field(None, description="Address other machines reach this one at (default: hostname)")
    sim_gpu: str = Field(
        "L40S", description="Simulated hosts of a group (no plan sim section): the GPU model their engines simulate"
    )
    sim_gpus: int = Field(0, ge=0, le=16, description="Simulated hosts of a group: the GPUs they declare (0: none)")
    # what a plan may make this machine run or write (kvbench_node_agent.allowlist): comma-separated
    allowed_images: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Container images a plan may choose (engine.args.image), globs; none: the stacks' own only"
    )
    allowed_code_dirs: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Directories a plan may point engine.args.lmcache_examples into, besides /opt/lmcache/examples"
    )
    allowed_data_dirs: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Directories a plan's disk tier and shared mount must lie in; none: any the plan rules accept"
    )
    allowed_env: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Engine variables a plan may set (engine.env), globs such as VLLM_*; none: no variable"
    )
    models_dir: str | None = Field(
        None,
        description="A folder of models as <org>/<name> folders (config, tokenizer, weights), looked in before the "
        "Hugging Face cache; the engines load a model found here from its folder",
    )

    @field_validator("allowed_images", "allowed_code_dirs", "allowed_data_dirs", "allowed_env", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("allowed_code_dirs", "allowed_data_dirs")
    @classmethod
    def _absolute(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        relative = [d for d in value if not d.startswith("/")]
        if relative:
            raise ValueError(f"directories must be absolute paths: {', '.join(relative)}")
        return value

    def policy(self) -> MachinePolicy:
        """What a plan may make this machine run or write, as the planner's review reads it from the inventory."""
        return MachinePolicy(allowed_images=list(self.allowed_images), allowed_code_dirs=list(self.allowed_code_dirs),
                             allowed_data_dirs=list(self.allowed_data_dirs),
                             allowed_env=list(self.allowed_env))  # fmt: skip
