"""The expanded plan shown at review: machines, engines and processes per machine, tiers, network path,
jobs, and an estimate of the run's duration."""

from __future__ import annotations

import shlex
from typing import Any

from kvbench_contracts.plan import Plan, Workload
from kvbench_planner.cluster import Machine
from kvbench_stacks.catalog import CATALOG, StackSpec
from kvbench_stacks.hardware import find_model, gpu_spec
from kvbench_stacks.recipes import PoolMachine, RenderContext, render
from kvbench_stacks.recipes.servers import CacheServer, group_engines

__all__ = ["estimate_job_s", "expand_plan"]

STAND_UP_S = {"sim": 10.0, "real": 180.0}  # engines load weights and compile graphs on real GPUs
DRAIN_S = 15.0


def estimate_job_s(w: Workload) -> float:
    """Wall seconds: simulated engines faster than real time live the load's engine seconds in less."""
    speed = (w.cluster.sim.speed if w.cluster.sim is not None else None) or 1.0  # unset: at least real time
    if w.traffic.shape == "document_reuse" and w.traffic.documents is not None:
        # one request per document per round, about a second each at this scale; a rough guide only
        return float(w.traffic.documents.count * w.traffic.documents.rounds) / speed
    return w.effective_load_duration_s() / speed + DRAIN_S


def _processes(
    w: Workload, stack: StackSpec, index: int, engines: int, gpus: int, prefill: bool, servers: list[CacheServer]
) -> list[str]:
    procs: list[str] = []
    if index == 0 and stack.pd_router:
        procs.append("router (prefill/decode aware)")
    if index == 0 and "shared_store_gb" in stack.needs:
        procs.append(f"shared store ({w.sizing.shared_store_gb or 0:g} GB)")
    if stack.lmcache_server:
        for server in (s for s in servers if s.machine == index):
            shared = w.sizing.engines_per_cache_server is not None
            procs.append(f"lmcache server (for {len(server.engines)} engine(s))" if shared else "lmcache server")
    role = "prefill" if prefill else ("decode" if stack.strategy in ("split", "split_offload") else "serve")
    for e in range(engines):
        procs.append(
            f"{w.engine.name} engine {e} ({role}, TP {w.engine.tensor_parallel_size}, GPUs "
            f"{e * w.engine.tensor_parallel_size}-{(e + 1) * w.engine.tensor_parallel_size - 1} of {gpus})"
        )
    return procs


def _commands(w: Workload, machines: list[Machine]) -> dict[str, list[dict[str, Any]]]:
    """Per machine, exactly what its agent will start, in order: the recipe rendered for this pool (real machines
    only; a simulated one runs kvbench's simulated engines). The address a machine is reached at is its name here,
    as its agent reports another one only when it registers."""
    if not machines:
        return {}
    pool = [
        PoolMachine(
            name=m.name,
            host=m.name,
            gpus=w.sizing.gpus_per_machine or m.gpus,
            vendor=m.vendor or "nvidia",
            gpu_model=m.gpu_model,
        )
        for m in machines
    ]
    ctx = RenderContext.for_pool(
        w.stack,
        w.model,
        w.engine,
        w.kv_tier,
        w.sizing,
        w.network,
        pool,
        w.measurement.routing,
        open_reset_route=w.measurement.acceptance,
    )
    return {
        name: [
            {
                "name": spec.name,
                "role": spec.role,
                "command": shlex.join(spec.argv),
                "environment": spec.env,
                "config_files": sorted(spec.files),
                "binary": spec.binary,
                **(
                    {
                        "note": "VLLM_SERVER_DEV_MODE=1 opens vLLM's development endpoints (/reset_prefix_cache, "
                        "/sleep, /collective_rpc, ...) to whoever reaches the engine's port: the acceptance test's "
                        "reset step needs /reset_prefix_cache; keep the port on a private network"
                    }
                    if spec.env.get("VLLM_SERVER_DEV_MODE") == "1"
                    else {}
                ),
            }
            for spec in specs
        ]
        for name, specs in render(ctx).items()
    }


def _network_path(w: Workload, stack: StackSpec) -> str:
    if stack.rdma:
        device = w.network.rdma_device or "the active RDMA card"
        return f"KV between machines over RDMA ({device}), transfer backend {w.network.transfer_backend}"
    if stack.shared_mount:
        return f"KV through the shared filesystem at {w.sizing.shared_mount_path}"
    if "shared_store_gb" in stack.needs:
        return "KV to and from the shared store on the head machine, over the cluster network"
    return "KV stays on each machine; only requests cross the network"


def _tiers(w: Workload, machines: list[Machine]) -> list[dict[str, Any]]:
    tiers: list[dict[str, Any]] = []
    gpu = gpu_spec(machines[0].gpu_model) if machines else None
    model = find_model(w.model)
    if gpu is not None:
        kv_gb = gpu.mem_gb * 0.9 * w.engine.tensor_parallel_size - (model.weights_gb if model else 0)
        entry: dict[str, Any] = {"tier": "gpu", "per_engine_gb": round(max(kv_gb, 0), 1)}
        if model is not None and kv_gb > 0:
            entry["per_engine_tokens"] = int(kv_gb * 1e9 / model.kv_bytes_per_token)
        tiers.append(entry)
    if w.sizing.host_memory_gb:
        tiers.append({"tier": "cpu_ram", "per_machine_gb": w.sizing.host_memory_gb})
    if w.sizing.disk_tier_gb:
        tiers.append({"tier": "nvme", "per_machine_gb": w.sizing.disk_tier_gb, "path": w.sizing.disk_tier_path})
    if w.sizing.shared_store_gb:
        tiers.append({"tier": "shared_store", "gb": w.sizing.shared_store_gb})
    if w.sizing.shared_mount_path:
        tiers.append({"tier": "shared_fs", "path": w.sizing.shared_mount_path})
    return tiers


def expand_workload(w: Workload, machines: list[Machine]) -> dict[str, Any]:
    stack = CATALOG[w.stack]
    tp = w.engine.tensor_parallel_size
    prefill_machines = w.sizing.prefill_machines or 0
    out_machines = []
    commands = _commands(w, machines) if w.cluster.sim is None and not all(m.simulated for m in machines) else {}
    engines_of = [
        1 if stack.one_engine_per_machine else max(1, (w.sizing.gpus_per_machine or m.gpus) // tp) for m in machines
    ]
    slots = [(i, e) for i, count in enumerate(engines_of) for e in range(count)]
    servers = group_engines(slots, len(machines), w.sizing.engines_per_cache_server)  # as the recipe groups them
    for i, m in enumerate(machines):
        gpus = w.sizing.gpus_per_machine or m.gpus
        engines = engines_of[i]
        entry: dict[str, Any] = {
            "name": m.name,
            "gpu_model": m.gpu_model,
            "gpus": gpus,
            "processes": _processes(w, stack, i, engines, gpus, i < prefill_machines, servers),
        }
        if m.name in commands:
            entry["commands"] = commands[m.name]
        out_machines.append(entry)
    grid = w.job_grid()
    jobs = [{"load_level": point.load_level, "repeat": point.repeat} for point in grid]
    stand_up = STAND_UP_S["sim" if w.cluster.sim else "real"]
    restarts = sum(w.cache_start(i) == "restarted" for i in range(len(grid)))
    duration = stand_up * (1 + restarts) + len(jobs) * estimate_job_s(w)
    return {
        "name": w.name,
        "stack": w.stack,
        "strategy": w.strategy,
        "engine": w.engine.name,
        "machines": out_machines,
        "tiers": _tiers(w, machines),
        "network_path": _network_path(w, stack),
        "jobs": jobs,
        "estimated_duration_s": round(duration),
    }


def expand_plan(plan: Plan, machines_by_workload: dict[str, list[Machine]]) -> dict[str, Any]:
    workloads = [expand_workload(w, machines_by_workload.get(w.name, [])) for w in plan.workloads]
    return {"workloads": workloads, "estimated_duration_s": sum(w["estimated_duration_s"] for w in workloads)}
