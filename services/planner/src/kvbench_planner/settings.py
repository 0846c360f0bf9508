from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from kvbench_core.settings import ServiceSettings, read_secret_file

__all__ = ["PlannerSettings"]


class PlannerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="KVBENCH_PLANNER_", extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", description="Address the REST API listens on")
    port: int = Field(8700, ge=1, le=65535, description="Port of the REST API")
    # one name for the token on both sides: the CLI sends KVBENCH_API_TOKEN (the planner's own name still works)
    api_token: SecretStr | None = Field(  # type: ignore[pydantic-alias]  # two env names, read by pydantic-settings
        default=None,
        validation_alias=AliasChoices("KVBENCH_API_TOKEN", "KVBENCH_PLANNER_API_TOKEN"),
        description="Bearer token for mutating endpoints; unset = no auth",
    )
    api_token_file: str | None = Field(  # type: ignore[pydantic-alias]  # two env names, as api_token
        default=None,
        validation_alias=AliasChoices("KVBENCH_API_TOKEN_FILE", "KVBENCH_PLANNER_API_TOKEN_FILE"),
        description="A file (mode 600) holding the bearer token (kvbench up --listen writes one)",
    )
    stack_ready_timeout_s: float = Field(300.0, gt=0, description="How long a stack may take to become healthy")
    job_grace_s: float = Field(240.0, gt=0, description="Slack after a job's load end before it is failed")
    loadgen_shards: int = Field(1, ge=1, le=256, description="Load generator processes that share each job")
    node_wait_s: float = Field(20.0, ge=0, description="How long to wait for a cluster's agents to register")
    launcher: Literal["process", "docker"] = Field("process", description="How agents start real stacks")
    max_active_runs: int = Field(8, ge=1, le=1000, description="Runs pending or running at once; more are refused")
    sim_speed: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="Speed of simulated clusters whose plan sets none (engine seconds per wall second); unset: 1",
    )

    @field_validator("api_token")
    @classmethod
    def _no_placeholder(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and value.get_secret_value() in ("", "changethis", "changeme"):
            raise ValueError("KVBENCH_PLANNER_API_TOKEN is a placeholder; set a real token or leave it unset")
        return value

    @field_validator("api_token_file")
    @classmethod
    def _token_file(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                read_secret_file(Path(value))
            except OSError as exc:
                raise ValueError(f"KVBENCH_API_TOKEN_FILE: cannot read {value} ({exc.strerror})") from None
        return value

    def bearer_token(self) -> str | None:
        """The token mutating requests must carry, or None when the API is open."""
        if self.api_token is not None:
            return self.api_token.get_secret_value()
        return read_secret_file(Path(self.api_token_file)) if self.api_token_file else None
