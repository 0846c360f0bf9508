"""Step time of one engine iteration: roofline plus correction (reference/simulator.md section 3).

Within one step, prefill chunks and decodes share the step time; that single fact is what makes long
prefills raise the inter-token latency of a colocated engine.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from kvbench_sim.profiles import Profile

__all__ = ["StepTimer"]


class StepTimer:
    def __init__(self, profile: Profile, seed: int = 0) -> None:
        self.p = profile
        self._rng = random.Random(seed)
        cv = profile.gpu.eff.jitter_cv
        self._sigma = math.sqrt(math.log(1 + cv * cv)) if cv > 0 else 0.0
        self._affine: dict[int, tuple[float, float]] = {}  # batch size -> decode step time at 0 context, slope

    def step_s(self, prefill_chunks: Sequence[tuple[int, int]], decode_ctx_sum: int, num_decodes: int) -> float:
        """``prefill_chunks``: (new tokens, prefix tokens already in KV) per chunk."""
        gpu, model, eff = self.p.gpu, self.p.model, self.p.gpu.eff
        tp = self.p.engine.tensor_parallel_size
        flops = gpu.tflops_bf16 * 1e12 * tp
        bw = gpu.hbm_tbps * 1e12 * tp * eff.bw_eff
        tokens = sum(c for c, _ in prefill_chunks) + num_decodes
        if tokens == 0:
            return 0.0
        mfu = eff.mfu_max * tokens / (tokens + eff.t_half)
        weights_read = model.weight_bytes
        moe_overhead = 0.0
        if model.moe is not None:  # only the experts the batch's tokens route to are read
            moe = model.moe
            touched = 1 - (1 - moe.top_k / moe.experts) ** tokens
            weights_read = model.weight_bytes - moe.expert_bytes + moe.expert_bytes * touched
            moe_overhead = model.layers * moe.layer_overhead_us / 1e6
        t_lin = max(2 * model.params_active * tokens / (flops * mfu), weights_read / bw)
        attn_layers = model.attn_layers or model.layers
        attn_flops = sum(4 * attn_layers * model.q_heads * model.head_dim * c * (p + c / 2) for c, p in prefill_chunks)
        t_attn = attn_flops / (flops * eff.mfu_attn) + decode_ctx_sum * model.kv_bytes_per_token / bw
        t_comm = 0.0
        if tp > 1:
            act_bytes = tokens * model.q_heads * model.head_dim * 2
            t_comm = 2 * model.layers * (25e-6 + act_bytes / 450e9)
        fixed = eff.t0_ms / 1e3 + model.layers * eff.tau_layer_us / 1e6 + moe_overhead
        if any(c > 1 for c, _ in prefill_chunks):  # a one-token chunk (a P/D hand-off's last token) is decode-like
            fixed += eff.prefill_fixed_ms / 1e3
        base = fixed + t_lin + t_attn + t_comm
        if self._sigma:
            base *= self._rng.lognormvariate(-self._sigma * self._sigma / 2, self._sigma)
        return base

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
        jitter = self._rng.lognormvariate
        mu, sigma = -self._sigma * self._sigma / 2, self._sigma
        return [(first + i * step_slope) * jitter(mu, sigma) for i in range(steps)]
