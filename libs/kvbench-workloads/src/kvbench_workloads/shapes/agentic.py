"""The agentic data set (``sammshen/lmcache-agentic-traces``) and its Mooncake-style JSONL conversion.

Parquet rows: ``session_id``, ``input`` (the full cumulative OpenAI message array), ``output_length``,
``pre_gap`` (seconds). JSONL rows (``convert_lmcache_to_mooncake.py``, AIPerf's ``mooncake_trace``):
``session_id``, ``messages``, ``output_length``, ``delay`` (milliseconds, absent when 0). Rows of a session
are in turn order; each turn resends the recorded history verbatim. A turn whose messages do not extend
the previous turn's is a chain break (a restarted agent): the rest becomes a new session, and breaks are
counted so the report can say so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench_workloads.jsonl import read_jsonl
from kvbench_workloads.sessions import ReplaySession, Session, Turn
from kvbench_workloads.source import ShapeRequest, Source, shape_builder, shared_sessions

__all__ = ["DATASET_FIX", "AgenticDataset", "DatasetNotFoundError", "load_agentic", "resolve_dataset"]

HUB_ID = "sammshen/lmcache-agentic-traces"
# how to provide the data set: said by the plan's review and by the load generator alike
DATASET_FIX = (
    f"Download it (huggingface-cli download --repo-type dataset {HUB_ID}), or set traffic.dataset to a parquet file, "
    "a directory of parquet shards or a Mooncake-style JSONL file (or KVBENCH_AGENTIC_DATASET to its path)"
)
_COLUMNS = ["session_id", "input", "output_length", "pre_gap"]


class DatasetNotFoundError(FileNotFoundError):
    pass


@dataclass
class AgenticDataset:
    sessions: list[ReplaySession]
    source: str
    rows: int = 0
    chain_breaks: int = 0
    skipped_rows: int = 0
    notes: list[str] = field(default_factory=list)


def resolve_dataset(name: str | None) -> Path:
    """A path as given, else the installed copy of the named data set in the Hugging Face cache, else an
    error that says how to provide it (the Hub itself is not reached from here)."""
    name = name or "sammshen"
    candidate = Path(name).expanduser()
    if candidate.exists():
        return candidate
    if name in ("sammshen", HUB_ID):
        env = os.environ.get("KVBENCH_AGENTIC_DATASET")
        if env and Path(env).exists():
            return Path(env)
        hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
        snapshots = sorted(
            (hub.expanduser() / "datasets--sammshen--lmcache-agentic-traces" / "snapshots").glob("*/data")
        )
        if snapshots:
            return snapshots[-1]
    raise DatasetNotFoundError(
        f"traffic.dataset: {name!r} is not a file or directory here and no installed copy of {HUB_ID} was found; "
        + DATASET_FIX[0].lower()
        + DATASET_FIX[1:]
    )


def _parquet_rows(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq  # noqa: PLC0415 (heavy; only agentic parquet replay needs it)

    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise DatasetNotFoundError(f"traffic.dataset: no *.parquet files in {path}")
    for file in files:
        parquet = pq.ParquetFile(file)
        missing = [c for c in _COLUMNS if c not in parquet.schema_arrow.names]
        if missing:
            raise ValueError(f"traffic.dataset: {file} lacks the columns {missing} of the agentic schema")
        for batch in parquet.iter_batches(columns=_COLUMNS, batch_size=256):
            for row in batch.to_pylist():
                yield {
                    "session_id": row["session_id"],
                    "messages": row["input"],
                    "output_length": row["output_length"],
                    "gap_s": float(row.get("pre_gap") or 0.0),
                }


def _agentic_row(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "session_id": row["session_id"],
        "messages": row["messages"],
        "output_length": row["output_length"],
        "gap_s": float(row.get("delay") or 0) / 1000.0,  # milliseconds in this format
    }


def _jsonl_rows(path: Path) -> Iterator[dict[str, Any]]:
    return read_jsonl(path, _agentic_row, field="traffic.dataset", kind="an agentic row")


def _clean(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    # parquet structs come back with every field, null where unused; an OpenAI server wants them absent
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def _tokens(messages: list[dict[str, Any]]) -> int:
    # the fallback tokenizer's count: one token per word, plus one role marker per message and the reply marker
    total = 1
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        total += 1 + len(str(content or "").split())
    return total


def load_agentic(path: Path, *, max_sessions: int | None = None) -> AgenticDataset:
    rows = _jsonl_rows(path) if path.suffix in (".jsonl", ".json") else _parquet_rows(path)
    data = AgenticDataset(sessions=[], source=str(path))
    sessions: dict[str, ReplaySession] = {}  # by chain id, in first-seen order
    chain_of: dict[str, str] = {}  # the data set's session id -> its current chain
    last_input: dict[str, list[dict[str, Any]]] = {}
    chains: dict[str, int] = {}
    for row in rows:
        data.rows += 1
        messages = _clean(row["messages"] or [])
        output = int(row["output_length"] or 0)
        if not messages or output < 1:
            data.skipped_rows += 1
            continue
        sid = str(row["session_id"])
        chain = chain_of.get(sid)
        previous = last_input.get(sid, [])
        if chain is not None and messages[: len(previous)] != previous:
            data.chain_breaks += 1  # this turn does not extend the last one: a new chain under the same id
            chains[sid] = chains.get(sid, 1) + 1
            chain, previous = f"{sid}#chain{chains[sid]}", []
        chain = chain or sid
        if chain not in sessions:
            if max_sessions is not None and len(sessions) >= max_sessions:
                continue
            sessions[chain] = ReplaySession(chain, [])
        # share the previous turn's message objects: memory grows with new messages, not with history length
        messages = previous + messages[len(previous) :]
        sessions[chain].turns.append(
            Turn(
                prompt=None,
                messages=messages,
                prompt_tokens=_tokens(messages),
                output_tokens=output,
                gap_s=float(row["gap_s"]),
            )
        )
        chain_of[sid], last_input[sid] = chain, messages
    data.sessions = list(sessions.values())
    if data.chain_breaks:
        data.notes.append(f"{data.chain_breaks} chain break(s): turns that did not extend their session's history")
    return data


@shape_builder("agentic_replay")
def agentic_source(request: ShapeRequest) -> Source:
    data = load_agentic(resolve_dataset(request.traffic.get("dataset")))
    notes = [*data.notes, f"agentic data set {data.source}: {len(data.sessions)} sessions from {data.rows} rows"]
    sessions: list[Session] = list(data.sessions)
    return Source(
        request.shape, shared_sessions(sessions, request.shard, request.shards), request.my_users, True, notes=notes
    )
