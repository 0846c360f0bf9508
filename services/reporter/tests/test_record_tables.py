"""Record batches as the stored rows' Arrow tables: every field as sent, the chunk arrays over the message's own
bytes, and anything the table would refuse refused where the batch is decoded (poison), never at the COPY."""

from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa
import pytest

from kvbench_contracts.events import RecordsBatch, RecordsBinary, RecordsColumnar, RecordsPacked
from kvbench_contracts.records import RECORD_COLUMNS, RequestRecord
from kvbench_reporter.ingest import decode_batch
from kvbench_reporter.record_tables import RECORD_SCHEMA, chunk_column, requests_table


def records() -> list[RequestRecord]:
    return [
        RequestRecord(request_id="r0", job_id="J", workload="chat", session_id="s-é", turn=2, start_s=0.5,
                      ttft_s=0.1, e2e_s=0.4, chunk_times_s=[0.1, 0.25, 0.4], chunk_tokens=[1, 2, 1], prompt_tokens=9,
                      output_tokens=4, cached_tokens=8, ok=True, shard="lg-1", connect_s=0.002),
        RequestRecord(request_id="r1", job_id="J", workload="chat", start_s=0.75, chunk_times_s=[], chunk_tokens=[],
                      prompt_tokens=3, output_tokens=0, ok=False, error="HTTP 503: overloaded", shard="lg-1"),
    ]  # fmt: skip


def expected_rows() -> list[dict[str, object]]:
    out = []
    for r in records():
        row = {name: getattr(r, name, None) for name in RECORD_COLUMNS}
        row["run_id"] = "R"
        row["chunk_times_s"] = np.asarray(r.chunk_times_s, dtype="<f8").tobytes()
        row["chunk_tokens"] = np.asarray(r.chunk_tokens, dtype="<i4").tobytes()
        out.append(row)
    return out


@pytest.mark.parametrize("form", [RecordsColumnar, RecordsBinary, RecordsPacked])
def test_every_form_decodes_to_the_same_rows_field_for_field(
    form: type[RecordsColumnar] | type[RecordsBinary] | type[RecordsPacked],
) -> None:
    batch, _ = decode_batch(form.from_records("R", "J", "lg-1", records()).to_bytes())
    assert batch.table.schema == RECORD_SCHEMA
    assert batch.table.to_pylist() == expected_rows()
    assert (batch.run_id, batch.job_id) == ("R", "J")


def test_the_per_record_json_form_and_imported_records_give_the_same_rows() -> None:
    body = RecordsBatch(run_id="R", job_id="J", shard="lg-1", records=records()).to_bytes()
    assert decode_batch(body)[0].table.to_pylist() == expected_rows()
    assert requests_table("R", records()).to_pylist() == expected_rows()


def test_the_chunk_columns_are_the_messages_own_bytes() -> None:
    times = np.arange(6, dtype="<f8").tobytes()
    column = chunk_column(np.array([0, 2, 2, 6]), times, 8)
    assert column.to_pylist() == [times[:16], b"", times[16:]]
    assert column.buffers()[2].address == pa.py_buffer(times).address  # a view, not a copy


@pytest.mark.parametrize(
    ("offsets", "data"),
    [([0, 2, 1, 3], 24), ([1, 2, 3], 16), ([0, 2, 4], 40), ([0, 5], 16)],
    ids=["decreasing", "not from 0", "short of the data", "past the data"],
)
def test_offsets_that_do_not_fit_their_bytes_are_refused(offsets: list[int], data: int) -> None:
    with pytest.raises(ValueError, match="offsets"):
        chunk_column(np.array(offsets), bytes(data), 8)


def _binary_with(**changes: object) -> bytes:
    body = RecordsBinary.from_records("R", "J", "lg-1", records()).to_bytes()
    cut = body.index(b"\n")
    head = orjson.loads(body[:cut])
    head.update(changes)
    return orjson.dumps(head) + body[cut:]


@pytest.mark.parametrize(
    "changes",
    [
        {"request_id": ["r0", None]},
        {"ok": [True, None]},
        {"start_s": [0.5, "soon"]},
        {"workload": ["chat"]},
        {"turn": [2, "second"]},
        {"prompt_tokens": [9, 2.5]},
        {"output_tokens": [4, 2**40]},
    ],
    ids=[
        "null request id",
        "null ok",
        "text start",
        "a column short",
        "text turn",
        "fractional tokens",
        "tokens past int32",
    ],
)
def test_a_value_the_table_would_refuse_is_refused_where_the_batch_is_decoded(changes: dict[str, object]) -> None:
    with pytest.raises((ValueError, TypeError, pa.ArrowException)):
        decode_batch(_binary_with(**changes))


def _columnar_with(**changes: bytes | None) -> bytes:
    """The columnar form of records() with some arrays replaced (None: left out), the head's layout to match."""
    message = RecordsColumnar.from_records("R", "J", "lg-1", records())
    arrays = {**message.arrays, **changes}
    return RecordsColumnar(
        run_id="R", job_id="J", shard="lg-1", count=2, arrays={k: v for k, v in arrays.items() if v is not None}
    ).to_bytes()


@pytest.mark.parametrize(
    "changes",
    [
        {"request_id": None},
        {"request_id.offsets": np.array([0, 2, 9], dtype="<i4").tobytes()},
        {"request_id.offsets": np.array([0, 2], dtype="<i4").tobytes()},
        {"session_id": b"s-\xc3\x28r1"},
        {"start_s": np.array([0.5, np.nan]).tobytes()},
        {"start_s": np.array([0.5]).tobytes()},
        {"ttft_s.valid": None},
        {"ok": b"\x01"},
        {"prompt_tokens": bytes(7)},
        {"chunk_offsets": np.array([0, 3], dtype="<i8").tobytes()},
    ],
    ids=[
        "no request ids",
        "text offsets past the data",
        "a text column short",
        "text that is not UTF-8",
        "a start that is not a number",
        "a float column short",
        "nullable floats without their flags",
        "a flag column short",
        "an int column of odd bytes",
        "chunk offsets short",
    ],
)
def test_a_columnar_batch_the_table_would_refuse_is_refused_where_it_is_decoded(
    changes: dict[str, bytes | None],
) -> None:
    with pytest.raises((ValueError, TypeError, pa.ArrowException)):
        decode_batch(_columnar_with(**changes))


def test_a_columnar_batch_reads_a_missing_nullable_column_as_null_and_non_finite_floats_as_null() -> None:
    rows = decode_batch(
        _columnar_with(**{"connect_s": None, "connect_s.valid": None, "ttft_s": np.array([np.inf, 0.2]).tobytes()})
    )[0].table.to_pylist()
    assert [row["connect_s"] for row in rows] == [None, None]  # a producer older than the column
    assert [row["ttft_s"] for row in rows] == [None, None]  # inf sent as a value: null, as JSON has it; r1 had none
    assert rows[0]["request_id"] == "r0"
    assert rows[1]["error"] == "HTTP 503: overloaded"


def test_a_columnar_batch_keeps_arrays_it_does_not_know_out_of_the_rows() -> None:
    body = _columnar_with(a_later_column=b"\x00" * 16)
    assert decode_batch(body)[0].table.to_pylist() == expected_rows()
