from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from kvbench_core.settings import ApiTokenSettings

__all__ = ["ReporterSettings"]


class ReporterSettings(ApiTokenSettings):
    model_config = SettingsConfigDict(env_prefix="KVBENCH_REPORTER_", extra="ignore", frozen=True)

    database_url: str = Field(validation_alias="KVBENCH_DATABASE_URL", description="PostgreSQL DSN")
    host: str = Field("127.0.0.1", description="Address of the report HTTP server")
    port: int = Field(8701, ge=1, le=65535, description="Port of the report HTTP server")
    completeness_timeout_s: float = Field(60.0, gt=0, description="Wait this long for a job's records to arrive")
    fabric_wait_s: float = Field(15.0, ge=0, le=600, description="How long a finished run waits for switch reads")
    price_per_gpu_hour: dict[str, float] = Field(
        default_factory=dict, description='Cost table for the report, e.g. {"H100": 2.5, "L40S": 1.0} (JSON)'
    )
    target_goodput_rps: float | None = Field(None, gt=0, description="Goodput the capacity plan sizes the pool for")
    grafana_url: str | None = Field(None, description="Push dashboards to this Grafana at start (its HTTP API)")
    grafana_token: SecretStr | None = Field(None, description="Service-account token for grafana_url")

    @field_validator("database_url")
    @classmethod
    def _postgres(cls, value: str) -> str:
        if not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("KVBENCH_DATABASE_URL must be a postgresql:// DSN")
        return value
