"""Whatever `kvbench up` started and dies comes back by itself: every service, the NATS server and PostgreSQL,
killed at once (SIGKILL, as a crash), are started again by the supervisor, `kvbench status` says so (restarts, the
last exit) and is unhealthy (exit 1) while something is down, and a run afterwards loses nothing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kvbench_cli.deployment import LocalDeployment
from kvbench_core.procs import pid_alive

from .runs import record_counts, run_to_end

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.faults]


def _status(state_dir: Path) -> tuple[int, dict[str, Any]]:
    cli = [sys.executable, "-c", "import sys; from kvbench_cli.entry import main; sys.exit(main())"]
    done = subprocess.run([*cli, "--state-dir", str(state_dir), "status", "--json"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    return done.returncode, json.loads(done.stdout)


def test_every_program_killed_under_kvbench_up_comes_back_by_itself(tmp_path: Path, short_plan: Any) -> None:
    deployment = LocalDeployment(tmp_path / "state")
    state = deployment.up(sim_machines=2, tie_to_parent=True)
    try:
        code, before = _status(deployment.state_dir)
        assert code == 0
        assert before["supervisor"]["running"]
        killed = {s.name: s.pid for s in state.services if s.name != "sim-switch"}
        killed["nats"] = int(state.nats_servers[0]["pid"])
        killed["postgresql"] = int((Path(str(state.pg_dir)) / "data" / "postmaster.pid").read_text().split()[0])
        # the reporter held down until status has been asked (else, on a busy machine, the supervisor may have
        # started everything again before `status` itself has started)
        deployment.hold("reporter")
        for pid in killed.values():
            os.kill(pid, signal.SIGKILL)
        code, during = _status(deployment.state_dir)
        assert code == 1  # something is down: unhealthy, said with a non-zero exit
        assert not next(s for s in during["services"] if s["name"] == "reporter")["running"]
        deployment.hold("reporter", held=False)
        deadline = time.monotonic() + 120
        while True:
            code, after = _status(deployment.state_dir)
            programs = {p["name"]: p for p in [*after["services"], *after["nats"]]}
            back = all(programs[name]["running"] and programs[name]["restarts"] >= 1 for name in killed)
            if code == 0 and back:
                break
            assert time.monotonic() < deadline, f"not all came back: {json.dumps(after, indent=1)[:3000]}"
            time.sleep(1.0)
        for name, pid in killed.items():
            assert programs[name]["pid"] != pid
            assert programs[name]["last_exit"], name
        # what came back works: a run end to end, every record stored
        plan = short_plan(
            "after-supervised-restarts", duration_s=8, users=2, gpu_only=True, measurement={"warmup_s": 1}
        )
        status = run_to_end(state.api_url, plan)
        assert status["status"] == "succeeded", status
        rows = asyncio.run(record_counts(state.database_url, status["run_id"]))
        assert rows
        assert all(r["stored"] == r["records_expected"] > 0 for r in rows)
    finally:
        supervisor = deployment.load().supervisor_pid  # type: ignore[union-attr]
        deployment.down(wipe=True)
    # down stops the supervisor first, then what it started: nothing is left
    assert not any(pid_alive(int(pid)) for pid in [supervisor, *(programs[name]["pid"] for name in killed)] if pid)
