"""The model's own tokenizer, when it is available locally, for prompt token counts.

Looked for, in order: ``KVBENCH_TOKENIZER_PATH`` (a ``tokenizer.json`` or a directory holding one), then the
model's snapshot in the Hugging Face cache (``$HF_HUB_CACHE`` or ``$HF_HOME/hub``). It is read with the
``tokenizers`` library when that is installed; the Hub itself is never contacted. Without one, kvbench counts
one token per whitespace-separated word (its prompts are written that way; exact on the simulated engine) and
says so in every job's ``tokenizer`` field. Real engines report their own count in ``usage``, which wins.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvbench_workloads.prompts import TOKENIZER_NAME

__all__ = ["PromptTokenizer", "find_tokenizer_file", "load_tokenizer"]


@dataclass(frozen=True)
class PromptTokenizer:
    name: str
    count: Callable[[str], int]


WORDS = PromptTokenizer(TOKENIZER_NAME, lambda text: len(text.split()))


def find_tokenizer_file(model: str | None) -> Path | None:
    configured = os.environ.get("KVBENCH_TOKENIZER_PATH")
    if configured:
        path = Path(configured).expanduser()
        path = path / "tokenizer.json" if path.is_dir() else path
        return path if path.is_file() else None
    if not model or "/" not in model:
        return None
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    snapshots = hub.expanduser() / f"models--{model.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/tokenizer.json")) if snapshots.is_dir() else []
    return found[-1] if found else None


def load_tokenizer(model: str | None) -> PromptTokenizer:
    """The model's tokenizer if it is here and readable, else the documented words fallback."""
    path = find_tokenizer_file(model)
    if path is None:
        return WORDS
    try:
        from tokenizers import Tokenizer  # noqa: PLC0415 (optional: only when a tokenizer file exists)
    except ImportError:
        return WORDS
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception:
        return WORDS
    encode = tokenizer.encode
    return PromptTokenizer(f"{model or 'local'} tokenizer ({path})", lambda text: len(encode(text).ids))
