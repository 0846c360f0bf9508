"""`kvbench run` (submit a plan, follow it) and `kvbench demo` (up, the demo plan, its report, down)."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from kvbench_cli.api import ApiError, Endpoints, fetch_report, resolve_endpoints
from kvbench_cli.console import (
    TERMINAL,
    console,
    err_console,
    interrupt_on_signals,
    print_acceptance,
    print_comparison,
    print_refusal,
)
from kvbench_cli.deployment import LocalDeployment

__all__ = ["register"]


def submit_and_wait(
    endpoints: Endpoints, plan_text: str, wait: bool, path: str = "/v1/runs", params: dict[str, str] | None = None
) -> tuple[str, dict[str, Any] | None]:
    with httpx.Client(timeout=30.0) as client:
        response = client.post(
            f"{endpoints.api_url}{path}",
            content=plan_text.encode(),
            params=params,
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
        status = _wait(client, endpoints, run_id)
        for reason in status.get("reasons", []):
            err_console.print(
                f"[red]{escape(str(reason.get('code')))}[/red]: "
                f"{escape(str(reason.get('message')))} {escape(str(reason.get('fix', '')))}"
            )
        return run_id, status


def _wait(client: httpx.Client, endpoints: Endpoints, run_id: str) -> dict[str, Any]:
    """Until the run ends: a progress bar in a terminal, a plain line every 10 s in a log or CI (never minutes of
    silence)."""
    if not console.is_terminal:
        return _wait_plainly(client, endpoints, run_id)
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
            status = client.get(f"{endpoints.api_url}/v1/runs/{run_id}", headers=endpoints.headers()).json()
            label = _progress_label(status)
            progress.update(task, completed=status["progress"], description=label)
            if status["status"] in TERMINAL:
                break
            time.sleep(1.0)
    return status


def _progress_label(status: dict[str, Any]) -> str:
    queue = status.get("queue")
    if status["status"] == "queued" and queue:  # another run holds its machines
        return f"queued · place {queue['position']} · waiting for {', '.join(queue['waiting_for'])}"
    running = [j for j in status["jobs"] if j["status"] == "running"]
    done = sum(1 for j in status["jobs"] if j["status"] in TERMINAL)
    if not running:
        return f"{status['status']} · {done} of {len(status['jobs'])} jobs done"
    job = running[0]
    return (
        f"{status['status']} · {job['workload']} (load {job['load_level']:g}, repeat {job['repeat'] + 1}) · "
        f"{job['requests']} requests · {done} of {len(status['jobs'])} jobs done"
    )


def _wait_plainly(client: httpx.Client, endpoints: Endpoints, run_id: str, every_s: float = 10.0) -> dict[str, Any]:
    started = time.monotonic()
    last_line = -every_s
    while True:
        status: dict[str, Any] = client.get(f"{endpoints.api_url}/v1/runs/{run_id}", headers=endpoints.headers()).json()
        elapsed = time.monotonic() - started
        finished = status["status"] in TERMINAL
        if finished or elapsed - last_line >= every_s:
            console.print(f"[{elapsed:5.0f} s] {status['progress']:4.0%} · {_progress_label(status)}", highlight=False)
            last_line = elapsed
        if finished:
            return status
        time.sleep(1.0)


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


def cmd_accept(args: argparse.Namespace) -> int:
    """The store-and-reload acceptance test of one workload of a plan: exit 0 when every step passed."""
    endpoints = resolve_endpoints(Path(args.state_dir), args.api, args.report_api)
    plan_text = Path(args.plan).read_text()
    params = {"workload": args.workload} if args.workload else None
    # with --json, standard output carries the JSON alone: the progress goes to standard error
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        run_id, status = submit_and_wait(endpoints, plan_text, wait=True, path="/v1/accept", params=params)
        report = fetch_report(endpoints, run_id)
    accepted = next((w["acceptance"] for w in report.get("workloads", []) if w.get("acceptance")), None)
    if args.json:
        print(json.dumps({"run_id": run_id, "status": (status or {}).get("status"), "acceptance": accepted}, indent=2))
    elif accepted is None:
        err_console.print("the run measured nothing to judge: see its reasons above")
    else:
        print_acceptance(accepted)
        console.print(f"report: {endpoints.report_url}/v1/runs/{run_id}/report.html")
    return 0 if accepted and accepted["passed"] else 1


def cmd_demo(args: argparse.Namespace) -> int:
    interrupt_on_signals()
    out = Path(args.output)
    deployment = LocalDeployment(Path(args.state_dir) / "demo")
    if deployment.load() is not None:  # a demo killed before it could clean up
        deployment.down(wipe=True)
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
        stopped = deployment.down(wipe=True)  # the demo's results are its files in --output
        console.print(f"stopped {len(stopped)} processes · demo took {time.monotonic() - started:.0f} s")


def register(sub: Any) -> None:
    run = sub.add_parser("run", help="submit a plan")
    run.add_argument("plan")
    run.add_argument("--wait", action="store_true", help="follow the run and print its summary")
    add_endpoint_args(run)
    run.set_defaults(func=cmd_run)
    accept = sub.add_parser(
        "accept",
        help="the store-and-reload acceptance test of a workload: records created in its external tier and reloaded",
    )
    accept.add_argument("plan")
    accept.add_argument("--workload", help="the workload to test (the plan's only one when left out)")
    accept.add_argument("--json", action="store_true", help="print the steps as JSON")
    add_endpoint_args(accept)
    accept.set_defaults(func=cmd_accept)
    demo = sub.add_parser("demo", help="up, run the demo plan, write the report, down")
    demo.add_argument("--output", default="demo-output")
    demo.set_defaults(func=cmd_demo)


def add_endpoint_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api", default=None, help="planner URL (default: from `up`, or KVBENCH_API_URL)")
    parser.add_argument("--report-api", default=None, help="reporter URL (default: from `up`, or KVBENCH_REPORT_URL)")
