from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from kvbench_core.settings import ApiTokenSettings, SecretsKeySettings

__all__ = ["PlannerSettings"]


class PlannerSettings(ApiTokenSettings, SecretsKeySettings):
    model_config = SettingsConfigDict(env_prefix="KVBENCH_PLANNER_", extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", description="Address the REST API listens on")
    port: int = Field(8700, ge=1, le=65535, description="Port of the REST API")
    stack_ready_timeout_s: float = Field(300.0, gt=0, description="How long a stack may take to become healthy")
    job_grace_s: float = Field(240.0, gt=0, description="Slack after a job's load end before it is failed")
    acceptance_settle_s: float = Field(
        5.0,
        ge=0,
        le=300,
        description="An acceptance test's pause after each phase and before one on new or restarted engines: "
        "longer than the agents' scrape interval (2 s), so each phase's engine counters are read before and after "
        "it, not shared with the phase next to it",
    )
    bus_outage_s: float = Field(
        300.0,
        ge=5,
        le=86_400,
        description="How long a run waits for a bus that does not acknowledge (a NATS server down, a cluster that "
        "lost its quorum) before it fails as bus_unavailable; its state and commands are re-sent with their ids "
        "meanwhile, so nothing is stored twice",
    )
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
