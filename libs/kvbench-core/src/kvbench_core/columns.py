"""Request records as columns (numpy arrays), for the report's maths on millions of requests.

Chunk arrays are packed: ``chunk_times`` holds every request's chunk arrival times back to back (float64, seconds
after the request's send time) and ``chunk_offsets[i]:chunk_offsets[i+1]`` is request i's slice; ``chunk_tokens``
is aligned with ``chunk_times``. PostgreSQL stores each request's arrays the same way (bytea, little-endian), so
a job's records load without building a Python object per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvbench_contracts.records import COUNTS_TYPECODE, TIMES_TYPECODE, RequestRecord

__all__ = ["F8", "Columns", "one_token_each", "pack_floats", "pack_ints", "unpack_floats", "unpack_ints"]

# the contracts' packed chunk format (kvbench_contracts.records), read with numpy
F8 = np.dtype("<" + TIMES_TYPECODE)
I4 = np.dtype("<" + COUNTS_TYPECODE)


def pack_floats(values: Sequence[float]) -> bytes:
    return np.asarray(values, dtype=F8).tobytes()


def pack_ints(values: Sequence[int]) -> bytes:
    return np.asarray(values, dtype=I4).tobytes()


def unpack_floats(data: bytes) -> list[float]:
    return [float(v) for v in np.frombuffer(data, dtype=F8)]


def unpack_ints(data: bytes) -> list[int]:
    return [int(v) for v in np.frombuffer(data, dtype=I4)]


@dataclass
class Columns:
    start_s: np.ndarray[Any, Any]
    ttft_s: np.ndarray[Any, Any]  # NaN where no content arrived
    e2e_s: np.ndarray[Any, Any]  # NaN where no content arrived
    ok: np.ndarray[Any, Any]
    prompt_tokens: np.ndarray[Any, Any]
    output_tokens: np.ndarray[Any, Any]
    cached_tokens: np.ndarray[Any, Any]  # 0 where not reported
    chunk_times: np.ndarray[Any, Any]
    chunk_tokens: np.ndarray[Any, Any]
    chunk_offsets: np.ndarray[Any, Any]  # len n + 1
    connect_s: np.ndarray[Any, Any]  # NaN where a kept-alive connection was reused (or not recorded)

    def __len__(self) -> int:
        return int(self.start_s.size)

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord]) -> Columns:
        lengths = np.array([len(r.chunk_times_s) for r in records], dtype=np.int64)
        offsets = np.zeros(len(records) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        times = np.fromiter((t for r in records for t in r.chunk_times_s), dtype=F8, count=int(offsets[-1]))
        tokens = np.fromiter((m for r in records for m in _tokens(r)), dtype=np.int64, count=int(offsets[-1]))
        return cls(
            start_s=np.array([r.start_s for r in records], dtype=F8),
            ttft_s=np.array([np.nan if r.ttft_s is None else r.ttft_s for r in records], dtype=F8),
            e2e_s=np.array([np.nan if r.e2e_s is None else r.e2e_s for r in records], dtype=F8),
            ok=np.array([r.ok for r in records], dtype=bool),
            prompt_tokens=np.array([r.prompt_tokens for r in records], dtype=np.int64),
            output_tokens=np.array([r.output_tokens for r in records], dtype=np.int64),
            cached_tokens=np.array([r.cached_tokens or 0 for r in records], dtype=np.int64),
            chunk_times=times,
            chunk_tokens=tokens,
            chunk_offsets=offsets,
            connect_s=np.array([np.nan if r.connect_s is None else r.connect_s for r in records], dtype=F8),
        )

    @classmethod
    def from_rows(cls, rows: Sequence[Any]) -> Columns:
        """Rows with start_s, ttft_s, e2e_s, ok, prompt_tokens, output_tokens, cached_tokens and the packed
        chunk_times_s / chunk_tokens bytes (as the reporter's query returns them), and connect_s where stored."""
        times_b = [r["chunk_times_s"] for r in rows]
        tokens_b = [r["chunk_tokens"] for r in rows]
        lengths = np.array([len(b) // 8 for b in times_b], dtype=np.int64)
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(
            start_s=np.array([r["start_s"] for r in rows], dtype=F8),
            ttft_s=np.array([np.nan if r["ttft_s"] is None else r["ttft_s"] for r in rows], dtype=F8),
            e2e_s=np.array([np.nan if r["e2e_s"] is None else r["e2e_s"] for r in rows], dtype=F8),
            ok=np.array([r["ok"] for r in rows], dtype=bool),
            prompt_tokens=np.array([r["prompt_tokens"] for r in rows], dtype=np.int64),
            output_tokens=np.array([r["output_tokens"] for r in rows], dtype=np.int64),
            cached_tokens=np.array([r["cached_tokens"] or 0 for r in rows], dtype=np.int64),
            chunk_times=np.frombuffer(b"".join(times_b), dtype=F8),
            chunk_tokens=np.frombuffer(b"".join(tokens_b), dtype=I4).astype(np.int64),
            chunk_offsets=offsets,
            connect_s=np.array([np.nan if (c := dict(r).get("connect_s")) is None else c for r in rows], dtype=F8),
        )

    def take(self, mask: np.ndarray[Any, Any]) -> Columns:
        """The requests where ``mask`` is true, chunks included."""
        index = np.flatnonzero(mask)
        lengths = np.diff(self.chunk_offsets)
        offsets = np.zeros(index.size + 1, dtype=np.int64)
        np.cumsum(lengths[index], out=offsets[1:])
        # every kept chunk, without a Python loop over requests: a byte a chunk, not the 8-byte positions and their
        # two temporaries (an hour of 64 simulated engines has 92 million chunks)
        chunks = np.repeat(np.asarray(mask, dtype=bool), lengths)
        return Columns(
            self.start_s[index],
            self.ttft_s[index],
            self.e2e_s[index],
            self.ok[index],
            self.prompt_tokens[index],
            self.output_tokens[index],
            self.cached_tokens[index],
            self.chunk_times[chunks],
            _take_chunks(self.chunk_tokens, chunks),
            offsets,
            self.connect_s[index],
        )

    @staticmethod
    def concat(parts: Sequence[Columns]) -> Columns:
        if not parts:
            return Columns.from_records([])
        offsets = [np.zeros(1, dtype=np.int64)]
        base = 0
        for part in parts:
            offsets.append(part.chunk_offsets[1:] + base)
            base += int(part.chunk_offsets[-1])

        def cat(name: str) -> np.ndarray[Any, Any]:
            return np.concatenate([getattr(p, name) for p in parts])

        return Columns(
            start_s=cat("start_s"),
            ttft_s=cat("ttft_s"),
            e2e_s=cat("e2e_s"),
            ok=cat("ok"),
            prompt_tokens=cat("prompt_tokens"),
            output_tokens=cat("output_tokens"),
            cached_tokens=cat("cached_tokens"),
            chunk_times=cat("chunk_times"),
            chunk_tokens=cat("chunk_tokens"),
            chunk_offsets=np.concatenate(offsets),
            connect_s=cat("connect_s"),
        )


def one_token_each(chunks: int) -> np.ndarray[Any, Any]:
    """``chunk_tokens`` where every chunk carries one token: a read-only view of a single 1, no memory per chunk."""
    return np.broadcast_to(np.int64(1), (chunks,))


def _take_chunks(tokens: np.ndarray[Any, Any], chunks: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    if tokens.ndim == 1 and tokens.strides == (0,):  # one_token_each's view stays one
        return np.broadcast_to(tokens[:1], (int(np.count_nonzero(chunks)),))
    kept: np.ndarray[Any, Any] = tokens[chunks]
    return kept


def _tokens(r: RequestRecord) -> list[int]:
    if len(r.chunk_tokens) == len(r.chunk_times_s):
        return list(r.chunk_tokens)
    return [1] * len(r.chunk_times_s)
