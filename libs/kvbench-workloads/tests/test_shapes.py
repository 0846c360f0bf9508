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


@pytest.mark.parametrize("shape", ["synthetic_sessions", "per_user_history"])
def test_a_reply_recorded_as_words_makes_the_same_history_as_the_reply_as_text(shape: str) -> None:
    """The simulator's batch mode hands a session its reply as words (never joined to be split again): every later
    turn is what the same reply as text would have made, for a turn built as words and for one sent as text."""
    from kvbench_workloads.sessions import Turn  # noqa: PLC0415
    from kvbench_workloads.shapes.synthetic import SyntheticSession  # noqa: PLC0415

    traffic = {"shape": shape, "synthetic": {"prefix_tokens": 40, "groups": 2, "turns": 4, "input_tokens": 12}}
    as_text, as_words = (build_source(traffic, users=2).next_session(1) for _ in range(2))
    assert isinstance(as_text, SyntheticSession)
    assert isinstance(as_words, SyntheticSession)
    for turn_number in range(4):
        sent, again = as_text.next_turn(), as_words.next_turn()
        assert sent is not None
        assert again is not None
        assert sent.text() == again.text()
        reply = tuple(f"r{turn_number}-{i}" for i in range(5))
        if turn_number == 2:  # a turn the driver sent as text (Turn.prompt), not as words
            sent = again = Turn(prompt=sent.text(), messages=None, prompt_tokens=sent.prompt_tokens, output_tokens=5)
        as_text.record(sent, " ".join(reply), True)
        as_words.record_words(again, reply)
    assert as_text.next_turn() is None
    assert as_words.next_turn() is None
    assert as_text.turn == as_words.turn == 4
    assert as_text.context == as_words.context
