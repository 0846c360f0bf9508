"""`kvbench sim run`: a plan on its simulated cluster in virtual time (batch, what-if mode)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table

from kvbench_cli.console import (
    console,
    err_console,
    ms,
    print_refusal,
)

if TYPE_CHECKING:
    from kvbench_contracts.plan import Plan
    from kvbench_sim.entrypoints import SimProgress

__all__ = ["register"]


def _reviewed(args: argparse.Namespace) -> Plan | None:
    """The plan, reviewed as the planner reviews it; None once its refusals are printed (JSON with --json)."""
    from kvbench_planner.entrypoints import review_text  # noqa: PLC0415

    review = review_text(Path(args.plan).read_bytes())
    if not review.valid or review.plan is None:
        if args.json:
            sys.stdout.write(json.dumps(review.as_dict(), indent=2) + "\n")
        else:
            print_refusal(review.as_dict())
        return None
    return review.plan


def cmd_sim_run(args: argparse.Namespace) -> int:
    """Batch (what-if) mode: the whole plan on the simulated cluster in virtual time, no services."""
    from kvbench_sim.entrypoints import run_plan  # noqa: PLC0415

    plan = _reviewed(args)
    if plan is None:
        return 2
    started = time.monotonic()
    try:
        if args.json or not err_console.is_terminal:
            report = run_plan(plan, progress=_plain_progress, progress_every_s=PLAIN_EVERY_S)
        else:
            with Progress(
                TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeRemainingColumn(),
                console=err_console, transient=True,
            ) as bar:  # fmt: skip
                task = bar.add_task("simulating", total=1.0)

                def show(where: SimProgress) -> None:
                    bar.update(task, completed=where.done, description=escape(where.short()))

                report = run_plan(plan, progress=show, progress_every_s=0.5)
    except ValueError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    report["wall_s"] = time.monotonic() - started
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return 0
    table = Table(title=f"kvbench sim run {report['plan_name']} · virtual time · {report['wall_s']:.1f} s wall")
    for column in ("workload", "stack", "load", "repeat", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "ITL p99 ms",
                   "tok/s", "first request TTFT ms", "prompt tokens from"):  # fmt: skip
        table.add_column(column)
    for w in report["workloads"]:
        for point in w["test_points"]:
            for job in point["jobs"]:
                sources = job["prompt_token_sources"]
                total = sum(sources.values()) or 1
                where = ", ".join(f"{k} {v / total:.0%}" for k, v in sources.items() if v)
                first = job.get("first_request_ttft_ms")
                table.add_row(
                    w["name"], w["stack"], f"{point['load_level']:g}", f"{job['repeat'] + 1} ({job['cache_state']})",
                    ms(job["ttft_ms"], "p50"), ms(job["ttft_ms"], "p99"), ms(job["tpot_ms"], "p50"),
                    ms(job["itl_ms"], "p99"), f"{job['output_tokens_per_s']:,.1f}",
                    f"{first:,.1f}" if first is not None else "–", where,
                )  # fmt: skip
    console.print(table)
    for line in shared_server_lines(report):
        console.print(line)
    console.print(
        "repeat: fresh (a new stack), restarted (cache_state: empty: GPU and host tiers and memory stores lost, "
        "disk tiers and shared filesystems kept, a cold start) or warm (every cache kept); first request TTFT: the "
        "job's first request, measured or not"
    )
    return 0


def cmd_sim_search(args: argparse.Namespace) -> int:
    """A plan's question (search:) answered on the simulator: the best candidate meeting the SLO, every point."""
    from kvbench_sim.entrypoints import search_plan  # noqa: PLC0415

    plan = _reviewed(args)
    if plan is None:
        return 2
    if plan.search is None:
        err_console.print("[red]error:[/red] the plan asks no question: add search: (vary, slo, objective); "
                          "see examples/search/host-memory.yaml")  # fmt: skip
        return 2

    def say(line: str) -> None:  # progress on stderr: stdout carries the answer (and the JSON alone with --json)
        err_console.print(f"[dim]search:[/dim] {escape(line)}", highlight=False)

    try:
        answer = search_plan(plan, progress=say, workers=args.workers)
    except ValueError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    if args.html:
        from kvbench_reporter.entrypoints import search_html  # noqa: PLC0415

        Path(args.html).write_text(search_html(answer, plan.name))
    if args.json:
        sys.stdout.write(json.dumps(answer, indent=2, default=_finite) + "\n")
        return 0 if answer["best"] is not None else 1
    _print_answer(answer)
    if args.html:
        console.print(f"wrote {args.html}")
    return 0 if answer["best"] is not None else 1


def _finite(value: object) -> object:
    raise TypeError(f"{type(value).__name__} is not JSON")


def _print_answer(answer: dict[str, Any]) -> None:
    question = answer["question"]
    paths = list(question["vary"])
    figures = list(answer["evaluated"][0]["figures"]) if answer["evaluated"] else []
    table = Table(title=f"kvbench sim search · {question['objective']} · {len(answer['evaluated'])} candidates · "
                        f"{answer['wall_s']:.1f} s wall")  # fmt: skip
    for column in [*paths, "meets SLO", *figures]:
        table.add_column(column)
    for e in answer["evaluated"]:
        shown = ("–" if e["figures"].get(f) is None else f"{e['figures'][f]:,.4g}" for f in figures)
        table.add_row(*(f"{e['values'][p]:g}" for p in paths), "yes" if e["met"] else "[red]no[/red]", *shown)
    console.print(table)
    best = answer["best"]
    if best is None:
        closest = answer["closest"] or {}
        tried = ", ".join(f"{p} = {v:g}" for p, v in closest.get("values", {}).items())
        why = "; ".join(m["why"] for m in closest.get("missed", []))
        console.print(f"[red]No candidate meets the SLO.[/red] The closest, {tried}, missed: {escape(why)}")
        return
    console.print("[bold]answer:[/bold] " + ", ".join(f"{p} = {v:g}" for p, v in best["values"].items()))
    if best.get("next_failed"):
        tried = ", ".join(f"{p} = {v:g}" for p, v in best["next_failed"]["values"].items())
        why = "; ".join(m["why"] for m in best["next_failed"]["missed"])
        console.print(f"the next candidate, {tried}, missed: {escape(why)}")
    if answer.get("precision"):
        console.print(answer["precision"])


PLAIN_EVERY_S = 10.0  # in a log or CI, or beside --json's output: a line this often, never minutes of silence


def _plain_progress(where: SimProgress) -> None:
    """Progress outside a terminal (and with --json, whose report is stdout's): plain lines on stderr."""
    sys.stderr.write(f"simulating {where.line()}\n")
    sys.stderr.flush()


BOTTLENECK = 0.7  # a shared server's link busy this share of a job: its loads queue behind each other


def shared_server_lines(report: dict[str, Any]) -> list[str]:
    """Shared LMCache servers (sizing.engines_per_cache_server): who computed what another instance reused, and how
    busy each server's link was (its average over the job: bursts queue well below 100%)."""
    lines = []
    for w in report["workloads"]:
        for point in w["test_points"]:
            for job in point["jobs"]:
                shared = [s for s in job.get("cache_servers", []) if len(s["engines"]) > 1]
                if not shared:
                    continue
                cross = job.get("cross_instance_tokens", {})
                pairs = ", ".join(f"{pair} {tokens:,}" for pair, tokens in list(cross.items())[:4])
                more = f" and {len(cross) - 4} more pairs" if len(cross) > 4 else ""
                servers = "; ".join(
                    f"{s['server']} ({', '.join(s['engines'])}): {s['bytes_moved'] / 1e9:,.1f} GB, link busy "
                    f"{s['busy_share']:.0%}"
                    for s in shared
                )
                where = f"{w['name']} (load {point['load_level']:g}, repeat {job['repeat'] + 1})"
                if any(s["busy_share"] >= BOTTLENECK for s in shared):
                    servers += f"; a server busy {BOTTLENECK:.0%} of the job or more is the bottleneck (loads queue)"
                lines.append(
                    f"{where}: shared servers {servers}; {sum(cross.values()):,} prompt tokens computed by one "
                    "instance and reused by another" + (f" ({pairs}{more})" if pairs else "")
                )
    return lines


def register(sub: Any) -> None:
    sim = sub.add_parser("sim", help="the simulated engine").add_subparsers(dest="sim_command", required=True)
    sim_run = sim.add_parser("run", help="run a plan on its simulated cluster in virtual time (what-if)")
    sim_run.add_argument("plan")
    sim_run.add_argument("--json", action="store_true", help="print the report JSON")
    sim_run.set_defaults(func=cmd_sim_run)
    sim_search = sim.add_parser("search", help="answer a plan's question (search:) on the simulator: the best "
                                "values meeting an SLO")  # fmt: skip
    sim_search.add_argument("plan")
    sim_search.add_argument("--json", action="store_true", help="print the answer JSON (best, evaluated, pareto)")
    sim_search.add_argument("--html", metavar="FILE", help="also write the answer as a page with its chart")
    sim_search.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    sim_search.set_defaults(func=cmd_sim_search)
