"""A batch run's finished requests as columns: the same figures and the same records as pydantic records gave."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvbench_core.analysis import analyze, analyze_columns
from kvbench_core.columns import Columns
from kvbench_sim.finished import FinishedRequests


def _finished() -> FinishedRequests:
    done = FinishedRequests("job", "w")
    done.append(0, "s0", 0, 0.5, [0.02, 0.03, 0.045], 100, 64)
    done.append(3, "s1", 2, 1.25, [], 50, 0)  # streamed nothing
    done.append(7, "s0", 1, 2.0, [0.1 + 0.01 * i for i in range(64)], 300, 288)
    return done


def test_the_columns_are_those_of_the_records_they_stand_for() -> None:
    done = _finished()
    direct, via_records = done.columns(), Columns.from_records(list(done))
    for field in dataclasses.fields(Columns):
        np.testing.assert_array_equal(getattr(direct, field.name), getattr(via_records, field.name), field.name)
        assert getattr(direct, field.name).dtype == getattr(via_records, field.name).dtype, field.name
    assert analyze_columns(direct, 0.0, 10.0) == analyze(list(done), 0.0, 10.0)
    assert done.ends_s().tolist() == [done.end_s(i) for i in range(len(done))]  # bit for bit
    assert done.ends_s().tolist() == pytest.approx([0.545, 1.25, 2.73])  # the silent request ends as it starts


def test_a_request_reads_back_as_its_record() -> None:
    done = _finished()
    assert len(done) == 3
    last = done[-1]
    assert (last.request_id, last.session_id, last.turn, last.start_s) == ("job-7", "s0", 1, 2.0)
    assert (last.ttft_s, last.output_tokens, last.cached_tokens, last.chunk_tokens) == (0.1, 64, 288, [1] * 64)
    assert last.e2e_s == pytest.approx(0.1 + 0.63)
    silent = done[1]
    assert (silent.ttft_s, silent.e2e_s, silent.output_tokens, silent.chunk_times_s) == (None, None, 0, [])
    assert (done.ttft_s(1), done.e2e_s(1), done.request_id(1)) == (None, None, "job-3")
    assert [r.request_id for r in done] == ["job-0", "job-3", "job-7"]
    with pytest.raises(IndexError):
        done[3]
    assert done.nbytes < 2_000  # 67 chunk times and a few numbers


def test_the_columns_copy_no_chunk_array() -> None:
    """An hour of 64 simulated engines has 92 million chunks, 740 MB an array: the columns read the packed times
    in place and stand for the token counts (all ones) with a view of a single 1, also once selected."""
    done = _finished()
    columns = done.columns()
    assert not columns.chunk_times.flags.owndata
    assert columns.chunk_tokens.strides == (0,)
    assert columns.chunk_tokens.tolist() == [1] * 67
    later = columns.take(columns.start_s > 1.0)
    assert later.chunk_tokens.strides == (0,)
    assert later.chunk_tokens.tolist() == [1] * 64
    np.testing.assert_array_equal(later.chunk_times, [0.1 + 0.01 * i for i in range(64)])
    with pytest.raises(BufferError):  # the view pins the times: an append cannot move them under it
        done.append(8, "s2", 0, 3.0, [0.5], 10, 0)
    del columns, later
    done.append(8, "s2", 0, 3.0, [0.5], 10, 0)
    assert done.e2e_s(3) == 0.5


def test_sources_read_back_and_add_up_as_the_per_request_dicts_did() -> None:
    """Each request's sources come back as the dict it was given (keys in their order, zeros kept); the totals over
    a selection are the sums a loop over those dicts gives, each source where the loop first meets it."""
    import random  # noqa: PLC0415

    rng = random.Random(3)
    done = FinishedRequests("job", "w")
    given: list[dict[str, int]] = []
    for i in range(400):
        keys = rng.choice([(), ("device", "recomputed"), ("recomputed",), ("host", "device", "recomputed"),
                           ("transferred", "recomputed"), ("device", "disk", "shared", "recomputed")])  # fmt: skip
        sources = {key: rng.choice([0, rng.randrange(1, 5000)]) for key in keys}
        given.append(sources)
        done.append(i, f"s{i}", 0, float(i), [0.01], 100, 0, sources or None)
    assert [done.sources(i) for i in range(400)] == given
    assert [list(done.sources(i)) for i in range(400)] == [list(g) for g in given]  # the order too
    for _ in range(20):
        which = np.array([rng.random() < 0.3 for _ in range(400)])
        expected: dict[str, int] = {}
        for i in np.flatnonzero(which).tolist():
            for key, tokens in given[i].items():
                expected[key] = expected.get(key, 0) + tokens
        totals = done.source_totals(which)
        assert totals == expected
        assert list(totals) == list(expected)
    assert done.source_totals(np.zeros(400, dtype=bool)) == {}
