"""GPU KV block pool: chained block hashes, reference counts and an LRU list of free blocks.

Free blocks keep their hash until they are reused, so a later request can still hit them; the least
recently freed block is evicted first. A cyclic scan over more blocks than the pool holds therefore
hits nothing, which is the regime where offload tiers help.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["BlockPool", "chain_hashes"]


def chain_hashes(
    tokens: Sequence[str], block_size: int, known: tuple[Sequence[str], list[int]] | None = None
) -> list[int]:
    """h_j = H(h_{j-1}, tokens of block j), full blocks only.

    Python's own tuple hash: ten times faster than a cryptographic digest, and identity is all an engine needs
    (one engine process, or one batch simulation, owns its caches; the values never leave the process).
    ``known``: an earlier prompt and its hashes (a conversation's previous turn); the blocks it shares with
    ``tokens`` are not hashed again."""
    hashes: list[int] = []
    prev, begin = 0, 0
    if known is not None:
        old_tokens, old_hashes = known
        shared = len(old_hashes)
        while shared and not _same(old_tokens[: shared * block_size], tokens[: shared * block_size]):
            shared //= 2  # the conversation was not resent verbatim: fall back to the blocks that still agree
        if shared:
            hashes = old_hashes[:shared]
            prev, begin = hashes[-1], shared * block_size
    append = hashes.append
    for start in range(begin, len(tokens) - block_size + 1, block_size):
        prev = hash((prev, *tokens[start : start + block_size]))
        append(prev)
    return hashes


def _same(a: Sequence[str], b: Sequence[str]) -> bool:
    return a == b if type(a) is type(b) else list(a) == list(b)


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("the GPU KV cache holds no block; lower the model size or raise memory")
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        # built in C: 64 engines' pools are 1.5 million blocks (a generator took half a second)
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
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
        cached = self._cached
        for h in hashes:
            block = cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def acquire_prefix(self, hashes: Sequence[int]) -> list[int]:
        """``match`` and ``touch`` in one pass: the blocks of the longest cached prefix, referenced."""
        hit: list[int] = []
        cached, ref, free = self._cached, self._ref, self._free
        for h in hashes:
            block = cached.get(h)
            if block is None:
                break
            if ref[block] == 0:
                free.pop(block, None)
            ref[block] += 1
            hit.append(block)
        return hit

    def register_prefix(self, blocks: Sequence[int], hashes: Sequence[int], start: int, end: int) -> None:
        """``register`` for blocks[start:end] under hashes[start:end]."""
        cached, own = self._cached, self._hash
        for j in range(start, end):
            block, h = blocks[j], hashes[j]
            if h in cached or own[block] is not None:
                continue
            cached[h] = block
            own[block] = h

    def touch(self, blocks: Sequence[int]) -> None:
        ref, free = self._ref, self._free
        for b in blocks:
            if ref[b] == 0:
                free.pop(b, None)
            ref[b] += 1

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
        ref, free, hashes = self._ref, self._free, self._hash
        for b in reversed(blocks):
            left = ref[b] - 1
            ref[b] = left
            if left == 0:
                free[b] = None
                if hashes[b] is None:
                    free.move_to_end(b, last=False)

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
