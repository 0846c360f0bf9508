"""What the planner's API does, from the command line: runs (list, cancel), machines (nodes, cluster groups),
secrets and switches. Secret values are read from a file or standard input, never taken as arguments."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path
from typing import Any

import httpx
from rich.markup import escape
from rich.table import Table

from kvbench_cli.api import ApiError, Endpoints, resolve_endpoints
from kvbench_cli.commands.runs import add_endpoint_args
from kvbench_cli.console import console, err_console, print_refusal

__all__ = ["register"]


def _endpoints(args: argparse.Namespace) -> Endpoints:
    return resolve_endpoints(Path(args.state_dir), args.api, args.report_api)


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    """One API call; a refusal prints its problems and exits 2, any other failure is an ApiError."""
    endpoints = _endpoints(args)
    with httpx.Client(timeout=30.0) as client:
        response = client.request(method, f"{endpoints.api_url}{path}", json=body, headers=endpoints.headers())
    if response.status_code == 422:
        detail = response.json().get("detail")
        print_refusal({"errors": detail if isinstance(detail, list) else [{"code": "refused", "message": detail}]})
        raise SystemExit(2)
    if response.status_code == 401:
        raise ApiError("the planner wants its API token: set KVBENCH_API_TOKEN (kvbench up --listen printed where)")
    if response.status_code >= 400:
        detail = (
            response.json().get("detail")
            if response.headers.get("content-type", "").startswith("application/json")
            else response.text
        )
        raise ApiError(f"{method} {path}: HTTP {response.status_code}: {detail}", response.status_code)
    return response.json() if response.content else None


def _out(args: argparse.Namespace, data: Any, table: Table | None) -> int:
    if args.json or table is None:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        console.print(table)
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    runs = _call(args, "GET", "/v1/runs")
    table = Table(title="kvbench runs")
    for column in ("run", "plan", "status", "progress", "created"):
        table.add_column(column)
    for r in runs:
        status = r["status"]
        if status == "queued" and r.get("queue"):  # its place, and the machines (and runs) it waits for
            status = f"queued #{r['queue']['position']}: waiting for {', '.join(r['queue']['waiting_for'])}"
        table.add_row(r["run_id"], escape(r["plan_name"]), escape(status), f"{r['progress']:.0%}", r["created_at"][:19])
    return _out(args, runs, table)


def cmd_cancel(args: argparse.Namespace) -> int:
    state = _call(args, "POST", f"/v1/runs/{args.run_id}/cancel")
    console.print(f"run {args.run_id}: {state['status']}")
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    beats = _call(args, "GET", "/v1/nodes")
    table = Table(title=f"{len(beats)} machine(s) heartbeating")
    for column in ("node", "group", "GPUs", "RAM GB", "address", "simulated", "deployments"):
        table.add_column(column)
    for b in beats:
        i = b["inventory"]
        gpus = f"{i['gpus']} x {i.get('gpu_model') or '?'}" if i["gpus"] else "0"
        where = i.get("address") or i["hostname"]
        table.add_row(i["node_id"], i.get("group") or "-", gpus, f"{i['ram_gb']:.0f}", where,
                      "yes" if i["simulated"] else "", str(len(b.get("deployments", []))))  # fmt: skip
    return _out(args, beats, table)


def cmd_groups(args: argparse.Namespace) -> int:
    if args.groups_command == "create":
        created = _call(args, "POST", "/v1/cluster-groups", {"name": args.name, "nodes": args.nodes})
        console.print(f"group {created['name']}: {', '.join(created['nodes'])}")
        return 0
    if args.groups_command == "delete":
        _call(args, "DELETE", f"/v1/cluster-groups/{args.name}")
        console.print(f"deleted group {args.name}")
        return 0
    groups = _call(args, "GET", "/v1/cluster-groups")
    table = Table(title="cluster groups")
    for column in ("group", "declared by", "machines"):
        table.add_column(column)
    for g in groups:
        machines = ", ".join(f"{m['name']}{'' if m['up'] else ' (down)'}" for m in g["machines"])
        table.add_row(g["name"], g["declared_by"], machines)
    return _out(args, groups, table)


def _secret_value(source: str | None, what: str) -> str:
    """From a file, from standard input (`-`), or typed at a prompt that does not echo."""
    if source and source != "-":
        return Path(source).read_text(encoding="utf-8").strip()
    if source == "-" or not sys.stdin.isatty():
        return sys.stdin.read().strip()
    return getpass.getpass(f"{what}: ").strip()


def cmd_secrets(args: argparse.Namespace) -> int:
    if args.secrets_command == "set":
        value = _secret_value(args.from_file, f"value of secret {args.name}")
        if not value:
            err_console.print(
                "[red]error:[/red] the secret is empty; give it with --from-file FILE or on standard input"
            )
            return 2
        _call(args, "PUT", f"/v1/secrets/{args.name}", {"value": value})
        console.print(f"stored secret {args.name} (its value is never shown again)")
        return 0
    if args.secrets_command == "delete":
        _call(args, "DELETE", f"/v1/secrets/{args.name}")
        console.print(f"deleted secret {args.name}")
        return 0
    names = _call(args, "GET", "/v1/secrets")
    table = Table(title="secrets (names only)")
    table.add_column("name")
    for n in names:
        table.add_row(n["name"])
    return _out(args, names, table)


def cmd_switches(args: argparse.Namespace) -> int:
    if args.switches_command == "connect":
        login = _secret_value(args.credential_file, f"read-only login of {args.name}")
        body = {"name": args.name, "address": args.address, "protocol": args.protocol,
                "snmp_version": args.snmp_version, "credential": login}  # fmt: skip
        if args.port:
            body["port"] = args.port
        stored = _call(args, "POST", "/v1/switches", body)
        console.print(
            f"connected switch {stored['name']} at {stored['address']}:{stored['port']} ({stored['protocol']})"
        )
        return 0
    if args.switches_command == "disconnect":
        _call(args, "DELETE", f"/v1/switches/{args.name}")
        console.print(f"disconnected switch {args.name}")
        return 0
    switches = _call(args, "GET", "/v1/switches")
    table = Table(title="switches")
    for column in ("switch", "state", "address", "protocol"):
        table.add_column(column)
    for s in switches["connected"]:
        table.add_row(s["name"], "connected", f"{s['address']}:{s['port']}", s["protocol"])
    for s in switches["discovered"]:
        if not s.get("connected"):
            table.add_row(
                str(s.get("name") or s.get("chassis_id")), "[yellow]discovered, not connected[/yellow]", "-", "-"
            )
    return _out(args, switches, table)


def _common(parser: argparse.ArgumentParser, json_output: bool = True) -> argparse.ArgumentParser:
    add_endpoint_args(parser)
    if json_output:
        parser.add_argument("--json", action="store_true")
    return parser


def register(sub: Any) -> None:
    _common(sub.add_parser("runs", help="list runs")).set_defaults(func=cmd_runs)
    cancel = _common(sub.add_parser("cancel", help="cancel a run"), json_output=False)
    cancel.add_argument("run_id")
    cancel.set_defaults(func=cmd_cancel)
    _common(sub.add_parser("nodes", help="machines whose agent is heartbeating")).set_defaults(func=cmd_nodes)

    groups = sub.add_parser("groups", help="cluster groups").add_subparsers(dest="groups_command", required=True)
    _common(groups.add_parser("list", help="every group and its machines")).set_defaults(func=cmd_groups)
    create = _common(groups.add_parser("create", help="a group of registered machines"), json_output=False)
    create.add_argument("name")
    create.add_argument("nodes", nargs="+", metavar="NODE")
    create.set_defaults(func=cmd_groups)
    delete = _common(groups.add_parser("delete", help="a group created here"), json_output=False)
    delete.add_argument("name")
    delete.set_defaults(func=cmd_groups)

    secrets = sub.add_parser("secrets", help="stored secrets").add_subparsers(dest="secrets_command", required=True)
    _common(secrets.add_parser("list", help="names only")).set_defaults(func=cmd_secrets)
    put = _common(secrets.add_parser("set", help="store one (value from --from-file, stdin or a prompt)"), False)
    put.add_argument("name")
    put.add_argument("--from-file", metavar="FILE", help="read the value from FILE ('-': standard input)")
    put.set_defaults(func=cmd_secrets)
    forget = _common(secrets.add_parser("delete", help="delete one"), json_output=False)
    forget.add_argument("name")
    forget.set_defaults(func=cmd_secrets)

    switches = sub.add_parser("switches", help="switches").add_subparsers(dest="switches_command", required=True)
    _common(switches.add_parser("list", help="connected and discovered switches")).set_defaults(func=cmd_switches)
    connect = _common(switches.add_parser("connect", help="connect one with a read-only login"), False)
    connect.add_argument("name")
    connect.add_argument("address")
    connect.add_argument("--protocol", choices=("snmp", "gnmi"), default="snmp")
    connect.add_argument("--snmp-version", choices=("2c", "3"), default="3")
    connect.add_argument("--port", type=int, default=None)
    connect.add_argument("--credential-file", metavar="FILE", help="the login ('-': standard input; else a prompt)")
    connect.set_defaults(func=cmd_switches)
    disconnect = _common(switches.add_parser("disconnect", help="stop reading one"), json_output=False)
    disconnect.add_argument("name")
    disconnect.set_defaults(func=cmd_switches)
