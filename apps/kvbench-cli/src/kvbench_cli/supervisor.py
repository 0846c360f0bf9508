"""What `kvbench up` started, kept running: every service, NATS server and the embedded PostgreSQL that dies is
started again, with back-off, and said so in the log and in ``supervisor.json`` (which `kvbench status` shows).

Why not supervisord or circus: both want to start the programs themselves from a configuration of their own, while
`up` starts them in an order with health waits and records them in its state file; supervisord also gives up on a
program for good (FATAL) after a few quick failures, and PostgreSQL runs through ``pg_ctl`` (which forks it away).
This loop watches the pids `up` recorded, starts a dead program with `up`'s own code, and never gives up: a program
that keeps failing is tried again after 0.5, 1, 2 ... 30 s, and its log and ``status`` say why.

Run as ``python -m kvbench_cli.supervisor --state-dir DIR`` by `kvbench up`; it ends when `down` removes the state.
A program may be held (a file ``supervisor-hold/NAME`` in the state directory): it is not started again until the
hold is removed (the fault tests hold a NATS server down for a while, as a long outage would).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from kvbench_cli.deployment import (
    HOLD_DIR,
    DeploymentState,
    LocalDeployment,
    launch_nats,
    launch_service,
    postmaster_pid,
    start_postgres,
    state_lock,
)
from kvbench_core.logging import configure_logging
from kvbench_core.procs import pid_alive

__all__ = ["HOLD_DIR", "STATUS_FILE", "ProgramStatus", "Supervisor", "backoff_s", "read_status"]

log = logging.getLogger("kvbench.supervisor")

STATUS_FILE = "supervisor.json"
STABLE_AFTER_S = 30.0  # a program that ran this long before it died starts again at once (its back-off resets)
MAX_BACKOFF_S = 30.0

Kind = Literal["service", "nats", "postgresql"]


def backoff_s(failures: int) -> float:
    """How long to wait before starting a program again after its ``failures``-th death in a row (0 for the first
    death of a program that had run for a while)."""
    return 0.0 if failures <= 1 else min(MAX_BACKOFF_S, 0.5 * 2 ** (failures - 2))


@dataclass
class ProgramStatus:
    name: str
    kind: Kind
    pid: int | None
    running: bool = True
    restarts: int = 0
    last_exit: str | None = None  # "exit 1", "signal 9 (SIGKILL)", or why it could not be seen
    last_exit_at: float | None = None  # wall clock (time.time), for people
    next_start_in_s: float | None = None  # while it waits out its back-off
    last_error: str | None = None  # why the last start failed, if it did
    held: bool = False


@dataclass
class _Watch:
    status: ProgramStatus
    started_at: float = field(default_factory=time.monotonic)
    failures: int = 0
    due: float = 0.0  # monotonic time of the next start, once dead
    child: subprocess.Popen[bytes] | None = None  # set when this supervisor started it (its exit status is seen)


def read_status(state_dir: Path) -> dict[str, object] | None:
    """The supervisor's last written view (None: none written); its pid says whether it still runs."""
    try:
        data: dict[str, object] = json.loads((state_dir / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"signal {-returncode} ({signal.Signals(-returncode).name})"
        return f"signal {-returncode}"
    return f"exit {returncode}"


class Supervisor:
    def __init__(self, state_dir: Path, *, interval_s: float = 0.5, tie_to_parent: bool = False) -> None:
        self.deployment = LocalDeployment(state_dir)
        self.state_dir = state_dir
        self.interval_s = interval_s
        self.tie_to_parent = tie_to_parent
        self.watches: dict[str, _Watch] = {}

    def run(self, stop: threading.Event) -> None:
        log.info("supervising", extra={"state_dir": str(self.state_dir), "pid": os.getpid()})
        while not stop.wait(self.interval_s):
            state = self.deployment.load()
            if state is None:  # `down` removed the state: nothing left to keep
                log.info("the deployment is down: supervisor ends")
                return
            self.round(state)
        log.info("supervisor stopped")

    # -- one look at everything ------------------------------------------------------------------------------
    def round(self, state: DeploymentState) -> None:
        now = time.monotonic()
        for name, kind, pid in self._programs(state):
            watch = self.watches.get(name)
            if watch is None:
                watch = self.watches[name] = _Watch(ProgramStatus(name, kind, pid))
            elif watch.status.running and pid != watch.status.pid:  # started anew by someone else (`up`, a test)
                watch.status.pid, watch.child, watch.started_at = pid, None, now
            watch.status.held = (self.state_dir / HOLD_DIR / name).exists()
            if watch.status.running:
                if self._alive(watch):
                    if now - watch.started_at > STABLE_AFTER_S:
                        watch.failures = 0
                    continue
                self._died(watch, now)
            if watch.status.held:
                watch.status.next_start_in_s = None
                continue
            if now < watch.due:
                watch.status.next_start_in_s = round(watch.due - now, 1)
                continue
            self._start(state, watch)
        self._write()

    def _programs(self, state: DeploymentState) -> list[tuple[str, Kind, int | None]]:
        programs: list[tuple[str, Kind, int | None]] = []
        for index, record in enumerate(state.nats_servers):
            programs.append(
                (LocalDeployment.nats_name(state, index), "nats", int(record["pid"]) if record.get("pid") else None)
            )
        if state.pg_dir:
            programs.append(("postgresql", "postgresql", postmaster_pid(state.pg_dir)))
        # the simulated switch keeps its SNMP community in its environment only: it is not started again
        programs += [(s.name, "service", s.pid) for s in state.services if s.module and s.name != "sim-switch"]
        return programs

    def _alive(self, watch: _Watch) -> bool:
        if watch.child is not None:
            return watch.child.poll() is None
        return watch.status.pid is not None and pid_alive(watch.status.pid)

    def _died(self, watch: _Watch, now: float) -> None:
        status = watch.status
        status.running = False
        status.last_exit_at = time.time()
        if watch.child is not None and watch.child.returncode is not None:
            status.last_exit = _describe_exit(watch.child.returncode)
        else:  # started by `up` (another parent): its exit status was that parent's to read
            status.last_exit = "died (exit status not seen: started before the supervisor)"
        watch.failures = 1 if now - watch.started_at > STABLE_AFTER_S else watch.failures + 1
        wait = backoff_s(watch.failures)
        watch.due = now + wait
        log.warning(
            "a program died; starting it again" + (f" in {wait:g} s" if wait else ""),
            extra={
                "program": status.name,
                "pid": status.pid,
                "last_exit": status.last_exit,
                "failures_in_a_row": watch.failures,
                "restarts": status.restarts,
            },
        )

    def _start(self, state: DeploymentState, watch: _Watch) -> None:
        status = watch.status
        try:
            if status.kind == "nats":
                watch.child = launch_nats(state.nats_servers[_nats_index(state, status.name)])
            elif status.kind == "postgresql":
                watch.child = None
                start_postgres(state)
            else:
                record = next(s for s in state.services if s.name == status.name)
                watch.child = launch_service(state, record, self.tie_to_parent)
        except Exception as exc:  # any failure to start is waited out and tried again
            status.last_error = str(exc)[:500]
            watch.failures += 1
            wait = backoff_s(watch.failures)
            watch.due = time.monotonic() + wait
            log.error("a program could not be started; trying again", extra={"program": status.name,
                      "error": status.last_error, "retry_in_s": wait})  # fmt: skip
            return
        status.pid = watch.child.pid if watch.child is not None else postmaster_pid(str(state.pg_dir))
        status.running, status.restarts, status.next_start_in_s, status.last_error = (
            True,
            status.restarts + 1,
            None,
            None,
        )
        watch.started_at = time.monotonic()
        self._record_pid(status)
        log.warning("a program was started again",
                    extra={"program": status.name, "pid": status.pid, "restarts": status.restarts})  # fmt: skip

    def _record_pid(self, status: ProgramStatus) -> None:
        """The new pid into `up`'s state file, so that `down` and `status` find the program that runs now."""
        with state_lock(self.state_dir):
            state = self.deployment.load()
            if state is None:
                return
            if status.kind == "nats":
                index = _nats_index(state, status.name)
                state.nats_servers[index]["pid"] = status.pid
                if index == 0 and state.nats_pid:
                    state.nats_pid = status.pid
            elif status.kind == "service":
                for record in state.services:
                    if record.name == status.name and status.pid is not None:
                        record.pid = status.pid
            state.save(self.deployment.state_path, locked=True)

    def _write(self) -> None:
        view = {"pid": os.getpid(), "at": time.time(),
                "programs": [asdict(w.status) for w in self.watches.values()]}  # fmt: skip
        path = self.state_dir / STATUS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(view, indent=2))
        tmp.replace(path)


def _nats_index(state: DeploymentState, name: str) -> int:
    return next(i for i in range(len(state.nats_servers)) if LocalDeployment.nats_name(state, i) == name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvbench-supervisor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--interval-s", type=float, default=0.5)
    parser.add_argument("--tie-to-parent", action="store_true", help="what it starts dies with it (kvbench demo)")
    args = parser.parse_args(argv)
    configure_logging("supervisor", json_logs=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())  # a signal only sets the event
    Supervisor(args.state_dir, interval_s=args.interval_s, tie_to_parent=args.tie_to_parent).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
