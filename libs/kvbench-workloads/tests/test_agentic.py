"""The agentic loader on a made-up sample in the real schema (tests/data/README.md says how it was made)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvbench_workloads.shapes.agentic import DatasetNotFoundError, load_agentic, resolve_dataset

SAMPLE = Path(__file__).parent / "data" / "agentic_madeup.jsonl"


def test_jsonl_sessions_keep_turn_order_gaps_and_detect_chain_breaks() -> None:
    data = load_agentic(SAMPLE)
    ids = [s.session_id for s in data.sessions]
    assert ids == [
        "madeup__task-a__model-x",
        "madeup__task-b__model-x",
        "madeup__task-c__model-y",
        "madeup__task-c__model-y#chain2",
    ]
    assert data.chain_breaks == 1
    assert data.rows == 12
    a = data.sessions[0]
    assert [t.gap_s for t in a.turns] == [0.0, 0.12, 0.08, 0.3]  # delay is in milliseconds
    assert [t.output_tokens for t in a.turns] == [8, 12, 16, 20]
    for previous, turn in itertools.pairwise(a.turns):
        assert previous.messages is not None
        assert turn.messages is not None
        assert turn.messages[: len(previous.messages)] == previous.messages  # history resent verbatim
        assert turn.prompt_tokens > previous.prompt_tokens
    assert a.turns[1].messages is not None
    assert "tool_calls" in a.turns[1].messages[2]


def test_parquet_in_the_data_sets_own_schema_loads_the_same_sessions(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in SAMPLE.open()]
    table = pa.Table.from_pylist(
        [
            {
                "session_id": r["session_id"],
                "model": "made-up",
                "input": r["messages"],
                "output_length": r["output_length"],
                "pre_gap": r.get("delay", 0) / 1000.0,
            }
            for r in rows
        ]
    )
    shards = tmp_path / "data"
    shards.mkdir()
    pq.write_table(table, shards / "train-00000-of-00001.parquet")
    from_parquet, from_jsonl = load_agentic(shards), load_agentic(SAMPLE)
    assert [s.session_id for s in from_parquet.sessions] == [s.session_id for s in from_jsonl.sessions]
    for p, j in zip(from_parquet.sessions, from_jsonl.sessions, strict=True):
        assert [t.messages for t in p.turns] == [t.messages for t in j.turns]  # nulls of parquet structs dropped
        assert [t.gap_s for t in p.turns] == pytest.approx([t.gap_s for t in j.turns])


def test_the_default_data_set_resolves_from_a_path_or_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_dataset(str(SAMPLE)) == SAMPLE
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("KVBENCH_AGENTIC_DATASET", raising=False)
    with pytest.raises(DatasetNotFoundError, match=r"traffic\.dataset"):
        resolve_dataset("sammshen")
    snapshot = tmp_path / "hub" / "datasets--sammshen--lmcache-agentic-traces" / "snapshots" / "abc" / "data"
    snapshot.mkdir(parents=True)
    assert resolve_dataset("sammshen") == snapshot
    monkeypatch.setenv("KVBENCH_AGENTIC_DATASET", str(SAMPLE))
    assert resolve_dataset(None) == SAMPLE
