"""`kvbench up`, `down` and `status`: the local deployment of every service and a simulated cluster."""

from __future__ import annotations

import argparse
import json
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from rich.markup import escape
from rich.table import Table

from kvbench_cli.bususers import BusUsers, agent_user
from kvbench_cli.console import (
    console,
)
from kvbench_cli.deployment import LocalDeployment, nats_server_view, postmaster_pid, reload_bus_users
from kvbench_cli.statedir import record_state_dir
from kvbench_cli.supervisor import read_status
from kvbench_core.procs import pid_alive

__all__ = ["register"]


def cmd_up(args: argparse.Namespace) -> int:
    deployment = LocalDeployment(Path(args.state_dir))
    with console.status("starting NATS, PostgreSQL, the services and a simulated cluster"):
        state = deployment.up(
            sim_machines=args.sim_machines,
            nats_url=args.nats_url,
            database_url=args.database_url,
            loadgens=max(1, args.loadgens),
            sim_speed=args.sim_speed,
            listen=args.listen,
            nats_cluster=args.nats_cluster,
            nats_tls=args.nats_tls,
        )
    speed = f", engines at {args.sim_speed:g}x real time unless a plan says" if args.sim_speed else ""
    console.print(f"kvbench is up ({args.sim_machines} simulated machines{speed})")
    console.print(f"  API      {state.api_url}   (OpenAPI: {state.api_url}/openapi.json)")
    console.print(f"  reports  {state.report_url}/v1/runs/<run_id>/report.html")
    console.print(
        f"  bus      {state.nats_url}" + ("   (a user of its own per service and agent)" if state.nats_users else "")
    )
    if len(state.nats_servers) > 1:
        console.print(f"           a cluster of {len(state.nats_servers)} NATS servers, every stream and bucket "
                      f"replicated {state.base_env.get('KVBENCH_NATS_REPLICAS', '1')} times")  # fmt: skip
    console.print(f"  logs     {args.state_dir}/logs/   stop with: kvbench down")
    record_state_dir(args.state_dir)  # later commands find it from any folder
    for note in state.notes:
        console.print(f"  [yellow]note[/yellow] {note}")
    if args.listen:
        print_agent_line(state)
    return 0


def print_agent_line(state: Any) -> None:
    """What to run on each GPU machine so its agent joins this control plane (docs/cluster.md)."""
    console.print("\nFor each GPU machine (docs/cluster.md): make its agent's own bus user here,")
    console.print("  kvbench agent-credentials GPU-HOST")
    console.print("copy the password file it names to the machine (readable by root only), and start its agent there:")
    console.print(
        f"  kvbench-agent --nats {state.nats_url} --nats-user agent-GPU-HOST --nats-password-file "
        "/etc/kvbench/nats-password --group lab --node-id GPU-HOST --detach"
    )
    console.print(f"API token for the CLI elsewhere: KVBENCH_API_TOKEN from {state.api_token_file}")


NODE_ID = re.compile(r"^[A-Za-z0-9_-]{1,63}$")


def cmd_agent_credentials(args: argparse.Namespace) -> int:
    """A GPU machine's agent gets a bus user of its own: it reads only its own commands and publishes only its own
    facts. The running NATS servers take the new user at once (their configuration reloaded)."""
    state = LocalDeployment(Path(args.state_dir)).load()
    if state is None or not state.nats_users:
        console.print("[red]error:[/red] kvbench is not up with its own bus (kvbench up); an external NATS has its "
                      "own users")  # fmt: skip
        return 1
    if not NODE_ID.match(args.node_id):
        console.print(f"[red]error:[/red] node id {args.node_id!r}: use letters, digits, dashes and underscores "
                      "(the agent's --node-id, e.g. its short host name)")  # fmt: skip
        return 2
    users = BusUsers(Path(args.state_dir))
    user = agent_user(args.node_id)
    password = users.ensure(user, "node_agent", node_id=args.node_id)
    reload_bus_users(state, users.block())
    console.print(f"bus user {user} for the agent of {args.node_id}; its password is in {password}")
    console.print(f"  scp {password} root@{args.node_id}:/etc/kvbench/nats-password   # then chmod 600 it")
    ca = ""
    if state.nats_ca_file:
        console.print(
            f"  scp {state.nats_ca_file} root@{args.node_id}:/etc/kvbench/nats-ca.pem   # the bus's authority"
        )
        ca = " --nats-ca-file /etc/kvbench/nats-ca.pem"
    console.print(
        f"  kvbench-agent --nats {state.nats_url} --nats-user {user} --nats-password-file /etc/kvbench/nats-password"
        f"{ca} --node-id {args.node_id} --group lab --detach"
    )
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    stopped = LocalDeployment(Path(args.state_dir)).down(wipe=args.wipe)
    # what a `kvbench demo` killed before it could clean up left behind (it keeps its state in STATE_DIR/demo)
    demo = LocalDeployment(Path(args.state_dir) / "demo")
    if demo.load() is not None:
        stopped += [f"{name} (a killed demo's)" for name in demo.down(wipe=True)]
    console.print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    if args.wipe:
        console.print("deleted the results of every earlier run (database and bus)")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state = LocalDeployment(Path(args.state_dir)).load()
    if state is None:
        if args.json:
            print(json.dumps({"up": False, "state_dir": args.state_dir}))
        else:
            console.print(f"kvbench is not up (no state in {args.state_dir})")
        return 1
    servers = [nats_server_view(record) for record in state.nats_servers]
    if not servers:  # a NATS kvbench did not start (--nats-url)
        servers = [{"name": "nats", "pid": None, "url": state.nats_url, "running": True,
                    "role": "external" if _answers(state.nats_url.split(",")[0]) else "down"}]  # fmt: skip
    services: list[dict[str, Any]] = []
    with httpx.Client(timeout=2.0) as client:
        for record in state.services:
            alive = pid_alive(record.pid)
            health = "–"
            if record.health_url:
                try:
                    health = "ok" if client.get(record.health_url).status_code == 200 else "failing"
                except httpx.HTTPError:
                    health = "unreachable"
            services.append({"name": record.name, "pid": record.pid, "running": alive, "health": health})
        nodes, running = _planner_view(client, state)
    database = _postgres_view(state.database_url, state.pg_dir)
    services.insert(0, database)
    supervisor = _supervisor_view(state)
    for program in (*services, *servers):  # what the supervisor saw: restarts and the last exit
        program.update(supervisor["programs"].get(program["name"], {"restarts": 0, "last_exit": None}))
    # a cluster is healthy while a majority of its servers run (one down of three: the run goes on, say so)
    serving = sum(1 for s in servers if s["role"] not in ("down", "electing"))
    healthy = (serving > len(servers) // 2 and supervisor["running"]
               and all(s["running"] and s["health"] in ("ok", "–") for s in services))  # fmt: skip
    if args.json:
        view = {"up": True, "healthy": healthy, "supervisor": {"pid": supervisor["pid"],
                "running": supervisor["running"]}, "nats": servers, "services": services,
                "nodes": None if nodes is None else len(nodes), "api_url": state.api_url,
                "report_url": state.report_url, "runs_in_progress": running}  # fmt: skip
        print(json.dumps(view, indent=2, default=str))
        return 0 if healthy else 1
    table = Table(title="kvbench status")
    for column in ("service", "pid", "process", "health", "restarts", "last exit"):
        table.add_column(column)
    for program in (*servers, *services):
        table.add_row(program["name"], str(program["pid"] or "external"),
                      "running" if program["running"] else "[red]stopped[/red]",
                      program.get("role") or program["health"], str(program["restarts"]),
                      escape(program["last_exit"] or "–"))  # fmt: skip
    console.print(table)
    if not supervisor["running"]:
        console.print("[red]the supervisor is not running[/red]: nothing that dies is started again (its log: "
                      f"{state.state_dir}/logs/supervisor.log); `kvbench down`, `kvbench up` start one")  # fmt: skip
    console.print(f"nodes registered: {'?' if nodes is None else len(nodes)}; API {state.api_url}; "
                  f"reports {state.report_url}")  # fmt: skip
    for run in running:
        console.print(f"run in progress: {run['run_id']} ({escape(run['plan_name'])}), {run['progress']:.0%} done")
    return 0 if healthy else 1


def _supervisor_view(state: Any) -> dict[str, Any]:
    """The supervisor: whether it runs, and what it last wrote of each program (restarts, last exit, back-off)."""
    pid = state.supervisor_pid
    written = read_status(Path(state.state_dir)) or {}
    listed = written.get("programs")
    programs: list[Any] = listed if isinstance(listed, list) else []
    by_name = {str(p["name"]): {"restarts": p.get("restarts", 0), "last_exit": p.get("last_exit"),
                                "next_start_in_s": p.get("next_start_in_s"), "held": p.get("held", False)}
               for p in programs if isinstance(p, dict)}  # fmt: skip
    return {"pid": pid, "running": bool(pid) and pid_alive(int(pid)), "programs": by_name}


def _postgres_view(database_url: str, pg_dir: str | None) -> dict[str, Any]:
    """PostgreSQL as `status` shows it: the embedded server's pid (its postmaster.pid) and whether it takes
    connections at the database URL's address (an external one: only the latter)."""
    pid = postmaster_pid(pg_dir) if pg_dir else None
    parts = urlsplit(database_url)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5432), timeout=2).close()
        health = "ok"
    except OSError:
        health = "unreachable"
    running = pid_alive(pid) if pid else (pg_dir is None and health == "ok")
    return {"name": "postgresql", "pid": pid if pg_dir else "external", "running": running, "health": health}


def _answers(url: str) -> bool:
    """Whether something accepts connections at a nats:// URL's host and port."""
    parts = urlsplit(url)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 4222), timeout=2).close()
    except OSError:
        return False
    return True


def _planner_view(client: httpx.Client, state: Any) -> tuple[list[Any] | None, list[dict[str, Any]]]:
    """The machines heartbeating and the runs in progress, as the planner sees them (None: it does not answer)."""
    try:
        nodes = client.get(f"{state.api_url}/v1/nodes", headers=state.api_headers()).json()
        runs = client.get(f"{state.api_url}/v1/runs", headers=state.api_headers()).json()
    except (httpx.HTTPError, ValueError):
        return None, []
    return nodes, [r for r in runs if r["status"] in ("pending", "queued", "running")]


def speed(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give e.g. 20") from None
    if not 0 < value <= 1000:
        raise argparse.ArgumentTypeError(f"{value:g} is out of range; give a speed above 0 and at most 1000")
    return value


def register(sub: Any) -> None:
    up = sub.add_parser("up", help="start embedded servers, every service and a simulated cluster")
    up.add_argument("--sim-machines", type=int, default=2)
    up.add_argument("--loadgens", type=int, default=1, help="load generator processes; each job is split among them")
    up.add_argument(
        "--sim-speed",
        type=speed,
        default=None,
        help="run simulated engines this many times faster than real time when a plan's cluster.sim sets no speed "
        "(reports stay in engine seconds)",
    )
    up.add_argument("--nats-url", default=None, help="use this NATS instead of starting one")
    up.add_argument(
        "--nats-tls",
        action="store_true",
        help="TLS on the bus: certificates made here (.kvbench/secrets/tls; agents get ca.pem, --nats-ca-file)",
    )
    up.add_argument(
        "--nats-cluster",
        type=int,
        default=1,
        metavar="N",
        help="start N NATS servers clustered with routes, every stream and bucket replicated 3 times (3: any one "
        "server may die mid-run with nothing lost); default 1",
    )
    up.add_argument("--database-url", default=None, help="use this PostgreSQL instead of starting one")
    up.add_argument(
        "--listen",
        metavar="ADDR",
        default=None,
        help="serve NATS (4222), the planner (8700) and the reporter (8701) on ADDR, where GPU machines' agents "
        "reach them, with bus users per agent (kvbench agent-credentials) and an API token (default: loopback only)",
    )
    up.set_defaults(func=cmd_up)
    down = sub.add_parser("down", help="stop exactly what `up` started (earlier runs' results stay)")
    down.add_argument("--wipe", action="store_true", help="also delete every earlier run's results (database, bus)")
    down.set_defaults(func=cmd_down)
    credentials = sub.add_parser(
        "agent-credentials", help="make a GPU machine's agent its own bus user (prints what to copy and run there)"
    )
    credentials.add_argument("node_id", metavar="NODE", help="the machine's --node-id (e.g. its short host name)")
    credentials.set_defaults(func=cmd_agent_credentials)
    status = sub.add_parser("status", help="what `up` started, and whether it is healthy")
    status.add_argument(
        "--json", action="store_true", help="print it as JSON (every NATS server with its pid and role)"
    )
    status.set_defaults(func=cmd_status)
