from __future__ import annotations

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from kvbench_loadgen.client import stream_completion
from kvbench_loadgen.mock_server import MockServer, MockTiming


async def test_mock_server_injects_timing_and_keeps_its_own_record() -> None:
    mock = MockServer(MockTiming(ttft_s=0.05, itl_s=0.02, tokens_per_chunk=2))
    server = TestServer(mock.app())
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            result = await stream_completion(
                session,
                str(server.make_url("")).rstrip("/"),
                {"model": "mock", "prompt": "a b c", "max_tokens": 6},
                chat=False,
                timeout_s=10,
                headers={"X-Request-Id": "q1"},
            )
        assert result.ok
        assert result.output_tokens == 6
        assert result.prompt_tokens == 3
        assert len(result.chunk_times) == 3  # 6 tokens, 2 per chunk
        sent = mock.sent["q1"]
        assert sent[0] - mock.received["q1"] == pytest.approx(0.05, abs=0.02)
        assert sent[1] - sent[0] == pytest.approx(0.04, abs=0.02)  # 2 tokens x 20 ms
        assert result.chunk_times[0] >= sent[0]  # the client sees a chunk after the server wrote it
    finally:
        await server.close()
