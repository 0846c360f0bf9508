from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

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
