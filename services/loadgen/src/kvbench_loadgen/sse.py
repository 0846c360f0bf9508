"""A minimal HTTP/1.1 client for streamed completions, timestamping server-sent events as the bytes arrive.

Why not aiohttp for this path: its reader wakes the reading coroutine one loop iteration after the bytes came in,
behind every other stream's callbacks, which adds milliseconds to inter-token gaps at 50+ streams. Here the
socket is read with ``recvmsg`` from a reader callback, and each read carries the kernel's receive timestamp
(``SO_TIMESTAMPNS``): when the segment reached the socket, not when this process got round to reading it, so a
busy loop or a descheduled process does not shift the timings. The kernel stamps on the real-time clock; each
stamp is moved onto the monotonic clock with the offset between the two clocks read at that moment, and clamped
between the request's send and the read (a clock step can never produce an impossible time). Where the kernel
gives no stamp, the read time is used. Limit: segments of one connection that wait in the kernel together are
merged and carry the later one's stamp, so events are told apart only while the reader is late by less than the
gap between them (a late read still never stamps later than the read itself).
JSON is parsed after the response ends, off the timing path. Connections are kept alive and reused per host; a
response says when its request was written to the socket (TTFT's origin) and, apart from it, how long opening a
new connection took, so neither hides the other; ``preconnect`` opens connections before a schedule starts.
Only what an OpenAI-compatible streaming endpoint needs: POST with a JSON body, a status line, headers, chunked
or length-delimited bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import struct
import time
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

__all__ = ["ConnectFailedError", "HttpError", "SseResponse", "post_stream", "preconnect"]


class HttpError(ConnectionError):
    """The connection failed or the response could not be read."""


class ConnectFailedError(HttpError):
    """No connection could be opened (refused, unreachable, no address): nothing was sent."""


@dataclass
class SseResponse:
    status: int = 0
    events: list[tuple[float, bytes]] = field(default_factory=list)  # (arrival time, data of one "data:" line)
    body: bytes = b""  # a non-streamed (error) body
    sent_at: float = 0.0  # monotonic time the request's write to the socket began
    connect_s: float | None = None  # time to open the connection it went on; None: a kept-alive one was reused


# Linux values, absent from the socket module on some builds
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_SCM_TIMESTAMPNS = _SO_TIMESTAMPNS
_READ_SIZE = 256 * 1024
_ADDRESSES: dict[tuple[str, int], list[tuple[Any, ...]]] = {}  # getaddrinfo's answer per (host, port)
_ANCILLARY_SIZE = socket.CMSG_SPACE(16)


def _arrival(ancillary: list[tuple[int, int, bytes]], floor: float) -> float:
    """The monotonic time the kernel received the bytes just read (the read time when it gave no stamp)."""
    now = time.monotonic()
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == _SCM_TIMESTAMPNS and len(data) >= 16:
            seconds, nanoseconds = cast(tuple[int, int], struct.unpack("qq", data[:16]))
            # the clocks' offset in integer nanoseconds, the real-time read bracketed by two monotonic ones
            before = time.monotonic_ns()
            real = time.time_ns()
            offset = real - (before + time.monotonic_ns()) // 2
            stamped = (seconds * 1_000_000_000 + nanoseconds - offset) / 1e9
            return min(now, max(floor, stamped))
    return now


class _Connection:
    """One keep-alive connection: a non-blocking socket read by a loop reader callback."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._sent_at = 0.0
        self._reset()
        self._loop.add_reader(sock.fileno(), self._readable)

    @classmethod
    async def open(cls, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        infos = _ADDRESSES.get((host, port))
        if infos is None:
            # resolved once per host (a lookup runs in a thread: a burst of new connections at thousands of requests
            # a second would queue behind it); a failed connect forgets it, so a moved host is looked up again
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            if not infos:
                raise HttpError(f"{host}: no address")
            _ADDRESSES[(host, port)] = infos
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with contextlib.suppress(OSError):  # no kernel stamps here: read times are used
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, address)
        except BaseException:
            sock.close()
            _ADDRESSES.pop((host, port), None)
            raise
        return cls(sock)

    def _reset(self) -> None:
        self.response = SseResponse()
        self.done: asyncio.Future[SseResponse] | None = None
        self._raw = b""  # undecoded bytes
        self._lines = b""  # decoded body not yet split into lines
        self._headers_done = False
        self._chunked = False
        self._remaining: int | None = None  # Content-Length left, when not chunked
        self._keep_alive = True

    async def request(self, data: bytes) -> asyncio.Future[SseResponse]:
        self._reset()
        self.done = self._loop.create_future()
        self._sent_at = self.response.sent_at = time.monotonic()
        try:
            await self._loop.sock_sendall(self.sock, data)
        except OSError as exc:
            self.close()
            raise HttpError(str(exc)) from exc
        return self.done

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._loop.remove_reader(self.sock.fileno())
            self.sock.close()

    def _readable(self) -> None:
        while not self.closed:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(_READ_SIZE, _ANCILLARY_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._lost(exc)
                return
            if not data:
                self._lost(None)
                return
            self._deliver(data, _arrival(ancillary, self._sent_at))

    def _deliver(self, data: bytes, arrived: float) -> None:
        if self.done is not None and not self.done.done():  # else a stray byte on an idle connection: ignore
            self._data(data, arrived)

    def _lost(self, exc: Exception | None) -> None:
        self.close()
        if self.done is not None and not self.done.done():
            if self._headers_done and not self._chunked and self._remaining is None:
                self._finish()  # a body delimited by the close
            else:
                self.done.set_exception(HttpError(str(exc or "connection closed by the server")))

    def _data(self, data: bytes, now: float) -> None:
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
        # every complete chunk of one read shares its arrival stamp: their payloads go to _body together (a
        # streamed token is one chunk, so per-chunk calls would be the client's main cost at thousands a second)
        raw, position, payloads = self._raw, 0, []
        finished = False
        while True:
            line_end = raw.find(b"\r\n", position)
            if line_end < 0:
                break
            size = int(raw[position:line_end].split(b";", 1)[0] or b"0", 16)
            if size == 0:
                if raw.find(b"\r\n", line_end + 2) < 0:
                    break  # wait for the end of the (empty) trailer
                position, finished = len(raw), True
                break
            start = line_end + 2
            if len(raw) < start + size + 2:
                break
            payloads.append(raw[start : start + size])
            position = start + size + 2
        self._raw = raw[position:]
        if payloads:
            self._body(payloads[0] if len(payloads) == 1 else b"".join(payloads), now)
        if finished:
            self._finish()

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


# idle connections per event loop (a loop's sockets are read by that loop only) and per host
_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, defaultdict[tuple[str, int], list[_Connection]]] = (
    weakref.WeakKeyDictionary()
)


@functools.lru_cache(maxsize=256)
def _target(url: str) -> tuple[str, int, str]:
    """(host, port, path with query) of a plain-http URL; parsed once per URL (a job sends to a few)."""
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise HttpError(f"{parts.scheme}: only plain http is streamed by this client")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname or "127.0.0.1", parts.port or 80, path


def _pool(url: str) -> tuple[str, int, list[_Connection]]:
    host, port, _ = _target(url)
    return host, port, _POOLS.setdefault(asyncio.get_running_loop(), defaultdict(list))[(host, port)]


async def preconnect(url: str, count: int, timeout_s: float = 10.0, parallel: int = 64) -> int:
    """Open connections to ``url``'s host until ``count`` idle ones wait in its pool (``parallel`` at a time, so a
    thousand are not a SYN flood); the number now idle there. Ones that fail to open are left out, not raised:
    their requests open their own, and say so in their connect time."""
    host, port, pool = _pool(url)
    pool[:] = [c for c in pool if not c.closed]
    missing = max(0, count - len(pool))
    gate = asyncio.Semaphore(parallel)

    async def one() -> None:
        async with gate:
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(timeout_s):
                    pool.append(await _Connection.open(host, port))

    await asyncio.gather(*(one() for _ in range(missing)))
    return len(pool)


_TIMER_SLACK_S = 0.001  # an event loop's timers fire up to a millisecond late (uvloop's resolution is 1 ms)


async def wait_until(when: float) -> None:
    """Wait until monotonic ``when`` to well under a millisecond: a timer for all but the last stretch, then yields
    to the loop (other streams' reads go on) until the moment; at most that stretch of spinning per send."""
    delay = when - time.monotonic()
    if delay > _TIMER_SLACK_S:
        await asyncio.sleep(delay - _TIMER_SLACK_S)
    while time.monotonic() < when:  # noqa: ASYNC110 (nothing to wait on but the clock, for under a millisecond)
        await asyncio.sleep(0)


async def post_stream(
    url: str, body: bytes, headers: dict[str, str], timeout_s: float, not_before: float | None = None
) -> SseResponse:
    """POST ``body`` and collect the streamed events; raises ``HttpError`` or ``TimeoutError``. ``not_before``: the
    monotonic moment the request is due; it is written then (a connection to open is opened first)."""
    host, port, pool = _pool(url)
    connection = None
    while pool and connection is None:
        candidate = pool.pop()
        if not candidate.closed:
            connection = candidate
    path = _target(url)[2]
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(body)}\r\n"
    head += "Accept: text/event-stream\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    connect_s: float | None = None
    try:
        async with asyncio.timeout(timeout_s):
            if connection is None:
                opening = time.monotonic()
                try:
                    connection = await _Connection.open(host, port)
                except OSError as exc:
                    raise ConnectFailedError(str(exc)) from exc
                connect_s = time.monotonic() - opening
            data = head.encode() + body
            if not_before is not None:
                await wait_until(not_before)
            done = await connection.request(data)
            response = await done
            response.connect_s = connect_s
    except BaseException:
        if connection is not None:
            connection.close()  # a half-read response must not be reused
        raise
    if connection._keep_alive and not connection.closed:
        pool.append(connection)
    else:
        connection.close()
    return response
