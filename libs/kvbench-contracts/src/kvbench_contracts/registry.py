"""Every bus message, as registered by its own definition (``Envelope.__pydantic_init_subclass__``), and the
messages of each stream: the lists consumers subscribe with are derived here, never written by hand."""

from __future__ import annotations

from kvbench_contracts import commands, events, fabric
from kvbench_contracts.envelope import MESSAGES, Envelope
from kvbench_contracts.streams import stream_for_subject

__all__ = ["ALL_MESSAGES", "messages_in"]

_DEFINED_IN = (commands, events, fabric)  # importing these modules defines (and so registers) every message
ALL_MESSAGES: tuple[type[Envelope], ...] = tuple(MESSAGES.values())


def messages_in(stream: str) -> tuple[type[Envelope], ...]:
    """The messages whose subjects fall in ``stream`` (a JetStream stream name, e.g. ``KVBENCH_CONTROL``)."""
    return tuple(m for m in ALL_MESSAGES if stream_for_subject(m.subject_filter().replace("*", "x")).name == stream)
