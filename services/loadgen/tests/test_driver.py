"""The driver against the project's mock OpenAI server (real HTTP on localhost, injected timing)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from kvbench_contracts.events import SEND_LATE_MS, ClientTiming, EngineEndpoint
from kvbench_contracts.records import RequestRecord
from kvbench_core.timing import TIMING_THRESHOLDS, timing_verdict
from kvbench_loadgen.driver import DriveConfig, Driver
from kvbench_loadgen.lag import LagProbe, client_timing
from kvbench_loadgen.mock_server import MockServer, MockTiming
from kvbench_loadgen.routing import Router
from kvbench_workloads.sessions import ReplaySession, Session, Turn
from kvbench_workloads.sources import Source, build_source

SAMPLE = Path(__file__).parents[3] / "libs" / "kvbench-workloads" / "tests" / "data" / "agentic_madeup.jsonl"


@pytest.fixture
async def mock() -> AsyncIterator[tuple[MockServer, Router]]:
    server_state = MockServer(MockTiming(ttft_s=0.02, itl_s=0.002))
    server = TestServer(server_state.app())
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    router = Router([EngineEndpoint(node_id="n", engine_id="e", base_url=url, metrics_url=url + "/metrics")], "rr")
    yield server_state, router
    await server.close()


def _config(**overrides: object) -> DriveConfig:
    base: dict[str, object] = {
        "job_id": "j",
        "workload": "w",
        "model": "mock",
        "mode": "closed_loop",
        "load_level": 2,
        "duration_s": 0,
    }
    return DriveConfig(**{**base, **overrides})  # type: ignore[arg-type]


LAST_TIMING: list[ClientTiming] = []  # the last drive's own lag, for the tests that check timing


async def _drive(config: DriveConfig, source: Source, router: Router) -> tuple[Driver, list[RequestRecord]]:
    records: list[RequestRecord] = []
    driver = Driver(config, source, router, records.append)
    async with LagProbe(interval_s=0.002) as probe:
        await driver.run()
    LAST_TIMING[:] = [client_timing(probe, driver.result.send_lateness_s)]
    return driver, records


def _on_time() -> bool:
    """Whether the last drive's client kept its schedule: timing asserts hold, or the product flags the figures."""
    return bool(timing_verdict(LAST_TIMING[0], None)["reliable"])


async def test_closed_loop_runs_one_session_per_user_in_turn_order(mock: tuple[MockServer, Router]) -> None:
    _, router = mock
    traffic = {"shape": "synthetic_sessions", "synthetic": {"prefix_tokens": 8, "turns": 3, "output_tokens": 4}}
    driver, records = await _drive(_config(load_level=2), build_source(traffic, users=2), router)
    assert len(records) == 6
    assert all(r.ok for r in records)
    for user in ("u0-s0", "u1-s0"):
        mine = [r for r in records if r.session_id == user]
        assert [r.turn for r in mine] == [0, 1, 2]
        for a, b in itertools.pairwise(mine):  # strictly one after another
            assert b.start_s >= a.start_s + (a.e2e_s or 0)
    assert all(r.output_tokens == 4 and len(r.chunk_times_s) == 4 for r in records)
    assert driver.result.load_end_s == pytest.approx(max(r.start_s + (r.e2e_s or 0) for r in records))


async def test_agentic_replay_sends_recorded_messages_with_their_gaps(mock: tuple[MockServer, Router]) -> None:
    server, router = mock
    traffic = {"shape": "agentic_replay", "dataset": str(SAMPLE)}
    _, records = await _drive(_config(load_level=4), build_source(traffic, users=4), router)
    assert len(records) == 12
    assert all(r.ok for r in records)
    a = sorted((r for r in records if r.session_id == "madeup__task-a__model-x"), key=lambda r: r.turn or 0)
    gaps = [b.start_s - (x.start_s + (x.e2e_s or 0)) for x, b in itertools.pairwise(a)]
    assert gaps[0] >= 0.12 - 0.005
    assert gaps[2] >= 0.3 - 0.005
    assert [r.output_tokens for r in a] == [8, 12, 16, 20]
    assert server.chat_requests == 12


async def test_gaps_none_sends_at_once(mock: tuple[MockServer, Router]) -> None:
    _, router = mock
    traffic = {"shape": "agentic_replay", "dataset": str(SAMPLE)}
    driver, records = await _drive(_config(load_level=4, honor_gaps=False), build_source(traffic, users=4), router)
    assert len(records) == 12
    if _on_time():  # a busy machine stretches the load itself: then the client's figures are flagged instead
        assert driver.result.load_end_s < 0.3  # task-a alone waits 0.5 s of gaps when they are honoured


async def test_request_rate_reaches_its_target_and_counts_what_it_could_not_send(
    mock: tuple[MockServer, Router],
) -> None:
    _, router = mock
    source = build_source({"shape": "shared_prompt", "synthetic": {"prefix_tokens": 4, "output_tokens": 2}}, users=1)
    driver, records = await _drive(_config(mode="request_rate", load_level=200, duration_s=1.0, seed=7), source, router)
    # every arrival of the schedule (Poisson: 200 +- 3.5 sigma) is sent, or counted as reached after the load's end
    assert 150 <= len(records) + driver.result.late_arrivals <= 250
    if _on_time():  # a busy machine may reach arrivals too late to send: then the client's figures are flagged
        assert 150 <= len(records) <= 250
    assert driver.result.skipped_arrivals == 0
    finite = build_source({"shape": "document_reuse", "documents": {"count": 5, "tokens": 8, "rounds": 1}}, users=1)
    driver, records = await _drive(_config(mode="request_rate", load_level=500, duration_s=0.5), finite, router)
    assert len(records) == 5  # the documents run out; the job ends early instead of idling


async def test_trace_mode_sends_on_schedule(mock: tuple[MockServer, Router]) -> None:
    _, router = mock

    def row(i: int) -> Session:
        s = ReplaySession(f"r{i}", [Turn(prompt="a b c", messages=None, prompt_tokens=3, output_tokens=2)])
        s.start_at_s = 0.05 * i
        return s

    rows = [row(i) for i in range(10)]
    it = iter(rows)
    source = Source("trace_replay", lambda _: next(it, None), [0], finite=True)
    driver, records = await _drive(_config(mode="trace"), source, router)
    starts = sorted(r.start_s for r in records)
    if _on_time():  # a busy machine delays the sends: then the lag figures must say so instead
        assert starts == pytest.approx([0.05 * i for i in range(10)], abs=0.02)
        assert max(driver.result.replay_lags_s) < 0.02
    else:  # flagged: for the reason the records show (the sends left late), or a loop that ran late
        client = LAST_TIMING[0]
        assert client is not None
        written_late = max(start - 0.05 * i for i, start in enumerate(starts))
        if (client.sends_late_share or 0) > TIMING_THRESHOLDS["sends_late_share"]:
            assert written_late > SEND_LATE_MS / 1e3, (written_late, client)  # what it says the records show
        else:
            assert (client.loop_lag_p99_ms or 0) > TIMING_THRESHOLDS["loop_lag_p99_ms"], client


async def test_document_rounds_set_the_measured_window(mock: tuple[MockServer, Router]) -> None:
    _, router = mock
    traffic = {"shape": "document_reuse", "documents": {"count": 3, "tokens": 8, "rounds": 3, "measure_rounds": [2]}}
    driver, records = await _drive(_config(load_level=1), build_source(traffic, users=1), router)
    assert len(records) == 9
    second = [r for r in records if "-r2-" in (r.session_id or "")]
    assert driver.result.warmup_s == pytest.approx(min(r.start_s for r in second))
    assert driver.result.load_end_s == pytest.approx(max(r.start_s + (r.e2e_s or 0) for r in second))


async def test_requests_cut_off_at_the_drain_time_are_recorded_as_timeouts() -> None:
    slow = MockServer(MockTiming(ttft_s=5.0, itl_s=0.01))
    server = TestServer(slow.app())
    await server.start_server()
    try:
        url = str(server.make_url("")).rstrip("/")
        router = Router([EngineEndpoint(node_id="n", engine_id="e", base_url=url, metrics_url=url)], "rr")
        source = build_source({"shape": "shared_prompt"}, users=2)
        config = _config(load_level=2, duration_s=0.2, drain_timeout_s=0.2)
        _, records = await _drive(config, source, router)
        assert len(records) == 2
        assert all(r.error == "timeout" and not r.ok for r in records)
    finally:
        await server.close()


async def test_engines_faster_than_real_time_are_driven_and_stamped_in_engine_seconds(
    mock: tuple[MockServer, Router],
) -> None:
    """time_scale 10 (a simulated cluster at speed 10): the mock's 20 ms TTFT is 200 engine ms, a trace scheduled
    0.5 engine seconds apart leaves 0.05 s apart, and a rate of 20 requests per engine second sends 200 per wall
    second for the job's 1 engine second (0.1 s of wall time)."""
    import time  # noqa: PLC0415

    _, router = mock

    def row(i: int) -> Session:
        s = ReplaySession(f"r{i}", [Turn(prompt="a b c", messages=None, prompt_tokens=3, output_tokens=2)])
        s.start_at_s = 0.5 * i
        return s

    it = iter([row(i) for i in range(5)])
    source = Source("trace_replay", lambda _: next(it, None), [0], finite=True)
    began = time.monotonic()
    _, records = await _drive(_config(mode="trace", time_scale=10.0), source, router)
    # 2 engine seconds of schedule, 0.2 s of wall time: the bound is the schedule's length, so that a busy machine's
    # delays (CI saw 1.1 s) cannot fail it, while a driver that waited in wall seconds still does
    assert time.monotonic() - began < 2.0
    if _on_time():
        assert sorted(r.start_s for r in records) == pytest.approx([0.5 * i for i in range(5)], abs=0.15)
    assert all(r.ttft_s is not None and 0.19 <= r.ttft_s < 0.5 for r in records)

    shared = build_source({"shape": "shared_prompt", "synthetic": {"prefix_tokens": 4, "output_tokens": 2}}, users=1)
    config = _config(mode="request_rate", load_level=20, duration_s=10.0, seed=7, time_scale=10.0)
    began = time.monotonic()
    driver, records = await _drive(config, shared, router)
    assert time.monotonic() - began < 10.0  # 10 engine seconds: 1 s of wall time, plus the drain (not 10 s)
    assert 140 <= len(records) <= 260  # 200 arrivals in 10 engine seconds, Poisson
    assert driver.result.load_end_s == 10.0
    # nothing is scheduled past the load end; a send scheduled just before it may leave late, by the lateness the
    # driver records for it (wall seconds, 10x in engine seconds), plus the write itself
    late_s = max(driver.result.send_lateness_s, default=0.0)
    assert max(r.start_s for r in records) <= 10.0 + 10.0 * (late_s + 0.002)
    assert max(r.start_s for r in records) > 8.0


async def test_closed_loop_users_back_off_on_a_dead_engine_instead_of_spinning() -> None:
    from kvbench_core.procs import free_port  # noqa: PLC0415

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: every request fails at once
    router = Router([EngineEndpoint(node_id="n", engine_id="e", base_url=dead, metrics_url=dead + "/metrics")], "rr")
    traffic = {"shape": "synthetic_sessions", "synthetic": {"prefix_tokens": 4, "turns": 2, "output_tokens": 2}}
    _, records = await _drive(_config(load_level=2, duration_s=1.5), build_source(traffic, users=2), router)
    assert records
    assert not any(r.ok for r in records)
    # doubling back-off from 50 ms: about five failed sessions per user in 1.5 s, where a spinning user makes hundreds
    assert len(records) <= 20, len(records)
