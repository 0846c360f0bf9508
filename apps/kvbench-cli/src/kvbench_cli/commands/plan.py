"""`kvbench plan validate` (the planner's review, offline) and `kvbench plan schema`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from kvbench_cli.console import (
    console,
    err_console,
    print_refusal,
)

__all__ = ["register"]


def cmd_plan_validate(args: argparse.Namespace) -> int:
    from kvbench_planner.entrypoints import GroupResolver, load_cluster_file, review_text  # noqa: PLC0415

    resolver: GroupResolver | None = None
    if args.cluster:
        groups, problem = load_cluster_file(Path(args.cluster).read_bytes())
        if problem is not None:
            err_console.print(f"[red]--cluster {escape(args.cluster)}[/red]: {escape(problem)}")
            return 2
        resolver = groups.get
    review = review_text(Path(args.plan).read_bytes(), resolver)
    if args.json:
        sys.stdout.write(json.dumps(review.as_dict(), indent=2) + "\n")
    else:
        print_refusal(review.as_dict())
        if review.valid:
            console.print(f"[green]valid[/green]: {review.jobs} job(s)")
            print_machines(review.expanded or {})
    return 0 if review.valid else 2


def print_machines(expanded: dict[str, Any]) -> None:
    """Per workload and machine, what will run there (with --cluster, the exact commands, to check first)."""
    for workload in expanded.get("workloads", []):
        console.print(f"[bold]{escape(workload['name'])}[/bold] ({workload['stack']}):")
        for machine in workload["machines"]:
            console.print(f"  {escape(machine['name'])}: {machine['gpus']} x {machine.get('gpu_model') or '?'}")
            for command in machine.get("commands", []):
                console.print(f"    {escape('[' + command['role'] + ']')} {escape(command['command'])}", soft_wrap=True)
            if not machine.get("commands"):
                for process in machine["processes"]:
                    console.print(f"    {escape(process)}")


def cmd_plan_schema(_: argparse.Namespace) -> int:
    from kvbench_contracts.plan import Plan  # noqa: PLC0415

    sys.stdout.write(json.dumps(Plan.model_json_schema(), indent=2) + "\n")
    return 0


def register(sub: Any) -> None:
    plan = sub.add_parser("plan", help="plan tools").add_subparsers(dest="plan_command", required=True)
    validate = plan.add_parser("validate", help="review a plan offline")
    validate.add_argument("plan")
    validate.add_argument("--json", action="store_true")
    validate.add_argument("--cluster", metavar="FILE", help="machines of registered groups: {groups: {NAME: [...]}}")
    validate.set_defaults(func=cmd_plan_validate)
    plan.add_parser("schema", help="print the plan's JSON Schema").set_defaults(func=cmd_plan_schema)
