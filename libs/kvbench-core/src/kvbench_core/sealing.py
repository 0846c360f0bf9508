"""Secrets at rest and on the way to the one machine that uses them (PyNaCl, libsodium's Python binding).

- Stored secrets (a Hugging Face token, switch logins) sit in the ``kvbench_secrets`` bucket encrypted with a key the
  control machine holds (``SecretsKey``: 32 random bytes in a file of mode 600; NaCl's secretbox, XSalsa20-Poly1305):
  the bucket's files, a NATS client that reads it and a backup show ciphertext only. The planner (and the switch
  poller, beside it) are given the key's file; nothing else is.
- A secret a GPU machine needs at stack start travels sealed to that machine's agent alone (``AgentKey``: an X25519
  key pair the agent makes as it starts and never writes down; its public half rides in its inventory; NaCl's sealed
  box): the start command in the bus's stream carries ciphertext only another agent cannot open.
"""

from __future__ import annotations

import base64
import os
import secrets
from pathlib import Path

import nacl.exceptions
import nacl.public
import nacl.secret

__all__ = ["AgentKey", "SealingError", "SecretsKey", "seal_for"]

_AT_REST = b"kvb-box1:"  # what the bucket holds: this prefix, then the secretbox (nonce included), base64
_SEALED = "kvb-seal1:"  # what a start command carries: this prefix, then the sealed box, base64


class SealingError(ValueError):
    """A secret could not be opened: another key sealed it, it was changed, or it was stored before encryption."""


class SecretsKey:
    """The control machine's key for stored secrets."""

    def __init__(self, key: bytes) -> None:
        if len(key) != nacl.secret.SecretBox.KEY_SIZE:
            raise SealingError(f"a secrets key is {nacl.secret.SecretBox.KEY_SIZE} bytes, not {len(key)}")
        self._box = nacl.secret.SecretBox(key)

    @classmethod
    def load(cls, path: Path) -> SecretsKey:
        """The key in ``path`` (base64, as ``create`` writes it)."""
        try:
            return cls(base64.b64decode(path.read_text(encoding="ascii").strip(), validate=True))
        except (ValueError, UnicodeDecodeError) as exc:
            raise SealingError(f"{path} does not hold a secrets key ({exc})") from None

    @classmethod
    def create(cls, path: Path) -> SecretsKey:
        """A new random key, written to ``path`` readable by its owner only (kept when it exists)."""
        if path.exists():
            return cls.load(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        key = secrets.token_bytes(nacl.secret.SecretBox.KEY_SIZE)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="ascii") as out:
            out.write(base64.b64encode(key).decode() + "\n")
        return cls(key)

    def encrypt(self, text: str) -> bytes:
        return _AT_REST + base64.b64encode(bytes(self._box.encrypt(text.encode())))

    def decrypt(self, stored: bytes) -> str:
        if not stored.startswith(_AT_REST):
            raise SealingError("the secret was stored unencrypted (before kvbench encrypted secrets): store it again")
        try:
            return self._box.decrypt(base64.b64decode(stored[len(_AT_REST) :], validate=True)).decode()
        except (nacl.exceptions.CryptoError, ValueError) as exc:
            raise SealingError(f"the secret does not open with this key ({exc}): store it again") from None


class AgentKey:
    """An agent's key pair: made as the agent starts, kept in memory only."""

    def __init__(self) -> None:
        self._private = nacl.public.PrivateKey.generate()

    @property
    def public_key(self) -> str:
        return base64.b64encode(bytes(self._private.public_key)).decode()

    def open(self, sealed: str) -> str:
        if not sealed.startswith(_SEALED):
            raise SealingError("not a sealed secret")
        try:
            box = nacl.public.SealedBox(self._private)
            return box.decrypt(base64.b64decode(sealed[len(_SEALED) :], validate=True)).decode()
        except (nacl.exceptions.CryptoError, ValueError) as exc:
            raise SealingError(f"the secret was sealed for another key ({exc})") from None


def seal_for(public_key: str, text: str) -> str:
    """``text`` sealed so that only the holder of ``public_key``'s private half (one agent) can open it."""
    try:
        recipient = nacl.public.PublicKey(base64.b64decode(public_key, validate=True))
    except (nacl.exceptions.CryptoError, ValueError) as exc:
        raise SealingError(f"not a public key ({exc})") from None
    return _SEALED + base64.b64encode(bytes(nacl.public.SealedBox(recipient).encrypt(text.encode()))).decode()
