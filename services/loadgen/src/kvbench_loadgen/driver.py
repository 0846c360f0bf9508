"""Drives a source of sessions against OpenAI endpoints and hands each request's record to a callback.

Arrival modes: closed loop (each user sends its next turn when the previous answer is in, after the
turn's recorded gap), request rate (Poisson or gamma arrivals; each arrival sends the next turn of a
session that is ready, else opens a new one, else is counted as skipped) and trace (each session's first
turn at its scheduled time; later turns after their gaps). The driver knows nothing of the bus: the
service publishes the records, ``kvbench load`` writes them to a file.

``time_scale``: engine seconds per wall-clock second, for simulated engines paced faster than real time. The
job's durations, gaps, rates and trace times are engine seconds: the driver waits them out divided by the scale
and stamps records multiplied by it, so a report reads in the engines' time whatever their speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import math
import random
import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import aiohttp

from kvbench_contracts.envelope import new_id
from kvbench_contracts.records import RequestRecord
from kvbench_loadgen.client import StreamResult, stream_completion
from kvbench_loadgen.routing import Router
from kvbench_loadgen.sse import preconnect, wait_until
from kvbench_workloads.arrivals import arrival_gaps
from kvbench_workloads.sessions import Session, Turn
from kvbench_workloads.sources import Source

__all__ = ["DriveConfig", "DriveResult", "Driver", "to_record"]

Mode = Literal["closed_loop", "request_rate", "trace"]
CANCEL_GRACE_S = 10.0  # after the drain time, how long cancelled requests may take to finish
log = logging.getLogger(__name__)
ERROR_BACKOFF_S, ERROR_BACKOFF_MAX_S = 0.05, 2.0  # closed loop: after failed sessions, doubling up to the cap


@dataclass(frozen=True)
class DriveConfig:
    job_id: str
    workload: str
    model: str
    mode: Mode
    load_level: float  # users (closed loop, the whole job) or requests/s (rate, the whole job)
    duration_s: float  # 0: until the sessions run out (synthetic shapes: one session per user)
    warmup_s: float = 0.0
    seed: int = 0
    shard: str = "loadgen-0"
    shards: int = 1
    distribution: str = "poisson"
    burstiness: float = 1.0
    max_concurrency: int | None = None
    honor_gaps: bool = True
    request_timeout_s: float = 600.0  # wall-clock
    drain_timeout_s: float = 120.0  # wall-clock
    time_scale: float = 1.0  # engine seconds per wall-clock second
    # the acceptance test: a digest of every answer (DriveResult.answers), so its passes can be compared
    keep_answers: bool = False
    # connections opened before the load starts, spread over the endpoints: None takes the concurrency the plan
    # states (this shard's closed-loop users, else max_concurrency, else 50 ms of a request rate's arrivals, at
    # most 256); 0 opens none. Requests that find none idle open their own, and their records say how long it took
    preconnect: int | None = None
    # the monotonic time the load starts at, shared by workers that split one schedule (processes of one machine
    # read the same CLOCK_MONOTONIC, so their records' times line up); None: as soon as the connections are open
    start_at: float | None = None
    # sent with every request: an API key's Authorization, a gateway's own headers (kvbench load --api-key, --header)
    headers: dict[str, str] = field(default_factory=dict)
    # a header carrying the session's id, for session-affinity routers (llm-d, vLLM production stack: X-Session-ID)
    session_header: str | None = None


# the acceptance test's answer digests travel in one JobFinished message (NATS: 1 MB): ~40 bytes each
MAX_ANSWERS = 10_000


@dataclass
class DriveResult:
    requests: int = 0
    errors: int = 0
    skipped_arrivals: int = 0  # rate mode: arrivals that found no session ready and none left to open
    # rate mode: arrivals scheduled inside the window that the event loop reached only after it (not sent: they
    # would be stamped after the load's end); a busy machine's sign
    late_arrivals: int = 0
    load_end_s: float = 0.0
    warmup_s: float = 0.0
    replay_lags_s: list[float] = field(default_factory=list)  # trace mode: actual minus scheduled send time
    abandoned: bool = False  # requests still in flight ignored cancellation after the drain time
    # with keep_answers: "session/turn" -> the answer's SHA-256 (16 hex digits), for answers that completed
    answers: dict[str, str] = field(default_factory=dict)
    # request rate and trace modes: wall seconds each scheduled send left after its schedule (the client's own lag)
    # (4 bytes a send: an hour at 3,000 requests/s is 43 MB, not the ~350 MB of a list of floats)
    send_lateness_s: array[float] = field(default_factory=lambda: array("f"))


def to_record(
    result: StreamResult,
    *,
    load_t0: float,
    job_id: str,
    workload: str,
    session_id: str | None,
    turn: int | None,
    prompt_tokens: int,
    shard: str,
    request_id: str | None = None,
    time_scale: float = 1.0,
) -> RequestRecord:
    """``time_scale``: engine seconds per wall-clock second (the record's times are engine seconds)."""
    chunk_times = [(t - result.t0) * time_scale for t in result.chunk_times]
    output_tokens = result.output_tokens if result.output_tokens is not None else sum(result.chunk_tokens)
    chunk_tokens = list(result.chunk_tokens)
    if output_tokens == len(chunk_tokens):
        chunk_tokens = [1] * len(chunk_tokens)
    return RequestRecord(
        request_id=request_id or new_id(),
        job_id=job_id,
        workload=workload,
        session_id=session_id,
        turn=turn,
        start_s=(result.t0 - load_t0) * time_scale,
        ttft_s=chunk_times[0] if chunk_times else None,
        e2e_s=chunk_times[-1] if chunk_times else None,
        chunk_times_s=chunk_times,
        chunk_tokens=chunk_tokens,
        prompt_tokens=result.prompt_tokens if result.prompt_tokens is not None else prompt_tokens,
        output_tokens=output_tokens,
        cached_tokens=result.cached_tokens,
        ok=result.ok,
        error=result.error,
        shard=shard,
        connect_s=result.connect_s * time_scale if result.connect_s is not None else None,
    )


# an open-loop request is started this long before its moment and waits for it itself, right before its write
# (sse.wait_until): the write then leaves one pass of the event loop after the moment, not two or three (the
# pacer's wake-up, the new task's first step, the request's set-up) behind it
_SEND_LEAD_S = 0.0015


class Driver:
    def __init__(
        self,
        config: DriveConfig,
        source: Source,
        router: Router,
        on_record: Callable[[RequestRecord], None],
        on_window_edge: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        # called as the measured window starts and as it ends ("start", "end"): the engines are read then
        self.on_window_edge = on_window_edge
        self._edges_said: set[str] = set()
        self.source = source
        self.router = router
        self.on_record = on_record
        self.result = DriveResult(warmup_s=config.warmup_s)
        self.load_t0 = 0.0
        self._limit = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
        self._measured_span: list[float] = []  # document rounds: first measured start, last measured end
        self._http: aiohttp.ClientSession | None = None

    @property
    def elapsed_s(self) -> float:
        """Engine seconds since the load started."""
        return (time.monotonic() - self.load_t0) * self.config.time_scale if self.load_t0 else 0.0

    def _edge(self, edge: str) -> None:
        """Say an edge of the measured window once, as it happens."""
        if self.on_window_edge is not None and edge not in self._edges_said:
            self._edges_said.add(edge)
            self.on_window_edge(edge)

    async def _window_start_at(self, warmup_wall_s: float) -> None:
        await asyncio.sleep(max(0.0, self.load_t0 + warmup_wall_s - time.monotonic()))
        self._edge("start")

    async def _window_end_at(self, deadline: float) -> None:
        """A bounded load's window ends at its deadline (what is still in flight then is drained, not measured)."""
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        if "start" in self._edges_said:
            self._edge("end")

    def _wall(self, engine_s: float) -> float:
        """Wall-clock seconds an engine-time span lasts."""
        return engine_s / self.config.time_scale

    async def run(self) -> DriveResult:
        cfg = self.config
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:
            self._http = http
            await self._preconnect()
            # what exists now (modules, sessions, prompts) lives for the whole load: out of the collector's sight, a
            # full collection during the load scans only what the load made (tens of ms less of a pause)
            gc.collect()
            gc.freeze()
            if cfg.start_at is not None:
                await asyncio.sleep(max(0.0, cfg.start_at - time.monotonic()))
            self.load_t0 = cfg.start_at if cfg.start_at is not None else time.monotonic()
            bounded = cfg.duration_s > 0
            self._deadline = self.load_t0 + self._wall(cfg.duration_s) if bounded else float("inf")
            # the measured window's start: after the warm-up, or (document rounds) when the first measured
            # request goes out (_send)
            opening = (
                asyncio.ensure_future(self._window_start_at(self._wall(cfg.warmup_s)))
                if not self.source.measure_phases
                else None
            )
            closing = asyncio.ensure_future(self._window_end_at(self._deadline)) if bounded else None
            if cfg.mode == "request_rate":
                if not bounded and not self.source.finite:
                    raise ValueError("a request rate on an endless shape needs a length: set traffic.duration_s")
                main = asyncio.ensure_future(self._open_loop())
            elif cfg.mode == "trace":
                main = asyncio.ensure_future(self._trace())
            else:
                main = asyncio.ensure_future(self._closed_loop())
            wait_s = self._wall(cfg.duration_s) + cfg.drain_timeout_s if bounded else None
            done, _ = await asyncio.wait([main], timeout=wait_s)
            # a finite source (a trace, sessions) that ran out before the deadline: the load ended with its last
            # answer, and rates over the whole configured duration would count idle time
            ran_out = bounded and main in done and time.monotonic() < self._deadline
            if main not in done:
                main.cancel()  # requests still running after the drain time are recorded as timeouts
                # a request stuck where cancelling does not reach (a socket call that ignores it) must not hold
                # the job forever: after a grace the job ends without it, and says so
                done, _ = await asyncio.wait([main], timeout=CANCEL_GRACE_S)
                if main not in done:
                    self.result.abandoned = True
                    log.warning("requests ignored cancellation; the job ends without them",
                                extra={"job_id": cfg.job_id, "grace_s": CANCEL_GRACE_S})  # fmt: skip
            if main.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await main
            if closing is not None and not closing.done():
                closing.cancel()
            if opening is not None and not opening.done():
                opening.cancel()  # the load ended inside its warm-up: there is no window
            elif "start" in self._edges_said:
                self._edge("end")  # an unbounded load's end (its last session, its last document round)
            gc.unfreeze()
        self.result.load_end_s = cfg.duration_s if bounded and not ran_out else self.result.load_end_s
        if self._measured_span and self.source.measure_phases:
            self.result.warmup_s, self.result.load_end_s = self._measured_span[0], self._measured_span[1]
        return self.result

    async def _preconnect(self) -> None:
        cfg = self.config
        wanted = cfg.preconnect
        if wanted is None and cfg.mode == "closed_loop":
            wanted = len(self.source.users)
        elif wanted is None and cfg.mode == "request_rate":
            # a Poisson burst or a pause of the loop puts several arrivals in flight at once: each would open its
            # own connection at the worst moment (thousands a second make this the client's main cost)
            per_wall_s = cfg.load_level / cfg.shards * cfg.time_scale
            wanted = cfg.max_concurrency or min(256, math.ceil(per_wall_s * 0.05))
        elif wanted is None:
            wanted = cfg.max_concurrency or 0
        plain = [e for e in self.router.endpoints if e.base_url.startswith("http://")]
        if wanted <= 0 or not plain:
            return
        each = -(-wanted // len(plain))
        opened = await asyncio.gather(*(preconnect(e.base_url, each) for e in plain))
        log.info("connections opened ahead of the load", extra={"job_id": cfg.job_id, "connections": sum(opened)})

    # -- one request -------------------------------------------------------------------------
    async def _send(self, session: Session, turn: Turn, due: float | None = None) -> bool:
        """``due``: the monotonic moment the schedule sent this request at (open loop, trace): how late it was is
        taken when it was written to the socket, the moment its record starts from, not when its turn came up."""
        cfg = self.config
        assert self._http is not None
        payload: dict[str, object] = {
            "model": cfg.model,
            "max_tokens": turn.output_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "user": session.session_id,  # OpenAI's end-user field: what session-affinity routers key on
        }
        if turn.chat:
            payload["messages"] = turn.messages
        else:
            payload["prompt"] = turn.text()
        endpoint = self.router.pick(session.session_id, turn.head())
        number = session.turn
        if self.source.measure_phases and turn.phase in self.source.measure_phases:
            self._edge("start")
        # the record's id goes out as X-Request-Id: vLLM and SGLang use it as their request id, so engine logs
        # and the mock server's ground truth can be matched to the record
        request_id = new_id()
        started = time.monotonic()
        try:
            if self._limit is not None:
                async with self._limit:
                    result = await self._stream(
                        endpoint.base_url, payload, turn.chat, request_id, due, session.session_id
                    )
            else:
                result = await self._stream(endpoint.base_url, payload, turn.chat, request_id, due, session.session_id)
        except asyncio.CancelledError:
            # cut off at the end of the drain time: a timeout, recorded (it may lie in the window)
            self._emit(session, number, turn, StreamResult(t0=started, error="timeout"), request_id)
            raise
        if due is not None:
            self.result.send_lateness_s.append(max(0.0, result.t0 - due))
        self._emit(session, number, turn, result, request_id)
        text = "".join(result.text)
        if self.config.keep_answers and result.ok and len(self.result.answers) < MAX_ANSWERS:
            self.result.answers[f"{session.session_id}/{number}"] = hashlib.sha256(text.encode()).hexdigest()[:16]
        session.record(turn, text, result.ok)
        return result.ok

    async def _stream(
        self,
        base_url: str,
        payload: dict[str, object],
        chat: bool,
        request_id: str,
        due: float | None = None,
        session_id: str | None = None,
    ) -> StreamResult:
        assert self._http is not None
        cfg = self.config
        headers = {**cfg.headers, "X-Request-Id": request_id}
        if cfg.session_header and session_id is not None:
            headers[cfg.session_header] = session_id
        return await stream_completion(
            self._http,
            base_url,
            payload,
            chat=chat,
            timeout_s=cfg.request_timeout_s,
            headers=headers,
            not_before=due,
        )

    def _emit(self, session: Session, number: int, turn: Turn, result: StreamResult, request_id: str) -> None:
        cfg = self.config
        expected = turn.prompt_tokens
        if result.prompt_tokens is None and self.source.count_tokens is not None and (text := turn.text()) is not None:
            expected = self.source.count_tokens(text)  # no usage from the server: the model's own count
        record = to_record(
            result,
            load_t0=self.load_t0,
            job_id=cfg.job_id,
            workload=cfg.workload,
            session_id=session.session_id,
            turn=number,
            prompt_tokens=expected,
            shard=cfg.shard,
            request_id=request_id,
            time_scale=cfg.time_scale,
        )
        self.on_record(record)
        self.result.requests += 1
        if not record.ok:
            self.result.errors += 1
        end = record.start_s + (record.e2e_s or 0.0)
        self.result.load_end_s = max(self.result.load_end_s, end)
        if self.source.measure_phases and turn.phase in self.source.measure_phases:
            span = self._measured_span
            if not span:
                span.extend([record.start_s, end])
            span[0], span[1] = min(span[0], record.start_s), max(span[1], end)

    async def _gap_wall(self, seconds: float) -> bool:
        """Wait ``seconds`` of wall time, or until the load ends; False when it ended."""
        await asyncio.sleep(min(seconds, max(0.0, self._deadline - time.monotonic())))
        return time.monotonic() < self._deadline

    async def _gap(self, seconds: float) -> bool:
        """Wait a session's recorded gap (engine seconds); False when the load ends first."""
        honored = seconds if seconds > 0 and self.config.honor_gaps else 0.0
        return await self._gap_wall(self._wall(honored))

    async def _session(self, session: Session, due: float | None = None) -> bool:
        """Every turn of one session in order (gaps between them); False when its last request failed. ``due``:
        when the schedule sends its first turn (a trace's timestamp)."""
        first, ok = True, True
        while (turn := session.next_turn()) is not None:
            if not first and not await self._gap(turn.gap_s):
                return ok
            if time.monotonic() >= self._deadline:
                return ok
            ok = await self._send(session, turn, due if first else None)
            first = False
        return ok

    # -- arrival modes ---------------------------------------------------------------------------
    async def _closed_loop(self) -> None:
        one_each = self.config.duration_s <= 0 and not self.source.finite

        async def user(index: int) -> None:
            failures = 0
            while time.monotonic() < self._deadline:
                session = self.source.next_session(index)
                if session is None:
                    return
                ok = await self._session(session)
                if one_each:
                    return
                # a failed turn ends its session; back off before the next one instead of spinning on a dead engine
                failures = 0 if ok else failures + 1
                if failures and not await self._gap_wall(
                    min(ERROR_BACKOFF_MAX_S, ERROR_BACKOFF_S * 2 ** (failures - 1))
                ):
                    return

        await asyncio.gather(*(user(u) for u in self.source.users))

    async def _open_loop(self) -> None:
        cfg = self.config
        rate = max(cfg.load_level / cfg.shards, 1e-9) * cfg.time_scale  # per wall-clock second
        rng = random.Random(f"{cfg.seed}/{cfg.shard}")
        ready: deque[Session] = deque()
        waiting = [0]  # sessions in flight or in a gap: they will come back ready
        in_flight: set[asyncio.Task[None]] = set()
        opened = 0
        exhausted = False
        loop = asyncio.get_running_loop()

        async def one(session: Session, turn: Turn, due: float) -> None:
            try:
                if time.monotonic() >= self._deadline:
                    # scheduled inside the window but reached after it (a busy event loop): a request sent once
                    # the load has ended would be stamped after the load's end, so it is skipped and counted, and
                    # how late it was is kept with the others'
                    self.result.late_arrivals += 1
                    self.result.send_lateness_s.append(max(0.0, time.monotonic() - due))
                    return
                await self._send(session, turn, due)
            finally:
                following = session.next_turn()
                if following is None:
                    waiting[0] -= 1
                elif following.gap_s > 0 and cfg.honor_gaps:
                    loop.call_later(self._wall(following.gap_s), _back, session)
                else:
                    _back(session)

        def _back(session: Session) -> None:
            waiting[0] -= 1
            ready.append(session)

        # the schedule counts from the load's start, shared by every shard: a worker that got here after it (a
        # loaded machine) sends its first arrivals late and records how late, rather than shifting its schedule
        next_t = self.load_t0
        for gap in arrival_gaps(rate, cfg.distribution, cfg.burstiness, rng):
            next_t += gap
            if next_t >= self._deadline:
                break
            ahead_s = next_t - _SEND_LEAD_S - time.monotonic()
            if ahead_s > 0:
                await asyncio.sleep(ahead_s)
            session: Session | None = ready.popleft() if ready else None
            if session is None and not exhausted:
                session = self.source.next_session(opened)
                opened += 1
                exhausted = session is None
            turn = session.next_turn() if session is not None else None
            if session is None or turn is None:
                self.result.skipped_arrivals += 1
                if exhausted and not ready and waiting[0] == 0 and not in_flight:
                    break  # replayed data is used up
                continue
            waiting[0] += 1
            task = asyncio.create_task(one(session, turn, next_t))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.gather(*in_flight)

    async def _trace(self) -> None:
        in_flight: set[asyncio.Task[bool]] = set()
        lags = self.result.replay_lags_s
        ahead: deque[Session] = deque()  # sessions whose prompts are already built, in schedule order
        exhausted = False

        def start_of(session: Session) -> float:
            return self.load_t0 + self._wall(session.start_at_s or 0.0)

        while True:
            if not ahead:
                first = None if exhausted else self.source.next_session(0)
                if first is None:
                    break
                first.next_turn()
                ahead.append(first)
            at = start_of(ahead[0])
            if at >= self._deadline:
                break
            # spend the wait building upcoming prompts (a long novel one takes tens of ms): a burst of requests
            # tied to one timestamp then leaves at once instead of each waiting for the next one's text
            while not exhausted and len(ahead) < 1024 and at - time.monotonic() > 0.05:
                upcoming = self.source.next_session(0)
                if upcoming is None:
                    exhausted = True
                    break
                upcoming.next_turn()
                ahead.append(upcoming)
                await asyncio.sleep(0)  # let the requests already sent read their streams in between
            await wait_until(at)
            session = ahead.popleft()
            lags.append(max(0.0, time.monotonic() - at) * self.config.time_scale)
            task = asyncio.create_task(self._session(session, at))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.gather(*in_flight)
