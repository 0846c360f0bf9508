"""The shape registry: every shape the plan contract allows has exactly one builder, and nothing else does."""

from typing import get_args

import pytest

from kvbench_contracts.plan import Shape
from kvbench_workloads.source import SHAPE_BUILDERS, shape_builder
from kvbench_workloads.sources import UnsupportedShapeError, build_source


def test_every_plan_shape_has_a_builder() -> None:
    assert set(SHAPE_BUILDERS) == set(get_args(Shape))


def test_a_second_builder_for_a_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="two builders"):
        shape_builder("document_reuse")(SHAPE_BUILDERS["document_reuse"])


def test_an_unknown_shape_names_the_field_and_the_choices() -> None:
    with pytest.raises(UnsupportedShapeError, match=r"traffic.shape 'nope' is not one of .*document_reuse"):
        build_source({"shape": "nope"}, users=1)
