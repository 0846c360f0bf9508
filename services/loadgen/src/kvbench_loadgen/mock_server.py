"""A fast mock OpenAI server for tests and benchmarks: configurable TTFT and inter-token gaps, and its own record
of when it sent each chunk, so a client's timing error can be measured against ground truth.

Timing is scheduled on the server's monotonic clock from the moment the request was read; ``sent`` holds, per
request id (the ``X-Request-Id`` header, else a counter), the monotonic times at which each chunk was handed to
the socket.
Client and server run on the same machine, so both clocks are the same ``time.monotonic``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["MockServer", "MockTiming"]


@dataclass
class MockTiming:
    ttft_s: float = 0.05
    itl_s: float = 0.01
    tokens_per_chunk: int = 1


@dataclass
class MockServer:
    timing: MockTiming = field(default_factory=MockTiming)
    received: dict[str, float] = field(default_factory=dict)
    sent: dict[str, list[float]] = field(default_factory=dict)
    chat_requests: int = 0
    keep_log: bool = True  # a long-running server must not grow without bound
    _count: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes(
            [
                web.post("/v1/completions", self._complete),
                web.post("/v1/chat/completions", self._complete),
                web.get("/health", self._health),
                web.get("/v1/models", self._models),
            ]
        )
        return app

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "mock", "object": "model"}]})

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        t_read = time.monotonic()
        body: dict[str, Any] = await request.json()
        self._count += 1
        rid = request.headers.get("X-Request-Id") or f"m{self._count}"
        if self.keep_log:
            self.received[rid] = t_read
        max_tokens = int(body.get("max_tokens") or 16)
        chat = request.path.endswith("/chat/completions")
        if chat:
            self.chat_requests += 1
            prompt = " ".join(str(m.get("content") or "") for m in body.get("messages") or [])
        else:
            prompt = str(body.get("prompt") or "")
        prompt_tokens = len(prompt.split())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        times: list[float] = []
        if self.keep_log:
            self.sent[rid] = times
        per = max(1, self.timing.tokens_per_chunk)
        chunks = (max_tokens + per - 1) // per
        for k in range(chunks):
            due = t_read + self.timing.ttft_s + k * self.timing.itl_s * per
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            n = min(per, max_tokens - k * per)
            text = " tok" * n
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            event = b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"
            times.append(time.monotonic())  # stamped as it is handed to the socket: a client cannot see it earlier
            await response.write(event)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        await response.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response


def main(argv: list[str] | None = None) -> None:
    """``python -m kvbench_loadgen.mock_server --port 8199 --ttft-ms 50 --itl-ms 10``: a server to point
    ``kvbench load`` at (its own send log is only kept in process, for the benchmarks)."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="kvbench-mock-openai")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8199)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    args = parser.parse_args(argv)
    server = MockServer(MockTiming(args.ttft_ms / 1000, args.itl_ms / 1000, args.tokens_per_chunk))
    server.keep_log = False
    web.run_app(server.app(), host=args.host, port=args.port, print=None, access_log=None, backlog=4096)


if __name__ == "__main__":
    main()
