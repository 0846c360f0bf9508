"""Machines, cluster groups and secrets, kept in JetStream KV buckets.

A cluster group is either created through the API (a name and its machines) or declared by the agents
themselves (``KVBENCH_NODE_AGENT_GROUP``); the last inventory each machine registered describes it.
Secrets are write-only: the API stores and deletes them and lists their names, never their values.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

import nats.js.errors
from nats.js.kv import KeyValue

from kvbench_core.bus import Bus
from kvbench_planner.cluster import Machine, machine_from_inventory

__all__ = ["NAME_PATTERN", "Registry", "read_all"]

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


async def read_all(kv: KeyValue) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with contextlib.suppress(nats.js.errors.NoKeysError):
        for key in await kv.keys():
            with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                entry = await kv.get(key)
                if entry.value:
                    out[key] = entry.value
    return out


class Registry:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def inventories(self) -> dict[str, dict[str, Any]]:
        raw = await read_all(await self.bus.kv("kvbench_inventory"))
        return {key: json.loads(value) for key, value in raw.items()}

    async def live_nodes(self) -> set[str]:
        return set(await read_all(await self.bus.kv("kvbench_nodes")))

    async def groups(self) -> dict[str, list[Machine]]:
        inventories = await self.inventories()
        groups: dict[str, list[Machine]] = {}
        for inventory in inventories.values():
            name = inventory.get("group")
            if name:
                groups.setdefault(str(name), []).append(machine_from_inventory(inventory))
        for name, value in (await read_all(await self.bus.kv("kvbench_groups"))).items():
            members = json.loads(value)["nodes"]
            groups[name] = [machine_from_inventory(inventories[n]) for n in members if n in inventories]
        return {name: sorted(machines, key=lambda m: m.name) for name, machines in groups.items()}

    async def explicit_groups(self) -> dict[str, list[str]]:
        raw = await read_all(await self.bus.kv("kvbench_groups"))
        return {name: list(json.loads(value)["nodes"]) for name, value in raw.items()}

    async def put_group(self, name: str, nodes: list[str]) -> None:
        kv = await self.bus.kv("kvbench_groups")
        await kv.put(name, json.dumps({"nodes": nodes}).encode())

    async def delete_group(self, name: str) -> bool:
        kv = await self.bus.kv("kvbench_groups")
        try:
            await kv.get(name)
        except nats.js.errors.KeyNotFoundError:
            return False
        await kv.purge(name)
        return True

    async def put_secret(self, name: str, value: str) -> None:
        kv = await self.bus.kv("kvbench_secrets")
        await kv.put(name, value.encode())

    async def secret_names(self) -> list[str]:
        return sorted(await read_all(await self.bus.kv("kvbench_secrets")))

    async def delete_secret(self, name: str) -> bool:
        kv = await self.bus.kv("kvbench_secrets")
        try:
            await kv.get(name)
        except nats.js.errors.KeyNotFoundError:
            return False
        await kv.purge(name)
        return True
