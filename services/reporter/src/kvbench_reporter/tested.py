"""What a run tested: model, engine and its version, stack, tiers and sizing, traffic and arrivals, measurement, and
the machines with their GPUs, per workload, with each engine's command line and version as its agent started it. A
benchmark figure that does not say what it measured cannot be published or compared: every form of the report puts
this first (report.json ``tested``, the HTML page's first section, the console's first lines)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["tested_lines", "tested_summary"]


def _set(section: Any) -> dict[str, Any]:
    """The fields a plan section sets (nulls left out: they mean 'the default')."""
    return {k: v for k, v in (section or {}).items() if v is not None and v not in ({}, [])}


def _machines(spec: dict[str, Any], stacks: list[dict[str, Any]], inventories: dict[str, dict[str, Any]]) -> list[Any]:
    sim = (spec.get("cluster") or {}).get("sim")
    if sim:
        keys = ("machines", "gpu", "gpus_per_machine", "host_memory_gb")
        return [{"simulated": True, **{k: sim.get(k) for k in keys}}]
    out = []
    for node in sorted({str(st.get("node_id")) for st in stacks if st.get("node_id")}):
        inventory = inventories.get(node, {})
        out.append({"node_id": node, "hostname": inventory.get("hostname"), "simulated": inventory.get("simulated"),
                    "gpu": inventory.get("gpu_model"), "gpus": inventory.get("gpus"),
                    "gpu_memory_gb": inventory.get("gpu_memory_gb"), "cpus": inventory.get("cpus"),
                    "ram_gb": inventory.get("ram_gb")})  # fmt: skip
    return out


def _engines(stacks: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Each engine process as its agent started it: its command line and the version it reported."""
    out = []
    for st in stacks:
        facts = st.get("facts") or {}
        for key in sorted(k for k in facts if k.endswith(".command")):
            process = key.removesuffix(".command")
            out.append({"node_id": str(st.get("node_id")), "process": process, "command": facts[key],
                        "version": facts.get(f"{process}.version", ""),
                        "model_source": facts.get("model_source", "")})  # fmt: skip
    return out


def tested_summary(
    workloads: list[dict[str, Any]], specs: dict[str, dict[str, Any]], inventories: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    out = []
    for workload in workloads:
        spec = specs.get(workload["name"], {})
        engine = spec.get("engine") or {}
        traffic = spec.get("traffic") or {}
        shape = traffic.get("shape")
        shape_params = {k: v for k, v in _set(traffic).items() if k not in ("shape", "arrivals")}
        engines = _engines(workload.get("stacks") or [])
        reported = sorted({e["version"] for e in engines if e["version"]})
        out.append(
            {
                "workload": workload["name"],
                "stack": workload.get("stack"),
                "model": spec.get("model"),
                "engine": engine.get("name"),
                "engine_version": ", ".join(reported) or engine.get("version") or "the stack's validated default",
                "tensor_parallel_size": engine.get("tensor_parallel_size", 1),
                "engine_args": _set(engine.get("args")),
                "kv_tier": spec.get("kv_tier"),
                "sizing": _set(spec.get("sizing")),
                "traffic": {"shape": shape, **shape_params},
                "arrivals": _set(traffic.get("arrivals")),
                "measurement": {k: v for k, v in _set(spec.get("measurement")).items() if k != "slo"},
                "machines": _machines(spec, workload.get("stacks") or [], inventories),
                "engines": engines,
            }
        )
    return out


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_inline(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) and " " in value else str(value)


def _machine_line(machine: dict[str, Any]) -> str:
    if machine.get("simulated") and "machines" in machine:
        return f"{machine['machines']} simulated machine(s), {machine['gpus_per_machine']} x {machine['gpu']} each"
    gpus = f"{machine.get('gpus')} x {machine.get('gpu')}" if machine.get("gpus") else "no GPU"
    kind = " (simulated)" if machine.get("simulated") else ""
    return f"{machine.get('node_id')}{kind}: {gpus}, {machine.get('cpus')} cores, {machine.get('ram_gb') or 0:.0f} GB"


def tested_lines(tested: list[dict[str, Any]]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Per workload, (label, text) rows for the HTML page and the console."""
    out = []
    for t in tested:
        rows = [
            ("model", str(t["model"])),
            ("engine", f"{t['engine']} {t['engine_version']}, tensor parallel {t['tensor_parallel_size']}"
             + (f"; {_inline(t['engine_args'])}" if t["engine_args"] else "")),
            ("tier and sizing", f"{t['kv_tier']}" + (f"; {_inline(t['sizing'])}" if t["sizing"] else "")),
            ("traffic", _inline(t["traffic"])),
            ("arrivals", _inline(t["arrivals"]) or "the plan's default"),
            ("measurement", _inline(t["measurement"]) or "the plan's defaults"),
            ("machines", "; ".join(_machine_line(m) for m in t["machines"]) or "none recorded"),
        ]  # fmt: skip
        rows += [(f"{e['node_id']} {e['process']}", e["command"]) for e in t["engines"]]
        out.append((f"{t['workload']} ({t['stack']})", rows))
    return out
