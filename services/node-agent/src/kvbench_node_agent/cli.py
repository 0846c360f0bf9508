"""``kvbench-agent``: the node agent on a GPU machine.

Its settings come from flags, the environment (``KVBENCH_NODE_AGENT_*``, ``KVBENCH_NATS_*``) or one config file of
``NAME=value`` lines (the same names; the format of a systemd ``EnvironmentFile``), in that order of precedence.
Before it registers, it checks what a person can fix, and says how: the bus answers at that address and takes its
token, the state directory is writable, the names are valid. ``--detach`` leaves it running after you log out
(``deploy/systemd/kvbench-agent.service`` does the same under systemd). ``--check`` checks and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from kvbench_core.access import agent_user
from kvbench_core.bus import NatsAuth, nats_servers

__all__ = ["main"]

# flag -> environment variable (what the settings read)
FLAGS = {
    "nats": "KVBENCH_NATS_URL",
    "nats_token_file": "KVBENCH_NATS_TOKEN_FILE",
    "nats_creds": "KVBENCH_NATS_CREDS",
    "nats_user": "KVBENCH_NATS_USER",
    "nats_password_file": "KVBENCH_NATS_PASSWORD_FILE",
    "nats_ca_file": "KVBENCH_NATS_CA_FILE",
    "node_id": "KVBENCH_NODE_AGENT_NODE_ID",
    "group": "KVBENCH_NODE_AGENT_GROUP",
    "address": "KVBENCH_NODE_AGENT_ADDRESS",
    "state_dir": "KVBENCH_NODE_AGENT_STATE_DIR",
    "simulated": "KVBENCH_NODE_AGENT_SIMULATED",
    "sim_gpu": "KVBENCH_NODE_AGENT_SIM_GPU",
    "sim_gpus": "KVBENCH_NODE_AGENT_SIM_GPUS",
}


class AgentConfigError(Exception):
    """A setting that stops the agent from joining, with the flag or variable to change and how."""

    def __init__(self, setting: str, problem: str, fix: str) -> None:
        super().__init__(f"{setting}: {problem}\n  fix: {fix}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvbench-agent", description="Run kvbench's node agent on this machine")
    parser.add_argument(
        "--config", metavar="FILE", help="NAME=value lines (KVBENCH_... names), e.g. /etc/kvbench/agent.env"
    )
    parser.add_argument("--nats", metavar="URL", help="the control plane's bus, e.g. nats://10.0.0.1:4222")
    parser.add_argument("--nats-token-file", metavar="FILE", help="the bus token copied from the control machine")
    parser.add_argument("--nats-creds", metavar="FILE", help="or a NATS credentials file (nkey and JWT)")
    parser.add_argument(
        "--nats-user", metavar="NAME", help="this machine's own bus user (`kvbench agent-credentials NODE` makes it)"
    )
    parser.add_argument("--nats-password-file", metavar="FILE", help="that user's password, copied here (mode 600)")
    parser.add_argument("--nats-ca-file", metavar="FILE", help="a bus with TLS: its authority's certificate (ca.pem)")
    parser.add_argument("--node-id", help="this machine's stable id (default: its short host name)")
    parser.add_argument("--group", help="the cluster group it joins (lowercase letters, digits, dashes)")
    parser.add_argument("--address", help="the address other machines reach this one at (default: its host name)")
    parser.add_argument("--state-dir", help="engine logs and runtime files (default: /var/lib/kvbench/agent as root)")
    parser.add_argument("--simulated", action="store_const", const="true", help="run simulated engines (a test lab)")
    parser.add_argument("--sim-gpu", help="with --simulated: the GPU model it declares and simulates (default L40S)")
    parser.add_argument("--sim-gpus", type=int, help="with --simulated: how many GPUs it declares")
    parser.add_argument("--check", action="store_true", help="check the settings and the bus, then exit")
    parser.add_argument(
        "--fetch-lmcache-examples",
        nargs="?",
        const="/opt/lmcache/examples",
        metavar="DIR",
        help="download LMCache's examples (its P/D proxies, which no LMCache image or wheel holds) at the release the "
        "LMCache stacks run, into DIR (default /opt/lmcache/examples), then exit",
    )
    parser.add_argument("--detach", action="store_true", help="keep running in the background after you log out")
    parser.add_argument(
        "--log", metavar="FILE", help="with --detach: where its log goes (default: STATE_DIR/agent.log)"
    )
    return parser


def read_config(path: Path) -> dict[str, str]:
    """``NAME=value`` lines; blank lines and ``#`` comments are skipped; values may be quoted."""
    values: dict[str, str] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise AgentConfigError("--config", f"cannot read {path} ({exc.strerror})", "give an existing file") from None
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        name, sep, value = text.partition("=")
        if not sep or not name.strip().startswith("KVBENCH_"):
            raise AgentConfigError(
                "--config", f"{path} line {number} is not KVBENCH_NAME=value", "write one setting per line"
            )
        values[name.strip()] = value.strip().strip("'\"")
    return values


def resolve_environment(args: argparse.Namespace, environ: dict[str, str]) -> dict[str, str]:
    """Flags over the environment over the config file; the node id defaults to the host name."""
    env = {**(read_config(Path(args.config)) if args.config else {}), **environ}
    for flag, name in FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            env[name] = str(value)
    env.setdefault("KVBENCH_NODE_AGENT_NODE_ID", socket.gethostname().split(".")[0])
    if os.geteuid() == 0:
        env.setdefault("KVBENCH_NODE_AGENT_STATE_DIR", "/var/lib/kvbench/agent")
    return env


def check_state_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise AgentConfigError(
            "--state-dir (KVBENCH_NODE_AGENT_STATE_DIR)",
            f"{path} is not a writable directory ({exc.strerror})",
            "give a directory the agent's user can write, e.g. /var/lib/kvbench/agent",
        ) from None


def check_identity(node_id: str, user: str | None) -> None:
    """A machine's bus user is its identity: an agent started as another node id would loop on permission errors."""
    if user is not None and user.startswith("agent-") and user != agent_user(node_id):
        raise AgentConfigError(
            "--node-id (KVBENCH_NODE_AGENT_NODE_ID)",
            f"{node_id} is not the machine the bus user {user} was made for ({user.removeprefix('agent-')})",
            f"pass --node-id {user.removeprefix('agent-')}, or make this machine's own user on the control machine: "
            f"kvbench agent-credentials {node_id}",
        )


def check_bus(url: str, auth: NatsAuth, timeout_s: float = 5.0) -> None:
    """The bus answers at ``url`` (the first of a cluster's URLs) and takes this machine's credentials."""
    parts = urlsplit(nats_servers(url)[0])
    host, port = parts.hostname or "127.0.0.1", parts.port or 4222
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise AgentConfigError(
            "--nats (KVBENCH_NATS_URL)",
            f"nothing answers at {host}:{port} ({exc.strerror or exc})",
            f"start the control plane with `kvbench up --listen ADDR` on a machine this one reaches, open TCP {port} "
            "there, and pass --nats nats://ADDR:4222",
        ) from None
    asyncio.run(_try_connect(url, auth, timeout_s))


async def _try_connect(url: str, auth: NatsAuth, timeout_s: float) -> None:
    import nats  # noqa: PLC0415 (only when checking)

    try:
        options = auth.connect_options()
        client = await nats.connect(servers=nats_servers(url), connect_timeout=timeout_s, allow_reconnect=False,
                                    max_reconnect_attempts=0, **options)  # fmt: skip
    except Exception as exc:  # nats-py raises its own errors and plain ones alike
        if "authorization" not in str(exc).lower():
            raise AgentConfigError(
                "--nats (KVBENCH_NATS_URL)",
                f"cannot join the bus at {url}: {exc}",
                "check the address, and that the control plane is up (`kvbench status` there)",
            ) from None
        # name the credential this machine gave (a user of its own, or a shared token), and how to get the right one
        by_user = bool(auth.user) or not auth.token
        raise AgentConfigError(
            "--nats-user and --nats-password-file (KVBENCH_NATS_USER, KVBENCH_NATS_PASSWORD_FILE)"
            if by_user
            else "--nats-token-file (KVBENCH_NATS_TOKEN_FILE)",
            f"the bus at {url} refused this machine: {exc}",
            "run `kvbench agent-credentials NODE` on the control machine, copy the password file it names here "
            "(mode 600) and pass --nats-user agent-NODE --nats-password-file FILE"
            if by_user
            else "copy the bus token from the machine that runs it here (mode 600) and pass --nats-token-file",
        ) from None
    await client.close()


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.fetch_lmcache_examples:  # a set-up step: no bus, no settings
        from kvbench_node_agent.lmcache_examples import fetch  # noqa: PLC0415

        try:
            done = fetch(Path(args.fetch_lmcache_examples))
        except (OSError, ValueError, tarfile.TarError) as exc:
            sys.stderr.write(f"kvbench-agent: could not fetch LMCache's examples: {exc}\n")
            raise SystemExit(1) from None
        sys.stdout.write(f"kvbench-agent: {done}\n")
        raise SystemExit(0)
    try:
        env = resolve_environment(args, dict(os.environ))
    except AgentConfigError as exc:
        _refuse(exc)
    os.environ.clear()
    os.environ.update(env)

    from kvbench_core.settings import load_settings  # noqa: PLC0415 (after the environment is resolved)
    from kvbench_node_agent.settings import NodeAgentSettings  # noqa: PLC0415

    settings = load_settings(NodeAgentSettings)  # names each bad variable and exits 2
    try:
        check_state_dir(Path(settings.state_dir))
        check_identity(settings.node_id, settings.nats_user)
        check_bus(settings.nats_url, settings.nats_auth())
    except AgentConfigError as exc:
        _refuse(exc)
    where = f"group {settings.group}" if settings.group else "no group"
    if args.check:
        sys.stdout.write(f"kvbench-agent: {settings.node_id} ({where}) can join the bus at {settings.nats_url}\n")
        raise SystemExit(0)
    if args.detach:
        _detach(argv if argv is not None else sys.argv[1:], Path(args.log or Path(settings.state_dir) / "agent.log"))
        return
    from kvbench_node_agent.agent import main as run_agent  # noqa: PLC0415

    sys.stderr.write(f"kvbench-agent: {settings.node_id} ({where}) joining the bus at {settings.nats_url}\n")
    run_agent()


def _detach(argv: list[str], log: Path) -> None:
    """Start the agent again in a session of its own (it outlives the terminal), logging to ``log``."""
    rest = [a for a in argv if a != "--detach"]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "kvbench_node_agent.cli", *rest],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    pid_file = log.with_name("agent.pid")
    pid_file.write_text(f"{child.pid}\n")
    sys.stdout.write(f"kvbench-agent: running as pid {child.pid} (log {log}, pid file {pid_file})\n")


def _refuse(exc: AgentConfigError) -> None:
    sys.stderr.write(f"kvbench-agent: {exc}\n")
    raise SystemExit(2)


if __name__ == "__main__":
    main()
