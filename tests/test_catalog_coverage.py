"""The planner's catalog and the node agent's recipes describe the same stacks."""

from __future__ import annotations

from kvbench_node_agent.launchers.sim import SIM_STACK_FLAGS
from kvbench_node_agent.recipes import RECIPES
from kvbench_planner.catalog import CATALOG


def test_every_catalog_stack_has_a_launch_recipe() -> None:
    assert set(CATALOG) == set(RECIPES)


def test_stacks_marked_simulated_are_the_ones_the_sim_launcher_starts() -> None:
    assert {s.id for s in CATALOG.values() if s.simulated} == set(SIM_STACK_FLAGS)
