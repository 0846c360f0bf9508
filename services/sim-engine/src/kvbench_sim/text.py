"""Tokens and deterministic output text.

The simulator's tokenizer is deliberately simple and documented: one token per whitespace-separated
word. kvbench's load generator writes prompts as words, so prompt token counts are exact on the
simulator. Output words are drawn from a seeded hash of the prompt, so the same prompt and seed always
give the same text (what an accuracy gate compares between cached and uncached runs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

__all__ = ["WORD_OF_VALUE", "chat_to_prompt", "output_words", "tokenize"]


def tokenize(text: str) -> list[str]:
    return text.split()


def chat_to_prompt(messages: list[dict[str, Any]]) -> str:
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"<|{message.get('role', 'user')}|> {content or ''}")
    parts.append("<|assistant|>")
    return " ".join(parts)


def output_words(prompt_tokens: Sequence[str], count: int, seed: int) -> tuple[str, ...]:
    """``count`` words drawn from an extendable-output hash (SHAKE-128) of the prompt's last 64 tokens and the
    seed: two bytes a word, so a whole reply costs one hash call."""
    key = " ".join(prompt_tokens[-64:]).encode() + seed.to_bytes(8, "big")
    stream = memoryview(hashlib.shake_128(key).digest(2 * count)).cast("H")
    return tuple(map(WORD_OF_VALUE.__getitem__, stream))


_WORDS = [f"w{i}" for i in range(4096)]
WORD_OF_VALUE = _WORDS * 16  # indexed by a 16-bit value: its low 12 bits' word, looked up in C
