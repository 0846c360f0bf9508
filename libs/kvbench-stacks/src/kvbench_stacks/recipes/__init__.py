"""Launch recipes: every catalog stack rendered to processes per machine (flags and configs from
reference/stacks.md, the section in each recipe's comment). One module per engine family; importing this package
registers every recipe."""

from kvbench_stacks.recipes import mori, sglang, trtllm, vllm, vllm_pd
from kvbench_stacks.recipes.common import EngineSlot, UnknownStackError
from kvbench_stacks.recipes.model import EngineSettings, PoolMachine, ProcessSpec, RenderContext
from kvbench_stacks.recipes.registry import RECIPES, recipe, render

__all__ = [
    "RECIPES",
    "EngineSettings",
    "EngineSlot",
    "PoolMachine",
    "ProcessSpec",
    "RenderContext",
    "UnknownStackError",
    "mori",
    "recipe",
    "render",
    "sglang",
    "trtllm",
    "vllm",
    "vllm_pd",
]
