"""``kvbench load`` as a user runs it (a subprocess), against the mock server and a simulated engine."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from kvbench_loadgen.mock_server import MockServer, MockTiming
from kvbench_sim.engine import Engine
from kvbench_sim.profiles import EngineConfig, load_profile
from kvbench_sim.server import PacedEngine, build_app
from kvbench_workloads.shapes.traces import public_traces_dir, read_trace

pytestmark = pytest.mark.integration

TRACES = public_traces_dir() or Path("/nonexistent")
MOONCAKE = TRACES / "mooncake" / "conversation_trace.jsonl"


async def _kvbench(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from kvbench_cli.main import main; main()",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    return process.returncode or 0, out.decode(), err.decode()


@pytest.fixture
async def mock_url() -> AsyncIterator[str]:
    server = TestServer(MockServer(MockTiming(ttft_s=0.02, itl_s=0.002), keep_log=False).app())
    await server.start_server()
    yield str(server.make_url("")).rstrip("/")
    await server.close()


async def test_load_writes_records_and_prints_the_reports_figures(mock_url: str, tmp_path: Path) -> None:
    records = tmp_path / "records.jsonl"
    code, out, err = await _kvbench(
        "load", "--endpoint", mock_url, "--model", "mock", "--shape", "shared_prompt", "--prefix-tokens", "16",
        "--output-tokens", "16", "--rate", "100", "--duration-s", "3", "--warmup-s", "1", "--records", str(records),
        "--json",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(out)
    lines = records.read_text().splitlines()
    assert summary["records_written"] == len(lines) == summary["requests_total"]
    assert 200 <= len(lines) <= 400  # Poisson at 100/s for 3 s
    assert summary["errors"] == 0
    assert summary["window_s"] == pytest.approx(2.0)
    # the server waits 20 ms then 2 ms a token: the figures are accurate, or the client says it fell behind
    timing = summary["timing"]
    assert timing["reliable"] or timing["reasons"], timing
    if timing["reliable"]:
        assert 15 < summary["ttft_ms"]["p50"] < 40
        assert summary["itl_ms"]["p50"] == pytest.approx(2.0, abs=1.0)
    else:
        assert "warning: the client fell behind" in err
    assert summary["client_timing"]["loop_lag_samples"] > 100  # the probe ran for the whole 3 s
    assert summary["client_timing"]["sends_scheduled"] >= len(lines)
    first = json.loads(lines[0])
    assert set(first) >= {"request_id", "start_s", "ttft_s", "e2e_s", "chunk_times_s", "chunk_tokens", "ok"}
    # the same file through `kvbench report analyze` gives the same figures
    code, again, err = await _kvbench(
        "report", "analyze", str(records), "--warmup-s", "1", "--load-duration-s", "3", "--json"
    )
    assert code == 0, err
    (analyzed,) = json.loads(again)["workloads"]
    assert analyzed["ttft_ms"] == summary["ttft_ms"]
    assert analyzed["merged_chunk_share"] == summary["merged_chunk_share"]


async def test_an_endpoint_with_the_openai_sdks_v1_suffix_works(mock_url: str, tmp_path: Path) -> None:
    # the OpenAI SDK's base URLs end in /v1; every request failed with 404 on them
    records = tmp_path / "records.jsonl"
    code, out, err = await _kvbench(
        "load", "--endpoint", f"{mock_url}/v1/", "--model", "mock", "--shape", "shared_prompt", "--prefix-tokens", "8",
        "--output-tokens", "4", "--users", "2", "--duration-s", "1", "--records", str(records), "--json", "--quiet",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(out)
    assert summary["requests_total"] > 0
    assert summary["errors"] == 0


async def test_bad_input_names_the_field_and_writes_nothing(mock_url: str, tmp_path: Path) -> None:
    records = tmp_path / "never.jsonl"
    code, _, err = await _kvbench(
        "load", "--endpoint", mock_url, "--model", "m", "--rate", "-2", "--records", str(records)
    )
    assert code == 2
    assert "traffic.arrivals.rates" in err
    assert not records.exists()
    code, _, err = await _kvbench(
        "load", "--endpoint", mock_url, "--model", "m", "--shape", "trace_replay", "--trace", "/nope.jsonl",
        "--records", str(records),
    )  # fmt: skip
    assert code == 2
    assert "traffic.trace.path" in err
    code, _, err = await _kvbench(
        "load", "--endpoint", mock_url, "--model", "m", "--shape", "synthetic_sessions", "--records", str(records)
    )  # neither --users nor --rate: said, not a traceback
    assert code == 2
    assert "--users N" in err
    assert "Traceback" not in err
    assert not records.exists()


async def test_a_load_whose_every_request_failed_exits_non_zero_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, _, err = await _kvbench(
        "load", "--endpoint", f"http://127.0.0.1:{port}", "--model", "m", "--shape", "synthetic_sessions",
        "--users", "1", "--duration-s", "1", "--records", str(tmp_path / "r.jsonl"),
    )  # fmt: skip
    assert code == 1
    assert f"requests to http://127.0.0.1:{port} failed" in err


@pytest.mark.skipif(not MOONCAKE.exists(), reason="needs ../shared/data/traces")
async def test_mooncake_replay_reproduces_the_traces_sharing_and_arrivals(tmp_path: Path) -> None:
    """On a prefix-caching engine with room for the whole replay, cached tokens match the share of prompt
    tokens in blocks the trace has seen before; requests leave at the trace's (scaled) times."""
    profile = load_profile("H200", "Qwen/Qwen3-8B", EngineConfig(kv_cache_gb=2000, max_num_batched_tokens=16384))
    paced = PacedEngine(Engine(profile), speed=4.0)
    server = TestServer(build_app(paced, "Qwen/Qwen3-8B"))
    await server.start_server()
    horizon_s, scale = 30.0, 0.25  # the first 30 s of the trace, replayed 4x faster (the engine runs 4x too)
    try:
        records = tmp_path / "trace.jsonl"
        code, out, err = await _kvbench(
            "load", "--endpoint", str(server.make_url("")).rstrip("/"), "--model", "Qwen/Qwen3-8B",
            "--shape", "trace_replay", "--trace", str(MOONCAKE), "--time-scale", str(scale),
            "--duration-s", str(horizon_s * scale), "--records", str(records), "--json", "--quiet",
        )  # fmt: skip
        assert code == 0, err
    finally:
        await server.close()
    rows = [r for r in read_trace("mooncake", MOONCAKE) if r.at_s < horizon_s]
    seen: set[tuple[int, ...]] = set()
    reusable = 0
    for row in rows:  # tokens in full blocks whose whole prefix was seen before (an unbounded prefix cache)
        for n in range(1, len(row.hash_ids)):
            if row.hash_ids[:n] in seen:
                reusable += 512
            seen.add(row.hash_ids[:n])
    expected_share = reusable / sum(r.input_tokens for r in rows)
    sent = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(sent) == len(rows)
    assert all(r["ok"] for r in sent)
    assert sum(r["prompt_tokens"] for r in sent) == sum(r.input_tokens for r in rows)  # exact lengths
    share = sum(r["cached_tokens"] for r in sent) / sum(r["prompt_tokens"] for r in sent)
    assert share == pytest.approx(expected_share, abs=0.03), (share, expected_share)
    scheduled = sorted(r.at_s * scale for r in rows)
    starts = sorted(r["start_s"] for r in sent)
    lateness = sorted(s - t for s, t in zip(starts, scheduled, strict=True))
    # the trace ties up to 28 requests to one timestamp; each send takes its turn on the one event loop
    assert lateness[0] > -0.005
    # a burst's sends take their turns, so the client flags a few percent of them late even here; what it says of
    # its own lateness must match what the records show (on a busy machine the sends fall further behind)
    summary = json.loads(out)
    client = summary["client_timing"]
    assert lateness[len(lateness) // 2] < 0.01 or client["sends_late_share"] >= 0.4, client
    assert lateness[int(0.99 * (len(lateness) - 1))] < 0.1 or client["send_late_p99_ms"] >= 50, client
    assert summary["replay_lag_p99_ms"] < 100 or not summary["timing"]["reliable"]


async def test_workers_split_one_schedule_and_join_their_records(mock_url: str, tmp_path: Path) -> None:
    """Two processes share one Poisson schedule (each half the rate) and one start: one records file, each request
    once, the shards told apart, the rate the one asked for, the timing of the worst worker."""
    records = tmp_path / "records.jsonl"
    code, out, err = await _kvbench(
        "load", "--endpoint", mock_url, "--model", "mock", "--shape", "shared_prompt", "--prefix-tokens", "16",
        "--output-tokens", "8", "--rate", "200", "--duration-s", "3", "--records", str(records), "--workers", "2",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(out)
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert summary["workers"] == 2
    assert summary["records_written"] == len(rows) == summary["requests_total"]
    assert len({r["request_id"] for r in rows}) == len(rows)
    assert {r["shard"] for r in rows} == {"cli-0", "cli-1"}
    # Poisson at 200/s for 3 s, split in two: sent, or scheduled in the window and reached after it (counted)
    assert 450 <= len(rows) + summary["late_arrivals"] <= 750, (len(rows), summary["late_arrivals"])
    # one clock and one start: both workers' sends spread over the same 3 s window; a worker that came up after the
    # shared start (a loaded machine: spawning takes longer) sends its first requests late, and must say so
    timing = summary["client_timing"]
    for shard in ("cli-0", "cli-1"):
        starts = [r["start_s"] for r in rows if r["shard"] == shard]
        assert min(starts) < 0.5 or timing["send_late_p99_ms"] > 100, (min(starts), timing)
        assert max(starts) > 2.5
    assert summary["client_timing"]["loop_lag_samples"] > 0  # both workers' probes, added up
    assert not list(tmp_path.glob(".records.jsonl.worker*"))  # the parts were joined and removed


async def test_workers_below_one_is_refused(mock_url: str, tmp_path: Path) -> None:
    code, _, err = await _kvbench(
        "load", "--endpoint", mock_url, "--model", "mock", "--shape", "shared_prompt", "--rate", "10",
        "--duration-s", "1", "--records", str(tmp_path / "r.jsonl"), "--workers", "0",
    )  # fmt: skip
    assert code == 2
    assert "--workers" in err


async def test_the_api_key_headers_and_the_session_header_reach_the_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An endpoint behind a key and a session-affinity router: the key from OPENAI_API_KEY (never the command line),
    a gateway header, and each request's session id in the header the router keys on."""
    from aiohttp import web  # noqa: PLC0415

    seen: list[dict[str, str]] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        if request.headers.get("Authorization") != "Bearer sk-test-123":
            return web.Response(status=401)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"text": " a", "index": 0}]}\n\n')
        usage = b'{"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 1}}'
        await response.write(b"data: " + usage + b"\n\ndata: [DONE]\n\n")
        return response

    app = web.Application()
    app.add_routes([web.post("/v1/completions", completions)])
    server = TestServer(app)
    await server.start_server()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-123")
    try:
        code, _, err = await _kvbench(
            "load", "--endpoint", str(server.make_url("")).rstrip("/"), "--model", "m", "--shape", "synthetic_sessions",
            "--users", "2", "--duration-s", "1", "--header", "X-Tenant: lab", "--session-header", "X-Session-ID",
            "--records", str(tmp_path / "r.jsonl"),
        )  # fmt: skip
        assert code == 0, err
        assert seen
        assert all(h["Authorization"] == "Bearer sk-test-123" and h["X-Tenant"] == "lab" for h in seen)
        assert len({h["X-Session-ID"] for h in seen}) >= 2  # two users: two sessions, each named in its requests
        code, _, err = await _kvbench(
            "load", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--users", "1", "--header", "no colon",
            "--records", str(tmp_path / "never.jsonl"),
        )  # fmt: skip
        assert code == 2
        assert "--header" in err
        assert "sk-test-123" not in err
    finally:
        await server.close()


async def test_a_trace_shorter_than_the_duration_is_measured_over_the_time_it_lasted(
    mock_url: str, tmp_path: Path
) -> None:
    """Three requests in one second, --duration-s 20: the throughput is over the second the trace lasted (what
    `report analyze` of the same records gives), not divided by the 20 s configured."""
    trace = tmp_path / "short.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": 64, "output_length": 8, "hash_ids": [i]})
                             + "\n" for i, t in enumerate((0, 500, 1000))))  # fmt: skip
    records = tmp_path / "r.jsonl"
    code, out, err = await _kvbench(
        "load", "--endpoint", mock_url, "--model", "m", "--shape", "trace_replay", "--trace", str(trace),
        "--duration-s", "20", "--records", str(records), "--json",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(out)
    assert summary["load_end_s"] < 5
    code, out, _ = await _kvbench("report", "analyze", str(records), "--json")
    assert code == 0
    [workload] = json.loads(out)["workloads"]
    assert workload["window_s"] == pytest.approx(summary["load_end_s"])
    assert workload["output_tokens_per_s"] == pytest.approx(summary["output_tokens_per_s"])
