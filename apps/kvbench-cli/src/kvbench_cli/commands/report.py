"""`kvbench report`: a run's report (`report RUN_ID`, `report show RUN_ID`), the figures of record files
(`report analyze FILE...`) and the report's JSON Schema (`report schema`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from kvbench_cli.api import fetch_report, resolve_endpoints
from kvbench_cli.commands.runs import add_endpoint_args
from kvbench_cli.console import (
    console,
    err_console,
    print_comparison,
    print_figures,
)

__all__ = ["register"]


def cmd_report(args: argparse.Namespace) -> int:
    endpoints = resolve_endpoints(Path(args.state_dir), args.api, args.report_api)
    if args.html:
        Path(args.html).write_text(fetch_report(endpoints, args.run_id, html=True, wait_s=0))
        console.print(f"wrote {args.html}")
        return 0
    report = fetch_report(endpoints, args.run_id, wait_s=0)
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        print_comparison(report)
    return 0


def cmd_report_schema(_: argparse.Namespace) -> int:
    from kvbench_reporter.entrypoints import report_json_schema  # noqa: PLC0415

    sys.stdout.write(json.dumps(report_json_schema(), indent=2) + "\n")
    return 0


def cmd_report_analyze(args: argparse.Namespace) -> int:
    """DESIGN.md 6: the client-side figures of record files, with the report's definitions, no server."""
    from kvbench_contracts.records import RequestRecord  # noqa: PLC0415
    from kvbench_core.analysis import Slo, analyze_grouped  # noqa: PLC0415
    from kvbench_core.timing import TIMING_DEFINITION, timing_verdict  # noqa: PLC0415

    records: list[RequestRecord] = []
    for path in args.files:
        for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
            if line.strip():
                try:
                    records.append(RequestRecord.model_validate_json(line))
                except ValueError as exc:
                    err_console.print(
                        f"[red]{escape(path)}:{number}[/red]: not a request record ({escape(str(exc)[:200])})"
                    )
                    return 2
    if not records:
        err_console.print("[red]no request records[/red] in " + escape(", ".join(args.files)))
        return 2
    slo = Slo(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2e_ms)
    # an export's metadata (kvbench records export writes it beside the file): each job's window as the report used
    # it, unless the command line gives one
    windows: dict[str, tuple[float, float | None]] = {}
    if args.warmup_s is None and args.load_duration_s is None:
        for path in args.files:
            meta = Path(path).with_name(Path(path).name + ".meta.json")
            if meta.is_file():
                for job_id, job in (json.loads(meta.read_text()).get("jobs") or {}).items():
                    if job.get("warmup_s") is not None:
                        windows[job_id] = (float(job["warmup_s"]), job.get("load_duration_s"))
    groups = analyze_grouped(records, args.by, args.warmup_s or 0.0, args.load_duration_s, slo, windows)
    for group in groups:  # files carry no client lag figures: merged reads are what the records can tell
        group["timing"] = timing_verdict(None, group["merged_chunk_share"])
    key = "workloads" if args.by == "workload" else "jobs"
    if args.json:
        out = {
            "by": args.by,
            key: groups,
            "definitions": {
                "window_s": "per job: load end (--load-duration-s, else the job's last request end) - warm-up; a "
                "workload sums its jobs' windows and pools their measured requests",
                "timing": TIMING_DEFINITION,
            },
        }
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return 0
    for group in groups:
        label = group["name"] if args.by == "workload" else f"{group['job_id']} ({group['workload']})"
        console.print(f"[bold]{escape(label)}[/bold] · {group['jobs']} job(s)")
        print_figures(group)
        if not group["timing"]["reliable"]:
            console.print("[yellow]TTFT and ITL unreliable:[/yellow] " + escape("; ".join(group["timing"]["reasons"])))
    return 0


def add_analyze_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE.jsonl")
    p.add_argument(
        "--warmup-s",
        type=float,
        default=None,
        help="each job's warm-up (default: as the report used it, from an export's FILE.meta.json; else 0)",
    )
    p.add_argument(
        "--load-duration-s", type=float, default=None, help="each job's load end (default: its last request's end)"
    )
    p.add_argument(
        "--by",
        choices=("workload", "job"),
        default="workload",
        help="figures per workload (its jobs pooled over their summed windows; the default) or per job",
    )
    p.add_argument("--slo-ttft-ms", type=float, default=None)
    p.add_argument("--slo-tpot-ms", type=float, default=None)
    p.add_argument("--slo-e2e-ms", type=float, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_report_analyze)


def register(sub: Any) -> None:
    report = sub.add_parser("report", help="a run's report; `report analyze FILE...`; `report schema`")
    group = report.add_subparsers(dest="report_command", required=True, action=DefaultSubcommand, default_choice="show")
    show = group.add_parser("show", help="show a run's report (the default: `kvbench report RUN_ID`)")
    show.add_argument("run_id")
    show.add_argument("--json", action="store_true")
    show.add_argument("--html", metavar="FILE", help="write the HTML report to FILE")
    add_endpoint_args(show)
    show.set_defaults(func=cmd_report)
    add_analyze_args(group.add_parser("analyze", help="figures of record files (JSON Lines), no server"))
    group.add_parser("schema", help="the report's JSON Schema").set_defaults(func=cmd_report_schema)
    group.route_unknown_to_default()


class _AnyName(dict[str, argparse.ArgumentParser]):
    """argparse checks a subcommand against its choices before the action sees it; every first argument passes
    here, and ``DefaultSubcommand`` routes the ones that name no subcommand."""

    def __contains__(self, _name: object) -> bool:
        return True


class DefaultSubcommand(argparse._SubParsersAction):  # type: ignore[type-arg]
    """A command group whose first argument, when it names no subcommand, goes to ``default_choice``: so
    `kvbench report RUN_ID` is `kvbench report show RUN_ID`, and `report analyze` / `report schema` are commands
    of the same group."""

    def __init__(self, *args: Any, default_choice: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.default_choice = default_choice

    def route_unknown_to_default(self) -> None:
        """Once every subcommand is added: a first argument that names none goes to the default one."""
        self._name_parser_map = _AnyName(self._name_parser_map)
        self.choices = self._name_parser_map

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        if values and values[0] not in self._name_parser_map.keys():  # noqa: SIM118 (the real names, not __contains__)
            values = [self.default_choice, *values]
        super().__call__(parser, namespace, values, option_string)
