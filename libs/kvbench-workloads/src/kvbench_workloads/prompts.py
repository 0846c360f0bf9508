"""Deterministic prompt text with known token counts.

Without the model's tokenizer, kvbench writes prompts as whitespace-separated words from a fixed
vocabulary and counts one token per word ("words" tokenizer). That is exact on the simulated engine
and close on real tokenizers for these short, common-character words; the tokenizer used is recorded
with every job.
"""

from __future__ import annotations

import random

__all__ = ["TOKENIZER_NAME", "WORD_OF_BYTE", "words"]

TOKENIZER_NAME = "words (1 token per whitespace-separated word)"
_VOCAB = [f"{a}{b}" for a in "bcdfghjklmnprstvz" for b in ("a", "e", "i", "o", "u", "an", "en", "in", "on", "ar")]
# a random byte's word (byte mod the vocabulary's size), looked up in C: a simulated hour draws millions of words
WORD_OF_BYTE = [_VOCAB[b % len(_VOCAB)] for b in range(256)]


def words(key: str, count: int) -> list[str]:
    """``count`` words fixed by ``key``: the same key always gives the same text (in any process: a string seed
    is hashed with SHA-512 by ``random.Random``, not with Python's per-process string hash)."""
    return list(map(WORD_OF_BYTE.__getitem__, random.Random(key).randbytes(count)))
