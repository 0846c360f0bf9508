"""What a node agent keeps in the ``kvbench_nodes`` KV bucket, and a load generator in ``kvbench_loadgens``: their
heartbeats (the planner reads them)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from kvbench_contracts.events import NodeInventory

__all__ = ["Heartbeat", "LoadgenHeartbeat", "shard_key", "shards_of_job"]


class Heartbeat(BaseModel):
    """Rewritten every few seconds; the bucket's TTL removes it when the agent stops."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    inventory: NodeInventory
    at: float = Field(description="Wall-clock time it was written, Unix seconds (compared across machines)")
    deployments: list[str] = Field(default_factory=list, description="Deployments the agent runs now")


def shard_key(job_id: str, shard_index: int) -> str:
    """One shard of one job, as a load generator's heartbeat lists it."""
    return f"{job_id}#{shard_index}"


def shards_of_job(keys: Iterable[str], job_id: str) -> list[int]:
    """The shard indices of ``job_id`` among ``keys`` (``shard_key`` values), in their order."""
    found = []
    for key in keys:
        job, _, index = key.rpartition("#")
        if job == job_id:
            found.append(int(index))
    return found


class LoadgenHeartbeat(BaseModel):
    """Rewritten every few seconds under the load generator's id; the load generator removes it as it stops, the
    bucket's TTL when it dies. A shard the planner saw listed and no longer sees (before its end arrived) was lost
    with its process."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    loadgen_id: str
    at: float = Field(description="Wall-clock time it was written, Unix seconds")
    shards: list[str] = Field(default_factory=list, description="Job shards it runs now (shard_key)")
