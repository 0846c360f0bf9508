"""Pieces every recipe uses: where engines go (slots), their environment, and how processes are placed."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvbench_stacks.recipes.model import ProcessSpec, RenderContext
from kvbench_stacks.recipes.ports import PORTS, engine_port


class UnknownStackError(ValueError):
    pass


@dataclass(frozen=True)
class EngineSlot:
    machine: int
    index: int  # engine index on its machine
    gpus: list[int]
    role: str  # engine | prefill | decode

    @property
    def port(self) -> int:
        return engine_port(self.index)


def user_args(args: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in args.items():
        if key in ("image", "lmcache_examples"):
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        else:
            out += [flag, json.dumps(value) if isinstance(value, dict | list) else str(value)]
    return out


def engine_slots(ctx: RenderContext, split: bool, one_per_machine: bool = False) -> list[EngineSlot]:
    tp = ctx.engine.tensor_parallel_size
    slots: list[EngineSlot] = []
    for m, machine in enumerate(ctx.machines):
        gpus = int(ctx.sizing.get("gpus_per_machine") or machine.gpus or tp)
        count = 1 if one_per_machine else max(1, gpus // tp)
        for i in range(count):
            slots.append(EngineSlot(m, i, list(range(i * tp, (i + 1) * tp)), "engine"))
    if not split:
        return slots
    prefill_machines = ctx.sizing.get("prefill_machines")
    prefill_gpus = ctx.sizing.get("prefill_gpus")
    if prefill_machines:
        return [
            EngineSlot(s.machine, s.index, s.gpus, "prefill" if s.machine < prefill_machines else "decode")
            for s in slots
        ]
    prefill_engines = math.ceil(int(prefill_gpus or tp) / tp)
    return [
        EngineSlot(s.machine, s.index, s.gpus, "prefill" if k < prefill_engines else "decode")
        for k, s in enumerate(slots)
    ]


def gpu_env(ctx: RenderContext, slot: EngineSlot) -> dict[str, str]:
    devices = ",".join(str(g) for g in slot.gpus)
    vendor = ctx.machines[slot.machine].vendor
    env = {"PYTHONHASHSEED": "0"}  # the same block hashes on every instance (stacks.md 0)
    env["HIP_VISIBLE_DEVICES" if vendor == "amd" else "CUDA_VISIBLE_DEVICES"] = devices
    return env


def engine_env(ctx: RenderContext, slot: EngineSlot) -> dict[str, str]:
    """An engine's environment: the plan's variables (as the operators allow them), under kvbench's own."""
    return {**ctx.engine.env, **gpu_env(ctx, slot)}


def served_name(ctx: RenderContext) -> list[str]:
    """``--served-model-name`` when the engine loads a local folder: clients keep asking for the plan's model id."""
    if ctx.model_path is None or "served_model_name" in ctx.engine.args:
        return []
    return ["--served-model-name", ctx.model]


def nixl_telemetry(spec: ProcessSpec, slot: EngineSlot) -> ProcessSpec:
    """NIXL's own telemetry on an engine whose KV moves over NIXL with no counter of its bytes (LMCache's NIXL channel
    creates its agent without telemetry; TensorRT-LLM's collector has no transfer series): its Prometheus exporter
    plug-in (src/plugins/telemetry/prometheus: NIXL_TELEMETRY_ENABLE, NIXL_TELEMETRY_EXPORTER=prometheus, one port
    per process, NIXL_TELEMETRY_PROMETHEUS_PORT; agent_tx_bytes_total counts what the agent's transfers moved)."""
    port = PORTS["nixl_telemetry"] + slot.index
    env = {"NIXL_TELEMETRY_ENABLE": "y", "NIXL_TELEMETRY_EXPORTER": "prometheus",
           "NIXL_TELEMETRY_PROMETHEUS_PORT": str(port)}  # fmt: skip
    return spec.model_copy(
        update={
            "env": {**spec.env, **env},
            "ports": {**spec.ports, "nixl_telemetry": port},
            "telemetry": [*spec.telemetry, (port, "/metrics")],
        }
    )


def image_for(ctx: RenderContext, default: str) -> str:
    return str(ctx.engine.args.get("image") or default)


def host_of(ctx: RenderContext, machine: int) -> str:
    return ctx.machines[machine].host


def url_of(ctx: RenderContext, slot: EngineSlot) -> str:
    return f"http://{host_of(ctx, slot.machine)}:{slot.port}"


def role_of(slot: EngineSlot) -> Any:
    return slot.role


Machines = dict[int, list[ProcessSpec]]


def place(slots: list[EngineSlot], build: Callable[[EngineSlot], ProcessSpec]) -> Machines:
    out: Machines = {}
    for s in slots:
        out.setdefault(s.machine, []).append(build(s))
    return out


def head_first(out: Machines, *specs: ProcessSpec) -> Machines:
    out.setdefault(0, [])
    out[0] = [*specs, *out[0]]
    return out


def head_last(out: Machines, *specs: ProcessSpec) -> Machines:
    out.setdefault(0, []).extend(specs)
    return out


def engines_per_machine(slots: list[EngineSlot]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for s in slots:
        counts[s.machine] = counts.get(s.machine, 0) + 1
    return counts


def offload_bytes(ctx: RenderContext, engines_on_machine: int) -> int:
    return int(float(ctx.sizing.get("host_memory_gb") or 0) * 2**30 / max(engines_on_machine, 1))


def kv_transfer_config(config: dict[str, Any]) -> list[str]:
    return ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
