"""`kvbench catalog`: the stack catalog, with why a stack cannot be chosen for an engine, vendor, version."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.markup import escape
from rich.table import Table

from kvbench_cli.console import (
    console,
)

__all__ = ["register"]


def cmd_catalog(args: argparse.Namespace) -> int:
    from kvbench_stacks.query import stack_rows  # noqa: PLC0415 (the same rows as GET /v1/catalog/stacks)

    rows = stack_rows(args.engine, args.vendor, args.version)
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    table = Table(title="kvbench stack catalog")
    for column in (
        "id",
        "engine",
        "strategy",
        "tiers",
        "what to set",
        "vendors",
        "checked on",
        "real runs",
        "sim",
        "why not",
    ):
        table.add_column(column)
    for r in rows:
        table.add_row(
            escape(r["id"]),
            r["engine"],
            r["strategy"],
            ", ".join(r["tiers"]),
            ", ".join(r["needs"]) or "-",
            ", ".join(r["vendors"]),
            ", ".join(r["validated_on"]) or "-",
            ", ".join(r["live_runs"]) or "-",
            "yes" if r["simulated"] else "",
            escape(r["why_not"] or ""),
            style=None if r["selectable"] else "dim",
        )
    console.print(table)
    console.print(
        "checked on: the engine versions whose own parsers accept the stack's recipe (make conformance); "
        "real runs: versions with a real run recorded (data/live)"
    )
    console.print("orchestrators: bare_metal; locked (coming soon): dynamo, llm-d, production-stack")
    return 0


def register(sub: Any) -> None:
    catalog = sub.add_parser("catalog", help="list the stack catalog")
    catalog.add_argument("--json", action="store_true")
    catalog.add_argument("--engine", choices=("vllm", "sglang", "trtllm"))
    catalog.add_argument("--vendor", choices=("nvidia", "amd"))
    catalog.add_argument("--version", help="engine version, e.g. 0.28.0")
    catalog.set_defaults(func=cmd_catalog)
