"""A plan's traffic section turned into a source of sessions (every shape of PLAN.md).

Synthetic shapes give each user an endless series of sessions; replayed shapes (agentic data set,
traces, documents) are a finite list that the users (or arrivals) share in order. Sharding gives each
load generator every n-th user or every n-th replayed session.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, get_args

from kvbench_contracts.plan import Shape
from kvbench_loadgen.agentic import load_agentic, resolve_dataset
from kvbench_loadgen.prompts import TOKENIZER_NAME, words
from kvbench_loadgen.sessions import ReplaySession, Session, Turn
from kvbench_loadgen.tokenizer import load_tokenizer
from kvbench_loadgen.traces import trace_sessions

__all__ = ["Source", "SyntheticSession", "UnsupportedShapeError", "build_source", "contexts_for_ratio"]

SHAPES: tuple[str, ...] = get_args(Shape)


class UnsupportedShapeError(ValueError):
    pass


class SyntheticSession(Session):
    """A user's conversation: a group prefix, then per turn new input; the history (inputs and the model's
    replies) is resent on every turn."""

    def __init__(self, session_id: str, prefix: list[str], turns: int, input_tokens: int, output_tokens: int,
                 think_time_s: float) -> None:  # fmt: skip
        super().__init__(session_id)
        self.prefix, self.turns = prefix, turns
        self.input_tokens, self.output_tokens, self.think_time_s = input_tokens, output_tokens, think_time_s
        self.history: list[str] = []
        self._built: tuple[int, Turn] | None = None  # the driver may look at the next turn before sending it

    def next_turn(self) -> Turn | None:
        if self.turn >= self.turns:
            return None
        if self._built is not None and self._built[0] == self.turn:
            return self._built[1]
        prompt = (*self.prefix, *self.history, *words(f"{self.session_id}/t{self.turn}", self.input_tokens))
        turn = Turn(
            prompt=" ".join(prompt),
            messages=None,
            words=prompt,
            prompt_tokens=len(prompt),
            output_tokens=self.output_tokens,
            gap_s=self.think_time_s if self.turn > 0 else 0.0,
        )
        self._built = (self.turn, turn)
        return turn

    def record(self, turn: Turn, reply: str, ok: bool) -> None:
        if ok:
            said = turn.words if turn.words is not None else tuple((turn.prompt or "").split())
            self.history = [*said[len(self.prefix) :], *reply.split()]
            self.turn += 1
        else:
            self.turn = self.turns  # a failed turn ends the conversation: its history is unknown


@dataclass
class Source:
    """Sessions for one job (one shard of it)."""

    shape: str
    next_session: Callable[[int], Session | None]  # argument: the user (closed loop) or arrival counter
    users: list[int]  # the closed-loop users this shard drives
    finite: bool  # replayed data: the job may end when it runs out
    tokenizer: str = TOKENIZER_NAME
    count_tokens: Callable[[str], int] | None = None  # the model's tokenizer, when one is here
    measure_phases: frozenset[int] = frozenset()  # document_reuse rounds that are measured (empty: all)
    notes: list[str] = field(default_factory=list)


def contexts_for_ratio(ratio: float, capacity_tokens: int, tokens_per_context: int) -> int:
    """Distinct contexts whose reusable tokens are ``ratio`` x the pool's GPU KV capacity (DESIGN.md §6)."""
    return max(1, math.ceil(ratio * capacity_tokens / max(1, tokens_per_context)))


def _shared(sessions: list[Session], shard: int, shards: int) -> Callable[[int], Session | None]:
    mine: Iterator[Session] = itertools.islice(iter(sessions), shard, None, shards)
    return lambda _user: next(mine, None)


def _synthetic(traffic: dict[str, Any], shape: str, population: int, ratio: float | None, capacity: int | None,
               notes: list[str]) -> Callable[[int], Session | None]:  # fmt: skip
    spec = traffic.get("synthetic") or {}
    groups = int(spec.get("groups", 4))
    prefix_tokens = int(spec.get("prefix_tokens", 1024))
    turns = int(spec.get("turns", 4))
    input_tokens, output_tokens = int(spec.get("input_tokens", 128)), int(spec.get("output_tokens", 64))
    if shape == "shared_prompt":
        groups, turns = 1, 1
    if ratio and capacity and shape != "per_user_history" and prefix_tokens > 0:
        groups = contexts_for_ratio(ratio, capacity, prefix_tokens)
        notes.append(
            f"working_set_ratio {ratio} over {capacity:,} GPU KV tokens: {groups} distinct prefixes of {prefix_tokens}"
        )
    numbers: dict[int, itertools.count[int]] = {}

    def next_session(user: int) -> Session:
        number = next(numbers.setdefault(user, itertools.count()))
        if shape == "per_user_history":
            prefix: list[str] = []
        else:
            # a user keeps its group; with more groups than users (working-set ratio) its sessions walk the groups
            group = user % groups if groups <= population else (user + number * population) % groups
            prefix = _prefix(group, prefix_tokens)
        return SyntheticSession(
            f"u{user}-s{number}", prefix, turns, input_tokens, output_tokens, float(spec.get("think_time_s", 0.0))
        )

    return next_session


@lru_cache(maxsize=4096)
def _prefix_words(group: int, tokens: int) -> tuple[str, ...]:
    return tuple(words(f"prefix/{group}", tokens))


def _prefix(group: int, tokens: int) -> list[str]:
    return list(_prefix_words(group, tokens))


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


def build_source(
    traffic: dict[str, Any],
    *,
    users: int,
    model: str | None = None,
    seed: int = 0,
    shard: int = 0,
    shards: int = 1,
    working_set_ratio: float | None = None,
    capacity_tokens: int | None = None,
    horizon_s: float = math.inf,
) -> Source:
    shape = str(traffic.get("shape", "agentic_replay"))
    if shape not in SHAPES:
        raise UnsupportedShapeError(f"traffic.shape {shape!r} is not one of {', '.join(SHAPES)}")
    if working_set_ratio and not capacity_tokens and shape in ("synthetic_sessions", "shared_prompt", "document_reuse"):
        raise UnsupportedShapeError(
            "measurement.working_set_ratio needs the pool's GPU KV capacity, and no engine reported it "
            "(vllm:cache_config_info or sglang:max_total_num_tokens); remove the ratio or use an engine that does"
        )
    source = _build(traffic, shape, users, seed, shard, shards, working_set_ratio, capacity_tokens, horizon_s)
    tokenizer = load_tokenizer(model)
    if tokenizer.name != TOKENIZER_NAME:
        source.tokenizer, source.count_tokens = tokenizer.name, tokenizer.count
    return source


def _build(traffic: dict[str, Any], shape: str, users: int, seed: int, shard: int, shards: int,
           working_set_ratio: float | None, capacity_tokens: int | None, horizon_s: float) -> Source:  # fmt: skip
    my_users = list(range(shard, users, shards))
    notes: list[str] = []
    if shape in ("synthetic_sessions", "shared_prompt", "per_user_history"):
        maker = _synthetic(traffic, shape, max(1, users), working_set_ratio, capacity_tokens, notes)
        return Source(shape, maker, my_users, finite=False, notes=notes)
    if shape == "agentic_replay":
        data = load_agentic(resolve_dataset(traffic.get("dataset")))
        notes.extend(data.notes)
        notes.append(f"agentic data set {data.source}: {len(data.sessions)} sessions from {data.rows} rows")
        return Source(shape, _shared(list(data.sessions), shard, shards), my_users, finite=True, notes=notes)
    if shape == "trace_replay":
        trace = traffic.get("trace")
        if not trace:
            raise UnsupportedShapeError("traffic.trace is required for trace_replay: {format, path, time_scale}")
        sessions: list[Session] = list(
            trace_sessions(
                str(trace["format"]),
                Path(str(trace["path"])).expanduser(),
                time_scale=float(trace.get("time_scale", 1.0)),
                jitter=bool(trace.get("jitter", False)),
                seed=seed,
                horizon_s=horizon_s,
                block_tokens=int(trace.get("block_tokens", 512)),
            )
        )
        notes.append(f"trace {trace['path']} ({trace['format']}): {len(sessions)} requests")
        return Source(shape, _shared(sessions, shard, shards), my_users, finite=True, notes=notes)
    spec = traffic.get("documents")
    if not spec:
        raise UnsupportedShapeError("traffic.documents is required for document_reuse: {count, tokens, rounds, ...}")
    count = int(spec["count"])
    if working_set_ratio and capacity_tokens:
        count = contexts_for_ratio(working_set_ratio, capacity_tokens, int(spec["tokens"]))
        notes.append(f"working_set_ratio {working_set_ratio}: {count} documents over {capacity_tokens:,} GPU KV tokens")
    docs = document_sessions(spec, seed, count)
    return Source(
        shape,
        _shared(docs, shard, shards),
        my_users,
        finite=True,
        measure_phases=frozenset(int(r) for r in spec.get("measure_rounds", [2])),
        notes=notes,
    )
