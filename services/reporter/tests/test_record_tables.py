"""Record batches as the stored rows' Arrow tables: every field as sent, the chunk arrays over the message's own
bytes, and anything the table would refuse refused where the batch is decoded (poison), never at the COPY."""

from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa
import pytest

from kvbench_contracts.events import RecordsBatch, RecordsBinary, RecordsPacked
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


@pytest.mark.parametrize("form", [RecordsBinary, RecordsPacked])
def test_every_form_decodes_to_the_same_rows_field_for_field(form: type[RecordsBinary] | type[RecordsPacked]) -> None:
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
