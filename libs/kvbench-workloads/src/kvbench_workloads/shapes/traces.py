"""Public request traces turned into timed single-request sessions (reference/traces.md).

- Mooncake JSONL: ``timestamp`` (ms from the trace start), ``input_length``, ``output_length``, ``hash_ids``.
  Each id is one 512-token block (the trace's block size) whose text is fixed by the id alone, so equal
  ids give equal prefixes and a prefix cache sees exactly the trace's sharing. Each block starts with a
  separator word so adjacent blocks cannot merge when a real tokenizer re-reads the text; the last block
  is cut to the row's remainder (a prefix of the same block, so sharing still holds).
- Azure 2023 CSV: ``TIMESTAMP`` (absolute, no zone), ``ContextTokens``, ``GeneratedTokens``; no content
  or sharing, so every prompt is distinct text (declared synthetic).
- ServeGen descriptors: per 600 s window a rate and an inter-arrival distribution (Gamma or Weibull),
  per 6 h window token-count distributions; requests are sampled from them (seeded).

Times are scaled by ``time_scale`` (2.0 = half the rate). The Mooncake conversation trace's timestamps
come in 3 s buckets; ``jitter`` spreads the requests of a bucket evenly over it.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvbench_workloads.jsonl import read_jsonl
from kvbench_workloads.prompts import words
from kvbench_workloads.sessions import Session, Turn
from kvbench_workloads.source import ShapeRequest, Source, UnsupportedShapeError, shape_builder, shared_sessions

__all__ = [
    "TraceRow",
    "TraceSession",
    "block_text",
    "mooncake_prompt",
    "public_traces_dir",
    "read_trace",
    "trace_sessions",
]

MOONCAKE_BLOCK_TOKENS = 512


def public_traces_dir() -> Path | None:
    """Where the public traces copied next to the checkout live (``../shared/data/traces``), or
    ``KVBENCH_TRACES_DIR``; None when neither exists."""
    import os  # noqa: PLC0415

    candidates = [os.environ.get("KVBENCH_TRACES_DIR", "")]
    here = Path(__file__).resolve()
    candidates += [str(parent / "shared" / "data" / "traces") for parent in here.parents]
    candidates.append("/work/shared/data/traces")  # where this project's workspaces keep them
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


@dataclass(frozen=True)
class TraceRow:
    at_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


@lru_cache(maxsize=65536)
def block_text(hash_id: int, block_tokens: int) -> tuple[str, ...]:
    """The words of one block: a separator, then text fixed by the id."""
    return (f"<blk{hash_id}>", *words(f"block/{hash_id}", block_tokens - 1))


def mooncake_prompt(row: TraceRow, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> str:
    n = len(row.hash_ids)
    if n == 0:
        raise ValueError("a Mooncake row needs hash_ids")
    remainder = row.input_tokens - block_tokens * (n - 1)
    if not 0 < remainder <= block_tokens:
        raise ValueError(
            f"input_length {row.input_tokens} does not fit {n} blocks of {block_tokens} tokens "
            "(the last block must hold 1..block tokens)"
        )
    parts: list[str] = []
    for index, hash_id in enumerate(row.hash_ids):
        text = block_text(hash_id, block_tokens)
        parts.extend(text if index < n - 1 else text[:remainder])
    return " ".join(parts)


def _mooncake_row(row: dict[str, Any]) -> TraceRow:
    return TraceRow(
        at_s=float(row["timestamp"]) / 1000.0,
        input_tokens=int(row["input_length"]),
        output_tokens=max(1, int(row["output_length"])),
        hash_ids=tuple(int(h) for h in row["hash_ids"]),
    )


def _mooncake(path: Path) -> Iterator[TraceRow]:
    return read_jsonl(path, _mooncake_row, field="traffic.trace.path", kind="a Mooncake row")


def _azure(path: Path) -> Iterator[TraceRow]:
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"traffic.trace.path: {path} lacks the Azure columns {sorted(missing)}")
        first: datetime | None = None
        for row in reader:
            # 7 fractional digits: Python parses at most 6
            stamp = datetime.fromisoformat(row["TIMESTAMP"][:26])
            first = first or stamp
            yield TraceRow(
                at_s=(stamp - first).total_seconds(),
                input_tokens=max(1, int(row["ContextTokens"])),
                output_tokens=max(1, int(row["GeneratedTokens"])),
            )


def _servegen(path: Path, seed: int, horizon_s: float) -> Iterator[TraceRow]:
    """``path`` is the ``*-trace.csv``; its ``*-dataset.json`` sibling holds the token distributions."""
    dataset_path = path.with_name(path.name.replace("-trace.csv", "-dataset.json"))
    if not dataset_path.exists():
        raise ValueError(f"traffic.trace.path: ServeGen needs {dataset_path.name} next to {path.name}")
    windows = json.loads(dataset_path.read_text(encoding="utf-8"))
    pmfs: list[tuple[float, dict[int, float], dict[int, float]]] = []
    for start, spec in sorted(windows.items(), key=lambda kv: float(kv[0])):
        inputs, outputs = ast.literal_eval(spec["input_tokens"]), ast.literal_eval(spec["output_tokens"])
        if inputs and outputs:
            pmfs.append((float(start), inputs, outputs))
    if not pmfs:
        raise ValueError(f"traffic.trace.path: {dataset_path.name} has no token distributions")
    rng = random.Random(seed)

    def draw(pmf: dict[int, float]) -> int:
        return int(rng.choices(list(pmf), weights=list(pmf.values()))[0])

    with path.open(encoding="utf-8", newline="") as handle:
        for fields in csv.reader(handle):
            start, rate, _cv, kind = float(fields[0]), float(fields[1]), fields[2], fields[3]
            if start >= horizon_s:
                return
            if rate <= 0 or kind not in ("Gamma", "Weibull"):
                continue
            a, b = float(fields[4]), float(fields[5])
            window_end = start + 600.0
            t = start
            _, inputs, outputs = next((p for p in reversed(pmfs) if p[0] <= start), pmfs[0])
            while True:
                t += rng.gammavariate(a, b) if kind == "Gamma" else rng.weibullvariate(b, a)
                if t >= window_end or t >= horizon_s:
                    break
                yield TraceRow(at_s=t, input_tokens=max(1, draw(inputs)), output_tokens=max(1, draw(outputs)))


def read_trace(fmt: str, path: Path, *, seed: int = 0, horizon_s: float = math.inf) -> Iterator[TraceRow]:
    if not path.exists():
        raise FileNotFoundError(f"traffic.trace.path: {path} does not exist; give the path of a {fmt} trace file")
    if fmt == "mooncake":
        return _mooncake(path)
    if fmt == "azure":
        return _azure(path)
    if fmt == "servegen":
        return _servegen(path, seed, horizon_s if math.isfinite(horizon_s) else 86400.0)
    raise ValueError(f"traffic.trace.format: {fmt!r} is not one of mooncake, azure, servegen")


def _jittered(rows: list[TraceRow]) -> list[TraceRow]:
    """Requests tied on one timestamp spread evenly until the next distinct timestamp."""
    out: list[TraceRow] = []
    i = 0
    while i < len(rows):
        j = i
        while j < len(rows) and rows[j].at_s == rows[i].at_s:
            j += 1
        span = (rows[j].at_s - rows[i].at_s) if j < len(rows) else 0.0
        for k in range(i, j):
            row = rows[k]
            out.append(TraceRow(row.at_s + span * (k - i) / (j - i), row.input_tokens, row.output_tokens, row.hash_ids))
        i = j
    return out


class TraceSession(Session):
    """One trace row; its prompt is built only when it is sent (a whole trace's text would not fit memory)."""

    def __init__(self, session_id: str, row: TraceRow, fmt: str, block_tokens: int) -> None:
        super().__init__(session_id)
        self.start_at_s = row.at_s
        self._row, self._fmt, self._block_tokens = row, fmt, block_tokens
        self._built: Turn | None = None

    def next_turn(self) -> Turn | None:
        if self.turn > 0:
            return None
        if self._built is None:
            self._built = self._build()
        return self._built

    def _build(self) -> Turn:
        row = self._row
        if row.hash_ids:
            prompt = mooncake_prompt(row, self._block_tokens)
        else:
            prompt = " ".join(words(f"{self._fmt}/{self.session_id}", row.input_tokens))
        return Turn(prompt=prompt, messages=None, prompt_tokens=row.input_tokens, output_tokens=row.output_tokens)


def trace_sessions(
    fmt: str,
    path: Path,
    *,
    time_scale: float = 1.0,
    jitter: bool = False,
    seed: int = 0,
    horizon_s: float = math.inf,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> list[TraceSession]:
    """One single-request session per trace row, to be sent ``at_s`` x ``time_scale`` after the load start;
    rows later than ``horizon_s`` (after scaling) are left out."""
    rows = sorted(read_trace(fmt, path, seed=seed, horizon_s=horizon_s / time_scale), key=lambda r: r.at_s)
    if jitter:
        rows = _jittered(rows)
    sessions: list[TraceSession] = []
    for index, row in enumerate(rows):
        scaled = TraceRow(row.at_s * time_scale, row.input_tokens, row.output_tokens, row.hash_ids)
        if scaled.at_s >= horizon_s:
            break
        sessions.append(TraceSession(f"r{index}", scaled, fmt, block_tokens))
    return sessions


@shape_builder("trace_replay")
def trace_source(request: ShapeRequest) -> Source:
    trace = request.traffic.get("trace")
    if not trace:
        raise UnsupportedShapeError("traffic.trace is required for trace_replay: {format, path, time_scale}")
    sessions: list[Session] = list(
        trace_sessions(
            str(trace["format"]),
            Path(str(trace["path"])).expanduser(),
            time_scale=float(trace.get("time_scale", 1.0)),
            jitter=bool(trace.get("jitter", False)),
            seed=request.seed,
            horizon_s=request.horizon_s,
            block_tokens=int(trace.get("block_tokens", 512)),
        )
    )
    notes = [f"trace {trace['path']} ({trace['format']}): {len(sessions)} requests"]
    return Source(
        request.shape, shared_sessions(sessions, request.shard, request.shards), request.my_users, True, notes=notes
    )
