"""A minimal HTTP/1.1 client for streamed completions, timestamping server-sent events as the bytes arrive.

Why not aiohttp for this path: its reader wakes the reading coroutine one loop iteration after the bytes came in,
behind every other stream's callbacks, which adds milliseconds to inter-token gaps at 50+ streams. Here the
socket callback itself records the arrival time and splits the events; JSON is parsed after the response ends,
off the timing path. Connections are kept alive and reused per host. Only what an OpenAI-compatible streaming
endpoint needs: POST with a JSON body, a status line, headers, chunked or length-delimited bodies.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["HttpError", "SseResponse", "post_stream"]


class HttpError(ConnectionError):
    """The connection failed or the response could not be read."""


@dataclass
class SseResponse:
    status: int = 0
    events: list[tuple[float, bytes]] = field(default_factory=list)  # (arrival time, data of one "data:" line)
    body: bytes = b""  # a non-streamed (error) body


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self.response = SseResponse()
        self.done: asyncio.Future[SseResponse] | None = None
        self._raw = b""  # undecoded bytes
        self._lines = b""  # decoded body not yet split into lines
        self._headers_done = False
        self._chunked = False
        self._remaining: int | None = None  # Content-Length left, when not chunked
        self._keep_alive = True

    def start(self) -> asyncio.Future[SseResponse]:
        self._reset()
        self.done = asyncio.get_running_loop().create_future()
        return self.done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            if self._headers_done and not self._chunked and self._remaining is None:
                self._finish()  # a body delimited by the close
            else:
                self.done.set_exception(HttpError(str(exc or "connection closed by the server")))

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        self._raw += data
        if not self._headers_done:
            end = self._raw.find(b"\r\n\r\n")
            if end < 0:
                return
            self._head(self._raw[:end])
            self._raw = self._raw[end + 4 :]
        if self._chunked:
            self._dechunk(now)
        else:
            body, self._raw = self._raw, b""
            if self._remaining is not None:
                self._remaining -= len(body)
            self._body(body, now)
            if self._remaining is not None and self._remaining <= 0:
                self._finish()

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        self.response.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key, value = name.strip().lower(), value.strip().lower()
            if key == b"transfer-encoding" and b"chunked" in value:
                self._chunked = True
            elif key == b"content-length" and value.isdigit():
                self._remaining = int(value)
            elif key == b"connection" and value == b"close":
                self._keep_alive = False
        self._headers_done = True

    def _dechunk(self, now: float) -> None:
        while True:
            line_end = self._raw.find(b"\r\n")
            if line_end < 0:
                return
            size = int(self._raw[:line_end].split(b";", 1)[0] or b"0", 16)
            if size == 0:
                if self._raw.find(b"\r\n", line_end + 2) < 0:
                    return  # wait for the end of the (empty) trailer
                self._raw = b""
                self._finish()
                return
            start = line_end + 2
            if len(self._raw) < start + size + 2:
                return
            self._body(self._raw[start : start + size], now)
            self._raw = self._raw[start + size + 2 :]

    def _body(self, data: bytes, now: float) -> None:
        if self.response.status != 200:
            self.response.body += data
            return
        self._lines += data
        *lines, self._lines = self._lines.split(b"\n")
        for line in lines:
            if line.startswith(b"data:"):
                self.response.events.append((now, line[5:].strip()))

    def _finish(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(self.response)


_POOLS: dict[tuple[int, str, int], list[_Protocol]] = defaultdict(list)


async def post_stream(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> SseResponse:
    """POST ``body`` and collect the streamed events; raises ``HttpError`` or ``TimeoutError``."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)
    if parts.scheme != "http":
        raise HttpError(f"{parts.scheme}: only plain http is streamed by this client")
    loop = asyncio.get_running_loop()
    pool = _POOLS[(id(loop), host, port)]
    protocol = None
    while pool and protocol is None:
        candidate = pool.pop()
        if not candidate.closed and candidate.transport is not None and not candidate.transport.is_closing():
            protocol = candidate
    if protocol is None:
        try:
            _, protocol = await loop.create_connection(_Protocol, host, port)
        except OSError as exc:
            raise HttpError(str(exc)) from exc
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(body)}\r\n"
    head += "Accept: text/event-stream\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    done = protocol.start()
    assert protocol.transport is not None
    protocol.transport.write(head.encode() + body)
    try:
        async with asyncio.timeout(timeout_s):
            response = await done
    except BaseException:
        protocol.transport.close()  # a half-read response must not be reused
        raise
    if protocol._keep_alive and not protocol.closed:
        pool.append(protocol)
    else:
        protocol.transport.close()
    return response
