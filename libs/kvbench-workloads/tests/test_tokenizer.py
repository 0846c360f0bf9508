"""The model's tokenizer from a local tokenizer.json (the Hub is never contacted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from kvbench_workloads.prompts import TOKENIZER_NAME, words
from kvbench_workloads.sources import build_source
from kvbench_workloads.tokenizer import find_tokenizer_file, load_tokenizer


def _train(path: Path) -> Tokenizer:
    """A small BPE tokenizer trained on kvbench's own prompt words: words split into several tokens."""
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"])
    tokenizer.train_from_iterator([" ".join(words(f"corpus/{i}", 200)) for i in range(20)], trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return tokenizer


def test_the_models_tokenizer_is_found_in_the_cache_and_counts_prompts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KVBENCH_TOKENIZER_PATH", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert load_tokenizer("Qwen/Qwen3-8B").name == TOKENIZER_NAME  # nothing installed: the words fallback
    file = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "abc123" / "tokenizer.json"
    trained = _train(file)
    assert find_tokenizer_file("Qwen/Qwen3-8B") == file
    tokenizer = load_tokenizer("Qwen/Qwen3-8B")
    assert "Qwen/Qwen3-8B tokenizer" in tokenizer.name
    text = " ".join(words("prompt", 50))
    assert tokenizer.count(text) == len(trained.encode(text).ids)
    assert tokenizer.count(text) > 50  # this small vocabulary splits most words
    source = build_source({"shape": "shared_prompt"}, users=1, model="Qwen/Qwen3-8B")
    assert source.tokenizer == tokenizer.name  # recorded with every job
    assert source.count_tokens is not None


def test_a_configured_path_wins_and_a_broken_file_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "tok"
    _train(directory / "tokenizer.json")
    monkeypatch.setenv("KVBENCH_TOKENIZER_PATH", str(directory))
    assert find_tokenizer_file(None) == directory / "tokenizer.json"
    assert load_tokenizer(None).name != TOKENIZER_NAME
    (directory / "tokenizer.json").write_text("{not json")
    assert load_tokenizer(None).name == TOKENIZER_NAME
