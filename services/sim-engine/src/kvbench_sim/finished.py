"""The finished requests of a batch run, as columns instead of one pydantic record each.

An hour of 64 simulated engines at 400 requests/s finishes 1.44 million requests. As ``RequestRecord`` objects
(64 chunk times each, in a Python list) they held about 4 KB apiece, 6 GB for the hour, and the report's maths then
copied them into numpy columns anyway. Here a request costs its chunk times as packed float64 and a few numbers; the
figures read the columns directly, and a ``RequestRecord`` is built only when one is asked for (the export format,
tests, the calibration's rounds).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from kvbench_contracts.records import RequestRecord
from kvbench_core.columns import F8, Columns, one_token_each

__all__ = ["FinishedRequests"]


class FinishedRequests:
    """Append-only, in finishing order. Request ``i``'s id is ``{job_id}-{number}``, its chunk times (seconds after
    its send) ``times[offsets[i]:offsets[i + 1]]``, one token each; every request finished ok.

    Each request's prompt tokens by where they came from (``sources``, the engine's accounting: ``{"device": 1024,
    "recomputed": 512}``) are kept the same way: the values back to back, and per request which of the few key
    orders seen so far they follow (a dict a request was 290 B of an hour's memory)."""

    def __init__(self, job_id: str, workload: str) -> None:
        self.job_id, self.workload = job_id, workload
        self._number = array("q")
        self._session: list[str] = []
        self._turn = array("q")
        self._start = array("d")
        self._prompt = array("q")
        self._cached = array("q")
        self._times = array("d")
        self._offsets = array("q", [0])
        self._source_values = array("q")
        self._source_order = array("H")  # per request: its sources' keys, as an index into _orders
        self._orders: list[tuple[str, ...]] = []
        self._order_of: dict[tuple[str, ...], int] = {}
        self._starts: np.ndarray[Any, Any] | None = None  # _source_starts, until the next append

    def append(
        self,
        number: int,
        session_id: str,
        turn: int,
        start_s: float,
        times: Sequence[float],
        prompt_tokens: int,
        cached_tokens: int,
        sources: dict[str, int] | None = None,
    ) -> None:
        self._number.append(number)
        self._session.append(session_id)
        self._turn.append(turn)
        self._start.append(start_s)
        self._prompt.append(prompt_tokens)
        self._cached.append(cached_tokens)
        self._times.extend(times)
        self._offsets.append(len(self._times))
        self._source_order.append(self.key_order(tuple(sources) if sources else ()))
        if sources:
            self._source_values.extend(sources.values())
        self._starts = None

    def key_order(self, keys: tuple[str, ...]) -> int:
        """The index of a request's source keys, in this order (registered when first seen)."""
        order = self._order_of.get(keys)
        if order is None:
            order = self._order_of[keys] = len(self._orders)
            self._orders.append(keys)
        return order

    def extend_packed(
        self,
        numbers: bytes,
        sessions: list[str],
        turns: bytes,
        starts: bytes,
        prompts: bytes,
        cached: bytes,
        times: bytes,
        counts: bytes,
        orders: bytes,
        values: bytes,
    ) -> None:
        """``append`` for many requests at once, as the compiled batch simulation packs them: per request its number,
        turn, start, prompt and cached tokens (int64 or float64 each), its chunk count and source keys' order (uint16,
        from ``key_order``); all their chunk times and source values back to back."""
        ends = np.cumsum(np.frombuffer(counts, dtype=np.int64)) + self._offsets[-1]
        self._number.frombytes(numbers)
        self._session.extend(sessions)
        self._turn.frombytes(turns)
        self._start.frombytes(starts)
        self._prompt.frombytes(prompts)
        self._cached.frombytes(cached)
        self._times.frombytes(times)
        self._offsets.frombytes(ends.tobytes())
        self._source_order.frombytes(orders)
        self._source_values.frombytes(values)
        self._starts = None

    def __len__(self) -> int:
        return len(self._start)

    @property
    def nbytes(self) -> int:
        """What the columns hold (the session ids' strings are the sessions' own)."""
        arrays = (self._number, self._turn, self._start, self._prompt, self._cached, self._times, self._offsets,
                  self._source_values, self._source_order)  # fmt: skip
        return sum(a.itemsize * len(a) for a in arrays) + 8 * len(self._session)

    def request_id(self, i: int) -> str:
        return f"{self.job_id}-{self._number[i]}"

    def start_s(self, i: int) -> float:
        return self._start[i]

    def e2e_s(self, i: int) -> float | None:
        """The last chunk's time, None for a request that streamed nothing."""
        end = self._offsets[i + 1]
        return self._times[end - 1] if end > self._offsets[i] else None

    def end_s(self, i: int) -> float:
        """When the request's last chunk came, in the job's time (its start when it streamed nothing): whether it
        ended inside a measured window."""
        return self._start[i] + (self.e2e_s(i) or 0.0)

    def starts_s(self) -> np.ndarray[Any, Any]:
        """``start_s`` of every request, as one array (a view of the column, no copy)."""
        return np.frombuffer(self._start, dtype=F8)

    def ends_s(self) -> np.ndarray[Any, Any]:
        """``end_s`` of every request, as one array."""
        columns = self.columns()
        ends: np.ndarray[Any, Any] = columns.start_s + np.nan_to_num(columns.e2e_s, nan=0.0)
        return ends

    def ttft_s(self, i: int) -> float | None:
        begin = self._offsets[i]
        return self._times[begin] if self._offsets[i + 1] > begin else None

    def sources(self, i: int) -> dict[str, int]:
        """Request ``i``'s prompt tokens by source, as the engine counted them ({} when it kept no account)."""
        begin = int(self._source_starts()[i])
        keys = self._orders[self._source_order[i]]
        return dict(zip(keys, self._source_values[begin : begin + len(keys)], strict=True))

    def source_totals(self, which: np.ndarray[Any, Any]) -> dict[str, int]:
        """Prompt tokens by source over the requests where ``which`` is true, each source in the order a loop over
        those requests' ``sources`` would first meet it."""
        values = np.frombuffer(self._source_values, dtype=np.int64)
        orders = np.frombuffer(self._source_order, dtype=np.uint16)
        starts = self._source_starts()
        totals: dict[str, int] = {}
        first_seen: dict[str, int] = {}
        for order, keys in enumerate(self._orders):
            rows = np.flatnonzero((orders == order) & which)
            for position, key in enumerate(keys):
                at = starts[rows] + position
                totals[key] = totals.get(key, 0) + int(values[at].sum())
                if at.size:
                    first_seen[key] = min(first_seen.get(key, int(at[0])), int(at[0]))
        return {key: totals[key] for key in sorted(first_seen, key=first_seen.__getitem__)}

    def _source_starts(self) -> np.ndarray[Any, Any]:
        """Where each request's source values begin (worked out once per length: the sources are read after a run)."""
        if self._starts is None:
            lengths = np.array([len(keys) for keys in self._orders], dtype=np.int64)
            counts = lengths[np.frombuffer(self._source_order, dtype=np.uint16)]
            self._starts = np.zeros(counts.size, dtype=np.int64)
            np.cumsum(counts[:-1], out=self._starts[1:])
        return self._starts

    def __getitem__(self, i: int) -> RequestRecord:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        times = self._times[self._offsets[i] : self._offsets[i + 1]].tolist()
        return RequestRecord(
            request_id=self.request_id(i),
            job_id=self.job_id,
            workload=self.workload,
            session_id=self._session[i],
            turn=self._turn[i],
            start_s=self._start[i],
            ttft_s=times[0] if times else None,
            e2e_s=times[-1] if times else None,
            chunk_times_s=times,
            chunk_tokens=[1] * len(times),
            prompt_tokens=self._prompt[i],
            output_tokens=len(times),
            cached_tokens=self._cached[i],
            ok=True,
            shard="sim",
        )

    def __iter__(self) -> Iterator[RequestRecord]:
        return (self[i] for i in range(len(self)))

    def columns(self) -> Columns:
        """The report's columns, as ``Columns.from_records`` would build them from these requests' records."""
        n = len(self)
        offsets = np.array(self._offsets, dtype=np.int64)
        # the packed times themselves, not a copy (740 MB for an hour of 64 engines); while the view lives, appending
        # raises BufferError rather than moving the memory under it
        times = np.frombuffer(self._times, dtype=F8)
        counts = np.diff(offsets)
        streamed = counts > 0
        ttft = np.full(n, np.nan, dtype=F8)
        e2e = np.full(n, np.nan, dtype=F8)
        ttft[streamed] = times[offsets[:-1][streamed]]
        e2e[streamed] = times[offsets[1:][streamed] - 1]
        return Columns(
            start_s=np.array(self._start, dtype=F8),
            ttft_s=ttft,
            e2e_s=e2e,
            ok=np.ones(n, dtype=bool),
            prompt_tokens=np.array(self._prompt, dtype=np.int64),
            output_tokens=counts,
            cached_tokens=np.array(self._cached, dtype=np.int64),
            chunk_times=times,
            chunk_tokens=one_token_each(times.size),
            chunk_offsets=offsets,
            connect_s=np.full(n, np.nan, dtype=F8),
        )
