"""The API's request and response bodies, so /openapi.json describes what each endpoint returns."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from kvbench_contracts.fabric import SwitchSpec
from kvbench_planner.cluster import Machine
from kvbench_planner.leases import QueuePlace
from kvbench_planner.registry import NAME_PATTERN
from kvbench_planner.state import JobState, RunStatus
from kvbench_stacks.catalog import StackSpec

__all__ = [
    "ClusterGroupCreated",
    "ClusterGroupIn",
    "ClusterGroupOut",
    "GroupMachine",
    "Health",
    "OrchestratorRow",
    "ProblemOut",
    "ReviewOut",
    "RunCreated",
    "RunDetail",
    "RunSummary",
    "SecretIn",
    "SecretName",
    "StackRow",
    "SwitchIn",
    "Switches",
]


class ClusterGroupIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN.pattern, description="Group name: lowercase letters, digits, dashes")
    nodes: list[str] = Field(min_length=1, max_length=256, description="Node ids of registered machines")


class SwitchIn(SwitchSpec):
    """A switch to connect: where to read it and a read-only login (stored as a secret, never returned)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    credential: SecretStr = Field(
        min_length=1, description="Read-only login: the v2c community, or SNMPv3 'user:authkey:privkey'"
    )


class SecretIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: SecretStr = Field(min_length=1, max_length=8192, description="The secret; it is never returned")


class ProblemOut(BaseModel):
    """One refusal or warning (kvbench_contracts.problem.Problem in the API's form)."""

    workload: str | None
    field: str
    code: str
    message: str
    fix: str


class ReviewOut(BaseModel):
    valid: bool
    errors: list[ProblemOut]
    warnings: list[ProblemOut]
    jobs: int = Field(description="Jobs the plan expands to (workloads x load levels x repeats)")
    notes: list[str]
    expanded: dict[str, Any] | None = Field(None, description="On success: per workload, what will run where")


class RunCreated(BaseModel):
    run_id: str
    jobs: int
    warnings: list[ProblemOut]


class RunSummary(BaseModel):
    run_id: str
    plan_name: str
    status: RunStatus
    progress: float = Field(description="0..1 over the run's jobs")
    created_at: str = Field(description="ISO 8601, UTC")
    queue: QueuePlace | None = Field(None, description="While queued: its place and what it waits for")


class RunDetail(BaseModel):
    run_id: str
    plan_name: str
    plan: dict[str, Any]
    status: RunStatus
    created_at: datetime
    updated_at: datetime
    jobs: list[JobState]
    reasons: list[dict[str, str]] = Field(description="Why it did not succeed: {code, message, fix}")
    current_workload: str | None
    nodes: list[str]
    queue: QueuePlace | None = Field(None, description="While queued: its place and what it waits for")
    stack_generation: dict[str, int]
    progress: float = Field(description="0..1 over the run's jobs")


class GroupMachine(Machine):
    up: bool = Field(description="Its agent is heartbeating now")


class ClusterGroupOut(BaseModel):
    name: str
    declared_by: Literal["api", "agents"]
    machines: list[GroupMachine]


class ClusterGroupCreated(BaseModel):
    name: str
    nodes: list[str]


class SecretName(BaseModel):
    name: str


class Switches(BaseModel):
    connected: list[SwitchSpec] = Field(description="Connected switches; their logins are never returned")
    discovered: list[dict[str, Any]] = Field(description="Switches the machines' LLDP neighbours name")


class StackRow(StackSpec):
    """A catalog stack and whether the query can choose it."""

    selectable: bool = Field(description="The query (engine, vendor, version) can choose it")
    why_not: str | None = Field(description="Why it cannot, when it cannot")
    validated: bool = Field(description="A real run on the queried version is recorded (live_runs)")
    conformance_checked: bool = Field(
        description="The queried version's own parsers accepted every process of the stack (validated_on)"
    )


class OrchestratorRow(BaseModel):
    id: str
    locked: bool
    why_not: str | None


class Health(BaseModel):
    ok: bool
