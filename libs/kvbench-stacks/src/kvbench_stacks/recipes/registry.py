"""The recipe registry: each stack id maps to the one function that renders its processes.

A recipe module decorates its functions with ``@recipe("stack-id")`` (with keyword options where one function
serves several stacks, e.g. the prefix cache on and off), so the id sits next to the code that launches it and a
test checks that the catalog and the registry name the same stacks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvbench_stacks.recipes.common import Machines, UnknownStackError
from kvbench_stacks.recipes.model import ProcessSpec, RenderContext

__all__ = ["RECIPES", "Recipe", "recipe", "render"]

Recipe = Callable[[RenderContext], Machines]
RECIPES: dict[str, Recipe] = {}


def recipe(stack_id: str, **options: Any) -> Callable[[Callable[..., Machines]], Callable[..., Machines]]:
    """Register ``function(ctx, **options)`` as the launch recipe of ``stack_id``."""

    def register(function: Callable[..., Machines]) -> Callable[..., Machines]:
        if stack_id in RECIPES:
            raise ValueError(f"stack {stack_id} has two launch recipes")
        RECIPES[stack_id] = lambda ctx: function(ctx, **options)
        return function

    return register


def render(ctx: RenderContext) -> dict[str, list[ProcessSpec]]:
    """Processes per machine name, in start order."""
    build = RECIPES.get(ctx.stack)
    if build is None:
        raise UnknownStackError(f"no launch recipe for stack {ctx.stack}")
    by_index = build(ctx)
    return {machine.name: by_index.get(i, []) for i, machine in enumerate(ctx.machines)}
