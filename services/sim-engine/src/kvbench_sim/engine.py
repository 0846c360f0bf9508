"""The engine core in virtual time: continuous batching with chunked prefill, prefix cache, preemption,
KV tiers (loads hold a request back until they land; stores are asynchronous), restarts with a cold start.

The core never sleeps and never touches asyncio: ``schedule`` picks the next step and returns its
duration; ``complete`` applies it at a virtual time and returns what happened. The server paces
these steps to the wall clock; a batch runner can call them back to back.
"""

from __future__ import annotations

import functools
import math
import operator
from collections import deque
from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass, field

from kvbench_sim import blocks
from kvbench_sim.profiles import Profile, cache_server_tier
from kvbench_sim.tiers import Tier, Transfer
from kvbench_sim.timing import StepTimer

__all__ = ["Engine", "EngineCounters", "SimRequest", "StepPlan", "TokenEvent"]


@dataclass(eq=False)  # identity: the scheduler looks requests up in its queues many times per step
class SimRequest:
    request_id: str
    prompt: Sequence[str]
    max_tokens: int
    arrival_s: float
    hashes: Sequence[int] = field(default_factory=list)  # chained block hashes (the compiled pool's: an array)
    blocks: MutableSequence[int] = field(default_factory=list)
    num_computed: int = 0
    cached_tokens: int = 0
    output: int = 0
    admitted: bool = False
    first_token_s: float | None = None
    finished: bool = False
    loads_pending: int = 0
    loaded_to: int = 0  # tokens that will be computed once the pending loads land
    sources: dict[str, int] = field(default_factory=dict)  # cached tokens by where they came from
    chunk_hashes: dict[int, Sequence[int]] = field(default_factory=dict)  # per tier chunk size
    registered: int = 0  # leading blocks already registered in the GPU pool
    prompt_len: int = field(init=False)  # read many times a step: kept, not recounted

    def __post_init__(self) -> None:
        self.prompt_len = len(self.prompt)

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prompt_len


@dataclass(frozen=True)
class TokenEvent:
    request_id: str
    index: int
    time_s: float
    finished: bool


@dataclass
class StepPlan:
    prefill: list[tuple[SimRequest, int]]
    decode: list[SimRequest]
    duration_s: float
    # several identical decode steps fused (batch mode): each one's duration; empty for one ordinary step
    steps: list[float] = field(default_factory=list)


@dataclass
class EngineCounters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    requests_finished: int = 0
    tier_hits: dict[str, int] = field(default_factory=dict)  # tokens loaded from each tier
    tier_load_bytes: dict[str, float] = field(default_factory=dict)
    tier_store_bytes: dict[str, float] = field(default_factory=dict)
    # a shared tier's hits on chunks another engine computed: "computed-by->reused-by" -> tokens
    cross_hits: dict[str, int] = field(default_factory=dict)
    restarts: int = 0


class Engine:
    def __init__(self, profile: Profile, seed: int = 0, shared_stores: dict[str, Tier] | None = None) -> None:
        self.profile = profile
        self.block_size = profile.block_size
        self.pool = blocks.BlockPool(profile.gpu_kv_blocks)
        self.timer = StepTimer(profile, seed)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.loading: list[SimRequest] = []
        self.counters = EngineCounters()
        self.name = ""  # how a cluster names this engine (who stored a shared tier's chunks)
        self.clock_s = 0.0
        model = profile.model
        self.tiers: list[Tier] = []
        for config in profile.engine.tiers:
            if config.store_id and shared_stores is not None and config.store_id in shared_stores:
                self.tiers.append(shared_stores[config.store_id])
                continue
            tier = Tier(config, self.block_size, model.kv_bytes_per_token, profile.state_bytes_per_block)
            if config.store_id and shared_stores is not None:
                shared_stores[config.store_id] = tier
            self.tiers.append(tier)
        self._chunk_sizes = sorted({t.chunk_tokens for t in self.tiers})
        self.cold = profile.engine.cold_start
        self._first_step_pending = True
        self._seen_shapes: set[int] = set()
        self.serving_from_s = self.cold.fixed_s

    # -- restart ----------------------------------------------------------------------------------
    def restart(self, now_s: float) -> None:
        """A new engine process: GPU blocks and its own host tier are gone, disk and shared tiers stay (a stack
        restart clears the servers' memory tiers itself); the engine
        serves after its fixed start time and pays a first-use penalty per new prefill shape."""
        for req in [*self.running, *self.waiting, *self.loading]:
            req.finished = True
        self.running, self.waiting, self.loading = [], deque(), []
        self.pool = blocks.BlockPool(self.profile.gpu_kv_blocks)
        for tier in self.tiers:
            if tier.name == "host" and not cache_server_tier(tier.config):  # an LMCache server's L1 outlives it
                tier.clear()
        self._first_step_pending = True
        self._seen_shapes = set()
        self.serving_from_s = now_s + self.cold.fixed_s
        self.clock_s = now_s
        self.counters.restarts += 1

    # -- tiers ------------------------------------------------------------------------------------
    def next_transfer_s(self) -> float | None:
        """When the next load or store lands (a runner must call ``advance`` then)."""
        times = [t for tier in self.tiers for link in tier.links if (t := link.next_done_s(self.clock_s)) is not None]
        return min(times) if times else None

    def advance(self, now_s: float) -> None:
        """Apply every transfer that has landed by ``now_s``. A shared tier's link carries every engine's flows
        (batch mode): a load that landed is handed to the engine that started it."""
        self.clock_s = max(self.clock_s, now_s)
        for tier in self.tiers:
            for transfer in (t for link in tier.links for t in link.landed(now_s)):
                owner = transfer.on_done[0] if transfer.key == "load" and isinstance(transfer.on_done, tuple) else self
                assert isinstance(owner, Engine)
                owner._landed(tier, transfer)

    def _landed(self, tier: Tier, transfer: Transfer) -> None:
        kind = transfer.key
        if kind == "store":
            assert isinstance(transfer.on_done, tuple)
            tier.commit(transfer.on_done)
            return
        assert isinstance(transfer.on_done, tuple)
        req = transfer.on_done[1]
        assert isinstance(req, SimRequest)
        req.loads_pending -= 1
        if req.loads_pending == 0 and not req.finished:
            self.loading.remove(req)
            req.num_computed = req.loaded_to
            self._register_full_blocks(req)
            self.waiting.appendleft(req)  # first in line: its KV is in GPU blocks already

    def _tier_lookup(self, req: SimRequest, gpu_tokens: int) -> int:
        """Start loads for the part of the prompt the tiers hold beyond the GPU hit; returns the tokens
        the request will have once they land (``gpu_tokens`` when the tiers hold nothing more)."""
        if not self.tiers:
            return gpu_tokens
        covered = gpu_tokens
        limit = req.prompt_len - 1  # at least one token is computed, as in vLLM
        plan: list[tuple[Tier, int, int]] = []
        for tier in self.tiers:
            hashes = self._chunk_hashes(req, tier.chunk_tokens)
            reach = min(tier.longest_prefix(hashes) * tier.chunk_tokens, limit // tier.chunk_tokens * tier.chunk_tokens)
            if reach > covered:
                first_chunk = covered // tier.chunk_tokens
                plan.append((tier, first_chunk, reach // tier.chunk_tokens))
                tier.touch(hashes[: reach // tier.chunk_tokens])
                covered = reach
        if not plan:
            return gpu_tokens
        if not self._grow(req, covered):
            return -1  # no GPU blocks to load into yet
        for tier, first, last in plan:
            tokens = (last - first) * tier.chunk_tokens
            chunk_hashes = self._chunk_hashes(req, tier.chunk_tokens)[first:last]
            req.loads_pending += len(tier.load(self.clock_s, chunk_hashes, "load", (self, req)))
            self.counters.tier_hits[tier.name] = self.counters.tier_hits.get(tier.name, 0) + tokens
            self.counters.tier_load_bytes[tier.name] = (
                self.counters.tier_load_bytes.get(tier.name, 0.0) + (last - first) * tier.bytes_per_chunk
            )
            gained = min(last * tier.chunk_tokens, covered) - max(first * tier.chunk_tokens, gpu_tokens)
            req.sources[tier.name] = req.sources.get(tier.name, 0) + max(0, gained)
            if tier.config.store_id and self.name:
                for owner, chunks in tier.owners(chunk_hashes, self.name).items():
                    pair = f"{owner}->{self.name}"
                    self.counters.cross_hits[pair] = self.counters.cross_hits.get(pair, 0) + chunks * tier.chunk_tokens
        req.loaded_to = covered
        return covered

    def _chunk_hashes(self, req: SimRequest, chunk_tokens: int) -> Sequence[int]:
        if chunk_tokens == self.block_size and req.hashes:
            return req.hashes
        if chunk_tokens not in req.chunk_hashes:
            req.chunk_hashes[chunk_tokens] = blocks.chain_hashes(req.prompt, chunk_tokens)
        return req.chunk_hashes[chunk_tokens]

    def _store(self, req: SimRequest) -> None:
        """After a prefill: whole chunks go to every tier, asynchronously (write-through, like LMCache)."""
        for tier in self.tiers:
            hashes = self._chunk_hashes(req, tier.chunk_tokens)[: req.prompt_len // tier.chunk_tokens]
            transfer = tier.store(self.clock_s, hashes, "store", self.name)
            if transfer is not None:
                self.counters.tier_store_bytes[tier.name] = (
                    self.counters.tier_store_bytes.get(tier.name, 0.0) + transfer.remaining_bytes
                )

    # -- intake -------------------------------------------------------------------------------
    def add(self, request: SimRequest, previous: SimRequest | None = None) -> None:
        """``previous``: the same conversation's last request, whose prompt this one usually extends (its block
        hashes are reused)."""
        if self.profile.engine.prefix_caching or self.tiers:
            known = (previous.prompt, previous.hashes) if previous is not None and previous.hashes else None
            request.hashes = blocks.chain_hashes(request.prompt, self.block_size, known)
        self.waiting.append(request)

    def add_transferred(self, request: SimRequest) -> None:
        """P/D decode side: the prompt's KV arrived from a prefill engine; only the last token is computed here."""
        if self.profile.engine.prefix_caching or self.tiers:
            request.hashes = blocks.chain_hashes(request.prompt, self.block_size)
        request.loaded_to = request.prompt_len - 1
        request.sources["transferred"] = request.loaded_to
        request.cached_tokens = request.loaded_to
        self.waiting.appendleft(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.loading)

    def abort(self, request_id: str) -> None:
        for req in list(self.running):
            if req.request_id == request_id:
                req.finished = True
                self.running.remove(req)
                self._free(req)
        self.waiting = deque(r for r in self.waiting if r.request_id != request_id)
        for req in list(self.loading):
            if req.request_id == request_id:
                req.finished = True
                self.loading.remove(req)
                self._free(req)

    # -- scheduling ---------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def _grow(self, req: SimRequest, tokens: int) -> bool:
        need = self._blocks_for(tokens) - len(req.blocks)
        if need <= 0:
            return True
        got = self.pool.allocate(need)
        if got is None:
            return False
        req.blocks.extend(got)
        return True

    def _free(self, req: SimRequest) -> None:
        self.pool.release(req.blocks)
        req.blocks = []

    def _preempt_newest(self, keep: SimRequest) -> bool:
        """vLLM's order: the newest running request gives its blocks back (to be recomputed), even when that is
        ``keep`` itself; False then (``keep`` waits). Requests placed in this step come before ``keep`` in the
        running list, so one is never preempted after it was scheduled."""
        if not self.running:
            return False
        victim = self.running[-1]
        self.running.pop()
        self._free(victim)
        victim.num_computed = 0
        victim.registered = 0
        victim.admitted = False
        self.counters.preemptions += 1
        self.waiting.appendleft(victim)
        return victim is not keep

    def schedule(self, now_s: float | None = None) -> StepPlan | None:
        if now_s is not None:
            self.advance(now_s)
        if self.clock_s < self.serving_from_s:
            return None  # still starting
        cfg = self.profile.engine
        budget = cfg.max_num_batched_tokens
        prefill: list[tuple[SimRequest, int]] = []
        decode: list[SimRequest] = []
        block_size = self.block_size
        preemptions = self.counters.preemptions
        for req in list(self.running):
            if self.counters.preemptions != preemptions and req not in self.running:
                continue  # preempted while making room for an earlier one
            if req.in_prefill:
                chunk = min(req.prompt_len - req.num_computed, budget)
                if chunk <= 0:
                    continue
                while not self._grow(req, req.num_computed + chunk):
                    if not self._preempt_newest(req):
                        break
                else:
                    prefill.append((req, chunk))
                    budget -= chunk
                continue
            if budget <= 0:
                break
            if len(req.blocks) * block_size > req.prompt_len + req.output:  # room for the next token already
                decode.append(req)
                budget -= 1
                continue
            while not self._grow(req, req.prompt_len + req.output + 1):
                if not self._preempt_newest(req):
                    break
            else:
                decode.append(req)
                budget -= 1
        # as vLLM: a step that had to preempt admits nobody from the waiting queue (not even the preempted)
        while (
            self.waiting
            and budget > 0
            and len(self.running) < cfg.max_num_seqs
            and (self.counters.preemptions == preemptions)
        ):
            req = self.waiting[0]
            if not req.admitted and req.sources.get("transferred"):
                if not self._grow(req, req.loaded_to):
                    break
                req.num_computed = req.loaded_to
                self.counters.prompt_tokens += req.prompt_len
                self.counters.tier_hits["transferred"] = self.counters.tier_hits.get("transferred", 0) + req.loaded_to
                req.admitted = True
            fresh = not req.admitted  # looked up now: its hit blocks are taken only with the blocks it needs
            device_before = req.sources.get("device")
            if fresh:
                max_hit_blocks = (req.prompt_len - 1) // self.block_size
                hit = self.pool.acquire_prefix(req.hashes[:max_hit_blocks]) if cfg.prefix_caching else []
                req.blocks = hit  # a new sequence: the request's own
                req.registered = len(hit)
                req.num_computed = len(hit) * self.block_size
                if req.num_computed:
                    req.sources["device"] = req.num_computed
                self.counters.prefix_queries += req.prompt_len
                self.counters.prefix_hits += req.num_computed
                self.counters.prompt_tokens += req.prompt_len
                req.admitted = True
                target = self._tier_lookup(req, req.num_computed)
                if target < 0:  # wait for free blocks, then look up again
                    self._unadmit(req)
                    req.sources.clear()
                    break
                req.cached_tokens = target
                if req.loads_pending:
                    self.waiting.popleft()
                    self.loading.append(req)
                    continue
            chunk = min(req.prompt_len - req.num_computed, budget)
            if not self._grow(req, req.num_computed + chunk):
                if fresh:  # wait for blocks to free up, holding none (it kept its hit blocks before, and an engine
                    # whose waiting requests held every free block stalled for good once nothing ran)
                    self._unadmit(req)
                    if device_before is None:
                        req.sources.pop("device", None)
                    else:
                        req.sources["device"] = device_before
                break
            self.waiting.popleft()
            self.running.append(req)
            prefill.append((req, chunk))
            budget -= chunk
        if not prefill and not decode:
            return None
        chunks = [(c, r.num_computed) for r, c in prefill]
        ctx_sum = sum(r.prompt_len + r.output for r in decode)
        duration = self.timer.step_s(chunks, ctx_sum, len(decode)) + self._cold_penalty_s(chunks)
        return StepPlan(prefill, decode, duration)

    def _unadmit(self, req: SimRequest) -> None:
        """Undo a waiting request's admission in this step (its cache hit looked up, nothing computed): its hit
        blocks go back and its lookup is not counted; the next step looks it up again."""
        hit_tokens = req.num_computed
        self.pool.release(req.blocks)
        req.blocks, req.num_computed, req.registered = [], 0, 0
        req.admitted = False
        self.counters.prefix_queries -= req.prompt_len
        self.counters.prefix_hits -= hit_tokens
        self.counters.prompt_tokens -= req.prompt_len

    def _cold_penalty_s(self, chunks: list[tuple[int, int]]) -> float:
        """A restarted engine compiles and tunes each new prefill shape on first use (simulator.md §4)."""
        cold = self.cold
        penalty = 0.0
        if self._first_step_pending:
            penalty += cold.first_request_s
            self._first_step_pending = False
        for tokens, _ in chunks:
            shape = 1 << max(0, math.ceil(math.log2(max(tokens, 1))))
            if shape not in self._seen_shapes:
                self._seen_shapes.add(shape)
                penalty += cold.first_use_ms_per_token * tokens / 1e3
        return penalty

    # -- completion ---------------------------------------------------------------------------
    def schedule_run(self, now_s: float, max_steps: int = 256) -> StepPlan | None:
        """Batch mode: the next step; when it is a pure decode step with nobody waiting, the identical decode
        steps after it are fused into the plan, up to the first request's last token (the runner cuts the plan
        short when a request arrives meanwhile). Same timings as stepping one by one, far fewer events."""
        plan = self.schedule(now_s)
        if plan is None or plan.prefill or self.waiting or self.loading or not plan.decode:
            return plan
        decode = plan.decode
        steps = min(max_steps, *(r.max_tokens - r.output for r in decode))
        if steps <= 1:
            return plan
        need = sum(max(0, self._blocks_for(r.prompt_len + r.output + steps) - len(r.blocks)) for r in decode)
        if need > self.pool.free_blocks:
            return plan  # the pool is short: step by step, so the ordinary scheduler can preempt
        for r in decode:
            self._grow(r, r.prompt_len + r.output + steps)
        ctx = sum(r.prompt_len + r.output for r in decode)
        plan.steps = [plan.duration_s, *self.timer.decode_run_s(ctx + len(decode), len(decode), steps - 1)]
        plan.duration_s = functools.reduce(operator.add, plan.steps)  # left to right under every Python (3.12's sum
        # compensates), as the compiled simulation adds them
        return plan

    def complete_run(self, plan: StepPlan, now_s: float) -> list[tuple[str, list[float], bool]]:
        """Apply fused decode steps ending at ``now_s``: per request, its token times and whether it finished."""
        self.clock_s = max(self.clock_s, now_s)
        times: list[float] = []
        t = now_s - plan.duration_s
        for duration in plan.steps:
            t += duration
            times.append(t)
        k = len(times)
        out: list[tuple[str, list[float], bool]] = []
        for req in plan.decode:
            if req.finished:
                continue
            out.append((req.request_id, times, self._produce(req, k, times[0])))
        return out

    def _produce(self, req: SimRequest, tokens: int, first_at_s: float) -> bool:
        """``tokens`` more output tokens for ``req``; True when that finishes it (its blocks go back)."""
        if req.first_token_s is None:
            req.first_token_s = first_at_s
        req.output += tokens
        self.counters.generation_tokens += tokens
        if req.output < req.max_tokens:
            return False
        req.finished = True
        self.running.remove(req)
        self._free(req)
        self.counters.requests_finished += 1
        return True

    def complete(self, plan: StepPlan, now_s: float) -> list[TokenEvent]:
        self.clock_s = max(self.clock_s, now_s)
        if plan.steps:  # fused decode steps (batch mode), as token events
            events: list[TokenEvent] = []
            for rid, times, done in self.complete_run(plan, now_s):
                first = len(times)
                events.extend(
                    TokenEvent(rid, i, t, done and i == first - 1) for i, t in enumerate(times)
                )  # indices are relative to the run; batch mode uses complete_run directly
            return events
        events = []
        for req, chunk in plan.prefill:
            if req.finished or not req.admitted:  # aborted, or preempted after this plan was made
                continue
            req.num_computed += chunk
            self._register_full_blocks(req)
            if not req.in_prefill:
                if self.tiers:
                    self._store(req)
                events.append(self._emit(req, now_s))
        for req in plan.decode:
            if req.finished or not req.admitted:  # aborted, or preempted after this plan was made
                continue
            events.append(self._emit(req, now_s))
        return events

    def _register_full_blocks(self, req: SimRequest) -> None:
        full = min(req.num_computed // self.block_size, len(req.hashes), len(req.blocks))
        if full > req.registered:  # blocks hit or registered before are cached already
            self.pool.register_prefix(req.blocks, req.hashes, req.registered, full)
        req.registered = max(req.registered, full)

    def _emit(self, req: SimRequest, now_s: float) -> TokenEvent:
        done = self._produce(req, 1, now_s)
        return TokenEvent(req.request_id, req.output - 1, now_s, done)
