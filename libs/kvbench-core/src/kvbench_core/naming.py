"""The order people read machine and port names in: ``sim-2`` before ``sim-10``, ``swp9`` before ``swp10``.

A string sort puts ``swp10`` to ``swp19`` between ``swp1`` and ``swp2``; with fifty machines a listing in that order
has to be searched, not read. Digit runs compare as numbers, the rest as text (the common idiom: no library for it is
among our dependencies, and ``natsort`` would be one more for three lines).
"""

from __future__ import annotations

import re

__all__ = ["natural_key"]

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[tuple[tuple[int, int | str], ...], str]:
    """Sort key: the name split into text and digit runs (a digit run sorts as its number, before any text), then
    the name itself, so names equal as numbers (``swp1``, ``swp01``) still sort one way."""
    runs = tuple((0, int(part)) if part.isdigit() else (1, part) for part in _DIGITS.split(name) if part)
    return runs, name
