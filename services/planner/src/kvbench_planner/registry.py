"""Machines, cluster groups and secrets, kept in JetStream KV buckets and mirrored in memory.

A cluster group is either created through the API (a name and its machines) or declared by the agents
themselves (``KVBENCH_NODE_AGENT_GROUP``); the last inventory each machine registered describes it.
Secrets are write-only: the API stores and deletes them and lists their names, never their values.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

from kvbench_contracts.fabric import SwitchConfig
from kvbench_contracts.node import Heartbeat
from kvbench_contracts.streams import BUCKETS
from kvbench_core.bus import Bus
from kvbench_core.kvmirror import KvMirror
from kvbench_core.naming import natural_key
from kvbench_core.sealing import SealingError, SecretsKey
from kvbench_planner.cluster import Machine, machine_from_inventory

__all__ = ["NAME_PATTERN", "Registry", "SecretsKeyMissingError"]

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_NODE_TTL_S = next(b.ttl_s for b in BUCKETS if b.name == "kvbench_nodes") or 15.0

log = logging.getLogger("kvbench_planner")


class SecretsKeyMissingError(RuntimeError):
    """The planner was given no key to encrypt secrets with, so it stores none."""


class Registry:
    def __init__(self, bus: Bus, secrets_key: SecretsKey | None = None) -> None:
        self.bus = bus
        self._mirrors: dict[str, KvMirror] = {}
        self._secrets_key = secrets_key  # stored secrets are encrypted with it (kvbench_core.sealing)

    async def start(self) -> Registry:
        for bucket in ("kvbench_nodes", "kvbench_inventory", "kvbench_groups", "kvbench_secrets", "kvbench_switches"):
            self._mirrors[bucket] = await self.bus.kv_mirror(bucket)
        return self

    async def stop(self) -> None:
        for mirror in self._mirrors.values():
            await mirror.stop()

    def live_nodes(self) -> dict[str, Heartbeat]:
        """Heartbeats younger than the bucket's TTL (expiry leaves no marker for a watcher to see)."""
        now = time.time()
        out: dict[str, Heartbeat] = {}
        for key, value in self._mirrors["kvbench_nodes"].snapshot().items():
            try:
                beat = Heartbeat.model_validate_json(value)
            except ValueError:
                log.warning("an unreadable heartbeat in kvbench_nodes", extra={"node_id": key})
                continue
            if now - beat.at <= _NODE_TTL_S:
                out[key] = beat
        return {key: out[key] for key in sorted(out, key=natural_key)}

    def inventories(self) -> dict[str, dict[str, Any]]:
        return {k: json.loads(v) for k, v in self._mirrors["kvbench_inventory"].snapshot().items()}

    def explicit_groups(self) -> dict[str, list[str]]:
        return {k: list(json.loads(v)["nodes"]) for k, v in self._mirrors["kvbench_groups"].snapshot().items()}

    def groups(self) -> dict[str, list[Machine]]:
        inventories = self.inventories()
        groups: dict[str, list[Machine]] = {}
        for inventory in inventories.values():
            name = inventory.get("group")
            if name:
                groups.setdefault(str(name), []).append(machine_from_inventory(inventory))
        for name, members in self.explicit_groups().items():
            groups[name] = [machine_from_inventory(inventories[n]) for n in members if n in inventories]
        return {name: sorted(machines, key=lambda m: natural_key(m.name)) for name, machines in groups.items()}

    async def put_group(self, name: str, nodes: list[str]) -> None:
        await self._mirrors["kvbench_groups"].put(name, json.dumps({"nodes": nodes}).encode())

    async def delete_group(self, name: str) -> bool:
        if not NAME_PATTERN.match(name) or name not in self.explicit_groups():
            return False
        await self._mirrors["kvbench_groups"].purge(name)
        return True

    async def put_secret(self, name: str, value: str) -> None:
        """Store ``value`` encrypted: the bucket never holds a secret in clear."""
        if self._secrets_key is None:
            raise SecretsKeyMissingError(name)
        await self._mirrors["kvbench_secrets"].put(name, self._secrets_key.encrypt(value))

    def secret_value(self, name: str) -> str | None:
        """A stored secret in clear, for the planner's own use (sealing it to the agent that needs it); None when no
        such secret is stored. Raises SealingError when it does not open (stored unencrypted, or under another key)."""
        stored = self._mirrors["kvbench_secrets"].snapshot().get(name)
        if stored is None:
            return None
        if self._secrets_key is None:
            raise SealingError("the planner holds no secrets key (KVBENCH_SECRETS_KEY_FILE) to open it with")
        return self._secrets_key.decrypt(stored)

    def secret_names(self) -> list[str]:
        return sorted(self._mirrors["kvbench_secrets"].snapshot())

    async def delete_secret(self, name: str) -> bool:
        if not NAME_PATTERN.match(name) or name not in self._mirrors["kvbench_secrets"].values:
            return False
        await self._mirrors["kvbench_secrets"].purge(name)
        return True

    # -- switches -------------------------------------------------------------------------------
    @staticmethod
    def switch_secret_name(switch: str) -> str:
        return "switch-" + re.sub(r"[^a-z0-9-]", "-", switch.lower())[:55]

    async def put_switch(self, config: SwitchConfig, credential: str) -> SwitchConfig:
        """The credential goes to the secrets bucket; the switch entry only names it."""
        stored = config.model_copy(update={"secret": self.switch_secret_name(config.name)})
        await self.put_secret(stored.secret, credential)
        await self._mirrors["kvbench_switches"].put(config.name, stored.model_dump_json().encode())
        return stored

    def switches(self) -> list[SwitchConfig]:
        return [
            SwitchConfig.model_validate_json(v) for _, v in sorted(self._mirrors["kvbench_switches"].snapshot().items())
        ]

    async def delete_switch(self, name: str) -> bool:
        if name not in self._mirrors["kvbench_switches"].values:
            return False
        await self._mirrors["kvbench_switches"].purge(name)
        await self.delete_secret(self.switch_secret_name(name))
        return True

    def discovered_switches(self) -> list[dict[str, Any]]:
        """Switches the machines' LLDP neighbours name, with the NICs cabled to them, and whether connected."""
        connected = {c.name for c in self.switches()} | {c.chassis_id for c in self.switches() if c.chassis_id}
        found: dict[str, dict[str, Any]] = {}
        for node, raw in sorted(self._mirrors["kvbench_inventory"].snapshot().items()):
            inventory = json.loads(raw)
            for neighbour in inventory.get("lldp", []):
                key = str(neighbour.get("chassis_id"))
                entry = found.setdefault(
                    key,
                    {
                        "chassis_id": key,
                        "system_name": neighbour.get("system_name", ""),
                        "mgmt_addresses": neighbour.get("mgmt_addresses", []),
                        "cabled": [],
                    },
                )
                entry["cabled"].append(
                    {"node": node, "nic": neighbour.get("local_port"), "port": neighbour.get("port_id")}
                )
        for entry in found.values():
            entry["connected"] = entry["chassis_id"] in connected or entry["system_name"] in connected
        return sorted(found.values(), key=lambda e: (e["connected"], e["system_name"]))
