"""A plan's traffic section turned into a source of sessions (every shape of PLAN.md).

Synthetic shapes give each user an endless series of sessions; replayed shapes (agentic data set,
traces, documents) are a finite list that the users (or arrivals) share in order. Sharding gives each
load generator every n-th user or every n-th replayed session. Each shape's builder lives in its own
module under ``shapes/`` and registers itself (``source.shape_builder``).
"""

from __future__ import annotations

import math
from typing import Any, get_args

from kvbench_contracts.plan import Shape
from kvbench_workloads import shapes
from kvbench_workloads.prompts import TOKENIZER_NAME
from kvbench_workloads.source import SHAPE_BUILDERS, ShapeRequest, Source, UnsupportedShapeError, contexts_for_ratio
from kvbench_workloads.tokenizer import load_tokenizer

__all__ = ["SHAPES", "Source", "UnsupportedShapeError", "build_source", "contexts_for_ratio", "shapes"]

SHAPES: tuple[str, ...] = get_args(Shape)
_NEEDS_CAPACITY = ("synthetic_sessions", "shared_prompt", "document_reuse")  # shapes a working-set ratio sizes


def build_source(
    traffic: dict[str, Any],
    *,
    users: int,
    model: str | None = None,
    seed: int = 0,
    shard: int = 0,
    shards: int = 1,
    working_set_ratio: float | None = None,
    capacity_tokens: int | None = None,
    horizon_s: float = math.inf,
) -> Source:
    shape = str(traffic.get("shape", "agentic_replay"))
    builder = SHAPE_BUILDERS.get(shape)
    if builder is None:
        raise UnsupportedShapeError(f"traffic.shape {shape!r} is not one of {', '.join(SHAPES)}")
    if working_set_ratio and not capacity_tokens and shape in _NEEDS_CAPACITY:
        raise UnsupportedShapeError(
            "measurement.working_set_ratio needs the pool's GPU KV capacity, and no engine reported it "
            "(vllm:cache_config_info or sglang:max_total_num_tokens); remove the ratio or use an engine that does"
        )
    request = ShapeRequest(traffic, shape, users, seed, shard, shards, working_set_ratio, capacity_tokens, horizon_s)
    source = builder(request)
    tokenizer = load_tokenizer(model)
    if tokenizer.name != TOKENIZER_NAME:
        source.tokenizer, source.count_tokens = tokenizer.name, tokenizer.count
    return source
