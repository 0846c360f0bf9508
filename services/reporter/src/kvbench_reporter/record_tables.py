"""Request records as Arrow tables in the stored row's shape: what the reporter COPYs into ``request_records``.

Arrow, because its columns are built in C from the packed batch's lists and its chunk arrays are the batch's own
bytes (a binary column over the same buffer, no slice per record), and ADBC's PostgreSQL driver turns a table into
PostgreSQL's binary COPY in C++ with the GIL released (issue 18: the Python tuple per row and asyncpg's encoding of
it were the reporter's largest cost per record).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.ma  # pyarrow imports it at its first array built from numpy: at start-up, not in a batch
import pyarrow as pa

from kvbench_contracts.records import (
    COUNTS_TYPECODE,
    NULLABLE_COLUMNS,
    RECORD_COLUMNS,
    SCALAR_KINDS,
    TIMES_TYPECODE,
    RequestRecord,
    chunk_size,
)
from kvbench_core.columns import F8, I4

__all__ = [
    "RECORD_SCHEMA",
    "chunk_column",
    "chunk_columns",
    "columnar_arrays",
    "per_record_chunks",
    "records_table",
    "requests_table",
]

_KIND_TYPES: dict[str, pa.DataType] = {"text": pa.string(), "i4": pa.int32(), "f8": pa.float64(), "bool": pa.bool_()}
_TYPES: dict[str, pa.DataType] = {
    **{name: _KIND_TYPES[kind] for name, kind in SCALAR_KINDS.items()},
    "job_id": pa.string(),
    "run_id": pa.string(),
    "shard": pa.string(),
    "chunk_times_s": pa.large_binary(),  # float64 little-endian, one per chunk (the column is bytea)
    "chunk_tokens": pa.large_binary(),  # int32 little-endian, aligned with chunk_times_s
}
# the table's NOT NULL columns (migrations/001_init.sql): a NULL there would fail the COPY of every batch written
# with it, so a batch holding one is refused where it is built
_REQUIRED = frozenset(
    {"job_id", "request_id", "run_id", "workload", "start_s", "chunk_times_s", "chunk_tokens", "prompt_tokens",
     "output_tokens", "ok"}
)  # fmt: skip
RECORD_SCHEMA = pa.schema([pa.field(name, _TYPES[name], nullable=name not in _REQUIRED) for name in RECORD_COLUMNS])

_TIME_BYTES, _TOKEN_BYTES = chunk_size(TIMES_TYPECODE), chunk_size(COUNTS_TYPECODE)


def chunk_column(offsets: np.ndarray, data: bytes | memoryview, item_bytes: int) -> pa.Array:
    """A binary column over ``data`` (no copy): record i's value is items ``offsets[i]:offsets[i+1]``. Raises
    ValueError unless the offsets start at 0, never decrease and end at the data's last item."""
    if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or int(offsets[-1]) * item_bytes != len(data):
        raise ValueError("packed chunk arrays do not match their offsets")
    if np.any(np.diff(offsets) < 0):
        raise ValueError("packed chunk offsets decrease")
    byte_offsets = pa.py_buffer(np.ascontiguousarray(offsets, dtype="<i8") * item_bytes)
    return pa.Array.from_buffers(pa.large_binary(), len(offsets) - 1, [None, byte_offsets, pa.py_buffer(data)])


def records_table(columns: Mapping[str, Sequence[object] | pa.Array], count: int) -> pa.Table:
    """The stored rows from one value list (or array) per column of RECORD_COLUMNS, ``count`` long each. Raises
    ValueError (or TypeError) on a value of the wrong type, a column of another length, or a NULL where the table
    has NOT NULL."""
    arrays = []
    for field in RECORD_SCHEMA:
        values = columns[field.name]
        array = values if isinstance(values, pa.Array) else _array(field, values)
        if len(array) != count:
            raise ValueError(f"column {field.name} has {len(array)} values for {count} records")
        if not field.nullable and array.null_count:
            raise ValueError(f"a record without its {field.name}")
        arrays.append(array)
    return pa.Table.from_arrays(arrays, schema=RECORD_SCHEMA)


def _array(field: pa.Field, values: Sequence[object]) -> pa.Array:
    """One column from Python values. pa.array(values, int32) truncates 2.5 to 2 without a word: an integer column
    holding a fractional value is refused instead (a whole 2.0 is taken as 2). Finding floats by their type set is
    one C pass, far cheaper than inferring the column and casting it."""
    if (
        pa.types.is_integer(field.type)
        and float in set(map(type, values))
        and any(isinstance(v, float) and not v.is_integer() for v in values)
    ):
        raise ValueError(f"{field.name} holds a fractional value where whole numbers belong")
    return pa.array(values, type=field.type)


def columnar_arrays(arrays: Mapping[str, memoryview], count: int) -> dict[str, pa.Array]:
    """The scalar columns of a columnar batch (RecordsColumnar) as Arrow arrays over the message's own bytes: one
    numpy pass a column, no Python object a value. A nullable column that is absent is all null; a float that is
    not finite is null, as JSON has it. Raises ValueError on an array of the wrong length, text offsets that do not
    fit their data, or text that is not UTF-8."""
    columns: dict[str, pa.Array] = {}
    for name, kind in SCALAR_KINDS.items():
        data_type = _KIND_TYPES[kind]
        if name not in arrays:
            if name not in NULLABLE_COLUMNS:
                raise ValueError(f"a columnar batch without its {name}")
            columns[name] = pa.nulls(count, data_type)
            continue
        valid = _flags(arrays, f"{name}.valid", count) if name in NULLABLE_COLUMNS else None
        data = arrays[name]
        if kind == "text":
            offsets = arrays.get(f"{name}.offsets", b"")
            if len(offsets) != 4 * (count + 1):
                raise ValueError(f"{name}: text offsets for {len(offsets) // 4 - 1} records, not {count}")
            array = pa.Array.from_buffers(data_type, count, [_bitmap(valid), pa.py_buffer(offsets), pa.py_buffer(data)])
            array.validate(full=True)  # offsets in order and within the data, every value UTF-8
        elif kind == "bool":
            array = pa.array(_flags(arrays, name, count), mask=None if valid is None else ~valid)
        else:
            values = np.frombuffer(data, dtype=F8 if kind == "f8" else I4)
            if len(values) * values.itemsize != len(data) or len(values) != count:
                raise ValueError(f"{name}: {len(data)} bytes for {count} records")
            if kind == "f8":
                finite = np.isfinite(values)
                if valid is None and not finite.all():
                    raise ValueError(f"{name} is not a finite number")
                valid = None if valid is None else valid & finite
            array = pa.Array.from_buffers(data_type, count, [_bitmap(valid), pa.py_buffer(data)])
        columns[name] = array
    return columns


def _flags(arrays: Mapping[str, memoryview], name: str, count: int) -> np.ndarray:
    flags = arrays.get(name)
    if flags is None or len(flags) != count:
        raise ValueError(f"{name}: {0 if flags is None else len(flags)} flags for {count} records")
    set_flags: np.ndarray = np.frombuffer(flags, dtype=np.uint8) != 0
    return set_flags


def _bitmap(valid: np.ndarray | None) -> pa.Buffer | None:
    """Arrow's validity bitmap (least significant bit first) from one flag a value; None: all valid."""
    if valid is None or valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _packed(lists: Sequence[Sequence[float] | Sequence[int]], dtype: np.dtype[Any]) -> tuple[np.ndarray, bytes]:
    lengths = np.fromiter((len(v) for v in lists), dtype=np.int64, count=len(lists))
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    flat = [x for v in lists for x in v]
    return offsets, np.asarray(flat, dtype=dtype).tobytes()


def chunk_columns(
    offsets: np.ndarray, times: bytes | memoryview, tokens: bytes | memoryview
) -> tuple[pa.Array, pa.Array]:
    """The two chunk columns of a packed batch: its times and token counts, split by the same offsets."""
    return chunk_column(offsets, times, _TIME_BYTES), chunk_column(offsets, tokens, _TOKEN_BYTES)


def per_record_chunks(times: Sequence[Sequence[float]], tokens: Sequence[Sequence[int]]) -> tuple[pa.Array, pa.Array]:
    """The two chunk columns from one list of chunk times and one of token counts per record."""
    t_offsets, t_data = _packed(times, F8)
    k_offsets, k_data = _packed(tokens, I4)
    return chunk_column(t_offsets, t_data, _TIME_BYTES), chunk_column(k_offsets, k_data, _TOKEN_BYTES)


def requests_table(run_id: str, records: Sequence[RequestRecord]) -> pa.Table:
    """Records outside a message (an import, a test) as stored rows."""
    columns: dict[str, Sequence[object] | pa.Array] = {
        name: [getattr(r, name) for r in records]
        for name in RECORD_COLUMNS
        if name not in ("run_id", "chunk_times_s", "chunk_tokens")
    }
    columns["run_id"] = [run_id] * len(records)
    columns["chunk_times_s"], columns["chunk_tokens"] = per_record_chunks(
        [r.chunk_times_s for r in records], [r.chunk_tokens for r in records]
    )
    return records_table(columns, len(records))
