"""Streaming OpenAI client: monotonic timestamps taken as each SSE event arrives."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from kvbench_loadgen.sse import ConnectFailedError, HttpError, post_stream, wait_until

__all__ = ["StreamResult", "stream_completion"]

_JSON = {"Content-Type": "application/json"}


@dataclass
class StreamResult:
    t0: float
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None
    connect_s: float | None = None  # opening a new connection, before t0; None when one was reused

    @property
    def ok(self) -> bool:
        return self.error is None


def _content(event: dict[str, Any]) -> str:
    choices = event.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        return str((choice.get("delta") or {}).get("content") or "")
    return str(choice.get("text") or "")


def _apply(result: StreamResult, event: dict[str, Any], now: float) -> None:
    text = _content(event)
    if text:
        result.chunk_times.append(now)
        result.chunk_tokens.append(max(1, len(text.split())))
        result.text.append(text)
    usage = event.get("usage")
    if usage:
        _usage(result, usage)


def _apply_all(result: StreamResult, events: list[tuple[float, bytes]]) -> None:
    """``_apply`` over a whole response, inlined for the common event (one choice, text or delta content, no usage):
    at thousands of requests a second, with a chunk per token, this loop is the client's largest cost."""
    loads = orjson.loads
    times, tokens, texts = result.chunk_times, result.chunk_tokens, result.text
    for now, data in events:
        if data == b"[DONE]":
            return
        event = loads(data)
        choices = event.get("choices")
        if choices:
            choice = choices[0]
            delta = choice.get("delta")
            text = (delta.get("content") if delta is not None else choice.get("text")) or ""
            if text:
                times.append(now)
                tokens.append(max(1, len(text.split())))
                texts.append(text if isinstance(text, str) else str(text))
        if event.get("usage"):
            _usage(result, event["usage"])


def _usage(result: StreamResult, usage: dict[str, Any]) -> None:
    result.prompt_tokens = usage.get("prompt_tokens")
    result.output_tokens = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details") or {}
    result.cached_tokens = details.get("cached_tokens")


async def stream_completion(
    session: aiohttp.ClientSession | None,
    base_url: str,
    payload: dict[str, Any],
    chat: bool,
    timeout_s: float,
    headers: dict[str, str] | None = None,
    not_before: float | None = None,
) -> StreamResult:
    """One streamed request. ``session`` is unused (kept for callers that hold one): the events are read by
    kvbench's own HTTP client, which stamps them in the socket callback (``sse.py``). ``not_before``: the monotonic
    moment the request is due (it is written then, its set-up done before)."""
    url = f"{base_url}/v1/chat/completions" if chat else f"{base_url}/v1/completions"
    # orjson: a long prompt (tens of thousands of words) encodes several times faster than with json.dumps
    body = orjson.dumps({**payload, "stream": True, "stream_options": {"include_usage": True}})
    if not base_url.startswith("http://"):
        if not_before is not None:
            await wait_until(not_before)
        return await _stream_aiohttp(session, url, body, timeout_s, headers)
    result = StreamResult(t0=time.monotonic())
    try:
        response = await post_stream(url, body, {**_JSON, **(headers or {})}, timeout_s, not_before)
        # TTFT runs from the request's write to the socket: opening a connection is its own figure
        result.t0, result.connect_s = response.sent_at, response.connect_s
        if response.status != 200:
            result.error = f"http_{response.status}"
            return result
        _apply_all(result, response.events)
    except TimeoutError:
        result.error = "timeout"
    except ConnectFailedError:  # nothing listens there, or it cannot be reached: no request was sent
        result.error = "connection_refused"
    except (HttpError, ConnectionResetError):
        result.error = "connection_reset"
    except (orjson.JSONDecodeError, UnicodeDecodeError, AttributeError, TypeError):
        result.error = "bad_stream"
    return _finished(result)


async def _stream_aiohttp(
    session: aiohttp.ClientSession | None, url: str, body: bytes, timeout_s: float, headers: dict[str, str] | None
) -> StreamResult:
    """HTTPS endpoints: aiohttp (TLS), events stamped when the reading coroutine gets the bytes; t0 is taken
    before aiohttp opens or reuses its connection, so here TTFT includes any TLS connection set-up (no connect
    time is recorded apart)."""
    own = session is None
    http = session or aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
    result = StreamResult(t0=time.monotonic())
    try:
        async with (
            asyncio.timeout(timeout_s),
            http.post(url, data=body, headers={**_JSON, **(headers or {})}) as response,
        ):
            if response.status != 200:
                result.error = f"http_{response.status}"
                await response.read()
                return result
            pending = b""
            async for raw in response.content.iter_any():
                now = time.monotonic()
                pending += raw
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    data = line[5:].strip() if line.startswith(b"data:") else None
                    if data == b"[DONE]":
                        return _finished(result)
                    if data:
                        _apply(result, orjson.loads(data), now)
    except TimeoutError:
        result.error = "timeout"
    except aiohttp.ClientConnectorError:
        result.error = "connection_refused"
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionResetError):
        result.error = "connection_reset"
    except (orjson.JSONDecodeError, UnicodeDecodeError, AttributeError, TypeError):
        result.error = "bad_stream"
    finally:
        if own:
            await http.close()
    return _finished(result)


def _finished(result: StreamResult) -> StreamResult:
    if result.error is None and not result.chunk_times:
        result.error = "empty_stream"
    return result
