from __future__ import annotations

import asyncio

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
        received = mock.received["q1"]
        # The schedule is absolute from the read: a chunk is never early (a busy machine makes it late, by an amount
        # the mock records, which is what makes its log ground truth), and lateness does not accumulate.
        assert sent[0] - received >= 0.05
        assert sent[1] - received >= 0.05 + 0.04  # then 2 tokens x 20 ms
        assert sent[2] - received >= 0.05 + 0.08
        assert sent[2] - received < 0.05 + 0.08 + 0.5
        # the client sees a chunk after the server wrote it (to the microseconds of the kernel stamp's conversion)
        assert result.chunk_times[0] >= sent[0] - 0.001
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
        # the keep-alive connection went back to the pool
        assert sum(len(idle) for hosts in _POOLS.values() for idle in hosts.values()) >= 1
        broken = await stream_completion(None, base + "/cut", {"prompt": "x", "max_tokens": 2}, False, 5)
        assert broken.error == "connection_reset"
        refused = await stream_completion(None, "http://127.0.0.1:9", {"prompt": "x"}, False, 2)
        assert refused.error == "connection_refused"  # nothing listens: said apart from a connection cut
    finally:
        await server.close()


async def test_events_are_stamped_when_they_reach_the_socket_even_while_the_loop_is_busy() -> None:
    """A chunk that arrives while the client's loop is blocked keeps its arrival time (the kernel's receive stamp),
    not the time the loop got round to reading it."""
    import socket  # noqa: PLC0415
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    from kvbench_loadgen.sse import post_stream  # noqa: PLC0415

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sent: list[float] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n")
            for k, pause in enumerate((0.05, 0.3, 0.0)):
                event = b'data: {"n": %d}\n\n' % k
                sent.append(time.monotonic())
                conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
                time.sleep(pause)
            conn.sendall(b"0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    task = asyncio.ensure_future(post_stream(f"http://127.0.0.1:{port}/v1/completions", b"{}", {}, 5))
    await asyncio.sleep(0.02)  # the request is out and the first event has arrived
    time.sleep(0.2)  # the loop is stuck while the second event arrives (50 ms in)
    response = await task
    thread.join(2)
    listener.close()
    assert response.status == 200
    assert [data for _, data in response.events] == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']
    lags = [arrived - at for (arrived, _), at in zip(response.events, sent, strict=True)]
    # the second was read 0.17 s late; a few microseconds either way are the two clocks' conversion
    assert all(-0.001 <= lag < 0.01 for lag in lags), lags


async def test_connection_set_up_is_its_own_figure_and_not_in_ttft(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow connection set-up (a far host, a full accept queue) is measured apart: TTFT runs from the request's
    write to the socket; a request that reuses a kept-alive connection, or one opened ahead, has no connect time."""
    from kvbench_loadgen import sse  # noqa: PLC0415

    opened = sse._Connection.open

    async def slow_open(host: str, port: int) -> sse._Connection:
        await asyncio.sleep(0.3)  # the handshake of a distant or busy server
        return await opened(host, port)

    monkeypatch.setattr(sse._Connection, "open", staticmethod(slow_open))
    mock = MockServer(MockTiming(ttft_s=0.02, itl_s=0.002))
    server = TestServer(mock.app())
    await server.start_server()
    base = str(server.make_url("")).rstrip("/")
    body = {"model": "mock", "prompt": "a b c", "max_tokens": 4}
    try:
        started = asyncio.get_running_loop().time()
        first = await stream_completion(None, base, body, False, 10)
        assert first.ok
        assert first.connect_s is not None
        assert first.connect_s >= 0.3
        assert first.t0 - started >= 0.3  # the send came after the connection was up
        ttft = first.chunk_times[0] - first.t0
        assert 0.015 < ttft < 0.25, ttft  # the server's 20 ms, not the 300 ms handshake
        reused = await stream_completion(None, base, body, False, 10)
        assert reused.ok
        assert reused.connect_s is None
        # three opened ahead of three concurrent requests: none of them waits for a handshake
        assert await sse.preconnect(base, 3) >= 3
        ahead = await asyncio.gather(*(stream_completion(None, base, body, False, 10) for _ in range(3)))
        assert [r.connect_s for r in ahead] == [None, None, None]
    finally:
        await server.close()
