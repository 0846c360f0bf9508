"""Tokens and deterministic output text.

The simulator's tokenizer is deliberately simple and documented: one token per whitespace-separated
word. kvbench's load generator writes prompts as words, so prompt token counts are exact on the
simulator. Output words are drawn from a seeded hash of the prompt, so the same prompt and seed always
give the same text (what an accuracy gate compares between cached and uncached runs).
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["chat_to_prompt", "output_words", "tokenize"]


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


def output_words(prompt_tokens: list[str], count: int, seed: int) -> list[str]:
    digest = hashlib.blake2b(" ".join(prompt_tokens[-64:]).encode() + seed.to_bytes(8, "big"), digest_size=16)
    state = int.from_bytes(digest.digest(), "big")
    words: list[str] = []
    for _ in range(count):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        words.append(f"w{(state >> 33) % 4096}")
    return words
