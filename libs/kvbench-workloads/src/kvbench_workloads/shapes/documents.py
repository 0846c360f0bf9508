"""``document_reuse``: each document visited once per round, a visit being the document and a question."""

from __future__ import annotations

import random
from typing import Any

from kvbench_workloads.prompts import words
from kvbench_workloads.sessions import ReplaySession, Session, Turn
from kvbench_workloads.source import (
    ShapeRequest,
    Source,
    UnsupportedShapeError,
    contexts_for_ratio,
    shape_builder,
    shared_sessions,
)

__all__ = ["document_sessions"]


def document_sessions(spec: dict[str, Any], seed: int, count: int | None = None) -> list[Session]:
    """Each document visited once per round in the given order; a visit is the document and a question."""
    count = count or int(spec["count"])
    tokens, rounds = int(spec["tokens"]), int(spec.get("rounds", 2))
    question_tokens, output_tokens = int(spec.get("question_tokens", 16)), int(spec.get("output_tokens", 16))
    order = spec.get("order", "tile")
    rng = random.Random(seed)
    if order == "interleave":  # each document's visits back to back
        visits = [(r, d) for d in range(count) for r in range(1, rounds + 1)]
    else:
        visits = []
        for r in range(1, rounds + 1):
            docs = list(range(count))
            if order == "random":
                rng.shuffle(docs)
            visits.extend((r, d) for d in docs)
    sessions: list[Session] = []
    for index, (round_no, doc) in enumerate(visits):
        text = [*words(f"document/{doc}", tokens), *words(f"question/{doc}/{round_no}", question_tokens)]
        turn = Turn(
            prompt=" ".join(text), messages=None, prompt_tokens=len(text), output_tokens=output_tokens, phase=round_no
        )
        sessions.append(ReplaySession(f"d{doc}-r{round_no}-v{index}", [turn]))
    return sessions


@shape_builder("document_reuse")
def document_source(request: ShapeRequest) -> Source:
    spec = request.traffic.get("documents")
    if not spec:
        raise UnsupportedShapeError("traffic.documents is required for document_reuse: {count, tokens, rounds, ...}")
    notes: list[str] = []
    count = int(spec["count"])
    ratio, capacity = request.working_set_ratio, request.capacity_tokens
    if ratio and capacity:
        count = contexts_for_ratio(ratio, capacity, int(spec["tokens"]))
        notes.append(f"working_set_ratio {ratio}: {count} documents over {capacity:,} GPU KV tokens")
    docs = document_sessions(spec, request.seed, count)
    return Source(
        request.shape,
        shared_sessions(docs, request.shard, request.shards),
        request.my_users,
        finite=True,
        measure_phases=frozenset(int(r) for r in spec.get("measure_rounds", [2])),
        notes=notes,
        requests_expected=len(range(request.shard, len(docs), request.shards)),  # one request a visit
    )
