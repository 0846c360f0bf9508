"""Plan review: every problem at once, as ``{workload, field, code, message, fix}`` entries (PLAN.md).

Structure (types, unknown keys) is checked by the pydantic models; ``rules`` holds the product's refusals
and warnings. The same function serves ``POST /v1/plans/validate`` and ``kvbench plan validate``: only
the way a registered cluster group is resolved differs (the live inventory, or ``--cluster FILE``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kvbench_contracts.plan import Plan, Workload
from kvbench_contracts.problem import Problem
from kvbench_planner.cluster import ClusterFile, Machine, machines_from_sim
from kvbench_planner.expand import expand_plan
from kvbench_planner.rules import workload_issues
from kvbench_planner.search_rules import search_issues
from kvbench_stacks.catalog import CATALOG
from kvbench_workloads.shapes.agentic import DATASET_FIX, DatasetNotFoundError, resolve_dataset

__all__ = [
    "MAX_JOBS",
    "GroupResolver",
    "Problem",
    "Review",
    "count_jobs",
    "load_cluster_file",
    "parse_document",
    "review_plan",
    "review_text",
]

MAX_DOCUMENT_BYTES = 1_000_000
MAX_JOBS = 1000  # a run's state is one KV value on the bus (1 MB at most): a thousand jobs fit with room to spare
MAX_DEPTH = 32  # a plan is a few levels deep; engine.args may nest a little

GroupResolver = Callable[[str], list[Machine] | None]


@dataclass
class Review:
    plan: Plan | None
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    jobs: int = 0
    expanded: dict[str, Any] | None = None
    machines: dict[str, list[Machine]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.plan is not None and not self.errors

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "valid": self.valid,
            "errors": [e.as_dict() for e in self.errors],
            "warnings": [w.as_dict() for w in self.warnings],
            "jobs": self.jobs,
            "notes": self.notes,
        }
        if self.valid and self.expanded is not None:
            out["expanded"] = self.expanded
        return out


class AliasRefusedError(yaml.YAMLError):
    pass


class PlanLoader(yaml.SafeLoader):
    """YAML's safe loader without aliases: a plan has no use for them, and a few lines of them (a "billion laughs")
    expand to more than the planner's memory."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            raise AliasRefusedError("aliases are not accepted")
        return super().compose_node(parent, index)


def _depth(data: Any) -> int:
    """How deeply mappings and lists nest (iteratively: a document's depth must not decide the stack's)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                return level
            stack.extend((child, level + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def parse_document(text: str | bytes) -> tuple[Any, Problem | None]:
    """YAML or JSON (JSON is YAML); a bad document is one clear issue, never a stack trace."""
    if len(text) > MAX_DOCUMENT_BYTES:
        return None, Problem(
            code="document_too_large",
            message=f"The plan is {len(text)} bytes; the limit is {MAX_DOCUMENT_BYTES}",
            fix="Split the plan or remove inline data.",
        )
    try:
        data = yaml.load(text, Loader=PlanLoader)  # noqa: S506 (PlanLoader is SafeLoader without aliases)
    except AliasRefusedError:
        return None, Problem(
            code="invalid_document",
            message="The plan uses YAML aliases (*name); they are not accepted, since one alias can expand to "
            "gigabytes",
            fix="Write the values out, or put shared settings in the plan's defaults section.",
        )
    except RecursionError:
        return None, Problem(
            code="invalid_document",
            message="The plan nests deeper than a plan can",
            fix="A plan is a few levels deep: version, name, defaults and workloads with their sections.",
        )
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        return None, Problem(
            code="invalid_document",
            message=f"The plan is not valid YAML or JSON{at}",
            fix="Fix the syntax; check indentation and quotes.",
        )
    except (ValueError, UnicodeDecodeError):
        return None, Problem(
            code="invalid_document", message="The plan is not UTF-8 text", fix="Save the plan as UTF-8."
        )
    if _depth(data) > MAX_DEPTH:
        return None, Problem(
            code="invalid_document",
            message=f"The plan nests more than {MAX_DEPTH} levels deep",
            fix="A plan is a few levels deep: version, name, defaults and workloads with their sections.",
        )
    if not isinstance(data, dict):
        return None, Problem(
            code="invalid_document",
            message="The plan must be a mapping with version, name and workloads",
            fix="Start from examples/demo.yaml.",
        )
    return data, None


def _field_path(loc: tuple[int | str, ...], data: dict[str, Any]) -> tuple[str | None, str]:
    workload: str | None = None
    if len(loc) >= 2 and loc[0] == "workloads" and isinstance(loc[1], int):
        items = data.get("workloads") or []
        if isinstance(items, list) and loc[1] < len(items) and isinstance(items[loc[1]], dict):
            name = items[loc[1]].get("name")
            workload = name if isinstance(name, str) else None
    return workload, ".".join(str(p) for p in loc)


def _structural(exc: ValidationError, data: dict[str, Any]) -> list[Problem]:
    issues: list[Problem] = []
    for err in exc.errors():
        workload, path = _field_path(tuple(err["loc"]), data)
        if err["type"] == "extra_forbidden":
            issues.append(
                Problem(
                    code="unknown_field",
                    message=f"Unknown key {path!r}",
                    fix="Remove it or check its spelling (`kvbench plan schema` lists every key).",
                    field=path,
                    workload=workload,
                )
            )
        elif err["type"] == "missing":
            issues.append(
                Problem(
                    code="missing_field",
                    message=f"{path} is required",
                    fix=f"Set {path}.",
                    field=path,
                    workload=workload,
                )
            )
        else:
            issues.append(
                Problem(
                    code="invalid_field",
                    message=f"{path}: {err['msg']}",
                    fix=f"Give {path} a valid value.",
                    field=path,
                    workload=workload,
                )
            )
    return issues


def count_jobs(plan: Plan) -> int:
    return sum(len(w.job_grid()) for w in plan.workloads)


def _data_problems(w: Workload) -> list[Problem]:
    """The data a workload's traffic reads must be there: a run never starts to crash on a missing file."""
    traffic = w.traffic
    if traffic.shape == "agentic_replay":
        try:
            resolve_dataset(traffic.dataset)
        except DatasetNotFoundError:
            return [
                Problem(
                    code="data_not_found",
                    message=f"The data set {traffic.dataset or 'sammshen'!r} is not installed on this machine",
                    fix=DATASET_FIX + ".",
                    field="traffic.dataset",
                    workload=w.name,
                )
            ]
    if traffic.shape == "trace_replay" and traffic.trace is not None:
        path = Path(traffic.trace.path).expanduser()
        if not path.is_file():
            return [
                Problem(
                    code="data_not_found",
                    message=f"The trace file {traffic.trace.path} does not exist or is not a file",
                    fix="Set traffic.trace.path to a readable trace file; the public traces are in data/traces "
                    "(see kvbench's README).",
                    field="traffic.trace.path",
                    workload=w.name,
                )
            ]
    return []


def review_plan(data: Any, resolve_group: GroupResolver | None = None) -> Review:
    if not isinstance(data, dict):
        return Review(
            None,
            [
                Problem(
                    code="invalid_document", message="The plan must be a mapping", fix="Start from examples/demo.yaml."
                )
            ],
        )
    try:
        plan = Plan.model_validate(data)
    except ValidationError as exc:
        return Review(None, _structural(exc, data))
    review = Review(plan)
    seen: set[str] = set()
    for w in plan.workloads:
        if w.name in seen:
            review.errors.append(
                Problem(
                    code="duplicate_workload_name",
                    message=f"Two workloads are named {w.name!r}",
                    fix="Give every workload a unique name.",
                    field="name",
                    workload=w.name,
                )
            )
        seen.add(w.name)
        machines: list[Machine] | None
        if w.cluster.sim is not None:
            machines = machines_from_sim(w.cluster.sim)
        else:
            group = w.cluster.group or ""
            machines = resolve_group(group) if resolve_group else None
            if machines is None:
                review.errors.append(
                    Problem(
                        code="unknown_cluster_group",
                        message=f"There is no cluster group {group!r}",
                        fix="Create the group (POST /v1/cluster-groups), pass --cluster FILE offline, "
                        "or set cluster.sim.",
                        field="cluster.group",
                        workload=w.name,
                    )
                )
        review.errors.extend(_data_problems(w))
        errors, warnings = workload_issues(w, machines)
        stack = CATALOG.get(w.stack)
        if w.cluster.sim is not None and stack is not None and not stack.simulated:
            review.notes.append(
                f"{w.name}: the stack {stack.id} has no simulated form yet, so a run on the simulated "
                "cluster stops at stand-up; run it on a registered cluster group"
            )
        if (
            w.traffic.shape != "agentic_replay"
            and not w.traffic.duration_s
            and w.traffic.shape in ("synthetic_sessions", "shared_prompt", "per_user_history")
        ):
            review.notes.append(
                f"{w.name}: no traffic.duration_s, so each user runs one session and the job ends "
                "when every user is done"
            )
        review.errors.extend(errors)
        review.warnings.extend(warnings)
        if machines is not None:
            review.machines[w.name] = machines
    if plan.baseline is not None and plan.baseline not in seen:
        review.errors.append(
            Problem(
                code="invalid_field",
                message=f"The baseline {plan.baseline!r} is not a workload of this plan",
                fix=f"Set baseline to one of {', '.join(sorted(seen))}, or leave it out to compare with the first "
                "own_cache workload.",
                field="baseline",
            )
        )
    review.errors.extend(search_issues(plan))
    review.jobs = count_jobs(plan)
    if review.jobs > MAX_JOBS:
        review.errors.append(
            Problem(
                code="too_many_jobs",
                message=f"The plan expands to {review.jobs:,} jobs; one run holds at most {MAX_JOBS:,}",
                fix="Split it into several plans, or use fewer load levels or repeats.",
                field="workloads",
            )
        )
    if review.errors:
        review.plan = None
    else:
        review.expanded = expand_plan(plan, review.machines)
    return review


def review_text(text: str | bytes, resolve_group: GroupResolver | None = None) -> Review:
    data, problem = parse_document(text)
    if problem is not None:
        return Review(None, [problem])
    return review_plan(data, resolve_group)


def load_cluster_file(text: str | bytes) -> tuple[dict[str, list[Machine]], str | None]:
    """``--cluster FILE`` for offline review: the groups, or a message naming what is wrong."""
    try:
        data = yaml.safe_load(text)
        return dict(ClusterFile.model_validate(data).groups), None
    except yaml.YAMLError:
        return {}, "not valid YAML or JSON"
    except ValidationError as exc:
        first = exc.errors()[0]
        return (
            {},
            f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']} (expected {{groups: {{NAME: [machine]}}}})",
        )
