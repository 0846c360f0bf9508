"""The `kvbench` command line: the top-level parser and every command group's own module."""

from __future__ import annotations

import argparse
from importlib import metadata

from kvbench_cli.commands import agent, catalog, control, deploy, grafana, plan, records, report, runs, sim
from kvbench_cli.load import add_load_parser

__all__ = ["build_parser"]

GROUPS = (deploy, runs, control, report, records, plan, sim, catalog, grafana, agent)


def _version() -> str:
    try:
        return metadata.version("kvbench-cli")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvbench", description="Benchmark distributed KV-cache strategies")
    parser.add_argument(
        "--state-dir",
        default=None,
        help="where `up` keeps its pids, logs and data (default: KVBENCH_STATE_DIR, else ./.kvbench when it holds a "
        "deployment, else the one your last `kvbench up` started)",
    )
    parser.add_argument("--version", action="version", version=f"kvbench {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.register(sub)
    add_load_parser(sub)
    return parser
