"""Run state, kept in the JetStream KV bucket ``kvbench_runs`` so a restarted planner resumes."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvbench_contracts.envelope import new_id, utc_now
from kvbench_contracts.plan import Plan
from kvbench_planner.leases import QueuePlace

__all__ = ["ACTIVE", "JobState", "RunState", "expand_jobs"]

JobStatus = Literal["pending", "running", "succeeded", "failed", "cancelled"]
# queued: waiting for machines another run holds (kvbench_planner.leases)
RunStatus = Literal["pending", "queued", "running", "succeeded", "failed", "cancelled"]
ACTIVE: tuple[RunStatus, ...] = ("pending", "queued", "running")


class JobState(BaseModel):
    model_config = ConfigDict(extra="ignore")

    job_id: str
    workload: str
    stack: str
    load_level: float
    repeat: int
    status: JobStatus = "pending"
    progress: float = Field(0.0, description="0..1, from the load generator's progress events")
    requests: int = 0
    errors: int = 0
    reason: str | None = None


class RunState(BaseModel):
    model_config = ConfigDict(extra="ignore")

    run_id: str
    plan_name: str
    plan: dict[str, Any]
    status: RunStatus = "pending"
    created_at: datetime = Field(default_factory=utc_now)
    updated_at: datetime = Field(default_factory=utc_now)
    jobs: list[JobState]
    reasons: list[dict[str, str]] = Field(default_factory=list)
    current_workload: str | None = None
    nodes: list[str] = Field(default_factory=list)
    queue: QueuePlace | None = Field(None, description="While queued: its place, and the machines it waits for")
    stack_generation: dict[str, int] = Field(
        default_factory=dict,
        description="Workload -> how many times its stack was started; a resumed planner "
        "re-attaches to the stack it last started",
    )

    @property
    def progress(self) -> float:
        if not self.jobs:
            return 1.0
        done = sum(1.0 if j.status in ("succeeded", "failed", "cancelled") else j.progress for j in self.jobs)
        return done / len(self.jobs)

    def public(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        data["progress"] = round(self.progress, 4)
        return data


def expand_jobs(plan: Plan) -> list[JobState]:
    """Workloads x load levels x repeats, in a stable order (repeats innermost)."""
    jobs: list[JobState] = []
    for workload in plan.workloads:
        for level, repeat in workload.job_grid():
            jobs.append(
                JobState(job_id=new_id(), workload=workload.name, stack=workload.stack, load_level=level, repeat=repeat)
            )
    return jobs
