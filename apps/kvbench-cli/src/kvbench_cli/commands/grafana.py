"""`kvbench grafana export|push`: the Grafana dashboards."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from kvbench_cli.console import (
    console,
    err_console,
)

__all__ = ["register"]


def cmd_grafana(args: argparse.Namespace) -> int:
    from kvbench_reporter.entrypoints import export_dashboards, push_dashboards  # noqa: PLC0415

    if args.grafana_command == "export":
        for path in export_dashboards(Path(args.dir)):
            console.print(f"wrote {path}")
        return 0
    token = os.environ.get("KVBENCH_GRAFANA_TOKEN")
    if not token:
        err_console.print("[red]error:[/red] set KVBENCH_GRAFANA_TOKEN to a Grafana service-account token")
        return 2
    console.print("pushed: " + ", ".join(push_dashboards(args.url, token)))
    return 0


def register(sub: Any) -> None:
    grafana = sub.add_parser("grafana", help="Grafana dashboards").add_subparsers(dest="grafana_command", required=True)
    export_g = grafana.add_parser("export", help="write the dashboards' JSON for file provisioning")
    export_g.add_argument("--dir", default="deploy/grafana/dashboards")
    export_g.set_defaults(func=cmd_grafana)
    push = grafana.add_parser("push", help="push the dashboards to a Grafana (token in KVBENCH_GRAFANA_TOKEN)")
    push.add_argument("--url", required=True)
    push.set_defaults(func=cmd_grafana)
