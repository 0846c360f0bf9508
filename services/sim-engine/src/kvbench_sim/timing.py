"""Step time of one engine iteration: roofline plus correction (reference/simulator.md section 3).

Within one step, prefill chunks and decodes share the step time; that single fact is what makes long
prefills raise the inter-token latency of a colocated engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kvbench_sim.profiles import Profile

__all__ = ["StepTimer"]


class StepTimer:
    def __init__(self, profile: Profile, seed: int = 0) -> None:
        self.p = profile
        cv = profile.gpu.eff.jitter_cv
        self._sigma = math.sqrt(math.log(1 + cv * cv)) if cv > 0 else 0.0
        # step-time jitter factors drawn in blocks (one numpy call per 4,096 steps instead of one Python draw each);
        # mean 1, deterministic for a seed
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._jitter: list[float] = []
        self._affine: dict[int, tuple[float, float]] = {}  # batch size -> decode step time at 0 context, slope
        # per-step constants of the roofline (step_s runs once per engine step)
        gpu, model, eff = profile.gpu, profile.model, profile.gpu.eff
        tp = profile.engine.tensor_parallel_size
        self._flops = gpu.tflops_bf16 * 1e12 * tp
        self._bw = gpu.hbm_tbps * 1e12 * tp * eff.bw_eff
        self._fixed_s = eff.t0_ms / 1e3 + model.layers * eff.tau_layer_us / 1e6
        if model.moe is not None:
            self._fixed_s += model.layers * model.moe.layer_overhead_us / 1e6
        self._attn_coeff = 4 * (model.attn_layers or model.layers) * model.q_heads * model.head_dim
        self._kv_read_per_token_s = model.kv_bytes_per_token / self._bw

    def step_s(self, prefill_chunks: Sequence[tuple[int, int]], decode_ctx_sum: int, num_decodes: int) -> float:
        """``prefill_chunks``: (new tokens, prefix tokens already in KV) per chunk."""
        model, eff = self.p.model, self.p.gpu.eff
        flops, bw = self._flops, self._bw
        tokens = num_decodes
        attn_flops = 0.0
        long_chunk = False
        for c, p in prefill_chunks:
            tokens += c
            attn_flops += c * (p + c / 2)
            long_chunk = long_chunk or c > 1
        if tokens == 0:
            return 0.0
        mfu = eff.mfu_max * tokens / (tokens + eff.t_half)
        weights_read = model.weight_bytes
        if model.moe is not None:  # only the experts the batch's tokens route to are read
            moe = model.moe
            touched = 1 - (1 - moe.top_k / moe.experts) ** tokens
            weights_read = model.weight_bytes - moe.expert_bytes + moe.expert_bytes * touched
        t_lin = max(2 * model.params_active * tokens / (flops * mfu), weights_read / bw)
        t_attn = self._attn_coeff * attn_flops / (flops * eff.mfu_attn) + decode_ctx_sum * self._kv_read_per_token_s
        t_comm = 0.0
        if self.p.engine.tensor_parallel_size > 1:
            act_bytes = tokens * model.q_heads * model.head_dim * 2
            t_comm = 2 * model.layers * (25e-6 + act_bytes / 450e9)
        fixed = self._fixed_s
        if long_chunk:  # a one-token chunk (a P/D hand-off's last token) is decode-like
            fixed += eff.prefill_fixed_ms / 1e3
        base = fixed + t_lin + t_attn + t_comm
        if self._sigma:  # the next jitter factor: _draw(1)'s, without a list for one number (once per step)
            base *= self._jitter.pop() if self._jitter else self._draw(1)[0]
        return base

    def _draw(self, n: int) -> list[float]:
        """The next ``n`` jitter factors."""
        while len(self._jitter) < n:
            block = self._rng.lognormal(-self._sigma * self._sigma / 2, self._sigma, max(4096, n))
            self._jitter = [*reversed(block.tolist()), *self._jitter]
        taken = self._jitter[-n:]
        del self._jitter[-n:]
        return taken

    def decode_run_s(self, ctx_sum: int, num_decodes: int, steps: int) -> list[float]:
        """``steps`` consecutive pure-decode steps of the same batch (its context grows by one token per request
        per step), computed at once: the same formula as ``step_s``, affine in the context, and the same jitter."""
        if steps <= 0:
            return []
        affine = self._affine.get(num_decodes)
        if affine is None:
            sigma, self._sigma = self._sigma, 0.0  # the affine parts, without jitter
            try:
                zero = self.step_s([], 0, num_decodes)
                affine = (zero, self.step_s([], 1_000_000, num_decodes) - zero)
            finally:
                self._sigma = sigma
            self._affine[num_decodes] = affine
        at_zero, slope = affine
        step_slope = slope * num_decodes / 1_000_000
        first = at_zero + slope * ctx_sum / 1_000_000
        if not self._sigma:
            return [first + i * step_slope for i in range(steps)]
        return [(first + i * step_slope) * factor for i, factor in enumerate(self._draw(steps))]
