"""What the driver sends: sessions of turns, in order.

A session is a conversation (or a single trace row): its turns go strictly one after another, each
after the previous response and its recorded gap. Sessions run concurrently. A session whose next
turn depends on the live reply (synthetic sessions resend what the model said) learns the reply
through ``record``; replayed sessions resend their recorded history verbatim and ignore it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ReplaySession", "Session", "Turn"]


@dataclass(frozen=True)
class Turn:
    """One request: the body part that carries the prompt (``prompt``, ``words`` or ``messages``) and its sizes."""

    prompt: str | None  # None for a chat turn, and for a turn built as ``words`` (joined when sent: ``text``)
    messages: list[dict[str, Any]] | None
    prompt_tokens: int  # by the load generator's tokenizer (the engine's usage, when sent, wins)
    output_tokens: int
    gap_s: float = 0.0  # wait after the previous turn's response before sending this one (think time, pre_gap)
    phase: int = 0  # document_reuse: the round this visit belongs to
    words: tuple[str, ...] | None = None  # the prompt as words (synthetic prompts: the simulator never joins them)

    @property
    def chat(self) -> bool:
        return self.messages is not None

    def text(self) -> str | None:
        """The completion prompt as sent: ``prompt``, or ``words`` joined by spaces; None for a chat turn."""
        if self.prompt is not None or self.words is None:
            return self.prompt
        return " ".join(self.words)

    def head(self, chars: int = 512) -> str:
        """The start of the prompt, for prefix-aware routing."""
        if self.prompt is not None:
            return self.prompt[:chars]
        if self.words is not None:  # chars words make at least chars characters: the same start as text()'s
            return " ".join(self.words[:chars])[:chars]
        return str((self.messages or [{}])[0].get("content") or "")[:chars]


class Session:
    """Base: a fixed list of turns. Subclasses may build turns from the replies."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.turn = 0
        self.start_at_s: float | None = None  # trace schedule: the first turn is sent this long after load start

    def next_turn(self) -> Turn | None:
        raise NotImplementedError

    def record(self, turn: Turn, reply: str, ok: bool) -> None:
        """Called after each response; the next ``next_turn`` moves on."""
        self.turn += 1

    def record_words(self, turn: Turn, reply_words: Sequence[str]) -> None:
        """``record`` of a response that came as words (the simulator's batch mode), whitespace-free each: what
        ``record`` would make of them joined by spaces."""
        self.record(turn, " ".join(reply_words), True)


class ReplaySession(Session):
    """Recorded turns replayed verbatim, whatever the model answers."""

    def __init__(self, session_id: str, turns: list[Turn]) -> None:
        super().__init__(session_id)
        self.turns = turns

    def next_turn(self) -> Turn | None:
        return self.turns[self.turn] if self.turn < len(self.turns) else None
