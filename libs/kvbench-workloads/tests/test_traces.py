"""Trace loaders on the real public files in ../shared/data/traces."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvbench_workloads.shapes.traces import TraceRow, mooncake_prompt, public_traces_dir, read_trace, trace_sessions

TRACES = public_traces_dir() or Path("/nonexistent")
MOONCAKE = TRACES / "mooncake" / "conversation_trace.jsonl"
AZURE = TRACES / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
SERVEGEN = TRACES / "servegen" / "m-large_chunk-0-trace.csv"

pytestmark = pytest.mark.skipif(
    not TRACES.exists(), reason="needs the public traces (../shared/data/traces or KVBENCH_TRACES_DIR)"
)


def _blocks(prompt: str, size: int = 512) -> list[tuple[str, ...]]:
    tokens = prompt.split()
    return [tuple(tokens[i : i + size]) for i in range(0, len(tokens), size)]


def test_mooncake_prompts_have_the_rows_lengths_and_equal_ids_give_equal_blocks() -> None:
    rows = list(read_trace("mooncake", MOONCAKE))
    assert len(rows) == 12_031
    assert rows[0].hash_ids[:3] == (0, 1, 2)
    assert rows[0].at_s == 0.0
    by_id: dict[int, tuple[str, ...]] = {}
    for row in rows[:300]:
        prompt = mooncake_prompt(row)
        assert len(prompt.split()) == row.input_tokens
        for hash_id, block in zip(row.hash_ids[:-1], _blocks(prompt), strict=False):  # full blocks only
            assert by_id.setdefault(hash_id, block) == block
    assert len({by_id[0]}) == 1
    assert len(by_id) > 300


def test_mooncake_prompt_sharing_matches_the_hash_ids() -> None:
    """The share of prompt tokens in blocks seen before (an infinite prefix cache) is the same whether counted
    on the trace's ids or on the text we send: sharing is reproduced exactly."""
    rows = list(read_trace("mooncake", MOONCAKE))[:400]
    seen_ids: set[tuple[int, ...]] = set()
    seen_text: set[tuple[tuple[str, ...], ...]] = set()
    hit_ids = hit_text = total = 0
    for row in rows:
        blocks = _blocks(mooncake_prompt(row))
        total += row.input_tokens
        for n in range(1, len(row.hash_ids)):  # a prefix of n full blocks
            if row.hash_ids[:n] in seen_ids:
                hit_ids += 512
            if tuple(blocks[:n]) in seen_text:
                hit_text += 512
        for n in range(1, len(row.hash_ids)):
            seen_ids.add(row.hash_ids[:n])
            seen_text.add(tuple(blocks[:n]))
    assert hit_ids == hit_text
    assert 0.05 < hit_ids / total < 0.6  # early rows share less than the whole trace (37%)


def test_a_row_whose_length_does_not_fit_its_blocks_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        mooncake_prompt(TraceRow(at_s=0, input_tokens=2000, output_tokens=1, hash_ids=(1, 2)))


def test_mooncake_sessions_are_scheduled_by_timestamp_times_scale_and_can_be_jittered() -> None:
    sessions = trace_sessions("mooncake", MOONCAKE, time_scale=0.5, horizon_s=30.0)
    starts = [s.start_at_s or 0.0 for s in sessions]
    assert starts == sorted(starts)
    assert starts[-1] < 30.0
    raw = [json.loads(line)["timestamp"] / 1000.0 for line in MOONCAKE.open()][: len(sessions)]
    assert starts == pytest.approx([t * 0.5 for t in raw])
    assert len(set(starts)) < len(starts) / 3  # timestamps come in 3 s buckets
    jittered = [s.start_at_s or 0.0 for s in trace_sessions("mooncake", MOONCAKE, jitter=True, horizon_s=60.0)]
    assert len(set(jittered)) > 0.9 * len(jittered)
    assert jittered == sorted(jittered)
    first = sessions[0].next_turn()
    assert first is not None
    assert first.prompt is not None
    assert first.prompt.startswith("<blk0> ")


def test_azure_rows_are_offsets_from_the_first_timestamp() -> None:
    rows = list(read_trace("azure", AZURE))
    assert len(rows) == 19_366
    assert rows[0].at_s == 0.0
    assert rows[0].input_tokens == 374
    assert rows[0].output_tokens == 44
    assert rows[1].at_s == pytest.approx(4.3145790, abs=1e-6)  # 18:15:50.9951690 - 18:15:46.6805900
    assert 3400 < rows[-1].at_s < 3600
    session = trace_sessions("azure", AZURE, horizon_s=10.0)[2]
    turn = session.next_turn()
    assert turn is not None
    assert turn.prompt is not None
    assert len(turn.prompt.split()) == 879


def test_servegen_descriptors_sample_arrivals_at_the_windows_rates() -> None:
    rows = list(read_trace("servegen", SERVEGEN, seed=3, horizon_s=3600.0))
    in_first = [r for r in rows if r.at_s < 600]
    assert 0.5 * 1.33 * 600 < len(in_first) < 1.5 * 1.33 * 600  # window 0: 1.33 requests/s
    assert not [r for r in rows if 600 <= r.at_s < 1200]  # window 600 is idle
    assert all(216 <= r.input_tokens <= 20_000 for r in rows)
    assert rows == list(read_trace("servegen", SERVEGEN, seed=3, horizon_s=3600.0))  # seeded


def test_missing_files_and_formats_name_the_field() -> None:
    with pytest.raises(FileNotFoundError, match=r"traffic\.trace\.path"):
        read_trace("mooncake", Path("/nonexistent.jsonl"))
    with pytest.raises(ValueError, match=r"traffic\.trace\.format"):
        read_trace("bogus", MOONCAKE)
    assert math.isinf(float("inf"))
