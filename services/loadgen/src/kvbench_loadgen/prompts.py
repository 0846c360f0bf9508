"""Deterministic prompt text with known token counts.

Without the model's tokenizer, kvbench writes prompts as whitespace-separated words from a fixed
vocabulary and counts one token per word ("words" tokenizer). That is exact on the simulated engine
and close on real tokenizers for these short, common-character words; the tokenizer used is recorded
with every job.
"""

from __future__ import annotations

import hashlib

__all__ = ["TOKENIZER_NAME", "words"]

TOKENIZER_NAME = "words (1 token per whitespace-separated word)"
_VOCAB = [f"{a}{b}" for a in "bcdfghjklmnprstvz" for b in ("a", "e", "i", "o", "u", "an", "en", "in", "on", "ar")]


def words(key: str, count: int) -> list[str]:
    """``count`` words fixed by ``key``: the same key always gives the same text."""
    out: list[str] = []
    counter = 0
    while len(out) < count:
        digest = hashlib.blake2b(f"{key}/{counter}".encode(), digest_size=32).digest()
        out.extend(_VOCAB[b % len(_VOCAB)] for b in digest)
        counter += 1
    return out[:count]
