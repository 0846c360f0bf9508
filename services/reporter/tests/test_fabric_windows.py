"""Each job's switch-port window: between the reads that bracket its measured window, never into another job's
load."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kvbench_reporter.fabric import _neighbours

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def test_a_jobs_port_window_stops_where_the_next_job_began_its_warm_up() -> None:
    """The next job's warm-up traffic is the next job's: the GPU-only demo job before the shared store's carried
    1.2 GB of the store's warm-up in its window when only measured windows bounded it."""
    t = [T0 + timedelta(seconds=s) for s in range(0, 200, 10)]
    first = {"job_id": "a", "began": t[0], "start": t[1], "end": t[3]}
    second = {"job_id": "b", "began": t[4], "start": t[6], "end": t[8]}  # 20 s of warm-up before its window
    third = {"job_id": "c", "start": t[10], "end": t[12]}  # no begin known (an older report): its window's start
    windows = [first, second, third]
    assert _neighbours(windows, first) == (None, t[4])  # not t[6]: the warm-up is excluded
    assert _neighbours(windows, second) == (t[3], t[10])
    assert _neighbours(windows, third) == (t[8], None)
