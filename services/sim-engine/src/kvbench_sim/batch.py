"""Batch (what-if) mode: a whole workload on a simulated cluster in virtual time, with no sleeping.

One event heap drives the load generator's own traffic sources (the same sessions the real load generator
sends), a router, the engines' step loops, their KV transfers and P/D hand-offs. Every request yields a
record in the export format, so the figures come from the report's own definitions.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import heapq
import itertools
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvbench_sim import fastpath
from kvbench_sim.engine import Engine, SimRequest, StepPlan
from kvbench_sim.finished import FinishedRequests
from kvbench_sim.profiles import CACHE_SERVER_STORE, Profile, cache_server_tier, load_profile
from kvbench_sim.records import file_backed
from kvbench_sim.stacks import SimLayout
from kvbench_sim.text import chat_to_prompt, output_words, tokenize
from kvbench_sim.tiers import Link, Transfer
from kvbench_workloads.arrivals import arrival_gaps
from kvbench_workloads.sessions import Session, Turn
from kvbench_workloads.sources import Source

__all__ = ["Cluster", "Simulation", "SimulationStalledError"]


class SimulationStalledError(ValueError):
    """A run whose engines stopped with requests they can never serve."""


@dataclass
class _Pending:
    """A request in flight: who sent it, and what the client has seen so far."""

    session: Session
    turn: Turn
    turn_number: int
    start_s: float
    prompt: Sequence[str]
    request_number: int  # the request's id is f"{job_id}-{request_number}"
    chunk_times: list[float] = field(default_factory=list)
    engine: int = -1
    prefill_engine: int | None = None
    request: SimRequest | None = None


class Cluster:
    """The engines of one workload (decode-capable ones first, then prefill engines of a split stack)."""

    def __init__(self, layout: SimLayout, gpu: str, model: str, seed: int = 0, routing: str = "round_robin") -> None:
        self.layout = layout
        shared: dict[str, Any] = {}
        self.profile: Profile = load_profile(gpu, model, layout.engine)
        self.engines = [
            Engine(self._profile_of(i, gpu, model), seed=seed * 1000 + i, shared_stores=shared)
            for i in range(layout.engines)
        ]
        for i, engine in enumerate(self.engines):
            engine.name = f"e{i}"
        self.prefill: list[Engine] = []
        if layout.prefill_engines and layout.prefill is not None:
            prefill_profile = load_profile(gpu, model, layout.prefill)
            self.prefill = [
                Engine(prefill_profile, seed=seed * 1000 + 500 + i, shared_stores=shared)
                for i in range(layout.prefill_engines)
            ]
        self.pd_link = Link("pd", layout.link_gbps * 1e9)
        self.routing = routing
        self.rr_next = 0  # round robin: the engine the next request goes to
        self._rr_prefill = itertools.cycle(range(max(1, len(self.prefill))))

    def _profile_of(self, index: int, gpu: str, model: str) -> Profile:
        """Engine ``index``'s profile: its group's LMCache server tiers are one store (engines_per_cache_server, by
        default a machine's engines: engines fill machines in order)."""
        share = self.layout.engines_per_cache_server
        if not share:
            return self.profile
        group = index // share
        tiers = tuple(
            t.model_copy(update={"store_id": f"{CACHE_SERVER_STORE}-{group}-{t.name}"}) if cache_server_tier(t) else t
            for t in self.layout.engine.tiers
        )
        return load_profile(gpu, model, self.layout.engine.model_copy(update={"tiers": tiers}))

    def cache_servers(self) -> dict[str, dict[str, Any]]:
        """Each shared LMCache server's tiers: the engines using it, the bytes its links moved so far (and its
        main link's rate, to say how busy it was)."""
        seen: dict[str, dict[str, Any]] = {}
        for engine in self.engines:
            for tier in engine.tiers:
                store = tier.config.store_id
                if not store or not cache_server_tier(tier.config):
                    continue
                row = seen.setdefault(store, {"engines": [], "bytes_moved": 0.0, "link_bytes": 0.0})
                row["engines"].append(engine.name)
                row["bytes_moved"] = sum(link.bytes_moved for link in tier.links)
                row["link_bytes"], row["link_bytes_per_s"] = tier.link.bytes_moved, tier.link.bytes_per_s
        return seen

    @property
    def all_engines(self) -> list[Engine]:
        return [*self.engines, *self.prefill]

    def restart_stack(self, at_s: float) -> float:
        """What the planner does before a job when the cache state is ``empty``: the stack's processes start again.
        Engines lose their GPU and host tiers and pay a cold start; a disk tier or a shared filesystem keeps its
        records; a memory store (Mooncake, Valkey) started with the stack loses its chunks. Returns when every
        engine serves again (the planner starts the load once the stack is healthy)."""
        shared = {id(t): t for e in self.all_engines for t in e.tiers if t.config.store_id and not file_backed(t)}
        for tier in shared.values():
            tier.clear()
        for engine in self.all_engines:
            engine.restart(at_s)
        self.pd_link.flows.clear()
        return max(e.serving_from_s for e in self.all_engines)

    def pick(self, session_id: str, prompt: Sequence[str]) -> int:
        n = len(self.engines)
        if n == 1:
            return 0
        if self.routing == "session_affinity":
            return _stable(session_id) % n
        if self.routing == "prefix_aware":
            return _stable(" ".join(prompt[:256])) % n
        if self.routing == "pd_aware":  # the decode engine with the least work queued (prefill side: round robin)
            return min(range(n), key=lambda i: len(self.engines[i].running) + len(self.engines[i].waiting))
        index = self.rr_next
        self.rr_next = (index + 1) % n
        return index


def _stable(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class Simulation:
    """Runs one job (one load level, one repeat) of a workload against a cluster in virtual time."""

    def __init__(
        self,
        cluster: Cluster,
        source: Source,
        *,
        mode: str,
        load_level: float,
        duration_s: float,
        seed: int = 0,
        honor_gaps: bool = True,
        distribution: str = "poisson",
        burstiness: float = 1.0,
        max_concurrency: int | None = None,
        job_id: str = "sim",
        workload: str = "w",
        start_s: float = 0.0,
        progress: Callable[[float, int], None] | None = None,
        progress_every_s: float = 1.0,
        compiled: bool = True,
    ) -> None:
        """``progress``: called with the virtual seconds simulated so far and the requests finished, at most every
        ``progress_every_s`` of wall time (an hour of 64 engines takes minutes). ``compiled``: run it compiled where
        ``kvbench_sim.fastpath`` can (the same results; False: always this Python reference, as the tests compare)."""
        self.cluster = cluster
        self.compiled = compiled
        self.source = source
        self.mode = mode
        self.load_level = load_level
        self.duration_s = duration_s
        self.seed = seed
        self.honor_gaps = honor_gaps
        self.distribution, self.burstiness = distribution, burstiness
        self.max_concurrency = max_concurrency
        self.job_id, self.workload = job_id, workload
        self.t0 = start_s
        self.now = start_s
        self.records = FinishedRequests(job_id, workload)
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()
        self._busy: set[int] = set()  # engines running a step (index in all_engines); an idle one waits in _wake_at
        self._wake_at: dict[int, float] = {}
        self.all_engines = cluster.all_engines
        self._by_request: dict[str, _Pending] = {}
        self._request_ids = itertools.count()
        self._in_flight = 0
        self._queued: list[tuple[Session, Turn]] = []  # over the concurrency cap
        self._deadline = start_s + duration_s if duration_s > 0 else float("inf")
        self.measure_span: list[float] = []
        self._user_of: dict[int, int] = {}
        self._last_request: dict[int, SimRequest] = {}  # per conversation: its latest request (hashes to reuse)
        self._running: dict[int, tuple[StepPlan, float, int]] = {}  # engine -> (plan, start, event token)
        self._progress, self._progress_every_s = progress, progress_every_s
        self._progress_at = time.monotonic()

    # -- event heap ------------------------------------------------------------------------------
    def _push(self, at: float, kind: str, payload: Any) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), kind, payload))

    def run(self) -> FinishedRequests:
        with _few_collections():
            if self.compiled and fastpath.unsupported(self) is None:
                unfinished, longest = fastpath.run(self)
            else:
                self._run()
                pending = self._by_request.values()
                unfinished = len(pending)
                longest = max((len(p.prompt) + p.turn.output_tokens for p in pending), default=0)
        if unfinished:  # nothing is left to happen: they would be missing from the figures without a word
            engine = min(self.all_engines, key=lambda e: e.pool.num_blocks)
            raise SimulationStalledError(
                f"{unfinished} requests never finished: an engine cannot hold the KV cache of a request of "
                f"{longest:,} tokens (prompt and output; an engine holds {engine.pool.num_blocks * engine.block_size:,}"
                " tokens). Raise the KV cache (engine kv_cache_gb or gpu_memory_utilization, a larger GPU, tensor "
                "parallelism) or shorten the workload's prompts and outputs"
            )
        if self._progress is not None:  # where it ended, before the figures over its requests (seconds, for an hour)
            self._progress(self.now - self.t0, len(self.records))
        return self.records

    def _run(self) -> None:
        self._start_arrivals()
        events = 0
        while self._heap:
            at, _, kind, payload = heapq.heappop(self._heap)
            self.now = at
            events += 1
            if not events & 4095 and self._progress is not None:  # the clock is read once per 4,096 events
                self._report_progress()
            if kind == "send":
                session, turn = payload
                self._send(session, turn)
            elif kind == "step":
                index, plan, token = payload
                if self._running.get(index, (None, 0.0, -1))[2] == token:
                    self._step_done(index, plan)
            elif kind == "wake":
                if self._wake_at.get(payload) == at:
                    self._wake_at.pop(payload, None)
                    self._kick(payload)
            elif kind == "pd":
                self._pd_landed(payload)
            elif kind == "intake":
                self._intake(payload)
            elif kind == "arrival":
                self._arrival(payload)
            elif kind == "session":
                self._begin_session(payload)
            elif kind == "session-ready":
                self._ready.append(payload)
            elif kind == "trace":
                self._next_trace()
                turn = payload.next_turn()
                if turn is not None:
                    self._send(payload, turn)

    def _report_progress(self) -> None:
        wall = time.monotonic()
        if wall - self._progress_at >= self._progress_every_s and self._progress is not None:
            self._progress_at = wall
            self._progress(self.now - self.t0, len(self.records))

    # -- arrivals ---------------------------------------------------------------------------------
    def _start_arrivals(self) -> None:
        if self.mode == "request_rate":
            self._gaps = self.arrival_gaps()
            self._ready: list[Session] = []
            self._opened = 0
            self._exhausted = False
            self._push(self.t0 + next(self._gaps), "arrival", None)
        elif self.mode == "trace":
            self._next_trace()
        else:
            for user in self.source.users:
                self._push(self.t0, "session", user)

    def arrival_gaps(self) -> Iterator[float]:
        """Request-rate mode: the gaps between arrivals (seeded by the job's seed)."""
        return arrival_gaps(
            max(self.load_level, 1e-9), self.distribution, self.burstiness, random.Random(f"{self.seed}/sim")
        )

    def _begin_session(self, user: int) -> None:
        if self.now >= self._deadline:
            return
        session = self.source.next_session(user)
        if session is None:
            return
        self._user_of[id(session)] = user
        self._next_turn(session, first=True)

    def _next_turn(self, session: Session, first: bool = False) -> None:
        turn = session.next_turn()
        if turn is None:
            self._last_request.pop(id(session), None)
            user = self._user_of.pop(id(session), None)
            if self.mode == "closed_loop" and user is not None:
                one_each = self.duration_s <= 0 and not self.source.finite
                if not one_each:
                    self._push(self.now, "session", user)
            return
        gap = 0.0 if first or not self.honor_gaps else turn.gap_s
        if self.mode == "request_rate":  # the session waits for an arrival to carry its next turn
            self._ready_later(session, gap)
            return
        if self.now + gap >= self._deadline:
            return
        self._push(self.now + gap, "send", (session, turn))

    def _ready_later(self, session: Session, gap: float) -> None:
        if gap <= 0:
            self._ready.append(session)
        else:
            self._push(self.now + gap, "session-ready", session)

    def _arrival(self, _: None) -> None:
        if self.now >= self._deadline:
            return
        session = self._ready.pop(0) if self._ready else None
        if session is None and not self._exhausted:
            session = self.source.next_session(self._opened)
            self._opened += 1
            self._exhausted = session is None
        if session is not None:
            turn = session.next_turn()
            if turn is not None:
                self._send(session, turn)
        elif self._exhausted and not self._by_request:
            return
        self._push(self.now + next(self._gaps), "arrival", None)

    def _next_trace(self) -> None:
        session = self.source.next_session(0)
        if session is None:
            return
        at = self.t0 + (session.start_at_s or 0.0)
        if at >= self._deadline:
            return
        self._push(at, "trace", session)

    # -- requests -----------------------------------------------------------------------------------
    def _send(self, session: Session, turn: Turn) -> None:
        if self.max_concurrency and self._in_flight >= self.max_concurrency:
            self._queued.append((session, turn))
            return
        self._in_flight += 1
        if turn.words is not None:
            prompt: Sequence[str] = turn.words  # a tuple, shared, never changed
        else:
            text = turn.text()
            prompt = tokenize(text if text is not None else chat_to_prompt(turn.messages or []))
        number = next(self._request_ids)
        rid = f"{self.job_id}-{number}"
        pending = _Pending(session, turn, session.turn, self.now, prompt, number)
        self._by_request[rid] = pending
        cluster = self.cluster
        if cluster.prefill:
            index = len(cluster.engines) + next(cluster._rr_prefill)
            pending.prefill_engine = index
            pending.engine = cluster.pick(session.session_id, prompt)
        else:
            index = cluster.pick(session.session_id, prompt)
            pending.engine = index
        intake = self.all_engines[index].profile.intake_s(len(prompt))
        if intake > 0:  # the serving path in front of the engine: the request reaches its queue later
            self._push(self.now + intake, "intake", rid)
        else:
            self._intake(rid)

    def _intake(self, rid: str) -> None:
        """The request reaches its (first) engine's queue."""
        pending = self._by_request[rid]
        if pending.prefill_engine is not None:
            index = pending.prefill_engine
            self.all_engines[index].add(SimRequest(rid, pending.prompt, 1, pending.start_s))
        else:
            index = pending.engine
            pending.request = SimRequest(rid, pending.prompt, pending.turn.output_tokens, pending.start_s)
            self.all_engines[index].add(pending.request, self._last_request.get(id(pending.session)))
            self._last_request[id(pending.session)] = pending.request
        self._cut_short(index)
        self._kick(index)

    def _kick(self, index: int) -> None:
        if index in self._busy:
            return
        engine = self.all_engines[index]
        plan = engine.schedule_run(self.now)
        if plan is not None:
            self._busy.add(index)
            self._wake_at.pop(index, None)
            token = next(self._seq)
            self._running[index] = (plan, self.now, token)
            self._push(self.now + plan.duration_s, "step", (index, plan, token))
            return
        # idle until a transfer lands or the engine is up: a request that arrives meanwhile is scheduled at once
        # (the engine is not busy; it used to wait for the wake, e.g. seconds of a slow tier's store)
        wake = [t for t in (engine.next_transfer_s(), engine.serving_from_s) if t is not None and t > self.now]
        if wake and self._wake_at.get(index) != min(wake):
            self._wake_at[index] = min(wake)
            self._push(min(wake), "wake", index)

    def _cut_short(self, index: int) -> None:
        """A request reached an engine in the middle of fused decode steps: stop them at the next step boundary,
        where a real engine would have admitted it."""
        running = self._running.get(index)
        if running is None or not running[0].steps:
            return
        plan, start, _ = running
        t, keep = start, 0
        for duration in plan.steps:
            t += duration
            keep += 1
            if t >= self.now:
                break
        if keep == len(plan.steps):
            return
        plan.steps = plan.steps[:keep]
        plan.duration_s = t - start
        token = next(self._seq)
        self._running[index] = (plan, start, token)
        self._push(t, "step", (index, plan, token))

    def _step_done(self, index: int, plan: StepPlan) -> None:
        engine = self.all_engines[index]
        self._busy.discard(index)
        self._running.pop(index, None)
        is_prefill_engine = index >= len(self.cluster.engines)
        if plan.steps:  # fused decode steps: each request's token times at once
            for rid, times, done in engine.complete_run(plan, self.now):
                pending = self._by_request.get(rid)
                if pending is None:
                    continue
                start = pending.start_s
                pending.chunk_times.extend(map(start.__rsub__, times))  # t - start, each
                if done:
                    self._finish(rid, pending, engine)
            self._kick(index)
            return
        for event in engine.complete(plan, self.now):
            pending = self._by_request.get(event.request_id)
            if pending is None:
                continue
            if is_prefill_engine:
                if event.finished:
                    self._hand_off(event.request_id, pending, engine)
                continue
            pending.chunk_times.append(event.time_s - pending.start_s)
            if event.finished:
                self._finish(event.request_id, pending, engine)
        self._kick(index)

    def _hand_off(self, rid: str, pending: _Pending, prefill: Engine) -> None:
        """P/D: the prefill engine's KV goes over the link; the decode engine admits it when it lands."""
        bytes_ = len(pending.prompt) * self.cluster.profile.model.kv_bytes_per_token
        transfer = Transfer("pd", bytes_, self.cluster.layout.link_setup_ms / 1e3, rid)
        self.cluster.pd_link.start(self.now, transfer)
        self._schedule_pd()

    def _schedule_pd(self) -> None:
        at = self.cluster.pd_link.next_done_s(self.now)
        if at is not None:
            self._push(at, "pd", None)

    def _pd_landed(self, _: None) -> None:
        for transfer in self.cluster.pd_link.landed(self.now):
            rid = transfer.on_done
            assert isinstance(rid, str)
            pending = self._by_request[rid]
            decode = self.all_engines[pending.engine]
            request = SimRequest(rid, pending.prompt, pending.turn.output_tokens, self.now)
            pending.request = request
            decode.add_transferred(request)
            self._cut_short(pending.engine)
            self._kick(pending.engine)
        self._schedule_pd()

    def _finish(self, rid: str, pending: _Pending, engine: Engine) -> None:
        del self._by_request[rid]
        self._in_flight -= 1
        request_cached = pending.request.cached_tokens if pending.request is not None else 0
        times = pending.chunk_times
        start_s = pending.start_s - self.t0
        session = pending.session
        known: dict[str, int] | None = None
        if pending.request is not None:
            known = dict(pending.request.sources)
            known["recomputed"] = max(0, len(pending.prompt) - sum(known.values()))
        self.records.append(
            pending.request_number, session.session_id, pending.turn_number, start_s, times, len(pending.prompt),
            request_cached, known,
        )  # fmt: skip
        if self.source.measure_phases and pending.turn.phase in self.source.measure_phases:
            end = start_s + (times[-1] if times else 0.0)
            span = self.measure_span
            span[:] = [min(span[0], start_s), max(span[1], end)] if span else [start_s, end]
        pending.session.record_words(pending.turn, output_words(pending.prompt, len(times), self.seed))
        if self._queued:
            session, turn = self._queued.pop(0)
            self._send(session, turn)
        self._next_turn(pending.session)


@contextlib.contextmanager
def _few_collections() -> Iterator[None]:
    """A run keeps hundreds of thousands of records alive and makes almost no reference cycles; the collector's
    default thresholds would re-scan those records over and over (an hour of an 8-engine pool ran 15% slower)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, 20, 1_000)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
