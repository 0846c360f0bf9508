"""The engine core in virtual time: continuous batching with chunked prefill, prefix cache, preemption.

The core never sleeps and never touches asyncio: ``schedule`` picks the next step and returns its
duration; ``complete`` applies it at a virtual time and returns what happened. The server paces
these steps to the wall clock; a batch runner can call them back to back.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from kvbench_sim.blocks import BlockPool, chain_hashes
from kvbench_sim.profiles import Profile
from kvbench_sim.timing import StepTimer

__all__ = ["Engine", "EngineCounters", "SimRequest", "StepPlan", "TokenEvent"]


@dataclass
class SimRequest:
    request_id: str
    prompt: list[str]
    max_tokens: int
    arrival_s: float
    hashes: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0
    cached_tokens: int = 0
    output: int = 0
    admitted: bool = False
    first_token_s: float | None = None
    finished: bool = False

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

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


@dataclass
class EngineCounters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    requests_finished: int = 0


class Engine:
    def __init__(self, profile: Profile, seed: int = 0) -> None:
        self.profile = profile
        self.block_size = profile.engine.block_size
        self.pool = BlockPool(profile.gpu_kv_blocks)
        self.timer = StepTimer(profile, seed)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.counters = EngineCounters()

    # -- intake -------------------------------------------------------------------------------
    def add(self, request: SimRequest) -> None:
        if self.profile.engine.prefix_caching:
            request.hashes = chain_hashes(request.prompt, self.block_size)
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id: str) -> None:
        for req in list(self.running):
            if req.request_id == request_id:
                self.running.remove(req)
                self._free(req)
        self.waiting = deque(r for r in self.waiting if r.request_id != request_id)

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
        victims = [r for r in self.running if r is not keep]
        if not victims:
            return False
        victim = victims[-1]
        self.running.remove(victim)
        self._free(victim)
        victim.num_computed = 0
        victim.admitted = False
        self.counters.preemptions += 1
        self.waiting.appendleft(victim)
        return True

    def schedule(self) -> StepPlan | None:
        cfg = self.profile.engine
        budget = cfg.max_num_batched_tokens
        prefill: list[tuple[SimRequest, int]] = []
        decode: list[SimRequest] = []
        for req in list(self.running):
            if req not in self.running:
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
            while not self._grow(req, req.prompt_len + req.output + 1):
                if not self._preempt_newest(req):
                    break
            else:
                decode.append(req)
                budget -= 1
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            if not req.admitted:
                max_hit_blocks = (req.prompt_len - 1) // self.block_size
                hit = self.pool.match(req.hashes[:max_hit_blocks])
                self.pool.touch(hit)
                req.blocks = list(hit)
                req.num_computed = len(hit) * self.block_size
                req.cached_tokens = req.num_computed
                self.counters.prefix_queries += req.prompt_len
                self.counters.prefix_hits += req.cached_tokens
                self.counters.prompt_tokens += req.prompt_len
                req.admitted = True
            chunk = min(req.prompt_len - req.num_computed, budget)
            if not self._grow(req, req.num_computed + chunk):
                break  # wait for blocks to free up; the request keeps its hit blocks
            self.waiting.popleft()
            self.running.append(req)
            prefill.append((req, chunk))
            budget -= chunk
        if not prefill and not decode:
            return None
        chunks = [(c, r.num_computed) for r, c in prefill]
        ctx_sum = sum(r.prompt_len + r.output for r in decode)
        return StepPlan(prefill, decode, self.timer.step_s(chunks, ctx_sum, len(decode)))

    # -- completion ---------------------------------------------------------------------------
    def complete(self, plan: StepPlan, now_s: float) -> list[TokenEvent]:
        events: list[TokenEvent] = []
        for req, chunk in plan.prefill:
            if req.finished or req not in self.running:
                continue
            req.num_computed += chunk
            self._register_full_blocks(req)
            if not req.in_prefill:
                events.append(self._emit(req, now_s))
        for req in plan.decode:
            if req.finished or req not in self.running:
                continue
            events.append(self._emit(req, now_s))
        return events

    def _register_full_blocks(self, req: SimRequest) -> None:
        full = min(req.num_computed // self.block_size, len(req.hashes), len(req.blocks))
        for j in range(full):
            self.pool.register(req.blocks[j], req.hashes[j])

    def _emit(self, req: SimRequest, now_s: float) -> TokenEvent:
        req.output += 1
        self.counters.generation_tokens += 1
        if req.first_token_s is None:
            req.first_token_s = now_s
        done = req.output >= req.max_tokens
        if done:
            req.finished = True
            self.running.remove(req)
            self._free(req)
            self.counters.requests_finished += 1
        return TokenEvent(req.request_id, req.output - 1, now_s, done)
