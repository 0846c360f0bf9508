"""How many engines a stack runs on a pool, and which of them prefill: one rule for the planner's simulated
clusters, the node agent's sim launcher and the simulator's own layouts."""

from __future__ import annotations

from typing import NamedTuple

from kvbench_contracts.plan import SimCluster, Sizing
from kvbench_stacks.catalog import CATALOG

__all__ = ["SimEngineCounts", "sim_engine_counts"]


class SimEngineCounts(NamedTuple):
    """A colocated stack has no prefill engines; ``engines`` are the decode-capable ones."""

    prefill: int
    engines: int


def sim_engine_counts(stack: str, sizing: Sizing, cluster: SimCluster, tensor_parallel_size: int) -> SimEngineCounts:
    """Every GPU of the simulated pool runs an engine of ``tensor_parallel_size`` GPUs; a split stack gives
    ``prefill_machines`` (or ``prefill_gpus``, default one engine) to prefill and the rest to decode."""
    tp = max(1, tensor_parallel_size)
    per_machine = sizing.gpus_per_machine or cluster.gpus_per_machine
    engines = max(1, cluster.machines * per_machine // tp)
    if not CATALOG[stack].split:
        return SimEngineCounts(0, engines)
    prefill = (sizing.prefill_machines or 0) * per_machine // tp
    if not prefill:
        prefill = max(1, (sizing.prefill_gpus or 1) // tp)
    return SimEngineCounts(prefill, max(1, engines - prefill))
