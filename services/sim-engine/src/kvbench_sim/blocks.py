"""GPU KV block pool: chained block hashes, reference counts and an LRU list of free blocks.

Free blocks keep their hash until they are reused, so a later request can still hit them; the least
recently freed block is evicted first. A cyclic scan over more blocks than the pool holds therefore
hits nothing, which is the regime where offload tiers help.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["BlockPool", "chain_hashes"]


def chain_hashes(tokens: Sequence[str], block_size: int) -> list[int]:
    """h_j = H(h_{j-1}, tokens of block j), full blocks only.

    Python's own tuple hash: ten times faster than a cryptographic digest, and identity is all an engine needs
    (one engine process, or one batch simulation, owns its caches; the values never leave the process)."""
    hashes: list[int] = []
    prev = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        prev = hash((prev, *tokens[start : start + block_size]))
        hashes.append(prev)
    return hashes


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("the GPU KV cache holds no block; lower the model size or raise memory")
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._cached: dict[int, int] = {}
        self.evictions = 0

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Share of blocks referenced by running requests (vLLM's kv_cache_usage_perc, 0..1)."""
        return 1.0 - len(self._free) / self.num_blocks

    def match(self, hashes: Sequence[int]) -> list[int]:
        """Blocks of the longest cached prefix."""
        hit: list[int] = []
        for h in hashes:
            block = self._cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def touch(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            if self._ref[b] == 0:
                self._free.pop(b, None)
            self._ref[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        out: list[int] = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            old = self._hash[b]
            if old is not None:
                if self._cached.get(old) == b:
                    del self._cached[old]
                self._hash[b] = None
                self.evictions += 1
            self._ref[b] = 1
            out.append(b)
        return out

    def register(self, block: int, h: int) -> None:
        """Mark a computed full block as reusable under its chained hash."""
        if h in self._cached or self._hash[block] is not None:
            return
        self._cached[h] = block
        self._hash[block] = h

    def release(self, blocks: Sequence[int]) -> None:
        # reversed, like vLLM: a request's tail blocks are the first to be evicted
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None
                if self._hash[b] is None:
                    self._free.move_to_end(b, last=False)

    def reset(self) -> int:
        """Forget every cached hash of a free block (POST /reset_prefix_cache); returns how many."""
        dropped = 0
        for b in list(self._free):
            h = self._hash[b]
            if h is not None:
                self._cached.pop(h, None)
                self._hash[b] = None
                dropped += 1
        return dropped
