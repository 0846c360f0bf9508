from __future__ import annotations

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from kvbench_loadgen.client import stream_completion
from kvbench_loadgen.mock_server import MockServer, MockTiming


async def test_mock_server_injects_timing_and_keeps_its_own_record() -> None:
    mock = MockServer(MockTiming(ttft_s=0.05, itl_s=0.02, tokens_per_chunk=2))
    server = TestServer(mock.app())
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            result = await stream_completion(
                session,
                str(server.make_url("")).rstrip("/"),
                {"model": "mock", "prompt": "a b c", "max_tokens": 6},
                chat=False,
                timeout_s=10,
                headers={"X-Request-Id": "q1"},
            )
        assert result.ok
        assert result.output_tokens == 6
        assert result.prompt_tokens == 3
        assert len(result.chunk_times) == 3  # 6 tokens, 2 per chunk
        sent = mock.sent["q1"]
        assert sent[0] - mock.received["q1"] == pytest.approx(0.05, abs=0.02)
        assert sent[1] - sent[0] == pytest.approx(0.04, abs=0.02)  # 2 tokens x 20 ms
        assert result.chunk_times[0] >= sent[0]  # the client sees a chunk after the server wrote it
    finally:
        await server.close()


async def test_http_errors_resets_and_reused_connections_are_classified() -> None:
    from aiohttp import web  # noqa: PLC0415

    from kvbench_loadgen.sse import _POOLS  # noqa: PLC0415

    async def unavailable(_: web.Request) -> web.Response:
        return web.json_response({"error": "overloaded"}, status=503)

    async def cut(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"text": " a"}]}\n\n')
        assert request.transport is not None
        request.transport.close()  # the server dies mid-stream
        return response

    app = web.Application()
    app.add_routes([web.post("/busy/v1/completions", unavailable), web.post("/cut/v1/completions", cut)])
    server = TestServer(app)
    await server.start_server()
    base = str(server.make_url("")).rstrip("/")
    try:
        busy = await stream_completion(None, base + "/busy", {"prompt": "x", "max_tokens": 2}, False, 5)
        assert busy.error == "http_503"
        again = await stream_completion(None, base + "/busy", {"prompt": "x", "max_tokens": 2}, False, 5)
        assert again.error == "http_503"
        assert sum(len(p) for p in _POOLS.values()) >= 1  # the keep-alive connection went back to the pool
        broken = await stream_completion(None, base + "/cut", {"prompt": "x", "max_tokens": 2}, False, 5)
        assert broken.error == "connection_reset"
        refused = await stream_completion(None, "http://127.0.0.1:9", {"prompt": "x"}, False, 2)
        assert refused.error == "connection_reset"
    finally:
        await server.close()
