"""The review of a plan's question (search:): a question that cannot be asked is refused naming the field and
the fix, as for every plan field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kvbench_planner.validation import review_text

ROOT = Path(__file__).resolve().parents[3]
HOST_MEMORY = ROOT / "examples" / "search" / "host-memory.yaml"


@pytest.mark.parametrize(
    ("change", "field", "code"),
    [
        ({"vary": {"sizing.nonsense_gb": [1, 2]}}, "search.vary.sizing.nonsense_gb", "search_field_unknown"),
        ({"vary": {"sizing.host_memory_gb": []}}, "search.vary.sizing.host_memory_gb", "search_empty"),
        ({"vary": {"sizing.host_memory_gb": [-4]}}, "search.vary.sizing.host_memory_gb", "search_value_invalid"),
        ({"vary": {"sizing.host_memory_gb": {"from": 1, "to": 8}}}, "search.vary.sizing.host_memory_gb",
         "search_range_not_load"),
        ({"vary": {"traffic.arrivals.rates": {"from": 1, "to": 8}}, "objective": "maximize goodput_rps"},
         "search.vary.traffic.arrivals.rates", "search_load_mode"),
        ({"objective": "maximize happiness"}, "search.objective", "search_objective_unknown"),
        ({"workload": "nope"}, "search.workload", "invalid_field"),
        ({"slo": {"ttft_p42_ms": 100}}, "search.slo.ttft_p42_ms", None),
        ({"vary": {"traffic.arrivals.users": {"from": 8, "to": 8}}}, "search.vary.traffic.arrivals.users", None),
    ],
)  # fmt: skip
def test_a_question_that_cannot_be_asked_is_refused_naming_the_field(
    change: dict[str, Any], field: str, code: str | None
) -> None:
    document = yaml.safe_load(HOST_MEMORY.read_text())
    document["search"].update(change)
    review = review_text(yaml.safe_dump(document))
    assert not review.valid
    problems = [(p.field, p.code) for p in review.errors]
    if code is None:  # a structural refusal: the field named, whatever its code
        assert any(f is not None and f.startswith(field) for f, _ in problems), problems
    else:
        assert (field, code) in problems, problems
    assert all(p.fix for p in review.errors)
