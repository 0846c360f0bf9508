"""Server mode: an OpenAI-compatible HTTP surface over the engine core, paced to the wall clock.

Each engine step is computed in virtual time and its tokens are released when the wall clock (times
``speed``) reaches the step's end, so timings do not depend on how fast this machine is; only pacing can
slip, and slips are counted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kvbench_sim.engine import Engine, SimRequest, TokenEvent
from kvbench_sim.metrics import SglangMetrics, VllmMetrics
from kvbench_sim.text import chat_to_prompt, output_words, tokenize
from kvbench_sim.tiers import Link, Transfer
from kvbench_stacks.catalog import LOCAL_CACHE_RESET

__all__ = ["PacedEngine", "build_app"]

log = logging.getLogger(__name__)


class PacedEngine:
    def __init__(self, engine: Engine, speed: float = 1.0, transfer: Link | None = None) -> None:
        self.engine = engine
        self.speed = speed
        # P/D decode side: the link prompts' KV arrives over from prefill engines (flows share its bandwidth)
        self.transfer = transfer
        self.on_transfer: Callable[[float, float], None] | None = None  # (bytes, seconds) of each landed transfer
        self._t0 = time.monotonic()
        self._clock_s = 0.0
        self._queues: dict[str, asyncio.Queue[TokenEvent]] = {}
        self._callbacks: dict[str, Callable[[TokenEvent], None]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.late_steps = 0
        # when each streamed token was written against its due time (signed seconds: negative is early); filled
        # during a step's burst of writes and handed to ``on_timing`` after it, so bookkeeping never delays writes
        self.timing: list[float] = []
        self.on_timing: Callable[[list[float]], None] | None = None
        # wall seconds one write of a burst costs (moving average): a burst starts half its expected length before
        # its due time, so its tokens straddle the due time instead of all trailing it
        self.write_cost_s = _INITIAL_WRITE_COST_S
        self._burst: list[tuple[asyncio.Transport, bytes, float]] = []  # a step's writes: transport, bytes, due
        self._after: list[Callable[[], None]] = []  # what must follow the writes (a finished stream's handler)
        # a second writer for large bursts: socket writes release the GIL, so two threads halve a burst's time
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sim-writer")

    def now_s(self) -> float:
        return self.virtual_at(time.monotonic())

    def virtual_at(self, monotonic_s: float) -> float:
        """This engine's virtual time at monotonic time ``monotonic_s``."""
        return (monotonic_s - self._t0) * self.speed

    def wake(self) -> None:
        """Something this engine waits for happened elsewhere (a store said a transfer is through)."""
        self._wake.set()

    def due_wall(self, virtual_s: float) -> float:
        """The monotonic wall time at which something due at ``virtual_s`` should happen."""
        return self._t0 + virtual_s / self.speed

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sim-engine-steps")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._writer.shutdown(wait=False)

    def emit(
        self, transport: asyncio.Transport, data: bytes, due_s: float, after: Callable[[], None] | None = None
    ) -> None:
        """Queue ``data`` for the socket in this step's burst, written when the step's tokens come due; ``after``
        runs once it is written."""
        self._burst.append((transport, data, self.due_wall(due_s)))
        if after is not None:
            self._after.append(after)

    def _flush(self) -> None:
        """Write the step's burst. Large bursts are split between this thread and the writer thread, each writing
        straight to the sockets whose transports hold nothing unsent (so bytes never overtake buffered ones);
        whatever a socket does not take goes through its transport, in order, after."""
        burst, self._burst = self._burst, []
        timing = self.timing
        started = time.monotonic()
        direct: list[tuple[asyncio.Transport, bytes, float, int]] = []
        for transport, data, due in burst:
            if transport.is_closing():
                continue  # the client left while the step ran (its socket may even be another's by now)
            fd = _socket_fd(transport) if len(burst) >= _PARALLEL_BURST else None
            if fd is None or transport.get_write_buffer_size():
                transport.write(data)
                timing.append(time.monotonic() - due)
            else:
                direct.append((transport, data, due, fd))
        if direct:
            half = len(direct) // 2
            other = self._writer.submit(_write_direct, direct[half:], timing)
            rest = _write_direct(direct[:half], timing) + other.result()
            for transport, data, due in rest:
                transport.write(data)
                timing.append(time.monotonic() - due)
        if len(burst) >= _MEASURED_BURST:
            cost = (time.monotonic() - started) / len(burst)
            self.write_cost_s += (cost - self.write_cost_s) / 8

    def burst_lead_s(self, writes: int, step_wall_s: float) -> float:
        """How long before its due time a burst of ``writes`` starts: half its expected length (so the first token
        is as early as the last is late), never more than half the step, never more than ``_MAX_LEAD_S``."""
        return min(writes * self.write_cost_s / 2, step_wall_s / 2, _MAX_LEAD_S)

    def submit(self, request: SimRequest) -> asyncio.Queue[TokenEvent]:
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._queues[request.request_id] = queue
        self.engine.add(request)
        self._wake.set()
        return queue

    def submit_callback(self, request: SimRequest, on_token: Callable[[TokenEvent], None]) -> None:
        """Streaming fast path: ``on_token`` runs inside the pacer as each token comes due (no queue, no
        coroutine wake-up per token: 500 streams cost one pass over 500 callbacks per step)."""
        self._callbacks[request.request_id] = on_token
        self.engine.add(request)
        self._wake.set()

    def submit_transferred(self, request: SimRequest, kv_bytes: float, setup_s: float,
                           on_token: Callable[[TokenEvent], None]) -> None:  # fmt: skip
        """P/D decode side: the prompt's KV comes over the transfer link; the request joins the batch when it has
        landed, with every prompt token but the last already computed."""
        assert self.transfer is not None
        self._callbacks[request.request_id] = on_token
        self.transfer.start(self.now_s(), Transfer("pd", kv_bytes, setup_s, (request, self.now_s())))
        self._wake.set()

    def _land_transfers(self, now_s: float) -> float | None:
        """Hand landed P/D transfers to the engine; returns when the next one lands."""
        if self.transfer is None:
            return None
        for transfer in self.transfer.landed(now_s):
            assert isinstance(transfer.on_done, tuple)
            request: SimRequest = transfer.on_done[0]
            started: float = transfer.on_done[1]
            if request.request_id in self._callbacks:  # not aborted meanwhile
                self.engine.add_transferred(request)
                if self.on_transfer is not None:
                    self.on_transfer(self.transfer_bytes(request), now_s - started)
        return self.transfer.next_done_s(now_s)

    def transfer_bytes(self, request: SimRequest) -> float:
        return request.prompt_len * self.engine.profile.model.kv_bytes_per_token

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        self._queues.pop(request_id, None)
        self._callbacks.pop(request_id, None)

    async def _run(self) -> None:
        while True:
            landing = self._land_transfers(max(self._clock_s, self.now_s()))
            plan = self.engine.schedule(max(self._clock_s, self.now_s()))
            if plan is None:
                # idle: wait for a request, a KV transfer landing or the end of a (re)start, whichever is first
                now = self.now_s()
                times = [t for t in (self.engine.next_transfer_s(), landing) if t is not None]
                transfer = min(times) if times else None
                if transfer is not None and transfer <= now:
                    await asyncio.sleep(0)  # landed while we looked: apply it on the next pass, never sleep past it
                    continue
                future = [t for t in (transfer, self.engine.serving_from_s) if t is not None and t > now]
                self._wake.clear()
                timeout = (min(future) - now) / self.speed if future else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            start = max(self._clock_s, self.now_s())
            end = start + plan.duration_s
            # apply the step while it "runs" (its results are fixed) and build its streams' bytes, so only the
            # writes wait for the due time
            events = self.engine.complete(plan, end)
            waiting: list[TokenEvent] = []
            for event in events:
                callback = self._callbacks.get(event.request_id)
                if callback is None:
                    waiting.append(event)
                    continue
                callback(event)
                if event.finished:
                    self._callbacks.pop(event.request_id, None)
            due = self._t0 + end / self.speed - self.burst_lead_s(len(self._burst), plan.duration_s / self.speed)
            delay = due - time.monotonic()
            if delay > _SPIN_S:
                await asyncio.sleep(delay - _SPIN_S)  # the loop's timers are millisecond-grained ...
            if delay > 0:
                while time.monotonic() < due:  # ... so the last stretch is waited out exactly
                    pass
            elif delay < -0.005:
                self.late_steps += 1
            self._clock_s = end
            if self._burst:
                self._flush()
            after, self._after = self._after, []
            for finish in after:
                finish()
            for event in waiting:
                queue = self._queues.get(event.request_id)
                if queue is not None:
                    queue.put_nowait(event)
                if event.finished:
                    self._queues.pop(event.request_id, None)
            if self.timing:
                samples, self.timing = self.timing, []
                if self.on_timing is not None:
                    self.on_timing(samples)


_PARALLEL_BURST = 64  # smaller bursts are written from the loop's thread alone
_MEASURED_BURST = 16  # bursts at least this long update the per-write cost
_INITIAL_WRITE_COST_S = 10e-6  # a loopback socket write on a small VM, until bursts say otherwise
_MAX_LEAD_S = 0.005  # a burst never starts more than this before its due time
_SPIN_S = 0.0015  # how early the pacer wakes before a step's tokens come due, to wait the rest out exactly


def _socket_fd(transport: asyncio.Transport) -> int | None:
    sock = transport.get_extra_info("socket")
    try:
        return int(sock.fileno()) if sock is not None else None
    except (OSError, ValueError):
        return None


def _write_direct(
    writes: list[tuple[asyncio.Transport, bytes, float, int]], timing: list[float]
) -> list[tuple[asyncio.Transport, bytes, float]]:
    """Write each payload to its socket (non-blocking); returns what a full socket did not take."""
    rest: list[tuple[asyncio.Transport, bytes, float]] = []
    for transport, data, due, fd in writes:
        try:
            sent = os.write(fd, data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            continue  # the peer is gone: the transport notices and the stream is aborted
        if sent < len(data):
            rest.append((transport, data[sent:], due))
        else:
            timing.append(time.monotonic() - due)
    return rest


_RUNNING = b',"logprobs":null,"finish_reason":null}]}\n\n'
_FINISHED = b',"logprobs":null,"finish_reason":"length"}]}\n\n'


def _transfer_params(body: dict[str, Any], paced: PacedEngine) -> bool:
    """True for a P/D decode request whose prompt KV is to be pulled from a prefill engine."""
    params = body.get("kv_transfer_params")
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        return False
    if paced.transfer is None:
        error = "kv_transfer_params: this engine is not a P/D decode engine (start it with --pd-role decode)"
        raise web.HTTPBadRequest(text=json.dumps({"error": error}))
    return True


def _prompt_tokens(body: dict[str, Any], chat: bool) -> list[str]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise web.HTTPBadRequest(text=json.dumps({"error": "messages: a non-empty list is required"}))
        return tokenize(chat_to_prompt(messages))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return [str(t) for t in prompt]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt.strip():
        raise web.HTTPBadRequest(text=json.dumps({"error": "prompt: a non-empty string is required"}))
    return tokenize(prompt)


def build_app(
    paced: PacedEngine,
    model: str,
    seed: int = 0,
    flavor: str = "vllm",
    engine_id: str = "sim-0",
    pd_setup_s: float = 0.0,
    uncounted_tiers: frozenset[str] = frozenset(),
    ready: Callable[[], bool] = lambda: True,
) -> web.Application:
    """``engine_id``: how this engine names itself to a P/D router (``kv_transfer_params.remote_engine_id``);
    ``pd_setup_s``: the fixed cost of each P/D transfer on the decode side (handshake, descriptors);
    ``uncounted_tiers``: shared tiers whose census another engine reports (a server's disk is counted once);
    ``ready``: whether it may say it is healthy (its shared stores' indexes have arrived)."""
    metrics: VllmMetrics | SglangMetrics = SglangMetrics(model) if flavor == "sglang" else VllmMetrics(model)
    metrics.describe_cache(paced.engine)
    slips = Counter("kvbench_sim_late_steps", "Steps released late by the pacer", registry=metrics.registry)
    timing_buckets = (0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.5, 2.0)
    lateness = Histogram(
        "kvbench_sim_token_lateness_seconds",
        "Wall time a streamed token was written after its virtual due time, 0 when written early (pacing slip)",
        buckets=timing_buckets,
        registry=metrics.registry,
    )
    timing_error = Histogram(
        "kvbench_sim_token_timing_error_seconds",
        "Wall time between a streamed token's write and its virtual due time, early or late (a step's burst of "
        "writes is centred on the due time)",
        buckets=timing_buckets,
        registry=metrics.registry,
    )
    tier_chunks = Gauge(
        "kvbench_sim_tier_chunks",
        "Chunks each KV tier holds (for a shared tier, the whole store's index as this engine sees it)",
        ["tier"],
        registry=metrics.registry,
    )
    tier_bytes = Gauge(
        "kvbench_sim_tier_bytes",
        "Bytes of the chunks each KV tier holds (a disk tier's files, as a census of its directory would count them)",
        ["tier"],
        registry=metrics.registry,
    )
    pd_sent = Counter(
        "kvbench_sim_pd_bytes_sent",
        "P/D prefill side: bytes of prompt KV this engine offered decode engines to pull (vLLM counts a transfer on "
        "the decode side only)",
        registry=metrics.registry,
    )
    cross_instance = Counter(
        "kvbench_sim_cross_instance_hit_tokens",
        "Prompt tokens this engine loaded from a shared tier that another engine computed and stored, by that engine",
        ["computed_by"],
        registry=metrics.registry,
    )
    counter = {"n": 0}

    def observe_timing(samples: list[float]) -> None:
        for error in samples:
            lateness.observe(max(0.0, error))
            timing_error.observe(abs(error))

    paced.on_timing = observe_timing
    paced.on_transfer = metrics.kv_transfer

    async def health(_: web.Request) -> web.Response:
        if not ready():  # as an engine whose KV connector has not reached its cache server or store yet
            return web.Response(status=503, text="waiting for the shared KV store's index")
        return web.Response(text="")

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "kvbench-sim"}]}
        )

    async def metrics_endpoint(_: web.Request) -> web.Response:
        metrics.refresh(paced.engine)
        for tier in paced.engine.tiers:
            if tier.name in uncounted_tiers:
                continue
            tier_chunks.labels(tier.name).set(tier.chunks)
            tier_bytes.labels(tier.name).set(tier.chunks * tier.bytes_per_chunk)
        for pair, tokens in paced.engine.counters.cross_hits.items():
            child = cross_instance.labels(pair.split("->", 1)[0])
            child.inc(tokens - child._value.get())
        slips.inc(paced.late_steps - slips._value.get())
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def reset_prefix_cache(_: web.Request) -> web.Response:
        dropped = paced.engine.pool.reset()
        if flavor == "sglang":
            # SGLang's /flush_cache resets HiCache's host pool with the radix tree (HiRadixCache.reset); a storage
            # backend (its L3: Mooncake, files) keeps what it holds
            for tier in paced.engine.tiers:
                if tier.name == "host" and not tier.config.store_id:
                    tier.clear()
        return web.json_response({"dropped_blocks": dropped})

    async def generate(request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            raise web.HTTPBadRequest(text=json.dumps({"error": "body: invalid JSON"})) from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text=json.dumps({"error": "body: a JSON object is required"}))
        tokens = _prompt_tokens(body, chat)
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        transfer_in = _transfer_params(body, paced)
        engine = paced.engine
        if engine._blocks_for(len(tokens) + max_tokens) > engine.pool.num_blocks:
            raise web.HTTPBadRequest(text=json.dumps({"error": "prompt plus max_tokens exceed the KV cache"}))
        counter["n"] += 1
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{counter['n']}"
        sim_req = SimRequest(rid, tokens, max_tokens, arrival_s=paced.now_s())
        intake = engine.profile.intake_s(len(tokens))
        if intake > 0:  # the serving path in front of the engine core (profile's request_ms and per-token cost)
            await asyncio.sleep(intake / paced.speed)
        words = output_words(tokens, max_tokens, seed)
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def usage() -> dict[str, Any]:
            return {
                "prompt_tokens": len(tokens),
                "completion_tokens": sim_req.output,
                "total_tokens": len(tokens) + sim_req.output,
                "prompt_tokens_details": {"cached_tokens": sim_req.cached_tokens},
            }

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            if chat:
                return {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

        if not stream:
            if transfer_in:
                raise web.HTTPBadRequest(text=json.dumps({"error": "kv_transfer_params: a P/D decode must stream"}))
            queue = paced.submit(sim_req)
            while True:
                event = await queue.get()
                if event.index == 0:  # the engine's view, streamed or not (as vLLM's own histograms)
                    metrics.ttft.labels(model, "0").observe(event.time_s - sim_req.arrival_s)
                if event.finished:
                    break
            text = " " + " ".join(words[: sim_req.output])
            metrics.e2e.labels(model, "0").observe(event.time_s - sim_req.arrival_s)
            metrics.success.labels(model, "0", "length").inc()
            message: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                if chat
                else {"index": 0, "text": text, "finish_reason": "length"}
            )
            reply: dict[str, Any] = {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": model,
                "choices": [message],
                "usage": usage(),
            }
            if isinstance(body.get("kv_transfer_params"), dict) and body["kv_transfer_params"].get("do_remote_decode"):
                # P/D prefill side: what the decode engine needs to pull this prompt's KV (vLLM's NIXL fields)
                host, port = [*request.host.rsplit(":", 1), "80"][:2]
                reply["kv_transfer_params"] = {
                    "do_remote_prefill": True,
                    "do_remote_decode": False,
                    "remote_engine_id": engine_id,
                    "remote_request_id": rid,
                    "remote_host": host,
                    "remote_port": int(port),
                    "remote_block_ids": [],
                    "prompt_tokens": len(tokens),
                }
                pd_sent.inc(len(tokens) * paced.engine.profile.model.kv_bytes_per_token)  # what the decode side pulls
            return web.json_response(reply)

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        transport = request.transport
        if transport is None:
            paced.abort(rid)
            return response
        # each SSE event is framed as one HTTP chunk and written straight to the socket from the pacer; aiohttp has
        # sent the headers (chunked) and writes the closing chunk when the handler returns
        head = (
            f'data: {{"id":"{rid}","object":"{obj}","created":{created},"model":{json.dumps(model)},"choices":[{{'
            + ('"index":0,"delta":{"content":" ' if chat else '"index":0,"text":" ')
        ).encode()
        after = b'"}' if chat else b'"'
        tokens_out = [w.encode() for w in words]

        def frame(data: bytes) -> bytes:
            return f"{len(data):x}\r\n".encode() + data + b"\r\n"

        def tail(payload: dict[str, Any] | str) -> bytes:
            data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
            return frame(b"data: " + data.encode() + b"\n\n")

        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_token(event: TokenEvent) -> None:
            if transport.is_closing():
                paced.abort(rid)
                if not done.done():
                    done.set_exception(ConnectionResetError())
                return
            # output words are plain ASCII ("w123"): no JSON escaping needed
            data = head + tokens_out[event.index] + after + (_FINISHED if event.finished else _RUNNING)
            chunk = b"%x\r\n%b\r\n" % (len(data), data)
            if event.index == 0:
                metrics.ttft.labels(model, "0").observe(event.time_s - sim_req.arrival_s)
            if event.finished:
                metrics.e2e.labels(model, "0").observe(event.time_s - sim_req.arrival_s)
                metrics.success.labels(model, "0", "length").inc()
                if include_usage:
                    chunk += tail(
                        {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": usage()}
                    )
                chunk += tail("[DONE]")
                paced.emit(transport, chunk, event.time_s, finish)  # the handler ends once the burst is written
                return
            paced.emit(transport, chunk, event.time_s)

        def finish() -> None:
            if not done.done():
                done.set_result(None)

        if chat:
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            transport.write(tail({"id": rid, "object": obj, "created": created, "model": model, "choices": [role]}))
        if transfer_in:
            paced.submit_transferred(sim_req, paced.transfer_bytes(sim_req), pd_setup_s, on_token)
        else:
            paced.submit_callback(sim_req, on_token)
        try:
            await done
        except (ConnectionResetError, asyncio.CancelledError):
            paced.abort(rid)
            raise
        return response

    async def completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, chat=False)

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await generate(request, chat=True)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes(
        [
            web.get("/health", health),
            web.get("/v1/models", models),
            web.get("/metrics", metrics_endpoint),
            web.post("/v1/completions", completions),
            web.post("/v1/chat/completions", chat_completions),
        ]
    )

    reset_route = LOCAL_CACHE_RESET.get(flavor, "/reset_prefix_cache")
    if reset_route:  # the engine's own route (a TensorRT-LLM server has none)
        app.add_routes([web.post(reset_route, reset_prefix_cache)])

    async def on_startup(_: web.Application) -> None:
        paced.start()

    async def on_cleanup(_: web.Application) -> None:
        await paced.stop()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
