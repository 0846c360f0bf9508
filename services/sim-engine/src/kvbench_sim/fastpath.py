"""The compiled batch simulation (``_batch.c``): which simulations it runs, and the engines' state in and out.

An hour of 64 simulated engines at 400 requests/s is 1.4 million requests; in Python each cost about 200 us (its
session's words and hashes, the event heap, the engines' scheduler and step timer). The compiled simulation runs the
case such runs are made of (request-rate or closed-loop arrivals of synthetic multi-turn sessions, engines without KV
tiers and without a prefill/decode split, every engine with the compiled block pool) step for step as
``Simulation._run`` does, with the same words, hashes, jitter and tie order, so its records are the reference's bit for
bit (``tests/test_fastpath.py`` runs both on the same workloads and compares every record). Everything else, and any
simulation made with ``compiled=False``, runs in Python.

The engines' own objects stay the state: their block pools are used in place, and their clocks, counters, cold-start
marks and unused jitter factors are read before and written back after, so a cluster moves on to its next job (warm or
restarted) exactly as after the Python run.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvbench_sim import blocks
from kvbench_sim.engine import Engine
from kvbench_sim.text import WORD_OF_VALUE
from kvbench_workloads.prompts import WORD_OF_BYTE
from kvbench_workloads.shapes.synthetic import SyntheticSession, synthetic_source
from kvbench_workloads.source import SHAPE_BUILDERS

if TYPE_CHECKING:
    from kvbench_sim.batch import Simulation

__all__ = ["run", "unsupported"]

# the cluster's routing: round robin and least-queued are worked out compiled, a session's affinity once per session
# (Cluster.pick), prefix-aware per request (Cluster.pick with the prompt's first words)
_ROUTING = {"round_robin": 0, "pd_aware": 1, "session_affinity": 2, "prefix_aware": 3}
# the engine counters the compiled engines keep, in the order _batch.c reads and returns them
_COUNTERS = ("prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits", "preemptions", "requests_finished")


def unsupported(sim: Simulation) -> str | None:
    """Why the compiled simulation does not run ``sim`` (None: it does)."""
    cluster, source = sim.cluster, sim.source
    engines = cluster.engines
    if blocks.COMPILED_POOL is None:
        return "no compiled block pool (the install found no C compiler)"
    if sim.mode not in ("request_rate", "closed_loop"):
        return f"arrivals {sim.mode} (compiled: request_rate and closed_loop)"
    if SHAPE_BUILDERS.get(source.shape) is not synthetic_source or source.measure_phases:
        return f"traffic shape {source.shape} (compiled: the synthetic sessions)"
    if cluster.prefill:
        return "a prefill/decode split"
    if any(engine.tiers for engine in engines):
        return "KV tiers beyond the GPU"
    if any(engine.has_work() for engine in engines):
        return "engines with requests left from before"
    if len({(e.block_size, e.profile.engine.prefix_caching) for e in engines}) != 1:
        return "engines with different block sizes or prefix caching"
    if any(not isinstance(e.pool, blocks.COMPILED_POOL) for e in engines):
        return "an engine without the compiled block pool"
    if any(shape >= 1 << 64 for e in engines for shape in e._seen_shapes):
        return "a prefill shape past 2**63 tokens"
    if not 0 <= sim.seed < 1 << 63:
        return f"seed {sim.seed} (compiled: 0 to 2**63 - 1)"
    return None


@dataclass
class _NativeEngine:
    """One engine as ``_batch.c`` reads it: its pool, its step timer's constants and its state."""

    pool: Any
    lognormal: Callable[..., Any]
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    prefix_caching: int
    serving_from_s: float
    clock_s: float
    first_step_pending: int
    seen_shapes: int  # bit k: prefill shape 2**k ran
    first_request_s: float
    first_use_ms_per_token: float
    request_ms: float
    request_us_per_token: float
    flops: float
    bw: float
    fixed_s: float
    prefill_fixed_s: float
    attn_coeff: float
    kv_read_per_token_s: float
    mfu_max: float
    t_half: float
    mfu_attn: float
    weight_bytes: float
    two_params_active: float
    moe: int
    moe_keep: float
    weights_without_experts: float
    expert_bytes: float
    tensor_parallel_size: int
    layers: int
    q_heads: int
    head_dim: int
    sigma: float
    lognormal_mean: float
    counters: tuple[int, ...]  # _COUNTERS' values
    jitter: list[float]  # the factors still to use, the next first


def _engine_in(engine: Engine) -> _NativeEngine:
    """The same numbers StepTimer.step_s and Engine.schedule compute with, each as they compute it."""
    profile, timer, counters = engine.profile, engine.timer, engine.counters
    eff, model = profile.gpu.eff, profile.model
    moe = model.moe
    return _NativeEngine(
        pool=engine.pool,
        lognormal=timer._rng.lognormal,
        block_size=engine.block_size,
        max_num_seqs=profile.engine.max_num_seqs,
        max_num_batched_tokens=profile.engine.max_num_batched_tokens,
        prefix_caching=int(profile.engine.prefix_caching),
        serving_from_s=engine.serving_from_s,
        clock_s=engine.clock_s,
        first_step_pending=int(engine._first_step_pending),
        seen_shapes=sum(engine._seen_shapes),  # powers of two: each its own bit
        first_request_s=engine.cold.first_request_s,
        first_use_ms_per_token=engine.cold.first_use_ms_per_token,
        request_ms=eff.request_ms,
        request_us_per_token=eff.request_us_per_token,
        flops=timer._flops,
        bw=timer._bw,
        fixed_s=timer._fixed_s,
        prefill_fixed_s=eff.prefill_fixed_ms / 1e3,
        attn_coeff=float(timer._attn_coeff),
        kv_read_per_token_s=timer._kv_read_per_token_s,
        mfu_max=eff.mfu_max,
        t_half=float(eff.t_half),
        mfu_attn=eff.mfu_attn,
        weight_bytes=float(model.weight_bytes),
        two_params_active=float(2 * model.params_active),
        moe=int(moe is not None),
        moe_keep=1 - moe.top_k / moe.experts if moe is not None else 0.0,
        weights_without_experts=float(model.weight_bytes - moe.expert_bytes) if moe is not None else 0.0,
        expert_bytes=float(moe.expert_bytes) if moe is not None else 0.0,
        tensor_parallel_size=profile.engine.tensor_parallel_size,
        layers=model.layers,
        q_heads=model.q_heads,
        head_dim=model.head_dim,
        sigma=timer._sigma,
        lognormal_mean=-timer._sigma * timer._sigma / 2,
        counters=tuple(getattr(counters, name) for name in _COUNTERS),
        jitter=timer._jitter[::-1],  # the timer pops its list from the end
    )


def _engine_out(engine: Engine, state: dict[str, Any]) -> None:
    engine.clock_s = state["clock_s"]
    engine._first_step_pending = bool(state["first_step_pending"])
    engine._seen_shapes = {1 << k for k in range(64) if state["seen_shapes"] >> k & 1}
    for name, value in zip(_COUNTERS, state["counters"], strict=True):
        setattr(engine.counters, name, value)
    engine.timer._jitter = state["jitter"][::-1]


class _Words:
    """The word table the compiled sessions hold word ids of: every word a synthetic turn's input (a random byte's
    word), a reply (a 16-bit value's word) or a prefix can be, each once."""

    def __init__(self) -> None:
        self.words: list[str] = []
        self._index: dict[str, int] = {}
        self.byte_word = [self.id_of(w) for w in WORD_OF_BYTE]
        self.value_word = [self.id_of(w) for w in WORD_OF_VALUE]
        self._prefixes: dict[int, tuple[int, bytes, tuple[str, ...]]] = {}

    def id_of(self, word: str) -> int:
        index = self._index.get(word)
        if index is None:
            index = self._index[word] = len(self.words)
            self.words.append(word)
        return index

    def prefix_ids(self, prefix: tuple[str, ...]) -> tuple[int, bytes]:
        """A session's prefix as (its index among the prefixes seen, its word ids as int32 bytes). A group's sessions
        share one prefix tuple (kept here, so its id is not reused)."""
        known = self._prefixes.get(id(prefix))
        if known is None:
            ids = array("i", map(self.id_of, prefix)).tobytes()
            known = self._prefixes[id(prefix)] = (len(self._prefixes), ids, prefix)
        return known[0], known[1]


@dataclass
class _NativeRun:
    """Everything ``_batch.run_batch`` reads."""

    engines: list[_NativeEngine]
    t0: float
    deadline: float
    seed: int
    routing: int
    honor_gaps: int
    closed_loop: int
    one_session_each: int  # closed loop with no duration and an endless source: each user one session
    users: list[int]  # closed loop: the source's users
    rr_next: int
    max_concurrency: int
    next_number: int
    hashing: int
    block_size: int
    order_device: int
    order_recomputed: int
    progress_every_s: float
    progress_at: float
    gaps: Iterator[float]
    next_session: Callable[[int], Any]
    session_type: type
    prefix_ids: Callable[[tuple[str, ...]], tuple[int, bytes]]
    pick: Callable[[str, Any], int]
    words: list[str]
    byte_word: list[int]
    value_word: list[int]
    flush: Callable[..., None]
    progress: Callable[[float, int], None] | None


def run(sim: Simulation) -> tuple[int, int]:
    """Run ``sim`` compiled (``unsupported(sim)`` is None): its records, clock and engines as ``sim._run`` leaves
    them. Returns the requests that never finished and the longest one's prompt and output tokens (see
    ``Simulation.run``)."""
    from kvbench_sim import _pool  # noqa: PLC0415 - present whenever blocks.NATIVE

    cluster = sim.cluster
    engines = cluster.engines
    words = _Words()
    first = engines[0]
    spec = _NativeRun(
        engines=[_engine_in(e) for e in engines],
        t0=sim.t0,
        deadline=sim._deadline,
        seed=sim.seed,
        routing=_ROUTING.get(cluster.routing, 0),
        honor_gaps=int(sim.honor_gaps),
        closed_loop=int(sim.mode == "closed_loop"),
        one_session_each=int(sim.duration_s <= 0 and not sim.source.finite),
        users=list(sim.source.users),
        rr_next=cluster.rr_next,
        max_concurrency=sim.max_concurrency or 0,
        next_number=0,
        hashing=int(first.profile.engine.prefix_caching),
        block_size=first.block_size,
        order_device=sim.records.key_order(("device", "recomputed")),
        order_recomputed=sim.records.key_order(("recomputed",)),
        progress_every_s=sim._progress_every_s,
        progress_at=sim._progress_at,
        gaps=sim.arrival_gaps(),
        next_session=sim.source.next_session,
        session_type=SyntheticSession,
        prefix_ids=words.prefix_ids,
        pick=cluster.pick,
        words=words.words,
        byte_word=words.byte_word,
        value_word=words.value_word,
        flush=sim.records.extend_packed,
        progress=sim._progress,
    )
    left = _pool.run_batch(spec)
    sim.now = left["now"]
    sim._request_ids = itertools.count(left["next_number"])
    cluster.rr_next = left["rr_next"]
    sim._progress_at = left["progress_at"]
    for engine, state in zip(engines, left["engines"], strict=True):
        _engine_out(engine, state)
    return left["unfinished"], left["longest_unfinished"]
