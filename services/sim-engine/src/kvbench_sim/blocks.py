"""GPU KV block pool: chained block hashes, reference counts and an LRU list of free blocks.

Free blocks keep their hash until they are reused, so a later request can still hit them; the least
recently freed block is evicted first. A cyclic scan over more blocks than the pool holds therefore
hits nothing, which is the regime where offload tiers help.
"""

from __future__ import annotations

from collections import deque
from collections.abc import MutableSequence, Sequence
from typing import cast

__all__ = ["COMPILED_POOL", "NATIVE", "BlockPool", "PyBlockPool", "chain_hashes", "py_chain_hashes"]


def py_chain_hashes(
    tokens: Sequence[str], block_size: int, known: tuple[Sequence[str], Sequence[int]] | None = None
) -> Sequence[int]:
    """h_j = H(h_{j-1}, tokens of block j), full blocks only.

    Python's own tuple hash: ten times faster than a cryptographic digest, and identity is all an engine needs
    (one engine process, or one batch simulation, owns its caches; the values never leave the process).
    ``known``: an earlier prompt and its hashes (a conversation's previous turn); the blocks it shares with
    ``tokens`` are not hashed again."""
    if block_size <= 0:
        raise ValueError("chain_hashes: block_size must be at least 1")
    hashes: list[int] = []
    prev, begin = 0, 0
    if known is not None:
        old_tokens, old_hashes = known
        shared = len(old_hashes)
        if shared > len(old_tokens) // block_size:
            raise ValueError("chain_hashes: known holds more hashes than its tokens make blocks")
        while shared and not _same(old_tokens[: shared * block_size], tokens[: shared * block_size]):
            shared //= 2  # the conversation was not resent verbatim: fall back to the blocks that still agree
        if shared:
            hashes = list(old_hashes[:shared])
            prev, begin = hashes[-1], shared * block_size
    append = hashes.append
    for start in range(begin, len(tokens) - block_size + 1, block_size):
        prev = hash((prev, *tokens[start : start + block_size]))
        append(prev)
    return hashes


def _same(a: Sequence[str], b: Sequence[str]) -> bool:
    return a == b if type(a) is type(b) else list(a) == list(b)


class PyBlockPool:
    """The free list is vLLM's: blocks given back join its end, oldest first out; a block given back without a hash
    goes to its front. It is kept as two queues without per-block bookkeeping on the way in (a simulated request
    takes and gives back a hundred blocks or more every turn): ``_front``, blocks without a hash, the last given back
    first, and ``_queue``, the rest in order. A block taken back by a hit leaves its entry where it is; an entry counts
    only if it is its block's latest (``_entries``) and the block is still free, which ``allocate`` checks as it
    pops. ``free_order`` lists the free list as one."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("the GPU KV cache holds no block; lower the model size or raise memory")
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._front: list[int] = []
        self._queue: deque[int] = deque(range(num_blocks))
        self._entries = [1] * num_blocks  # entries of each block in the two queues; only its latest can count
        self._free = num_blocks
        self._cached: dict[int, int] = {}
        self.evictions = 0

    @property
    def free_blocks(self) -> int:
        return self._free

    @property
    def usage(self) -> float:
        """Share of blocks referenced by running requests (vLLM's kv_cache_usage_perc, 0..1)."""
        return 1.0 - self._free / self.num_blocks

    def free_order(self) -> list[int]:
        """The free blocks in the order ``allocate`` takes them."""
        seen = [0] * self.num_blocks
        out: list[int] = []
        for b in (*reversed(self._front), *self._queue):
            seen[b] += 1
            if seen[b] == self._entries[b] and self._ref[b] == 0:
                out.append(b)
        return out

    def match(self, hashes: Sequence[int]) -> MutableSequence[int]:
        """Blocks of the longest cached prefix."""
        hit: list[int] = []
        cached = self._cached
        for h in hashes:
            block = cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def acquire_prefix(self, hashes: Sequence[int]) -> MutableSequence[int]:
        """``match`` and ``touch`` in one pass: the blocks of the longest cached prefix, referenced."""
        hit: list[int] = []
        cached, ref = self._cached, self._ref
        taken = 0
        for h in hashes:
            block = cached.get(h)
            if block is None:
                break
            count = ref[block]
            if not count:
                taken += 1
            ref[block] = count + 1
            hit.append(block)
        self._free -= taken
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
        ref = self._ref
        for b in blocks:
            if ref[b] == 0:
                self._free -= 1
            ref[b] += 1

    def allocate(self, n: int) -> MutableSequence[int] | None:
        if n > self._free:
            return None
        out: list[int] = []
        front, queue, ref, entries, own, cached = (
            self._front, self._queue, self._ref, self._entries, self._hash, self._cached
        )  # fmt: skip
        while len(out) < n:
            b = front.pop() if front else queue.popleft()
            left = entries[b] - 1
            entries[b] = left
            if left or ref[b]:
                continue  # an older entry, or the block was taken back by a hit
            old = own[b]
            if old is not None:
                if cached.get(old) == b:
                    del cached[old]
                own[b] = None
                self.evictions += 1
            ref[b] = 1
            out.append(b)
        self._free -= n
        return out

    def register(self, block: int, h: int) -> None:
        """Mark a computed full block as reusable under its chained hash."""
        if h in self._cached or self._hash[block] is not None:
            return
        self._cached[h] = block
        self._hash[block] = h

    def release(self, blocks: Sequence[int]) -> None:
        # reversed, like vLLM: a request's tail blocks are the first to be evicted
        ref, own, entries, front, queue = self._ref, self._hash, self._entries, self._front, self._queue
        freed = 0
        for b in reversed(blocks):
            left = ref[b] - 1
            ref[b] = left
            if not left:
                freed += 1
                entries[b] += 1
                if own[b] is None:
                    front.append(b)
                else:
                    queue.append(b)
        self._free += freed
        # hits leave dead entries behind, which allocate drops as it reaches them: a pool that is both hit and
        # allocated from settles below three entries a block (a busy simulated H100 engine: 2.7); one that is only
        # hit would grow without bound
        if len(queue) > 4 * self.num_blocks:
            self._compact()

    def _compact(self) -> None:
        order = self.free_order()
        self._entries = [0] * self.num_blocks
        for b in order:
            self._entries[b] = 1
        self._front, self._queue = [], deque(order)

    def reset(self) -> int:
        """Forget every cached hash of a free block (POST /reset_prefix_cache); returns how many."""
        dropped = 0
        for b in range(self.num_blocks):
            h = self._hash[b]
            if h is not None and self._ref[b] == 0:
                self._cached.pop(h, None)
                self._hash[b] = None
                dropped += 1
        return dropped


# The same pool and hashes compiled (_pool.c), when the install could build it: a large batch simulation spent a third
# of its time in the loops above. Bit for bit the same behaviour and hash values (the tests run both through the same
# steps); its hashes and blocks come as arrays (array('q'), array('i')) rather than lists. The Python reference serves
# where no C compiler was found.
try:
    from kvbench_sim import _pool
except ImportError:  # pragma: no cover - an install without a C compiler
    NATIVE = False
    COMPILED_POOL: type | None = None
    BlockPool = PyBlockPool
    chain_hashes = py_chain_hashes
else:
    NATIVE = True
    COMPILED_POOL = _pool.BlockPool  # what the compiled batch simulation works on (the name above may be swapped)
    BlockPool = cast("type[PyBlockPool]", _pool.BlockPool)  # the same interface (_pool.pyi), checked by the tests
    chain_hashes = _pool.chain_hashes
