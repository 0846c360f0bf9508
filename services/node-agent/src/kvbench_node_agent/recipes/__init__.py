"""Launch recipes: every catalog stack rendered to processes per machine."""

from kvbench_node_agent.recipes.model import EngineSettings, PoolMachine, ProcessSpec, RenderContext
from kvbench_node_agent.recipes.render import RECIPES, UnknownStackError, render

__all__ = ["RECIPES", "EngineSettings", "PoolMachine", "ProcessSpec", "RenderContext", "UnknownStackError", "render"]
