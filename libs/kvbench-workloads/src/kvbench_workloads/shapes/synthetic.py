"""Synthetic multi-turn sessions: ``synthetic_sessions``, ``shared_prompt`` and ``per_user_history``.

Each user has an endless series of conversations: a group prefix, then per turn new input; the history (inputs
and the model's replies) is resent on every turn.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import lru_cache

from kvbench_workloads.prompts import words
from kvbench_workloads.sessions import Session, Turn
from kvbench_workloads.source import ShapeRequest, Source, contexts_for_ratio, shape_builder

__all__ = ["SyntheticSession"]


class SyntheticSession(Session):
    """A user's conversation: a group prefix, then per turn new input; the history (inputs and the model's
    replies) is resent on every turn."""

    def __init__(self, session_id: str, prefix: Sequence[str], turns: int, input_tokens: int, output_tokens: int,
                 think_time_s: float) -> None:  # fmt: skip
        super().__init__(session_id)
        self.prefix, self.turns = tuple(prefix), turns
        self.input_tokens, self.output_tokens, self.think_time_s = input_tokens, output_tokens, think_time_s
        self.context = self.prefix  # the prefix, then what was said so far (inputs and replies), resent each turn
        self._built: tuple[int, Turn] | None = None  # the driver may look at the next turn before sending it

    def next_turn(self) -> Turn | None:
        if self.turn >= self.turns:
            return None
        if self._built is not None and self._built[0] == self.turn:
            return self._built[1]
        prompt = self.context + tuple(words(f"{self.session_id}/t{self.turn}", self.input_tokens))
        turn = Turn(
            prompt=None,  # joined when sent (Turn.text): batch mode never needs the string
            messages=None,
            words=prompt,
            prompt_tokens=len(prompt),
            output_tokens=self.output_tokens,
            gap_s=self.think_time_s if self.turn > 0 else 0.0,
        )
        self._built = (self.turn, turn)
        return turn

    def record(self, turn: Turn, reply: str, ok: bool) -> None:
        if not ok:
            self.turn = self.turns  # a failed turn ends the conversation: its history is unknown
        elif turn.words is not None:  # built by next_turn
            self.record_words(turn, reply.split())
        else:  # as sent: the prefix's words are shared with the group's other sessions, not copies of them
            said = tuple((turn.prompt or "").split())
            self.context = self.prefix + said[len(self.prefix) :] + tuple(reply.split())
            self.turn += 1

    def record_words(self, turn: Turn, reply_words: Sequence[str]) -> None:
        if turn.words is None:
            super().record_words(turn, reply_words)
            return
        self.context = turn.words + tuple(reply_words)  # it starts with the prefix's own words; never joined or split
        self.turn += 1


@shape_builder("synthetic_sessions", "shared_prompt", "per_user_history")
def synthetic_source(request: ShapeRequest) -> Source:
    notes: list[str] = []
    spec = request.traffic.get("synthetic") or {}
    shape, population = request.shape, max(1, request.users)
    ratio, capacity = request.working_set_ratio, request.capacity_tokens
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
            prefix: tuple[str, ...] = ()
        else:
            # a user keeps its group; with more groups than users (working-set ratio) its sessions walk the groups
            group = user % groups if groups <= population else (user + number * population) % groups
            prefix = _prefix_words(group, prefix_tokens)  # one tuple shared by the group's sessions
        return SyntheticSession(
            f"u{user}-s{number}", prefix, turns, input_tokens, output_tokens, float(spec.get("think_time_s", 0.0))
        )

    return Source(shape, next_session, request.my_users, finite=False, notes=notes)


@lru_cache(maxsize=4096)
def _prefix_words(group: int, tokens: int) -> tuple[str, ...]:
    return tuple(words(f"prefix/{group}", tokens))
