"""Streaming OpenAI client: monotonic timestamps taken as each SSE event arrives."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

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
        result.prompt_tokens = usage.get("prompt_tokens")
        result.output_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        result.cached_tokens = details.get("cached_tokens")


async def stream_completion(
    session: aiohttp.ClientSession,
    base_url: str,
    payload: dict[str, Any],
    chat: bool,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> StreamResult:
    url = f"{base_url}/v1/chat/completions" if chat else f"{base_url}/v1/completions"
    # orjson: a long prompt (tens of thousands of words) encodes several times faster than with json.dumps
    body = orjson.dumps({**payload, "stream": True, "stream_options": {"include_usage": True}})
    result = StreamResult(t0=time.monotonic())
    try:
        async with (
            asyncio.timeout(timeout_s),
            session.post(url, data=body, headers={**_JSON, **(headers or {})}) as response,
        ):
            if response.status != 200:
                result.error = f"http_{response.status}"
                await response.read()
                return result
            # whatever bytes arrived, as soon as they arrived: each event is stamped with the read that completed
            # it (events that came in one read share its time, truthfully); no per-line parsing inside aiohttp
            pending = b""
            done = False
            async for raw in response.content.iter_any():
                now = time.monotonic()
                pending += raw
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    _apply(result, orjson.loads(data), now)
                if done:
                    break
    except TimeoutError:
        result.error = "timeout"
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionResetError):
        result.error = "connection_reset"
    except (orjson.JSONDecodeError, UnicodeDecodeError, AttributeError):
        result.error = "bad_stream"
    if result.error is None and not result.chunk_times:
        result.error = "empty_stream"
    return result
