"""Secrets at rest (the planner's key) and sealed to one agent (its key pair): what opens, what does not."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from kvbench_core.sealing import AgentKey, SealingError, SecretsKey, seal_for


def test_a_stored_secret_is_ciphertext_that_only_the_same_key_opens(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "secrets-key"
    key = SecretsKey.create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = key.encrypt("hf_abcdef123456")
    assert b"hf_abcdef123456" not in stored
    assert key.encrypt("hf_abcdef123456") != stored  # a fresh nonce each time
    assert SecretsKey.load(path).decrypt(stored) == "hf_abcdef123456"  # kept across restarts
    assert SecretsKey.create(path).decrypt(stored) == "hf_abcdef123456"  # create keeps an existing key
    with pytest.raises(SealingError, match="does not open with this key"):
        SecretsKey(bytes(32)).decrypt(stored)
    tampered = stored[:-4] + (b"AAAA" if not stored.endswith(b"AAAA") else b"BBBB")
    with pytest.raises(SealingError):
        key.decrypt(tampered)
    with pytest.raises(SealingError, match="stored unencrypted"):
        key.decrypt(b"hf_plaintext_from_before")
    (tmp_path / "bad").write_text("not base64!\n")
    with pytest.raises(SealingError, match="does not hold a secrets key"):
        SecretsKey.load(tmp_path / "bad")


def test_a_sealed_secret_opens_only_for_the_agent_it_was_sealed_to() -> None:
    gpu1, gpu2 = AgentKey(), AgentKey()
    sealed = seal_for(gpu1.public_key, "hf_abcdef123456")
    assert "hf_abcdef123456" not in sealed
    assert gpu1.open(sealed) == "hf_abcdef123456"
    with pytest.raises(SealingError, match="sealed for another key"):
        gpu2.open(sealed)
    with pytest.raises(SealingError, match="not a sealed secret"):
        gpu1.open("hf_abcdef123456")
    with pytest.raises(SealingError, match="not a public key"):
        seal_for("AAAA", "x")
