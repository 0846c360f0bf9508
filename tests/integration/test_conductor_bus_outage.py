"""The conductor against a real NATS that stops answering: a run's state is kept through a short outage (the
write waits for the bus), a run the bus does not take is refused with nothing left behind, and an outage longer
than ``KVBENCH_PLANNER_BUS_OUTAGE_S`` fails the run as bus_unavailable, never as an internal error."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import nats.js.errors
import pytest
import yaml

from kvbench_contracts.plan import Plan
from kvbench_core.bus import Bus
from kvbench_core.embedded import EmbeddedNats
from kvbench_planner.conductor import BusUnavailableError, Conductor, RunFailedError
from kvbench_planner.registry import Registry
from kvbench_planner.settings import PlannerSettings
from kvbench_planner.state import RunState, expand_jobs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _plan() -> Plan:
    return Plan.model_validate(yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text()))


def _freeze(pid: int) -> None:
    """Stop the server and wait until every thread of it has stopped (a thread may run a moment after SIGSTOP)."""
    os.kill(pid, signal.SIGSTOP)
    while Path(f"/proc/{pid}/stat").read_text().split()[2] != "T":
        time.sleep(0.001)
    time.sleep(0.05)


async def _stopped_for(pid: int, seconds: float) -> None:
    _freeze(pid)
    await asyncio.sleep(seconds)
    os.kill(pid, signal.SIGCONT)


async def test_run_state_waits_out_a_short_outage_and_fails_by_name_after_a_long_one(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats").start()
    assert server.pid is not None
    try:
        async with Bus.connect(server.url, name="outage-test") as bus:
            settings = PlannerSettings(bus_outage_s=6)
            conductor = Conductor(bus, settings, Registry(bus))
            plan = _plan()
            state = RunState(
                run_id="R1", plan_name=plan.name, plan=plan.model_dump(mode="json"), jobs=expand_jobs(plan)
            )

            # a 3 s outage inside the 6 s allowance: the write waits and lands
            outage = asyncio.create_task(_stopped_for(server.pid, 3))
            await asyncio.sleep(0.2)
            state.status = "running"
            await conductor.save(state)
            await outage
            stored = await (await bus.kv("kvbench_runs")).get("R1")
            assert stored.value is not None
            assert RunState.model_validate_json(stored.value).status == "running"

            # longer than the allowance: the run fails with a reason a person can act on
            _freeze(server.pid)
            try:
                with pytest.raises(RunFailedError) as failed:
                    await conductor.save(state)
            finally:
                os.kill(server.pid, signal.SIGCONT)
            problem = failed.value.problem
            assert problem.code == "bus_unavailable", problem
            assert "KVBENCH_PLANNER_BUS_OUTAGE_S" in problem.fix
            assert "kvbench status" in problem.fix
    finally:
        if server.pid:
            os.kill(server.pid, signal.SIGCONT)
        server.stop()


async def test_a_run_the_bus_does_not_take_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats").start()
    assert server.pid is not None
    try:
        async with Bus.connect(server.url, name="submit-outage-test") as bus:
            settings = PlannerSettings()
            conductor = Conductor(bus, settings, Registry(bus))
            _freeze(server.pid)
            try:
                with pytest.raises(BusUnavailableError) as refused:
                    await conductor.submit(_plan())
            finally:
                os.kill(server.pid, signal.SIGCONT)
            assert refused.value.problem.code == "bus_unavailable"
            assert conductor.runs == {}  # the API lists no half-created run
            kv = await bus.kv("kvbench_runs")
            with pytest.raises(nats.js.errors.NoKeysError):
                await kv.keys()  # and a restarted planner resumes none
    finally:
        if server.pid:
            os.kill(server.pid, signal.SIGCONT)
        server.stop()


async def test_a_kv_mirror_waits_for_a_bus_slow_to_answer_at_start(tmp_path: Path) -> None:
    """A service's KV mirror at start-up (the reporter's, the planner's): a bus that gives no initial values for
    longer than one wait (a cluster still forming its replicas) is waited for, the watcher made again; it gives
    up only after give_up_s, naming the bucket."""
    from kvbench_core.kvmirror import KvMirror  # noqa: PLC0415

    server = EmbeddedNats(tmp_path / "nats").start()
    assert server.pid is not None
    try:
        async with Bus.connect(server.url, name="mirror-test") as bus:
            kv = await bus.kv("kvbench_switches")
            await kv.put("leaf1", b"{}")
            outage = asyncio.create_task(_stopped_for(server.pid, 3))
            await asyncio.sleep(0.2)
            mirror = await KvMirror(kv, "kvbench_switches", bus.js).start(timeout_s=1.0)
            await outage
            assert mirror.snapshot() == {"leaf1": b"{}"}
            await mirror.stop()
            _freeze(server.pid)
            try:
                with pytest.raises(TimeoutError, match="kvbench_switches"):
                    await KvMirror(kv, "kvbench_switches", bus.js).start(timeout_s=0.5, give_up_s=2.0)
            finally:
                os.kill(server.pid, signal.SIGCONT)
    finally:
        if server.pid:
            os.kill(server.pid, signal.SIGCONT)
        server.stop()
