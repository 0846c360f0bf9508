"""What a traffic shape produces (a ``Source`` of sessions) and the registry of shape builders.

Each shape module registers its builder with ``@shape_builder("name", ...)``; ``sources.build_source`` looks
the plan's shape up here, so a shape is one module and one decorator, and a test checks that every shape the
plan contract allows has a builder.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kvbench_workloads.prompts import TOKENIZER_NAME
from kvbench_workloads.sessions import Session

__all__ = [
    "SHAPE_BUILDERS",
    "ShapeBuilder",
    "ShapeRequest",
    "Source",
    "UnsupportedShapeError",
    "contexts_for_ratio",
    "shape_builder",
    "shared_sessions",
]


class UnsupportedShapeError(ValueError):
    pass


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
    requests_expected: int | None = None  # a session-bounded shape that knows its length: progress counts requests
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ShapeRequest:
    """Everything a shape builder may use: the plan's traffic section and the job's shard of it."""

    traffic: dict[str, Any]
    shape: str
    users: int
    seed: int
    shard: int
    shards: int
    working_set_ratio: float | None
    capacity_tokens: int | None
    horizon_s: float

    @property
    def my_users(self) -> list[int]:
        return list(range(self.shard, self.users, self.shards))


ShapeBuilder = Callable[[ShapeRequest], Source]
SHAPE_BUILDERS: dict[str, ShapeBuilder] = {}


def shape_builder(*names: str) -> Callable[[ShapeBuilder], ShapeBuilder]:
    """Register ``builder`` as the one that turns these traffic shapes into a ``Source``."""

    def register(builder: ShapeBuilder) -> ShapeBuilder:
        for name in names:
            if name in SHAPE_BUILDERS:
                raise ValueError(f"traffic shape {name!r} has two builders")
            SHAPE_BUILDERS[name] = builder
        return builder

    return register


def contexts_for_ratio(ratio: float, capacity_tokens: int, tokens_per_context: int) -> int:
    """Distinct contexts whose reusable tokens are ``ratio`` x the pool's GPU KV capacity (DESIGN.md §6)."""
    return max(1, math.ceil(ratio * capacity_tokens / max(1, tokens_per_context)))


def shared_sessions(sessions: list[Session], shard: int, shards: int) -> Callable[[int], Session | None]:
    """A finite list that every user (or arrival) of this shard takes from in order: every n-th session."""
    mine: Iterator[Session] = itertools.islice(iter(sessions), shard, None, shards)
    return lambda _user: next(mine, None)
