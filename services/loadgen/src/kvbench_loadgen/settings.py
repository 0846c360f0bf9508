from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from kvbench_core.settings import ServiceSettings

__all__ = ["LoadgenSettings"]


class LoadgenSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="KVBENCH_LOADGEN_", extra="ignore", frozen=True)

    shard_id: str = Field("loadgen-0", pattern=r"^[A-Za-z0-9_-]+$", description="Id stamped on every record")
    ops_port: int = Field(0, ge=0, le=65535, description="Port of /healthz and /metrics (0 = any free port)")
    request_timeout_s: float = Field(600.0, gt=0, description="Give up on one request after this long")
    drain_timeout_s: float = Field(120.0, ge=0, description="After the load ends, wait this long for requests")
    batch_interval_s: float = Field(0.25, gt=0, description="Publish records at least this often")
    heartbeat_s: float = Field(3.0, gt=0, le=10, description="How often the running jobs are written to the bus")
    batch_max_records: int = Field(500, gt=0, description="... or when this many are waiting")
