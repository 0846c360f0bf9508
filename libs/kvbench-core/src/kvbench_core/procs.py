"""Child processes that never outlive their parent: PDEATHSIG on Linux, process groups for teardown."""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["die_with_parent", "free_port", "pid_alive", "spawn", "stop_pid", "wait_port"]

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child before exec: the kernel sends SIGTERM when the parent dies (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(
    argv: list[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    *,
    own_group: bool = True,
    tie_to_parent: bool = True,
) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    preexec: Callable[[], None] | None = die_with_parent if tie_to_parent else None
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=own_group,
            preexec_fn=preexec,  # noqa: PLW1509  (only prctl; no locks taken in the child)
        )


# ports chosen for a child process come from here up to the kernel's ephemeral range (below 10000 live the usual
# services': NATS 4222, PostgreSQL 5432, the planner 8700, Prometheus 9090)
CHOSEN_PORTS_FROM = 20000
# ports every machine of a simulated pool works out alike from the run (its shared store, the engines of a split
# stack: the first plus a few hundred at most) lie below those, so that free_port never hands one of them out
AGREED_PORTS_FROM = 10000
AGREED_PORTS_SPAN = 9000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# a port handed out is claimed here for a while, against every other process's free_port on this machine: a port
# is free when chosen but its process binds it a second or more later (a deployment starts a dozen in turn), and
# parallel tests' picks met in that window
_CLAIMS = Path(tempfile.gettempdir()) / "kvbench-ports"
CLAIM_S = 120.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a process about to be started on it.

    Chosen below the kernel's ephemeral range where it can be: a process that binds port 0 (every service's ops
    server) or opens a connection gets its port from that range, so it cannot take this one before the process
    it was chosen for binds it (a planner once found a load generator's ops server on its port, under parallel
    tests). A random pick, so that concurrent callers rarely meet; the kernel's pick where there is no room."""
    try:
        ephemeral_from = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_from = 0
    if ephemeral_from - CHOSEN_PORTS_FROM >= 1000:
        for _ in range(50):
            port = random.randrange(CHOSEN_PORTS_FROM, ephemeral_from)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
            if _claim(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _claim(port: int) -> bool:
    """Whether ``port`` is this caller's: no other free_port on this machine handed it out in the last CLAIM_S
    seconds. Where the claims cannot be kept (another user's folder), every port is."""
    path = _CLAIMS / str(port)
    for _ in range(2):
        try:
            _CLAIMS.mkdir(mode=0o1777, exist_ok=True)
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return True
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - path.stat().st_mtime < CLAIM_S:  # file times are wall-clock times
                    return False
                path.unlink()  # an old claim: its process bound the port long ago, or never will
        except OSError:
            return True
    return False


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
