"""Traffic shapes turned into conversations: who sends what, in which order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvbench_loadgen.prompts import words

__all__ = ["SessionUser", "UnsupportedShapeError", "build_users"]

SUPPORTED_SHAPES = ("synthetic_sessions", "shared_prompt", "per_user_history")


class UnsupportedShapeError(ValueError):
    pass


@dataclass
class SessionUser:
    """One closed-loop user: sessions of ``turns`` turns; history (inputs and outputs) is resent."""

    user_index: int
    group: int
    prefix: list[str]
    turns: int
    input_tokens: int
    output_tokens: int
    think_time_s: float
    session_number: int = 0
    turn: int = 0
    history: list[str] = field(default_factory=list)

    @property
    def session_id(self) -> str:
        return f"u{self.user_index}-s{self.session_number}"

    def next_prompt(self) -> list[str]:
        new_input = words(f"g{self.group}/{self.session_id}/t{self.turn}", self.input_tokens)
        return [*self.prefix, *self.history, *new_input]

    def record_turn(self, prompt: list[str], output_text: str) -> None:
        self.history = prompt[len(self.prefix) :] + output_text.split()
        self.turn += 1
        if self.turn >= self.turns:
            self.session_number += 1
            self.turn = 0
            self.history = []


def build_users(traffic: dict[str, Any], users: int) -> list[SessionUser]:
    shape = traffic.get("shape", "agentic_replay")
    if shape not in SUPPORTED_SHAPES:
        raise UnsupportedShapeError(
            f"traffic.shape {shape!r} is not driven by this load generator yet; "
            f"supported: {', '.join(SUPPORTED_SHAPES)}"
        )
    spec = traffic.get("synthetic") or {}
    groups = int(spec.get("groups", 4))
    prefix_tokens = int(spec.get("prefix_tokens", 1024))
    turns = int(spec.get("turns", 4))
    if shape == "shared_prompt":
        groups, turns = 1, 1
    out: list[SessionUser] = []
    for i in range(users):
        group = i if shape == "per_user_history" else i % groups
        prefix = words(f"prefix/{group}", prefix_tokens) if shape != "per_user_history" else []
        out.append(
            SessionUser(
                user_index=i,
                group=group,
                prefix=prefix,
                turns=turns,
                input_tokens=int(spec.get("input_tokens", 128)),
                output_tokens=int(spec.get("output_tokens", 64)),
                think_time_s=float(spec.get("think_time_s", 0.0)),
            )
        )
    return out
