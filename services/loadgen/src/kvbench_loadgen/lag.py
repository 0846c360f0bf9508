"""The load generator's own lag: how late its event loop runs, and how late scheduled sends leave.

A timer asked to fire every few milliseconds fires late by as much as the loop was busy or the process was off
the CPU at that moment; every read and send of the loop was exposed to the same delay. Kernel receive stamps
(sse.py) keep most of a late read's time right, but chunks that wait in the socket together share one stamp, and
a late send shifts the offered load, so the report needs these figures to say whether TTFT and ITL can be trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections.abc import Sequence
from types import TracebackType

from kvbench_contracts.events import SEND_LATE_MS, ClientTiming

__all__ = ["LagProbe", "client_timing"]

PROBE_INTERVAL_S = 0.005


class LagProbe:
    """``async with LagProbe() as probe``: samples the event loop's timer lateness until the block ends."""

    def __init__(self, interval_s: float = PROBE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.lateness_s = array("f")  # 4 bytes a sample: an hour at 200 samples/s is 2.9 MB
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LagProbe:
        self._task = asyncio.create_task(self._sample(), name="loop-lag-probe")
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _sample(self) -> None:
        while True:
            asked = time.monotonic() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.lateness_s.append(max(0.0, time.monotonic() - asked))


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def client_timing(probe: LagProbe, send_lateness_s: Sequence[float]) -> ClientTiming:
    """The job's figures (wall-clock milliseconds) from the probe's samples and the scheduled sends' lateness."""
    lags = sorted(probe.lateness_s)
    sends = sorted(send_lateness_s)
    return ClientTiming(
        loop_lag_samples=len(lags),
        loop_lag_p50_ms=_quantile(lags, 0.5) * 1e3 if lags else None,
        loop_lag_p99_ms=_quantile(lags, 0.99) * 1e3 if lags else None,
        loop_lag_max_ms=lags[-1] * 1e3 if lags else None,
        sends_scheduled=len(sends),
        send_late_p99_ms=_quantile(sends, 0.99) * 1e3 if sends else None,
        sends_late_share=sum(1 for s in sends if s * 1e3 > SEND_LATE_MS) / len(sends) if sends else None,
    )
