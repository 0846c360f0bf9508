"""Client-side routing over a stack's engines (until a stack brings its own router)."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence

from kvbench_contracts.events import EngineEndpoint

__all__ = ["Router"]


def _stable(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class Router:
    def __init__(self, endpoints: Sequence[EngineEndpoint], policy: str) -> None:
        serving = [e for e in endpoints if e.role in ("both", "router")] or list(endpoints)
        if not serving:
            raise ValueError("the stack reported no endpoint to send requests to")
        self.endpoints = serving
        self.policy = policy
        self._cycle = itertools.cycle(range(len(serving)))

    def pick(self, session_key: str, prompt_head: str) -> EngineEndpoint:
        if len(self.endpoints) == 1:
            return self.endpoints[0]
        if self.policy == "session_affinity":
            return self.endpoints[_stable(session_key) % len(self.endpoints)]
        if self.policy == "prefix_aware":
            return self.endpoints[_stable(prompt_head) % len(self.endpoints)]
        return self.endpoints[next(self._cycle)]
