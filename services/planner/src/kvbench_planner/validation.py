"""Plan review: every problem at once, as ``{workload, field, code, message, fix}`` entries (PLAN.md).

Structure (types, unknown keys) is checked by the pydantic models; the rules below are the product's
refusals and warnings, with its messages word for word where it has one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from kvbench_contracts.plan import Plan, Workload
from kvbench_planner.catalog import CATALOG, ORCHESTRATOR_LOCKS

__all__ = ["Issue", "Review", "parse_document", "review_plan"]

MAX_DOCUMENT_BYTES = 1_000_000


@dataclass(frozen=True)
class Issue:
    code: str
    message: str
    fix: str = ""
    field: str = ""
    workload: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "field": self.field,
            "code": self.code,
            "message": self.message,
            "fix": self.fix,
        }


@dataclass
class Review:
    plan: Plan | None
    errors: list[Issue] = field(default_factory=list)
    warnings: list[Issue] = field(default_factory=list)
    jobs: int = 0

    @property
    def valid(self) -> bool:
        return self.plan is not None and not self.errors

    def as_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "errors": [e.as_dict() for e in self.errors],
            "warnings": [w.as_dict() for w in self.warnings],
            "jobs": self.jobs,
        }


def parse_document(text: str | bytes) -> tuple[Any, Issue | None]:
    """YAML or JSON (JSON is YAML); a bad document is one clear issue, never a stack trace."""
    if len(text) > MAX_DOCUMENT_BYTES:
        return None, Issue(
            "document_too_large",
            f"The plan is {len(text)} bytes; the limit is {MAX_DOCUMENT_BYTES}",
            "Split the plan or remove inline data.",
        )
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        return None, Issue(
            "invalid_document",
            f"The plan is not valid YAML or JSON{at}",
            "Fix the syntax; check indentation and quotes.",
        )
    if not isinstance(data, dict):
        return None, Issue(
            "invalid_document",
            "The plan must be a mapping with version, name and workloads",
            "Start from examples/demo.yaml.",
        )
    return data, None


def _field_path(loc: tuple[int | str, ...], data: dict[str, Any]) -> tuple[str | None, str]:
    workload: str | None = None
    parts = list(loc)
    if len(parts) >= 2 and parts[0] == "workloads" and isinstance(parts[1], int):
        items = data.get("workloads") or []
        if parts[1] < len(items) and isinstance(items[parts[1]], dict):
            workload = items[parts[1]].get("name")
    return workload, ".".join(str(p) for p in parts)


def _structural(exc: ValidationError, data: dict[str, Any]) -> list[Issue]:
    issues: list[Issue] = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        workload, path = _field_path(loc, data)
        if err["type"] == "extra_forbidden":
            issues.append(
                Issue(
                    "unknown_field",
                    f"Unknown key {path!r}",
                    "Remove it or check its spelling against PLAN.md (`kvbench plan schema` lists every key).",
                    path,
                    workload,
                )
            )
        elif err["type"] == "missing":
            issues.append(Issue("missing_field", f"{path} is required", f"Set {path}.", path, workload))
        else:
            issues.append(
                Issue("invalid_field", f"{path}: {err['msg']}", f"Give {path} a valid value.", path, workload)
            )
    return issues


def _workload_rules(w: Workload, machines: int | None, vendor: str | None) -> tuple[list[Issue], list[Issue]]:
    errors: list[Issue] = []
    warnings: list[Issue] = []

    def err(code: str, message: str, fix: str, path: str) -> None:
        errors.append(Issue(code, message, fix, path, w.name))

    stack = CATALOG.get(w.stack)
    if w.orchestrator != "bare_metal":
        err("orchestrator_locked", ORCHESTRATOR_LOCKS[w.orchestrator], "Choose bare_metal.", "orchestrator")
    if stack is None:
        err(
            "unknown_stack",
            f"There is no stack {w.stack!r}",
            "Choose a stack id from `kvbench catalog`.",
            "stack",
        )
    else:
        if stack.engine != w.engine.name:
            err(
                "stack_engine_mismatch",
                f"The stack {stack.id} runs on {stack.engine}, not {w.engine.name}",
                f"Choose a {w.engine.name} stack, or set engine.name to {stack.engine}.",
                "stack",
            )
        if stack.strategy != w.strategy:
            err(
                "stack_engine_mismatch",
                f"The stack {stack.id} implements the {stack.strategy} strategy, not {w.strategy}",
                f"Set strategy to {stack.strategy}, or choose a {w.strategy} stack.",
                "strategy",
            )
        if stack.lmcache_server and w.kv_tier == "gpu":
            err(
                "needs_lmcache_server",
                "The stack needs an LMCache server on every node",
                "Choose the CPU RAM or NVMe SSD tier.",
                "kv_tier",
            )
        elif w.kv_tier not in stack.tiers:
            if w.engine.name == "sglang":
                err("tier_not_offered", "SGLang offers the GPU tier only", "Choose the GPU tier.", "kv_tier")
            else:
                err(
                    "tier_not_offered",
                    f"The stack {stack.id} does not use the {w.kv_tier} tier",
                    "Choose the GPU tier, or an LMCache stack.",
                    "kv_tier",
                )
        for need in stack.needs:
            if need == "prefill":
                if w.sizing.prefill_machines is None and w.sizing.prefill_gpus is None:
                    err(
                        "missing_sizing_field",
                        "A split stack needs Prefill machines or Prefill GPUs",
                        "Set sizing.prefill_machines or sizing.prefill_gpus.",
                        "sizing.prefill_machines",
                    )
            elif getattr(w.sizing, need) is None:
                err(
                    "missing_sizing_field",
                    f"The stack {stack.id} needs sizing.{need}",
                    f"Set sizing.{need}.",
                    f"sizing.{need}",
                )
        if stack.strategy in ("split", "split_offload") and w.measurement.routing == "round_robin":
            err(
                "round_robin_split",
                "Round robin cannot route prefill and decode",
                "In Routing, choose a prefill and decode routing policy.",
                "measurement.routing",
            )
        if vendor and vendor not in stack.vendors:
            err(
                "engine_vendor",
                f"The stack {stack.id} does not run on {vendor.upper()} GPUs",
                "Choose a stack the vendor runs.",
                "stack",
            )
        if stack.one_engine_per_machine:
            gpm = w.sizing.gpus_per_machine
            if gpm is None or gpm != w.engine.tensor_parallel_size:
                err(
                    "one_engine_per_machine",
                    "The stack runs one engine per machine, and a machine would run more",
                    "Set GPUs per machine to the tensor parallel size.",
                    "sizing.gpus_per_machine",
                )
        if stack.strategy == "shared_pool" and machines == 1:
            err(
                "shared_pool_single_machine",
                "A shared KV pool shares KV between machines, and this group has one machine",
                "Add a machine to the cluster group, or choose an offload or split stack.",
                "cluster",
            )
        if w.cluster.sim is not None and not stack.simulated:
            err(
                "stack_not_simulated",
                f"The stack {stack.id} has no simulated form yet",
                "Choose a simulated stack (`kvbench catalog` marks them) or a registered cluster group.",
                "stack",
            )
        if w.engine.version and not any(v.endswith(w.engine.version) for v in stack.validated_on):
            warnings.append(
                Issue(
                    "stack_not_validated",
                    f"No validated run of {stack.id} on {w.engine.name} {w.engine.version}",
                    "Treat the result as a first measurement.",
                    "engine.version",
                    w.name,
                )
            )
    if w.kv_tier == "nvme" and (w.sizing.disk_tier_gb is None or w.sizing.disk_tier_path is None):
        err(
            "missing_sizing_field",
            "The NVMe tier needs sizing.disk_tier_gb and sizing.disk_tier_path",
            "Set both disk tier fields.",
            "sizing.disk_tier_gb",
        )

    m, shape = w.measurement, w.traffic.shape
    if shape != "agentic_replay":
        if m.load_duration_s is not None:
            err(
                "field_not_for_shape",
                "Load duration applies to the agentic data set replay only",
                "Remove measurement.load_duration_s; set traffic.duration_s to bound each job.",
                "measurement.load_duration_s",
            )
        if w.traffic.dataset is not None:
            err(
                "field_not_for_shape",
                "Only the agentic data set replay reads a dataset",
                "Remove traffic.dataset.",
                "traffic.dataset",
            )
        if w.traffic.duration_s is None and shape not in {"document_reuse", "trace_replay"}:
            err(
                "missing_field",
                f"The {shape} shape needs traffic.duration_s to bound each job",
                "Set traffic.duration_s, in seconds.",
                "traffic.duration_s",
            )
    elif m.load_duration_s is not None and not 120 <= m.load_duration_s <= 14400:
        err(
            "load_duration_range",
            "Load duration must be between 120 and 14400 s",
            "Set measurement.load_duration_s within 120..14400.",
            "measurement.load_duration_s",
        )
    if not 0 <= m.warmup_s <= 3600:
        err(
            "warmup_range",
            "Warm-up must be between 0 and 3600 s",
            "Set measurement.warmup_s within 0..3600.",
            "measurement.warmup_s",
        )
    load = w.effective_load_duration_s()
    if load and m.warmup_s >= load / 2:
        err(
            "warmup_too_long",
            "Warm-up must be less than half the load duration",
            f"Set measurement.warmup_s below {load / 2:g} s.",
            "measurement.warmup_s",
        )
    if m.repeats < 3:
        warnings.append(
            Issue(
                "preliminary",
                "Fewer than 3 repeats: results are preliminary",
                "Set measurement.repeats to 3 or more for confidence intervals.",
                "measurement.repeats",
                w.name,
            )
        )
    if load and load - m.warmup_s < 300:
        warnings.append(
            Issue(
                "short_window",
                f"Only {load - m.warmup_s:g} s would be measured (less than 300 s)",
                "Lengthen the load or shorten the warm-up.",
                "measurement.warmup_s",
                w.name,
            )
        )
    if w.traffic.arrivals.mode == "closed_loop" and shape == "synthetic_sessions" and w.traffic.synthetic is None:
        warnings.append(
            Issue(
                "defaults_used",
                "traffic.synthetic is empty: kvbench's defaults are used",
                "Set traffic.synthetic to describe the sessions.",
                "traffic.synthetic",
                w.name,
            )
        )
    return errors, warnings


def count_jobs(plan: Plan) -> int:
    return sum(len(w.traffic.arrivals.load_levels()) * w.measurement.repeats for w in plan.workloads)


def review_plan(data: Any) -> Review:
    if not isinstance(data, dict):
        return Review(None, [Issue("invalid_document", "The plan must be a mapping", "Start from examples/demo.yaml.")])
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        return Review(None, _structural(exc, data))
    review = Review(plan)
    seen: set[str] = set()
    for w in plan.workloads:
        if w.name in seen:
            review.errors.append(
                Issue(
                    "duplicate_workload_name",
                    f"Two workloads are named {w.name!r}",
                    "Give every workload a unique name.",
                    "name",
                    w.name,
                )
            )
        seen.add(w.name)
        sim = w.cluster.sim
        machines = sim.machines if sim else None
        vendor = None
        if sim is not None:
            vendor = "amd" if sim.gpu.upper().startswith("MI") else "nvidia"
        errors, warnings = _workload_rules(w, machines, vendor)
        review.errors.extend(errors)
        review.warnings.extend(warnings)
    review.jobs = count_jobs(plan)
    if review.errors:
        review.plan = None
    return review


def review_text(text: str | bytes) -> Review:
    data, problem = parse_document(text)
    if problem is not None:
        return Review(None, [problem])
    return review_plan(data)


def dumps(review: Review) -> str:
    return json.dumps(review.as_dict(), indent=2)
