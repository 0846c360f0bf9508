"""What a node agent keeps in the ``kvbench_nodes`` KV bucket: its heartbeat (the planner reads it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kvbench_contracts.events import NodeInventory

__all__ = ["Heartbeat"]


class Heartbeat(BaseModel):
    """Rewritten every few seconds; the bucket's TTL removes it when the agent stops."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    inventory: NodeInventory
    at: float = Field(description="Wall-clock time it was written, Unix seconds (compared across machines)")
    deployments: list[str] = Field(default_factory=list, description="Deployments the agent runs now")
