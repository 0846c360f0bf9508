"""The bus's users that `kvbench up` makes: one per service and one per machine's agent, each with the subject
permissions of its role (kvbench_core.access), its password in a file of mode 600 under ``.kvbench/secrets``."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from kvbench_core.access import Role, agent_user, nats_users_block, permissions_for
from kvbench_core.bus import NatsAuth
from kvbench_core.settings import read_secret_file

__all__ = ["BusUsers", "agent_user"]


class BusUsers:
    def __init__(self, state_dir: Path) -> None:
        self.directory = state_dir / "secrets" / "nats-users"
        self._index = self.directory / "users.json"

    def _users(self) -> dict[str, dict[str, str]]:
        return json.loads(self._index.read_text()) if self._index.exists() else {}

    def ensure(self, user: str, role: Role, node_id: str = "", shard: str = "") -> Path:
        """The user (made once, kept across `up` and `down`); returns its password file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        password = self.directory / user
        if not password.exists():
            descriptor = os.open(password, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as out:
                out.write(secrets.token_urlsafe(32) + "\n")
        users = self._users()
        if users.get(user) != {"role": role, "node_id": node_id, "shard": shard}:
            users[user] = {"role": role, "node_id": node_id, "shard": shard}
            tmp = self._index.with_suffix(".tmp")
            tmp.write_text(json.dumps(users, indent=2))
            tmp.chmod(0o600)
            tmp.replace(self._index)
        return password

    def block(self) -> str:
        """The NATS ``authorization`` block for every user made so far."""
        rows = []
        for user, entry in sorted(self._users().items()):
            role: Role = entry["role"]  # type: ignore[assignment]  # written by ensure from a Role
            allowed = permissions_for(role, user, node_id=entry.get("node_id", ""), shard=entry.get("shard", ""))
            rows.append((user, read_secret_file(self.directory / user), allowed))
        return nats_users_block(rows)

    def env(self, user: str) -> dict[str, str]:
        """What a service started as ``user`` is given: its name and its password's file, never the password."""
        return {"KVBENCH_NATS_USER": user, "KVBENCH_NATS_PASSWORD_FILE": str(self.directory / user)}

    def auth(self, user: str, ca_file: str | None = None) -> NatsAuth:
        return NatsAuth(user=user, password=read_secret_file(self.directory / user), ca_file=ca_file)
