"""The run conductor: commands out, events in, state in a KV bucket.

For each workload: start its stack on every machine and wait until every engine is healthy; for each
job apply the cache state (empty = a fresh stack), ask a load generator to run it and wait for its end;
then tear the stack down. Finished jobs are recorded in the run state, so a restarted planner resumes
without repeating them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from datetime import timedelta
from typing import Any, Literal

import nats.js.errors

from kvbench_contracts.commands import PoolMachine, ReadEngines, RestartEngines, RunLoad, StartStack, StopStack
from kvbench_contracts.envelope import Envelope, new_id, utc_now
from kvbench_contracts.events import (
    EngineEndpoint,
    EnginesRead,
    EnginesRestarted,
    JobFailed,
    JobFinished,
    JobProgressed,
    JobWindowEdge,
    RunCancelled,
    RunFinished,
    RunStarted,
    RunSubmitted,
    StackFailed,
    StackReady,
    StackStopped,
    WindowEdge,
)
from kvbench_contracts.node import Heartbeat, LoadgenHeartbeat, shard_key
from kvbench_contracts.plan import JobPoint, Plan, SimCluster, Workload
from kvbench_contracts.problem import KvbenchError, Problem
from kvbench_core.bus import TRANSIENT_BUS_ERRORS, Bus
from kvbench_core.naming import natural_key
from kvbench_core.sealing import SealingError, seal_for
from kvbench_planner.cluster import Machine
from kvbench_planner.leases import MachineLeases, QueuePlace
from kvbench_planner.registry import Registry
from kvbench_planner.settings import PlannerSettings
from kvbench_planner.state import ACTIVE, JobState, RunState, expand_jobs
from kvbench_stacks.catalog import get_stack

__all__ = ["CONTROL_EVENTS", "BusUnavailableError", "Conductor", "RunFailedError", "sim_cluster"]

log = logging.getLogger(__name__)

CONTROL_EVENTS: tuple[type[Envelope], ...] = (
    JobWindowEdge,
    EnginesRead,
    EnginesRestarted,
    StackReady,
    StackFailed,
    StackStopped,
    JobFinished,
    JobFailed,
    JobProgressed,
)

EDGE_READ_WAIT_S = 10.0  # how long the job's edge reads are awaited before the load goes on without one
SUBMIT_BUS_WAIT_S = 10.0  # how long a submission waits for a bus that does not acknowledge before it is refused
LOADGEN_END_GRACE_S = 5.0  # a shard gone from its load generator's heartbeat: how long its end may still take
HEARTBEAT_GRACE_S = 10.0  # after the bus comes back: about three of an agent's heartbeats (KV TTL 15 s)

NODE_RESTARTED = Problem(
    code="node_restarted",
    message="A node's agent restarted during the run, and the engines it had started stopped with it",
    fix="Keep the agent running for the whole run (its engines stop with it), and then run the workload again.",
)

NODE_UNRESPONSIVE = Problem(
    code="node_unresponsive",
    message="A node stopped responding",
    fix="Check that the agent is running on that machine, and then run the workload again.",
)


def sim_cluster(workload: Workload, default_speed: float | None) -> SimCluster | None:
    """The workload's simulated cluster as the agents get it: the plan's, with ``default_speed`` (the planner's
    setting) where the plan sets no speed; None for a real cluster."""
    sim = workload.cluster.sim
    if sim is None:
        return None
    return sim if sim.speed is not None else sim.model_copy(update={"speed": default_speed or 1.0})


async def _shards_of(kv: Any, loadgen_id: str) -> list[str] | None:
    """The shards a load generator's heartbeat lists; None when its key is not there (expired, or removed as the
    load generator stopped)."""
    try:
        entry = await kv.get(loadgen_id)
    except nats.js.errors.KeyNotFoundError:
        return None
    return LoadgenHeartbeat.model_validate_json(entry.value).shards if entry.value else None


async def _learn_owners(
    bus: Bus, kv: Any, job_id: str, ends: list[asyncio.Future[Envelope]], owner: dict[int, str]
) -> None:
    """Which load generator took each shard not yet placed, from a listing of the heartbeats."""
    for name in await bus.kv_keys("kvbench_loadgens"):
        shards = await _shards_of(kv, name) or []
        for index in range(len(ends)):
            if index not in owner and shard_key(job_id, index) in shards:
                owner[index] = name
                log.info("job shard taken", extra={"job_id": job_id, "shard_index": index, "loadgen_id": name})


class RunFailedError(KvbenchError):
    """The run cannot go on; its problem says why and what to do."""

    def __init__(self, code: str, message: str, fix: str = "") -> None:
        super().__init__(Problem(code=code, message=message, fix=fix))

    @classmethod
    def node_unresponsive(cls, which: str) -> RunFailedError:
        return cls(NODE_UNRESPONSIVE.code, f"{NODE_UNRESPONSIVE.message} ({which})", NODE_UNRESPONSIVE.fix)

    @classmethod
    def node_restarted(cls, which: str) -> RunFailedError:
        return cls(NODE_RESTARTED.code, f"{NODE_RESTARTED.message} ({which})", NODE_RESTARTED.fix)


class BusUnavailableError(KvbenchError):
    """The bus did not take a new run: nothing was created (the API answers 503 with the problem)."""


def _bus_unavailable(waited_s: float, exc: BaseException) -> RunFailedError:
    return RunFailedError(
        "bus_unavailable",
        f"The bus (NATS JetStream) acknowledged nothing for {waited_s:.0f} s ({type(exc).__name__}: "
        f"{str(exc)[:120]}); the run's state could not be kept, so it stopped",
        "Start the NATS servers that are down (kvbench status lists them; a cluster of three needs two), then run "
        "the plan again; KVBENCH_PLANNER_BUS_OUTAGE_S sets how long a run waits for the bus.",
    )


def _cancelled(state: RunState) -> Problem:
    """When, by what and how far: what a person reading a cancelled run's report needs to know."""
    done = sum(1 for j in state.jobs if j.status == "succeeded")
    running = [j for j in state.jobs if j.status == "running"]
    at = f" during {running[0].workload} (repeat {running[0].repeat + 1})" if running else ""
    return Problem(
        code="cancelled",
        message=f"Cancelled at {utc_now():%Y-%m-%d %H:%M:%S} UTC through the planner's API (POST "
        f"/v1/runs/{state.run_id}/cancel, as kvbench cancel does){at}, {state.progress:.0%} through the run: "
        f"{done} of {len(state.jobs)} jobs had finished",
        fix="The finished jobs' figures stand; run the plan again to measure the rest.",
    )


def _job_progress(event: JobProgressed) -> float:
    """By what bounds the job: its requests for a shape that knows how many it sends, else its duration; never
    100% before the job ends (the last requests drain after the load's end)."""
    if event.requests_expected:
        done = event.requests_done / event.requests_expected
        if event.duration_s > 0:
            done = min(done, event.elapsed_s / event.duration_s)
    elif event.duration_s > 0:
        done = event.elapsed_s / event.duration_s
    else:
        done = 0.0  # neither a length nor a count: unknown until it ends
    return max(0.0, min(0.99, done))


class Conductor:
    def __init__(self, bus: Bus, settings: PlannerSettings, registry: Registry) -> None:
        self.bus = bus
        self.settings = settings
        self.registry = registry
        self.runs: dict[str, RunState] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._waiters: dict[str, asyncio.Future[Envelope]] = {}
        # facts that arrived before anyone waited for them (e.g. redelivered after a planner restart)
        self._arrived: OrderedDict[str, Envelope] = OrderedDict()
        self._last_saved: dict[str, float] = {}
        self._cancelling: set[str] = set()
        self._job_deployments: dict[str, list[tuple[str, str]]] = {}  # running job -> its (node, deployment)s
        self.leases = MachineLeases()  # which run holds which machine
        self._chosen: dict[str, dict[str, list[dict[str, Any]]]] = {}  # run -> workload -> the machines it took
        # (node, deployment) -> when the agent said it was ready, by the agent's own clock (its heartbeats' clock)
        self._ready_at: dict[tuple[str, str], float] = {}

    # -- events in --------------------------------------------------------------------------
    async def on_event(self, event: Envelope) -> None:
        key: str | None = None
        if isinstance(event, JobWindowEdge):
            await self._read_engines(event)
            return
        # a stack's facts are awaited under the node the deployment was sent to: an event's node id is its sender's
        # (its subject names the node, and a node's bus user may publish under its own only), so no other machine's
        # agent can answer for it
        if isinstance(event, StackReady | StackFailed):
            key = _stack_key("stack", event.node_id, event.deployment_id)
        elif isinstance(event, StackStopped):
            key = _stack_key("stopped", event.node_id, event.deployment_id)
        elif isinstance(event, EnginesRestarted):
            key = _stack_key("restarted", event.node_id, event.deployment_id)
        elif isinstance(event, EnginesRead):
            key = _read_key(event.node_id, event.deployment_id, event.job_id, event.edge)
        elif isinstance(event, JobFinished | JobFailed):
            key = f"job:{event.job_id}#{event.shard_index}"
        elif isinstance(event, JobProgressed):
            await self._progress(event)
            return
        if key is None:
            return
        waiter = self._waiters.pop(key, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(event)
        else:
            self._arrived[key] = event
            while len(self._arrived) > 10_000:
                self._arrived.popitem(last=False)

    async def _read_engines(self, edge: JobWindowEdge) -> None:
        """A job's measured window starts or ends now: every engine of its deployments is read at once, so its
        counters are differenced over the window itself."""
        await self._send_reads(edge.run_id, edge.job_id, edge.edge, edge.at)

    async def _send_reads(self, run_id: str, job_id: str, edge: WindowEdge, at: float) -> None:
        """ReadEngines to every (node, deployment) of the running job."""
        for node_id, deployment_id in self._job_deployments.get(job_id, []):
            await self.publish(ReadEngines(node_id=node_id, run_id=run_id, deployment_id=deployment_id, job_id=job_id,
                                           edge=edge, edge_at=at))  # fmt: skip

    async def _read_at_job_edge(self, run_id: str, job_id: str, edge: Literal["job_start", "job_end"]) -> None:
        """Every engine of the job's deployments read now, before its first request or after its last answer, and
        their answers awaited: the counters then bracket exactly the job's requests. An agent that does not answer
        in time is named in the log; the report then falls back to the periodic scrapes for its engines."""
        pairs = self._job_deployments.get(job_id, [])
        keys = [_read_key(node_id, dep, job_id, edge) for node_id, dep in pairs]
        futures = [self._expect(key) for key in keys]
        await self._send_reads(run_id, job_id, edge, time.time())
        done, _ = await asyncio.wait(futures, timeout=EDGE_READ_WAIT_S) if futures else (set(), set())
        for key, future, (node_id, _) in zip(keys, futures, pairs, strict=True):
            self._waiters.pop(key, None)
            if future not in done:
                future.cancel()
                log.warning("an agent did not read its engines at a job's edge in time",
                            extra={"run_id": run_id, "job_id": job_id, "node_id": node_id, "edge": edge})  # fmt: skip

    async def _progress(self, event: JobProgressed) -> None:
        state = self.runs.get(event.run_id)
        if state is None:
            return
        for job in state.jobs:
            if job.job_id == event.job_id and job.status == "running":
                job.progress = _job_progress(event)
                job.requests, job.errors = event.requests_done, event.errors
        if time.monotonic() - self._last_saved.get(state.run_id, 0) > 2:
            # progress only: the next save carries it if the bus does not take this one
            with contextlib.suppress(RunFailedError):
                await self.save(state, retry_for_s=2.0)

    def _expect(self, key: str) -> asyncio.Future[Envelope]:
        future: asyncio.Future[Envelope] = asyncio.get_running_loop().create_future()
        if key in self._arrived:
            future.set_result(self._arrived.pop(key))
        else:
            self._waiters[key] = future
        return future

    async def _await(self, key: str, future: asyncio.Future[Envelope], timeout_s: float) -> Envelope:
        try:
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._waiters.pop(key, None)

    # -- state --------------------------------------------------------------------------------
    async def save(self, state: RunState, retry_for_s: float | None = None) -> None:
        """Write the run's state; a bus that does not acknowledge is waited for up to ``retry_for_s`` (the
        planner's ``bus_outage_s``), then the run fails as bus_unavailable."""
        state.updated_at = utc_now()
        body = state.model_dump_json().encode()
        try:
            await self.bus.kv_put("kvbench_runs", state.run_id, body, retry_for_s or self.settings.bus_outage_s)
        except TRANSIENT_BUS_ERRORS as exc:
            raise _bus_unavailable(self.settings.bus_outage_s, exc) from None
        self._last_saved[state.run_id] = time.monotonic()

    async def publish(self, message: Envelope) -> None:
        """Send a command or fact of the run; a bus that does not acknowledge is waited for as ``save`` does."""
        try:
            await self.bus.publish(message, retry_for_s=self.settings.bus_outage_s)
        except TRANSIENT_BUS_ERRORS as exc:
            raise _bus_unavailable(self.settings.bus_outage_s, exc) from None

    async def load_all(self) -> list[RunState]:
        values = await self.bus.kv_values("kvbench_runs")
        states = [RunState.model_validate_json(value) for value in values.values() if value]
        return sorted(states, key=lambda s: s.created_at)

    async def resume(self) -> None:
        for state in await self.load_all():
            self.runs[state.run_id] = state
            if state.status in ACTIVE:
                log.info("resuming run", extra={"run_id": state.run_id})
                self._start_task(state)

    # -- commands out -------------------------------------------------------------------------
    async def submit(self, plan: Plan, machines: dict[str, list[Machine]] | None = None) -> RunState:
        state = RunState(
            run_id=new_id(), plan_name=plan.name, plan=plan.model_dump(mode="json"), jobs=expand_jobs(plan)
        )
        submitted = RunSubmitted(
            run_id=state.run_id,
            plan_name=plan.name,
            plan=state.plan,
            jobs=[j.model_dump(mode="json") for j in state.jobs],
        )
        # a caller waits a moment for the bus, not a whole outage: a run the bus did not take is not created
        try:
            await self.bus.kv_put("kvbench_runs", state.run_id, state.model_dump_json().encode(), SUBMIT_BUS_WAIT_S)
            await self.bus.publish(submitted, retry_for_s=SUBMIT_BUS_WAIT_S)
        except TRANSIENT_BUS_ERRORS as exc:
            with contextlib.suppress(Exception):  # the state may have been written before the event failed
                await (await self.bus.kv("kvbench_runs")).delete(state.run_id)
            raise BusUnavailableError(_bus_unavailable(SUBMIT_BUS_WAIT_S, exc).problem) from None
        self.runs[state.run_id] = state
        self._last_saved[state.run_id] = time.monotonic()
        self._start_task(state)
        return state

    def _start_task(self, state: RunState) -> None:
        self._tasks[state.run_id] = asyncio.create_task(self._conduct(state), name=f"run:{state.run_id}")

    async def cancel(self, run_id: str) -> RunState | None:
        state = self.runs.get(run_id)
        if state is None:
            return None
        task = self._tasks.get(run_id)
        if state.status in ACTIVE:
            try:  # load generators stop the run's jobs; a bus that does not take it is said at once, not waited out
                await self.bus.publish(RunCancelled(run_id=run_id), retry_for_s=SUBMIT_BUS_WAIT_S)
            except TRANSIENT_BUS_ERRORS as exc:
                raise BusUnavailableError(_bus_unavailable(SUBMIT_BUS_WAIT_S, exc).problem) from None
        if task and not task.done():
            self._cancelling.add(run_id)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        elif state.status in ACTIVE:
            await self._finish(state, "cancelled", [_cancelled(state)])
        return state

    async def close(self) -> None:
        """Planner shutdown: stop conducting but keep run state as it is, so a restart resumes."""
        for task in self._tasks.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _finish(self, state: RunState, status: str, reasons: list[Problem]) -> None:
        state.status = status  # type: ignore[assignment]
        state.reasons = [r.as_reason() for r in reasons]
        state.current_workload = None
        state.queue = None
        for job in state.jobs:
            if job.status in ("pending", "running"):
                job.status = "cancelled" if status == "cancelled" else "failed"
                job.reason = job.reason or (reasons[0].message if reasons else status)
        await self.save(state)
        await self.publish(RunFinished(run_id=state.run_id, status=state.status, reasons=reasons))
        log.info("run finished", extra={"run_id": state.run_id, "status": status})

    async def _conduct(self, state: RunState) -> None:
        plan = Plan.model_validate(state.plan)
        ids = {"run_id": state.run_id}
        try:
            await self._take_machines(state, plan)
            if state.status != "running":
                state.status, state.queue = "running", None
                await self.save(state)
                await self.publish(RunStarted(run_id=state.run_id))
            for index, workload in enumerate(plan.workloads):
                jobs = [j for j in state.jobs if j.workload == workload.name]
                if all(j.status in ("succeeded", "failed") for j in jobs):
                    continue
                state.current_workload = workload.name
                await self.save(state)
                await self._run_workload(state, index, workload, jobs)
            failed = [j for j in state.jobs if j.status == "failed"]
            reasons = [
                Problem(
                    code="job_failed",
                    message=f"job {j.job_id} ({j.workload}): {j.reason}",
                    fix="Read the job's reason and the service logs.",
                    workload=j.workload,
                )
                for j in failed
            ]
            await self._finish(state, "failed" if failed else "succeeded", reasons)
        except RunFailedError as exc:
            # not the problem's fields as they are: "message" is a reserved LogRecord attribute and logging would raise
            log.warning("run failed", extra={**ids, "code": exc.problem.code, "reason": exc.problem.message})
            await self._finish(state, "failed", [exc.problem])
        except asyncio.CancelledError:
            # a user's cancel ends the run; a planner shutdown leaves it to be resumed
            if state.run_id in self._cancelling:
                self._cancelling.discard(state.run_id)
                await self._finish(state, "cancelled", [_cancelled(state)])
            raise
        except Exception as exc:
            log.exception("run failed unexpectedly", extra=ids)
            await self._finish(state, "failed", [Problem(code="internal_error", message=str(exc))])
        finally:
            self._chosen.pop(state.run_id, None)
            await asyncio.shield(self.leases.release(state.run_id))

    async def _take_machines(self, state: RunState, plan: Plan) -> None:
        """Every machine the run's unfinished workloads need, held until the run ends; while another run holds one,
        the run is ``queued`` (its place and what it waits for in its state), or refused if the plan says so."""
        unfinished = {j.workload for j in state.jobs if j.status not in ("succeeded", "failed")}
        remaining = [w for w in plan.workloads if w.name in unfinished]
        chosen = {w.name: await self._nodes_for(w) for w in remaining}
        self._chosen[state.run_id] = chosen
        needed = {str(n["node_id"]) for nodes in chosen.values() for n in nodes}
        if plan.when_busy == "refuse" and (busy := self.leases.blockers(state.run_id, needed)):
            raise RunFailedError(
                "machines_busy",
                "The machines this plan needs are busy: " + "; ".join(busy),
                "Run it again once they are free (kvbench runs lists what runs), or leave out when_busy: refuse "
                "so that it waits for them.",
            )

        async def queued(place: QueuePlace) -> None:
            state.status, state.queue = "queued", place
            await self.save(state)
            log.info("run queued for machines", extra={"run_id": state.run_id, "position": place.position,
                                                       "waiting_for": place.waiting_for})  # fmt: skip

        # a run that already ran (resumed by a restarted planner) held its machines: it takes them back first
        order = (0 if state.status == "running" else 1, state.created_at.timestamp())
        await self.leases.acquire(state.run_id, needed, order, queued)

    def busy_for(self, plan: Plan) -> list[str]:
        """What a new run of ``plan`` would wait for now: machines other runs hold or are queued for."""
        needed = {str(n["node_id"]) for w in plan.workloads for n in (self._pick_nodes(w)[0] or [])}
        return self.leases.blockers("", needed)

    def _sim_cluster(self, workload: Workload) -> SimCluster | None:
        return sim_cluster(workload, self.settings.sim_speed)

    def _speed(self, workload: Workload) -> float:
        """Engine seconds per wall second of the workload's engines (1 for real ones)."""
        sim = self._sim_cluster(workload)
        return sim.speed or 1.0 if sim is not None else 1.0

    def _pick_nodes(self, workload: Workload) -> tuple[list[dict[str, Any]] | None, str]:
        """The machines a workload runs on among those whose agents are up now, or None and what is missing."""
        live = {key: beat.inventory.model_dump() for key, beat in self.registry.live_nodes().items()}
        sim = workload.cluster.sim
        if sim is not None:
            simulated = (n for n in live.values() if n.get("simulated"))
            chosen = sorted(simulated, key=lambda n: natural_key(str(n["node_id"])))  # sim-2 before sim-10
            if len(chosen) >= sim.machines:
                return chosen[: sim.machines], ""
            return None, f"{sim.machines - len(chosen)} more simulated machine(s)"
        members = [m.name for m in self.registry.groups().get(workload.cluster.group or "", [])]
        down = [m for m in members if m not in live]
        if members and not down:
            return [live[m] for m in members], ""
        return None, ", ".join(down) or f"any machine of group {workload.cluster.group}"

    async def _nodes_for(self, workload: Workload) -> list[dict[str, Any]]:
        """The machines a workload runs on, once their agents are up (waits ``node_wait_s`` for them)."""
        deadline = time.monotonic() + self.settings.node_wait_s
        sim = workload.cluster.sim
        while True:
            nodes, missing = self._pick_nodes(workload)
            if nodes is not None:
                return nodes
            if time.monotonic() > deadline:
                if sim is not None:
                    raise RunFailedError(
                        "cluster_unavailable",
                        f"The simulated cluster needs {sim.machines} machines; {missing} are not up",
                        f"Start more simulated machines: kvbench up --sim-machines {sim.machines}.",
                    )
                raise RunFailedError.node_unresponsive(missing)
            await asyncio.sleep(0.5)

    async def _start_stacks(
        self, state: RunState, workload: Workload, nodes: list[dict[str, Any]], generation: str
    ) -> tuple[list[str], list[EngineEndpoint]]:
        deployments: dict[str, str] = {}
        waits: dict[str, asyncio.Future[Envelope]] = {}
        # every agent renders the whole pool's recipe, then starts its own machine's part
        pool = [
            PoolMachine(
                name=str(n["node_id"]),
                host=str(n.get("address") or n.get("hostname") or "127.0.0.1"),
                gpus=int(workload.sizing.gpus_per_machine or n.get("gpus") or 0),
                vendor=str(n.get("vendor") or "nvidia"),
                gpu_model=str(n["gpu_model"]) if n.get("gpu_model") else None,
            )
            for n in nodes
        ]
        try:
            token = self._stored_token(workload)
            for node in nodes:
                node_id = str(node["node_id"])
                dep = f"d{state.run_id[-10:]}{generation}{node_id.replace('-', '')}"[:60]
                deployments[node_id] = dep
                waits[dep] = self._expect(_stack_key("stack", node_id, dep))
                await self.publish(
                    StartStack(
                        node_id=node_id,
                        run_id=state.run_id,
                        deployment_id=dep,
                        workload=workload.name,
                        stack=workload.stack,
                        # machines that registered as simulated (a simulated cluster, or a lab of simulated hosts in
                        # a group) run simulated engines; real ones the planner's launcher
                        launcher="sim" if workload.cluster.sim or node.get("simulated") else self.settings.launcher,
                        model=workload.model,
                        engine=workload.engine,
                        sizing=workload.sizing,
                        sim=self._sim_cluster(workload),
                        kv_tier=workload.kv_tier,
                        network=workload.network,
                        routing=workload.measurement.routing,
                        pool=pool,
                        hf_token_secret=workload.hf_token_secret,
                        open_reset_route=workload.measurement.acceptance,
                        hf_token_sealed=_sealed_for(node, token) if token else None,
                        expires_at=utc_now() + timedelta(seconds=self.settings.stack_ready_timeout_s),
                    )
                )
            endpoints: list[EngineEndpoint] = []
            failures: list[str] = []
            node_of = {dep: node_id for node_id, dep in deployments.items()}
            for dep, future in waits.items():
                try:
                    event = await self._await(_stack_key("stack", node_of[dep], dep), future,
                                              self.settings.stack_ready_timeout_s)  # fmt: skip
                except TimeoutError:
                    failures.append(f"{dep}: not healthy within {self.settings.stack_ready_timeout_s:.0f} s")
                    continue
                if isinstance(event, StackFailed):
                    failures.append(f"{event.node_id}: {event.reason}")
                elif isinstance(event, StackReady):
                    endpoints.extend(event.endpoints)
                    self._ready_at[(event.node_id, event.deployment_id)] = event.occurred_at.timestamp()
        except BaseException:
            # cancelled (or failed) while the stacks start: every agent asked is told to stop what it started, so
            # no engine is left holding a GPU (an agent handles its commands in order: the stop follows the start)
            await asyncio.shield(self._stop_stacks(state, deployments, wait=False))
            raise
        if failures:
            await self._stop_stacks(state, deployments)
            raise RunFailedError(
                "stack_failed",
                f"The {workload.stack} stack did not start: " + "; ".join(failures),
                "Read the engine log named in the message, fix the setting, and run again.",
            )
        return list(deployments.values()), endpoints

    async def _restart_engines(self, state: RunState, workload: Workload, pairs: list[tuple[str, str]]) -> None:
        """Restart every engine of the stack alone, its cache servers and stores kept: how an engine with no call
        that empties its prefix cache (TensorRT-LLM) starts the acceptance test's reset phase."""
        waits = {(node_id, dep): self._expect(_stack_key("restarted", node_id, dep)) for node_id, dep in pairs}
        for node_id, dep in pairs:
            await self.publish(RestartEngines(node_id=node_id, run_id=state.run_id, deployment_id=dep))
        failures: list[str] = []
        for (node_id, dep), future in waits.items():
            try:
                event = await self._await(_stack_key("restarted", node_id, dep), future,
                                          self.settings.stack_ready_timeout_s)  # fmt: skip
            except TimeoutError:
                failures.append(f"{dep}: its engines were not healthy again within "
                                f"{self.settings.stack_ready_timeout_s:.0f} s")  # fmt: skip
                continue
            if isinstance(event, EnginesRestarted) and event.error:
                failures.append(event.error)
        if failures:
            raise RunFailedError(
                "engine_restart_failed",
                f"The {workload.stack} stack's engines could not be restarted alone to empty their prefix caches "
                "(the engine has no call that does it): " + "; ".join(failures),
                "Read the engine log named in the message; the acceptance test needs the engines to restart alone.",
            )
        log.info("engines restarted alone", extra={"run_id": state.run_id, "workload": workload.name})

    def _stored_token(self, workload: Workload) -> str | None:
        """The workload's Hugging Face token in clear, read from the encrypted store (None: it names none)."""
        if not workload.hf_token_secret:
            return None
        try:
            token = self.registry.secret_value(workload.hf_token_secret)
        except SealingError as exc:
            raise RunFailedError(
                "secret_unreadable",
                f"The stored secret {workload.hf_token_secret} could not be opened: {exc}",
                f"Store it again: kvbench secrets set {workload.hf_token_secret}.",
            ) from None
        if token is None:
            raise RunFailedError(
                "secret_missing",
                f"The secret {workload.hf_token_secret} is not stored (it was deleted after the plan was reviewed)",
                f"Store it: kvbench secrets set {workload.hf_token_secret}, and run again.",
            )
        return token

    async def _stop_stacks(
        self, state: RunState, deployments: dict[str, str] | list[tuple[str, str]], wait: bool = True
    ) -> None:
        """Ask every agent to tear down; wait (at most 30 s in all) only for agents that are still alive."""
        pairs = list(deployments.items()) if isinstance(deployments, dict) else deployments
        live = self.registry.live_nodes()
        waits: list[tuple[str, asyncio.Future[Envelope]]] = []
        for node_id, dep in pairs:
            self._ready_at.pop((node_id, dep), None)
            if wait and node_id in live:
                waits.append((_stack_key("stopped", node_id, dep), self._expect(_stack_key("stopped", node_id, dep))))
            await self.publish(StopStack(node_id=node_id, run_id=state.run_id, deployment_id=dep))
        if waits:
            await asyncio.wait([future for _, future in waits], timeout=30)
        for key, _ in waits:
            self._waiters.pop(key, None)

    async def _watch_shards(self, job_id: str, ends: list[asyncio.Future[Envelope]]) -> tuple[int, str]:
        """Returns (the shard's index and the reason) once a load generator running one of the job's shards is lost:
        its heartbeat key expired, or it came back without the shard (the process restarted). Never returns while
        every shard's runner is alive; a bus that does not answer is waited out, with a heartbeat's grace after.
        Which load generator took a shard is learnt from a listing of the bucket; whether it still runs it, from
        its own key, read twice a grace apart (a listing can come back short on a busy server)."""
        owner: dict[int, str] = {}
        bus_back_at, failing = 0.0, False
        while True:
            await asyncio.sleep(1.0)
            if not await _jetstream_answers(self.bus, failing):
                failing = True
                continue
            try:
                kv = await self.bus.kv("kvbench_loadgens")
                if len(owner) < len(ends):
                    await _learn_owners(self.bus, kv, job_id, ends, owner)
                if failing:
                    failing, bus_back_at = False, time.monotonic()
                if time.monotonic() - bus_back_at < HEARTBEAT_GRACE_S:
                    continue
                for index, runner in sorted(owner.items()):
                    key, end = shard_key(job_id, index), ends[index]
                    if end.done() or key in (await _shards_of(kv, runner) or ()):
                        continue
                    # the end is published before the shard leaves the list: give it a moment, then look again
                    await asyncio.wait([end], timeout=LOADGEN_END_GRACE_S)
                    if end.done():
                        continue
                    shards = await _shards_of(kv, runner)
                    if shards is not None and key in shards:
                        continue
                    how = "stopped (its heartbeat is gone)" if shards is None else "came back without it (it restarted)"
                    return index, (
                        f"load generator {runner}, running shard {index + 1} of {len(ends)} of this job, {how} before "
                        "the job ended; the records it published are kept, the rest of its share was never sent. Keep "
                        "the load generators running for the whole run (kvbench status lists them) and run the plan "
                        "again"
                    )
            except Exception as exc:  # the bus, not a load generator
                if not failing:
                    log.warning("the bus does not answer; waiting for it", extra={"error": str(exc)[:200]})
                failing = True

    async def _watch_nodes(self, node_ids: list[str], stop: asyncio.Event, running: dict[str, str]) -> None:
        """Only an expired heartbeat means a lost node. The bus itself failing (a NATS server down or restarting,
        a timeout) is not a node's fault: the watcher waits for it to come back, and after it does gives the agents
        a heartbeat's time to write again before it counts a missing key. ``running``: each node's deployment of
        the stack now up; once a node's heartbeat has listed it, a heartbeat without it means the agent restarted
        (its engines die with it), which fails the run within a heartbeat instead of at the key's TTL."""
        kv = await self.bus.kv("kvbench_nodes")
        listed: set[tuple[str, str]] = set()
        bus_back_at = 0.0  # when the bus answered again after failing
        failing = False
        while not stop.is_set():
            await asyncio.sleep(1.0)
            if not await _jetstream_answers(self.bus, failing):
                failing = True
                continue
            if failing:
                failing, bus_back_at = False, time.monotonic()
                log.info("the bus answers again")
            for node_id in node_ids:
                try:
                    entry = await kv.get(node_id)
                except nats.js.errors.KeyNotFoundError:
                    if time.monotonic() - bus_back_at < HEARTBEAT_GRACE_S:
                        continue  # the agent may not have written since the bus came back
                    raise RunFailedError.node_unresponsive(node_id) from None
                except Exception as exc:  # the bus, not the node: a timeout, a lost connection
                    if not failing:
                        log.warning("the bus does not answer; waiting for it", extra={"error": str(exc)[:200]})
                    failing = True
                    break
                else:
                    deployment = running.get(node_id)
                    if deployment is not None and entry.value:
                        try:
                            beat = Heartbeat.model_validate_json(entry.value)
                        except ValueError:
                            continue
                        ready_at = self._ready_at.get((node_id, deployment), float("inf"))
                        if deployment in beat.deployments:
                            listed.add((node_id, deployment))
                        elif (node_id, deployment) in listed or beat.at > ready_at + 0.5:
                            # a heartbeat written after the agent said the stack was ready, without it: the agent
                            # restarted (perhaps before it had listed the stack even once)
                            raise RunFailedError.node_restarted(node_id)

    async def _run_workload(self, state: RunState, index: int, workload: Workload, jobs: list[JobState]) -> None:
        nodes = self._chosen.get(state.run_id, {}).get(workload.name) or await self._nodes_for(workload)
        node_ids = [str(n["node_id"]) for n in nodes]
        state.nodes = node_ids
        # a resumed run re-sends StartStack with the ids it used before: agents answer for running stacks
        generation = state.stack_generation.get(workload.name, 0)
        state.stack_generation[workload.name] = generation
        await self.save(state)
        deps, endpoints = await self._start_stacks(state, workload, nodes, f"w{index}g{generation}")
        pairs = list(zip(node_ids, deps, strict=True))
        running = dict(pairs)  # what each node's heartbeat should list while the stack is up
        stop_watching = asyncio.Event()
        watcher = asyncio.create_task(self._watch_nodes(node_ids, stop_watching, running))
        try:
            started = 0  # jobs run on this stand-up; a resumed run counts from its first unfinished job
            # an acceptance test's phases are each read by the scrapes around them: one before its load (new or
            # restarted engines included) and one after it, before anything stops (the reporter's closing scrape)
            scraped = False
            for job in jobs:
                if job.status in ("succeeded", "failed"):
                    continue
                if workload.cache_start(started) == "restarted":
                    running.clear()  # a deliberate restart: the old deployments leave the heartbeats
                    await self._stop_stacks(state, pairs)
                    generation += 1
                    state.stack_generation[workload.name] = generation
                    await self.save(state)
                    deps, endpoints = await self._start_stacks(state, workload, nodes, f"w{index}g{generation}")
                    pairs = list(zip(node_ids, deps, strict=True))
                    running.update(pairs)
                    scraped = False
                started += 1
                if workload.acceptance_phase(job.repeat) == "reset" and _reset_route(workload) is None:
                    await self._restart_engines(state, workload, pairs)
                    scraped = False
                if workload.measurement.acceptance and not scraped:
                    await asyncio.sleep(self.settings.acceptance_settle_s)
                self._job_deployments[job.job_id] = list(pairs)  # read at the job's window edges
                try:
                    await self._run_job(state, workload, job, endpoints, watcher)
                finally:
                    self._job_deployments.pop(job.job_id, None)
                if workload.measurement.acceptance:
                    await asyncio.sleep(self.settings.acceptance_settle_s)
                    scraped = True
        except BaseException:
            # failing or cancelled: tell the agents to tear down, and do not wait on ones that may be gone
            await asyncio.shield(self._stop_stacks(state, pairs, wait=False))
            raise
        else:
            await self._stop_stacks(state, pairs)
        finally:
            # the flag as well as the cancel: Python 3.11's wait_for (inside a KV read) can swallow a cancel that
            # lands as its reply does, and the watcher would then run until the nodes went away
            stop_watching.set()
            watcher.cancel()
            await asyncio.wait({watcher}, timeout=5)
            if watcher.done() and not watcher.cancelled():
                with contextlib.suppress(RunFailedError):
                    watcher.result()

    async def _run_job(
        self,
        state: RunState,
        workload: Workload,
        job: JobState,
        endpoints: list[EngineEndpoint],
        watcher: asyncio.Task[None],
    ) -> None:
        duration = workload.effective_load_duration_s()
        speed = self._speed(workload)
        # a job with no set length (one session per user) is given hours before it is declared lost; simulated
        # engines that run faster than real time take the plan's duration in less wall time
        timeout_s = duration / speed + self.settings.job_grace_s if duration else 4 * 3600.0
        shards = self.settings.loadgen_shards
        keys = [f"job:{job.job_id}#{index}" for index in range(shards)]
        futures = [self._expect(key) for key in keys]
        if job.status != "running":  # a resumed running job is already in the load generators' hands
            job.status = "running"
            await self.save(state)
            await self._read_at_job_edge(state.run_id, job.job_id, "job_start")
            for index in range(shards):  # each shard is one work-queue message: any free load generator takes it
                await self.publish(
                    RunLoad(
                        run_id=state.run_id,
                        job_id=job.job_id,
                        workload=workload.name,
                        model=workload.model,
                        endpoints=endpoints,
                        traffic=workload.traffic,
                        load_level=job.load_level,
                        duration_s=duration,
                        warmup_s=workload.effective_warmup_s(),
                        routing=workload.measurement.routing,
                        seed=workload.job_seed(JobPoint(job.load_level, job.repeat)),
                        shard_index=index,
                        shards=shards,
                        working_set_ratio=workload.measurement.working_set_ratio,
                        time_scale=speed,
                        reset_prefix_cache=workload.acceptance_phase(job.repeat) == "reset"
                        and _reset_route(workload) is not None,
                        reset_route=_reset_route(workload) or "/reset_prefix_cache",
                        # the acceptance test compares its passes' answers, the accuracy gate each workload's with
                        # the baseline's
                        keep_answers=workload.measurement.acceptance or workload.measurement.accuracy_gate,
                    )
                )
        log.info(
            "job sent",
            extra={"run_id": state.run_id, "job_id": job.job_id, "workload": workload.name, "shards": shards},
        )
        every_shard: asyncio.Future[list[Envelope]] = asyncio.ensure_future(asyncio.gather(*futures))
        shards_lost = asyncio.ensure_future(self._watch_shards(job.job_id, futures))
        waitables: list[asyncio.Future[Any]] = [every_shard, watcher, shards_lost]
        sent_at = time.monotonic()
        done, _ = await asyncio.wait(waitables, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if shards_lost in done and every_shard not in done and watcher not in done:
            # the other shards still drive the engines: let them end before the next job starts on the same stack
            lost_index, _ = shards_lost.result()
            others = [f for index, f in enumerate(futures) if index != lost_index and not f.done()]
            left = max(0.0, timeout_s - (time.monotonic() - sent_at))
            if others:
                rest: list[asyncio.Future[Any]] = [asyncio.ensure_future(asyncio.gather(*others)), watcher]
                await asyncio.wait(rest, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        shards_lost.cancel()
        for key in keys:
            self._waiters.pop(key, None)
        if watcher.done() and not every_shard.done():
            every_shard.cancel()
            job.status, job.reason = "failed", NODE_UNRESPONSIVE.message
            watcher.result()  # raises RunFailedError(node_unresponsive)
        if shards_lost.done() and not shards_lost.cancelled() and not every_shard.done():
            every_shard.cancel()
            job.status, job.reason = "failed", shards_lost.result()[1]
            log.warning("a load generator was lost mid-job",
                        extra={"run_id": state.run_id, "job_id": job.job_id, "reason": job.reason})  # fmt: skip
        elif every_shard not in done and not every_shard.done():
            finished = sum(1 for f in futures if f.done() and not f.cancelled())  # before the cancel marks all done
            every_shard.cancel()
            job.status, job.reason = (
                "failed",
                f"{finished} of {shards} load generator shard(s) reported the job's end within {timeout_s:.0f} s of "
                "sending it (its duration plus KVBENCH_PLANNER_JOB_GRACE_S); check the load generators' logs "
                "(kvbench status shows where) and that they reach the engines",
            )
        else:
            events = every_shard.result()
            failed = [e for e in events if isinstance(e, JobFailed)]
            if failed:
                job.status, job.reason = "failed", failed[0].reason
            else:
                job.status, job.progress = "succeeded", 1.0
        if job.status == "succeeded":  # its last answer is in: the engines hold exactly what the job added
            await self._read_at_job_edge(state.run_id, job.job_id, "job_end")
        await self.save(state)


def _stack_key(what: str, node_id: str, deployment_id: str) -> str:
    """What a fact about a node's deployment (StackReady or StackFailed: "stack"; "stopped", "restarted") is awaited
    under."""
    return f"{what}:{node_id}:{deployment_id}"


def _read_key(node_id: str, deployment_id: str, job_id: str, edge: str) -> str:
    """What an edge read's answer (EnginesRead) is awaited under."""
    return f"read:{node_id}:{deployment_id}:{job_id}:{edge}"


def _reset_route(workload: Workload) -> str | None:
    """The route that empties the stack's engines' prefix caches while they run (None: only restarting them does)."""
    stack = get_stack(workload.stack)
    return stack.local_cache_reset if stack is not None else "/reset_prefix_cache"


def _sealed_for(node: dict[str, Any], token: str) -> str:
    """``token`` sealed to ``node``'s agent alone (its public key, from the inventory it heartbeats)."""
    key = node.get("public_key")
    if not key:
        raise RunFailedError(
            "agent_without_key",
            f"The agent of {node.get('node_id')} publishes no public key, so no secret can be sent to it",
            "Update kvbench on that machine and restart its agent (kvbench-agent).",
        )
    return seal_for(str(key), token)


async def _jetstream_answers(bus: Bus, failing: bool) -> bool:
    """Whether JetStream itself answers: a cluster that lost its quorum does not, though a server left alone
    still serves reads of what it holds (a heartbeat that stopped changing, then, is the bus's fault, and the
    keys that expire meanwhile are not nodes lost). Says so in the log once an outage."""
    try:
        await bus.js.account_info()
    except Exception as exc:  # any failure here is the bus's, and is waited out
        if not failing:
            log.warning("the bus does not answer; waiting for it", extra={"error": str(exc)[:200]})
        return False
    return True
