"""The ``kvbench`` command."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from importlib import resources
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvbench_cli.api import ApiError, Endpoints, fetch_report, resolve_endpoints
from kvbench_cli.deployment import LocalDeployment, StartupError
from kvbench_cli.load import add_load_parser
from kvbench_core.procs import pid_alive

__all__ = ["main"]

# logs and CI are not terminals: give tables room instead of rich's 80-column default
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

TERMINAL = ("succeeded", "failed", "cancelled")


def _interrupt_on_signals() -> None:
    """Ctrl-C, SIGTERM and a closed terminal all end in the same clean-up, even where the parent started us
    with SIGINT ignored (a background job of a script)."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


# -- output -------------------------------------------------------------------------------------
def _ms(stats: dict[str, Any] | None, key: str) -> str:
    value = (stats or {}).get(key)
    return "–" if value is None else f"{value:,.1f}"


def print_comparison(report: dict[str, Any]) -> None:
    table = Table(title=f"kvbench {report['plan_name']} · run {report['run_id']} · {report['status']}")
    for column in (
        "workload",
        "stack",
        "verdict",
        "requests",
        "measured",
        "TTFT p50 ms",
        "TTFT p90 ms",
        "TTFT p99 ms",
        "TPOT p50 ms",
        "output tok/s",
        "cached prompt tokens",
    ):
        table.add_column(column, justify="left" if column in ("workload", "stack", "verdict") else "right")
    for w in report["workloads"]:
        ratio = w.get("cache_hit_ratio")
        table.add_row(
            w["name"],
            w["stack"],
            w["validity"]["verdict"],
            f"{w['requests']:,}",
            f"{w['requests_measured']:,}",
            _ms(w["ttft_ms"], "p50"),
            _ms(w["ttft_ms"], "p90"),
            _ms(w["ttft_ms"], "p99"),
            _ms(w["tpot_ms"], "p50"),
            f"{w['output_tokens_per_s']:,.1f}",
            f"{w['cached_prompt_tokens']:,}" + (f" ({ratio:.0%})" if ratio is not None else ""),
        )
    console.print(table)
    for w in report["workloads"]:
        for reason in w["validity"]["reasons"]:
            console.print(f"  [dim]{w['name']}: {reason}[/dim]")
    print_fabric(report.get("fabric") or {})


def print_fabric(fabric: dict[str, Any]) -> None:
    """Switches the run's machines are cabled to: read or not, and what their ports carried."""
    gate = fabric.get("publish_gate") or {}
    for switch in fabric.get("switches", []):
        state = "read" if switch["read"] else f"[red]unread[/red] ({escape(str(switch.get('reason')))})"
        console.print(f"switch {escape(switch['switch'])}: {state}, {switch['reads']} reads around the run")
        for port in switch.get("ports", []):
            moved = (port.get("if.in_octets_delta") or 0) + (port.get("if.out_octets_delta") or 0)
            console.print(
                f"  {port['port']}: {moved / 1e9:,.2f} GB over {port['window_s']:.0f} s "
                f"(in {port.get('in_utilization', 0):.2%} / out {port.get('out_utilization', 0):.2%} of line rate)"
            )
    if gate and not gate.get("publishable", True):
        console.print(f"[red]not publishable[/red] [{gate['code']}] {escape(gate['message'])}. {escape(gate['fix'])}")


def print_refusal(body: dict[str, Any]) -> None:
    for entry in body.get("errors", []):
        where = ".".join(p for p in (entry.get("workload"), entry.get("field")) if p)
        text = "[{}] {}: {}".format(entry["code"], where, entry["message"])
        err_console.print("[red]refused[/red] " + escape(text))
        if entry.get("fix"):
            err_console.print(f"         fix: {escape(entry['fix'])}")
    for note in body.get("notes", []):
        err_console.print("[cyan]note[/cyan] " + escape(str(note)))
    for entry in body.get("warnings", []):
        where = ".".join(p for p in (entry.get("workload"), entry.get("field")) if p)
        text = "[{}] {}: {}".format(entry["code"], where, entry["message"])
        err_console.print("[yellow]warning[/yellow] " + escape(text))


# -- commands -----------------------------------------------------------------------------------
def submit_and_wait(endpoints: Endpoints, plan_text: str, wait: bool) -> tuple[str, dict[str, Any] | None]:
    with httpx.Client(timeout=30.0) as client:
        response = client.post(
            f"{endpoints.api_url}/v1/runs",
            content=plan_text.encode(),
            headers={"Content-Type": "application/yaml", **endpoints.headers()},
        )
        if response.status_code == 422:
            body = response.json()
            if "errors" not in body:  # a framework-level 422, not a plan review
                raise ApiError(f"submit: HTTP 422: {response.text[:500]}", 422)
            print_refusal(body)
            raise SystemExit(2)
        if response.status_code != 201:
            raise ApiError(f"submit: HTTP {response.status_code}: {response.text[:300]}", response.status_code)
        created = response.json()
        run_id: str = created["run_id"]
        print_refusal({"warnings": created.get("warnings", [])})
        console.print(f"run [bold]{run_id}[/bold] submitted: {created['jobs']} job(s)")
        if not wait:
            return run_id, None
        status: dict[str, Any] = {}
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as progress:
            task = progress.add_task("starting", total=1.0)
            while True:
                status = client.get(f"{endpoints.api_url}/v1/runs/{run_id}").json()
                running = [j for j in status["jobs"] if j["status"] == "running"]
                label = (
                    f"{status['status']} · {running[0]['workload']} (load {running[0]['load_level']:g}, "
                    f"repeat {running[0]['repeat'] + 1}) · {running[0]['requests']} requests"
                    if running
                    else status["status"]
                )
                progress.update(task, completed=status["progress"], description=label)
                if status["status"] in TERMINAL:
                    break
                time.sleep(1.0)
        for reason in status.get("reasons", []):
            err_console.print(
                f"[red]{escape(str(reason.get('code')))}[/red]: "
                f"{escape(str(reason.get('message')))} {escape(str(reason.get('fix', '')))}"
            )
        return run_id, status


def cmd_up(args: argparse.Namespace) -> int:
    deployment = LocalDeployment(Path(args.state_dir))
    with console.status("starting NATS, PostgreSQL, the services and a simulated cluster"):
        state = deployment.up(
            sim_machines=args.sim_machines,
            nats_url=args.nats_url,
            database_url=args.database_url,
            loadgens=max(1, args.loadgens),
            sim_speed=args.sim_speed,
        )
    speed = f", engines at {args.sim_speed:g}x real time unless a plan says" if args.sim_speed else ""
    console.print(f"kvbench is up ({args.sim_machines} simulated machines{speed})")
    console.print(f"  API      {state.api_url}   (OpenAPI: {state.api_url}/openapi.json)")
    console.print(f"  reports  {state.report_url}/v1/runs/<run_id>/report.html")
    console.print(f"  logs     {args.state_dir}/logs/   stop with: kvbench down")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    stopped = LocalDeployment(Path(args.state_dir)).down()
    console.print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = LocalDeployment(Path(args.state_dir)).load()
    if state is None:
        console.print(f"kvbench is not up (no state in {args.state_dir})")
        return 1
    table = Table(title="kvbench status")
    for column in ("service", "pid", "process", "health"):
        table.add_column(column)
    healthy = True
    with httpx.Client(timeout=2.0) as client:
        rows = [("nats", state.nats_pid, None)] + [(s.name, s.pid, s.health_url) for s in state.services]
        for name, pid, url in rows:
            alive = bool(pid) and pid_alive(int(pid or 0))
            health = "–"
            if url:
                try:
                    health = "ok" if client.get(url).status_code == 200 else "failing"
                except httpx.HTTPError:
                    health = "unreachable"
            healthy &= alive and health in ("ok", "–")
            table.add_row(name, str(pid or "external"), "running" if alive else "[red]stopped[/red]", health)
        nodes = client.get(f"{state.api_url}/v1/nodes").json() if healthy else []
    console.print(table)
    console.print(f"nodes registered: {len(nodes)}; API {state.api_url}; reports {state.report_url}")
    return 0 if healthy else 1


def cmd_run(args: argparse.Namespace) -> int:
    endpoints = resolve_endpoints(Path(args.state_dir), args.api, args.report_api)
    plan_text = Path(args.plan).read_text()
    run_id, status = submit_and_wait(endpoints, plan_text, args.wait)
    if status is None:
        return 0
    report = fetch_report(endpoints, run_id)
    print_comparison(report)
    console.print(f"report: {endpoints.report_url}/v1/runs/{run_id}/report.html")
    return 0 if status["status"] == "succeeded" else 1


def cmd_report_schema(_: argparse.Namespace) -> int:
    from kvbench_reporter.entrypoints import report_json_schema  # noqa: PLC0415

    sys.stdout.write(json.dumps(report_json_schema(), indent=2) + "\n")
    return 0


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


def cmd_demo(args: argparse.Namespace) -> int:
    _interrupt_on_signals()
    out = Path(args.output)
    deployment = LocalDeployment(Path(args.state_dir) / "demo")
    if deployment.load() is not None:  # a demo killed before it could clean up
        deployment.down()
    plan_text = resources.files("kvbench_cli").joinpath("plans", "demo.yaml").read_text()
    started = time.monotonic()
    try:
        with console.status("starting embedded NATS, PostgreSQL, every service and 2 simulated L40S machines"):
            state = deployment.up(sim_machines=2, tie_to_parent=True)
        console.print(f"kvbench is up in {time.monotonic() - started:.1f} s · API {state.api_url}")
        endpoints = Endpoints(state.api_url, state.report_url, None)
        run_id, status = submit_and_wait(endpoints, plan_text, wait=True)
        report = fetch_report(endpoints, run_id)
        html = fetch_report(endpoints, run_id, html=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report, indent=2))
        (out / "report.html").write_text(html)
        print_comparison(report)
        console.print(f"wrote {out / 'report.json'} and {out / 'report.html'}")
        return 0 if status and status["status"] == "succeeded" else 1
    except KeyboardInterrupt:
        err_console.print("interrupted: stopping everything the demo started")
        return 130
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second Ctrl-C must not cut the clean-up
            signal.signal(sig, signal.SIG_IGN)
        stopped = deployment.down()
        console.print(f"stopped {len(stopped)} processes · demo took {time.monotonic() - started:.0f} s")


def cmd_report_analyze(args: argparse.Namespace) -> int:
    """DESIGN.md 6: the client-side figures of record files, with the report's definitions, no server."""
    from kvbench_contracts.records import RequestRecord  # noqa: PLC0415
    from kvbench_core.analysis import Slo, analyze  # noqa: PLC0415

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
    load_end = args.load_duration_s
    if load_end is None:  # the whole file: up to the last request's end
        load_end = max((r.start_s + (r.e2e_s or 0.0) for r in records), default=0.0)
    figures = analyze(records, args.warmup_s, load_end, Slo(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2e_ms))
    if args.json:
        sys.stdout.write(json.dumps(figures, indent=2) + "\n")
    else:
        print_figures(figures)
    return 0


def print_figures(figures: dict[str, Any]) -> None:
    """The client-side figures of one job as a table (``report analyze`` and ``load``)."""
    table = Table(
        title=f"{figures['requests_measured']} of {figures['requests_total']} requests measured over "
        f"{figures['window_s']:g} s"
    )
    for column in ("figure", "mean", "p50", "p90", "p95", "p99"):
        table.add_column(column)
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        table.add_row(key, *[_ms(figures[key], k) for k in ("mean", "p50", "p90", "p95", "p99")])
    console.print(table)
    console.print(
        f"output {figures['output_tokens_per_s']:.1f} tok/s · {figures['request_rate']:.2f} req/s · "
        f"goodput {figures['goodput_rps']:.2f} req/s · errors {figures['errors']}"
    )


def cmd_records_export(args: argparse.Namespace) -> int:
    endpoints = resolve_endpoints(Path(args.state_dir), args.api, args.report_api)
    out = Path(args.output or f"{args.run_id}.{args.format}")
    with (
        httpx.Client(timeout=httpx.Timeout(30.0, read=300.0)) as client,
        client.stream("GET", f"{endpoints.report_url}/v1/runs/{args.run_id}/records") as response,
    ):
        if response.status_code != 200:
            raise ApiError(f"records of {args.run_id}: HTTP {response.status_code}", response.status_code)
        lines = (line for line in response.iter_lines() if line.strip())
        count = write_records(lines, out, args.format)
    console.print(f"wrote {count:,} records to {out}")
    return 0


def write_records(lines: Any, out: Path, fmt: str) -> int:
    """JSON Lines in; jsonl, csv (list fields as JSON) or parquet out. Returns the number of records."""
    count = 0
    if fmt == "jsonl":
        with out.open("w") as fh:
            for line in lines:
                fh.write(line + "\n")
                count += 1
        return count
    rows = [json.loads(line) for line in lines]
    if fmt == "csv":
        import csv  # noqa: PLC0415

        fields = list(rows[0]) if rows else ["request_id"]
        with out.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()})
        return len(rows)
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    pq.write_table(pa.Table.from_pylist(rows), out)
    return len(rows)


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
    return 0 if review.valid else 2


def cmd_sim_run(args: argparse.Namespace) -> int:
    """Batch (what-if) mode: the whole plan on the simulated cluster in virtual time, no services."""
    from kvbench_planner.entrypoints import review_text  # noqa: PLC0415
    from kvbench_sim.entrypoints import run_plan  # noqa: PLC0415

    review = review_text(Path(args.plan).read_bytes())
    if not review.valid or review.plan is None:
        if args.json:
            sys.stdout.write(json.dumps(review.as_dict(), indent=2) + "\n")
        else:
            print_refusal(review.as_dict())
        return 2
    started = time.monotonic()
    try:
        if args.json:
            report = run_plan(review.plan)
        else:
            with console.status("simulating") as status:
                report = run_plan(review.plan, progress=lambda text: status.update(f"simulating {text}"))
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
                    _ms(job["ttft_ms"], "p50"), _ms(job["ttft_ms"], "p99"), _ms(job["tpot_ms"], "p50"),
                    _ms(job["itl_ms"], "p99"), f"{job['output_tokens_per_s']:,.1f}",
                    f"{first:,.1f}" if first is not None else "–", where,
                )  # fmt: skip
    console.print(table)
    console.print(
        "repeat: fresh (a new stack), restarted (cache_state: empty: GPU and host tiers and memory stores lost, "
        "disk tiers and shared filesystems kept, a cold start) or warm (every cache kept); first request TTFT: the "
        "job's first request, measured or not"
    )
    return 0


def cmd_plan_schema(_: argparse.Namespace) -> int:
    from kvbench_contracts.plan import Plan  # noqa: PLC0415

    sys.stdout.write(json.dumps(Plan.model_json_schema(), indent=2) + "\n")
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
    from kvbench_stacks.query import stack_rows  # noqa: PLC0415 (the same rows as GET /v1/catalog/stacks)

    rows = stack_rows(args.engine, args.vendor, args.version)
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    table = Table(title="kvbench stack catalog")
    for column in ("id", "engine", "strategy", "tiers", "what to set", "vendors", "validated on", "sim", "why not"):
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
            "yes" if r["simulated"] else "",
            escape(r["why_not"] or ""),
            style=None if r["selectable"] else "dim",
        )
    console.print(table)
    console.print("orchestrators: bare_metal; locked (coming soon): dynamo, llm-d, production-stack")
    return 0


def _speed(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give e.g. 20") from None
    if not 0 < value <= 1000:
        raise argparse.ArgumentTypeError(f"{value:g} is out of range; give a speed above 0 and at most 1000")
    return value


def _analyze_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE.jsonl")
    p.add_argument("--warmup-s", type=float, default=0.0)
    p.add_argument("--load-duration-s", type=float, default=None, help="load end (default: the last request's end)")
    p.add_argument("--slo-ttft-ms", type=float, default=None)
    p.add_argument("--slo-tpot-ms", type=float, default=None)
    p.add_argument("--slo-e2e-ms", type=float, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_report_analyze)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvbench", description="Benchmark distributed KV-cache strategies")
    parser.add_argument("--state-dir", default=".kvbench", help="where `up` keeps its pids, logs and data")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start embedded servers, every service and a simulated cluster")
    up.add_argument("--sim-machines", type=int, default=2)
    up.add_argument("--loadgens", type=int, default=1, help="load generator processes; each job is split among them")
    up.add_argument(
        "--sim-speed",
        type=_speed,
        default=None,
        help="run simulated engines this many times faster than real time when a plan's cluster.sim sets no speed "
        "(reports stay in engine seconds)",
    )
    up.add_argument("--nats-url", default=None, help="use this NATS instead of starting one")
    up.add_argument("--database-url", default=None, help="use this PostgreSQL instead of starting one")
    up.set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop exactly what `up` started").set_defaults(func=cmd_down)
    sub.add_parser("status", help="what `up` started, and whether it is healthy").set_defaults(func=cmd_status)

    for name, func, text in (
        ("run", cmd_run, "submit a plan"),
        ("report", cmd_report, "show a run's report"),
    ):
        p = sub.add_parser(name, help=text)
        if name == "run":
            p.add_argument("plan")
            p.add_argument("--wait", action="store_true", help="follow the run and print its summary")
        else:
            p.add_argument("run_id")
            p.add_argument("--json", action="store_true")
            p.add_argument("--html", metavar="FILE", help="write the HTML report to FILE")
        p.add_argument("--api", default=None, help="planner URL (default: from `up`, or KVBENCH_API_URL)")
        p.add_argument("--report-api", default=None, help="reporter URL (default: from `up`, or KVBENCH_REPORT_URL)")
        p.set_defaults(func=func)

    analyze = sub.add_parser("report-analyze", help="kvbench report analyze FILE.jsonl: figures of record files")
    sub.add_parser("report-schema", help="kvbench report schema: the report's JSON Schema").set_defaults(
        func=cmd_report_schema
    )
    records = sub.add_parser("records", help="request records").add_subparsers(dest="records_command", required=True)
    export = records.add_parser("export", help="export a run's request records")
    export.add_argument("run_id")
    export.add_argument("--format", choices=("jsonl", "csv", "parquet"), default="jsonl")
    export.add_argument("--output", default=None, help="file to write (default RUN_ID.FORMAT)")
    export.add_argument("--api", default=None)
    export.add_argument("--report-api", default=None)
    export.set_defaults(func=cmd_records_export)
    for p in (analyze,):
        _analyze_args(p)
    add_load_parser(sub)

    grafana = sub.add_parser("grafana", help="Grafana dashboards").add_subparsers(dest="grafana_command", required=True)
    export_g = grafana.add_parser("export", help="write the dashboards' JSON for file provisioning")
    export_g.add_argument("--dir", default="deploy/grafana/dashboards")
    export_g.set_defaults(func=cmd_grafana)
    push = grafana.add_parser("push", help="push the dashboards to a Grafana (token in KVBENCH_GRAFANA_TOKEN)")
    push.add_argument("--url", required=True)
    push.set_defaults(func=cmd_grafana)

    demo = sub.add_parser("demo", help="up, run the demo plan, write the report, down")
    demo.add_argument("--output", default="demo-output")
    demo.set_defaults(func=cmd_demo)

    plan = sub.add_parser("plan", help="plan tools").add_subparsers(dest="plan_command", required=True)
    validate = plan.add_parser("validate", help="review a plan offline")
    validate.add_argument("plan")
    validate.add_argument("--json", action="store_true")
    validate.add_argument("--cluster", metavar="FILE", help="machines of registered groups: {groups: {NAME: [...]}}")
    validate.set_defaults(func=cmd_plan_validate)
    plan.add_parser("schema", help="print the plan's JSON Schema").set_defaults(func=cmd_plan_schema)

    sim = sub.add_parser("sim", help="the simulated engine").add_subparsers(dest="sim_command", required=True)
    sim_run = sim.add_parser("run", help="run a plan on its simulated cluster in virtual time (what-if)")
    sim_run.add_argument("plan")
    sim_run.add_argument("--json", action="store_true", help="print the report JSON")
    sim_run.set_defaults(func=cmd_sim_run)

    catalog = sub.add_parser("catalog", help="list the stack catalog")
    catalog.add_argument("--json", action="store_true")
    catalog.add_argument("--engine", choices=("vllm", "sglang", "trtllm"))
    catalog.add_argument("--vendor", choices=("nvidia", "amd"))
    catalog.add_argument("--version", help="engine version, e.g. 0.28.0")
    catalog.set_defaults(func=cmd_catalog)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `kvbench report analyze FILE...` and `kvbench report schema` are the documented spellings;
    # `kvbench report RUN_ID` shows a run
    for i in range(len(argv) - 1):
        if argv[i] == "report" and argv[i + 1] in ("analyze", "schema"):
            argv[i : i + 2] = [f"report-{argv[i + 1]}"]
            break
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except (ApiError, StartupError) as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        code = 1
    except KeyboardInterrupt:
        code = 130
    raise SystemExit(code)
