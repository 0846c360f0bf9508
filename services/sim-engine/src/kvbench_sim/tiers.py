"""KV tiers behind the GPU: host memory, local disk and shared stores (simulator.md section 3).

A tier holds whole chunks under chained chunk hashes, evicts least recently used first, and moves data
through a ``Link``: transfers are flows that share its bandwidth fairly (processor sharing), each also
paying a per-chunk latency divided by the queue depth. Loads keep their request out of the batch until
they finish (vLLM's WAITING_FOR_REMOTE_KVS); stores are asynchronous and a chunk becomes visible when its
store completes. Engines that name the same ``store_id`` share one tier object: a shared pool.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvbench_sim.profiles import TierConfig

__all__ = ["Link", "Tier", "Transfer"]


@dataclass
class Transfer:
    """One flow on a link. ``done_s`` is known only once no later flow can slow it down."""

    key: object
    remaining_bytes: float
    latency_s: float
    on_done: object = None  # what the engine does when it lands (opaque here)
    finished_at: float | None = None


@dataclass
class Link:
    """A shared resource (PCIe, NVMe, NIC, store server) with processor-sharing flows."""

    name: str
    bytes_per_s: float
    flows: list[Transfer] = field(default_factory=list)
    last_s: float = 0.0
    bytes_moved: float = 0.0

    def _advance(self, now_s: float) -> None:
        if now_s <= self.last_s:
            return
        budget = (now_s - self.last_s) * self.bytes_per_s
        # share fairly, re-splitting as flows finish inside the interval
        active = [f for f in self.flows if f.remaining_bytes > 0]
        t = self.last_s
        while active and budget > 1e-9:
            share = budget / len(active)
            smallest = min(f.remaining_bytes for f in active)
            step = min(share, smallest)
            for f in active:
                f.remaining_bytes -= step
                if f.remaining_bytes <= 1e-6 and f.finished_at is None:
                    f.finished_at = t + step * len(active) / self.bytes_per_s
            budget -= step * len(active)
            t += step * len(active) / self.bytes_per_s
            active = [f for f in active if f.remaining_bytes > 1e-6]
        self.last_s = now_s

    def start(self, now_s: float, transfer: Transfer) -> None:
        self._advance(now_s)
        self.bytes_moved += transfer.remaining_bytes
        if transfer.remaining_bytes <= 0:
            transfer.finished_at = now_s
        self.flows.append(transfer)

    def next_done_s(self, now_s: float) -> float | None:
        """When the next flow lands (bandwidth share as of now, plus its latency)."""
        self._advance(now_s)
        best: float | None = None
        moving = [f for f in self.flows if f.remaining_bytes > 1e-6]
        for f in self.flows:
            if f.finished_at is not None:
                at = f.finished_at + f.latency_s
            else:
                at = now_s + f.remaining_bytes * len(moving) / self.bytes_per_s + f.latency_s
            best = at if best is None else min(best, at)
        return best

    def landed(self, now_s: float) -> list[Transfer]:
        self._advance(now_s)
        done = [f for f in self.flows if f.finished_at is not None and f.finished_at + f.latency_s <= now_s + 1e-12]
        if done:
            self.flows = [f for f in self.flows if f not in done]
        return done


class Tier:
    def __init__(self, config: TierConfig, chunk_tokens: int, bytes_per_token: float, state_bytes: float) -> None:
        self.config = config
        self.name = config.name
        self.chunk_tokens = config.chunk_tokens or chunk_tokens
        self.bytes_per_token = bytes_per_token
        self.bytes_per_chunk = self.chunk_tokens * bytes_per_token + state_bytes  # hybrid: a state per chunk
        self.capacity_chunks = max(1, int(config.capacity_gb * 1e9 // self.bytes_per_chunk))
        self.link = Link(config.name, config.bw_gbps * 1e9)
        # reads the OS page cache serves (a file tier's recent files) travel at memory speed, apart from the disk
        self.cached_link: Link | None = None
        self._page_cache: OrderedDict[int, None] = OrderedDict()
        self._page_cache_chunks = int(config.page_cache_gb * 1e9 // self.bytes_per_chunk)
        if self._page_cache_chunks and config.cached_bw_gbps:
            self.cached_link = Link(f"{config.name}-page-cache", config.cached_bw_gbps * 1e9)
        self._chunks: OrderedDict[int, None] = OrderedDict()
        self._pending: set[int] = set()  # stores in flight: not visible yet, not stored twice
        # which engine computed each chunk (a shared tier: what one instance stored and another reused)
        self._owner: dict[int, str] = {}
        self._pending_owner: dict[int, str] = {}
        self.evictions = 0
        self.stored_tokens = 0
        self.loaded_tokens = 0
        self.changes = 0  # bumped whenever the index or its order changes (what a records file must follow)
        # a tier whose index lives in a store process (server mode): told what this engine stored and hit
        self.on_commit: Callable[[list[int]], None] | None = None
        self.on_touch: Callable[[list[int]], None] | None = None

    # -- lookup -----------------------------------------------------------------------------------
    def longest_prefix(self, chunk_hashes: Sequence[int]) -> int:
        """Chunks of the longest stored prefix."""
        n = 0
        for h in chunk_hashes:
            if h not in self._chunks:
                break
            n += 1
        return n

    def touch(self, chunk_hashes: Sequence[int]) -> None:
        for h in chunk_hashes:
            if h in self._chunks:
                self._chunks.move_to_end(h)
        self.changes += 1
        if self.on_touch is not None and chunk_hashes:
            self.on_touch(list(chunk_hashes))

    def mirror(self, chunk_hashes: Sequence[int], exactly: bool = False) -> None:
        """Chunks the shared store holds (stored by any engine) become visible here; ``exactly``: the store's whole
        index, replacing what was mirrored (after a reconnect, evictions missed meanwhile must not look like hits)."""
        self.changes += 1
        if exactly:
            self._chunks = OrderedDict.fromkeys(chunk_hashes)
            self._owner.clear()
            return
        for h in chunk_hashes:
            self._chunks[h] = None

    def own(self, chunk_hashes: Sequence[int], owner: str) -> None:
        """The shared store says which engine stored these chunks."""
        for h in chunk_hashes:
            if h in self._chunks:
                self._owner[h] = owner

    def forget(self, chunk_hashes: Sequence[int]) -> None:
        """Chunks the shared store evicted."""
        for h in chunk_hashes:
            self._owner.pop(h, None)
            if self._chunks.pop(h, 0) is None:
                self.evictions += 1
        self.changes += 1

    # -- transfers --------------------------------------------------------------------------------
    def transfer_latency_s(self, chunks: int) -> float:
        if chunks <= 0:
            return 0.0
        return math.ceil(chunks / min(self.config.queue_depth, chunks)) * self.config.lat_ms / 1e3

    @property
    def links(self) -> list[Link]:
        return [self.link] if self.cached_link is None else [self.link, self.cached_link]

    def load(self, now_s: float, chunk_hashes: Sequence[int], key: object, on_done: object) -> list[Transfer]:
        """Load ``chunk_hashes``: the transfers that carry them (the page cache's share travels apart)."""
        parts: list[tuple[Link, int]] = [(self.link, len(chunk_hashes))]
        if self.cached_link is not None:
            cached = sum(1 for h in chunk_hashes if h in self._page_cache)
            parts = [(self.link, len(chunk_hashes) - cached), (self.cached_link, cached)]
            self._page_in(chunk_hashes)
        transfers = []
        for link, chunks in parts:
            if chunks:
                transfer = Transfer(key, chunks * self.bytes_per_chunk, self.transfer_latency_s(chunks), on_done)
                link.start(now_s, transfer)
                transfers.append(transfer)
        self.loaded_tokens += len(chunk_hashes) * self.chunk_tokens
        return transfers

    def _page_in(self, chunk_hashes: Sequence[int]) -> None:
        for h in chunk_hashes:
            self._page_cache[h] = None
            self._page_cache.move_to_end(h)
        while len(self._page_cache) > self._page_cache_chunks:
            self._page_cache.popitem(last=False)

    def drop_page_cache(self) -> None:
        """What `echo 3 > /proc/sys/vm/drop_caches` does: every later read comes from the disk."""
        self._page_cache.clear()

    def owners(self, chunk_hashes: Sequence[int], reader: str) -> dict[str, int]:
        """Chunks of ``chunk_hashes`` another engine than ``reader`` stored, by that engine."""
        out: dict[str, int] = {}
        for h in chunk_hashes:
            owner = self._owner.get(h)
            if owner and owner != reader:
                out[owner] = out.get(owner, 0) + 1
        return out

    def store(self, now_s: float, chunk_hashes: Sequence[int], key: object, owner: str = "") -> Transfer | None:
        new = [h for h in chunk_hashes if h not in self._chunks and h not in self._pending]
        if not new:
            return None
        self._pending.update(new)
        if owner:
            self._pending_owner.update(dict.fromkeys(new, owner))
        transfer = Transfer(key, len(new) * self.bytes_per_chunk, self.transfer_latency_s(len(new)), tuple(new))
        self.link.start(now_s, transfer)
        return transfer

    def commit(self, chunk_hashes: Sequence[int]) -> None:
        """A store landed: its chunks become visible, the least recently used make room."""
        new: list[int] = []
        for h in chunk_hashes:
            self._pending.discard(h)
            if h in self._chunks:
                continue
            while len(self._chunks) >= self.capacity_chunks:
                evicted, _ = self._chunks.popitem(last=False)
                self._owner.pop(evicted, None)
                self.evictions += 1
            self._chunks[h] = None
            owner = self._pending_owner.pop(h, None)
            if owner:
                self._owner[h] = owner
            self.stored_tokens += self.chunk_tokens
            new.append(h)
        if new:
            self.changes += 1
            if self.cached_link is not None:  # a file just written stays in the page cache
                self._page_in(new)
        if self.on_commit is not None and new:
            self.on_commit(new)

    def clear(self) -> None:
        self._chunks.clear()
        self._pending.clear()
        self._owner.clear()
        self._pending_owner.clear()
        self.link.flows.clear()
        self.changes += 1

    def index(self) -> list[int]:
        """The chunk hashes held, least recently used first."""
        return list(self._chunks)

    def restore(self, chunk_hashes: Sequence[int]) -> int:
        """Hold ``chunk_hashes`` (least recently used first), as a new process finds a file tier's records; beyond
        the capacity only the most recent stay. Returns how many are held."""
        kept = list(chunk_hashes)[-self.capacity_chunks :]
        self._chunks = OrderedDict.fromkeys(kept)
        self.changes += 1
        return len(self._chunks)

    @property
    def chunks(self) -> int:
        return len(self._chunks)

    @property
    def usage(self) -> float:
        return len(self._chunks) / self.capacity_chunks
