"""Child processes that never outlive their parent: PDEATHSIG on Linux, process groups for teardown."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["die_with_parent", "spawn"]

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
