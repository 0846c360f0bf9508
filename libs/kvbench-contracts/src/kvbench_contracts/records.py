"""Per-request records: the public export format of DESIGN.md section 6."""

from __future__ import annotations

import itertools
import math
import struct
import sys
import types
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "COUNTS_TYPECODE",
    "NULLABLE_COLUMNS",
    "OFFSETS_TYPECODE",
    "PACKED_COLUMNS",
    "RECORD_COLUMNS",
    "SCALAR_KINDS",
    "TIMES_TYPECODE",
    "ColumnKind",
    "RequestRecord",
    "chunk_size",
    "decode_scalar_columns",
    "encode_scalar_columns",
    "pack_chunks",
    "unpack_chunks",
]

# -- the packed chunk format: one definition for the load generator, the bus and PostgreSQL ------------------------
# A request's chunk arrays travel and are stored as little-endian machine arrays: times as float64 (seconds after
# the request's send), tokens as int32 aligned with them, and, where many requests are packed together, int64
# offsets (request i's chunks are offsets[i]:offsets[i+1]). Each reader uses the fastest tool it has for the same
# format: ``array`` here (no numpy in the contracts), numpy in the report's maths, ``struct`` on the ingest path.
ChunkKind = Literal["d", "i", "q"]  # array typecodes
# chunk arrival times (float64), tokens in each chunk (int32), offsets of each request's chunks (int64)
TIMES_TYPECODE: Final[ChunkKind] = "d"
COUNTS_TYPECODE: Final[ChunkKind] = "i"
OFFSETS_TYPECODE: Final[ChunkKind] = "q"


def pack_chunks(kind: ChunkKind, values: list[float] | list[int]) -> bytes:
    data = array(kind, values)
    if sys.byteorder != "little":
        data.byteswap()
    return data.tobytes()


def unpack_chunks(kind: ChunkKind, data: bytes) -> list[float] | list[int]:
    values = array(kind)
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


def chunk_size(kind: ChunkKind) -> int:
    """Bytes of one packed value."""
    return struct.calcsize("<" + kind)


class RequestRecord(BaseModel):
    """One request, measured on the load generator's monotonic clock.

    Field names are a public interface (``kvbench records export``, ``kvbench load --records``,
    ``kvbench report analyze``): never rename them, only add.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    request_id: str = Field(description="Unique id of the request (ULID)")
    job_id: str = Field(description="Job the request belongs to")
    workload: str = Field(description="Workload name from the plan")
    session_id: str | None = Field(default=None, description="Session or user id, when the shape has sessions")
    turn: int | None = Field(default=None, description="Turn number within the session, from 0")
    start_s: float = Field(description="Send time, seconds after the job's load start (monotonic clock)")
    ttft_s: float | None = Field(default=None, description="First content chunk minus send time; null if none")
    e2e_s: float | None = Field(default=None, description="Last content chunk minus send time; null if none")
    chunk_times_s: list[float] = Field(default_factory=list, description="Arrival of each content chunk after start_s")
    chunk_tokens: list[int] = Field(
        default_factory=list, description="Tokens in each chunk, same length as chunk_times_s"
    )
    prompt_tokens: int = Field(default=0, description="Prompt tokens (server usage when reported)")
    output_tokens: int = Field(default=0, description="Output tokens (server usage when reported)")
    cached_tokens: int | None = Field(default=None, description="usage.prompt_tokens_details.cached_tokens")
    ok: bool = Field(description="True when the request completed without error")
    error: str | None = Field(
        default=None, description="timeout | http_<status> | connection_refused | connection_reset | bad_stream | ..."
    )
    shard: str | None = Field(default=None, description="Id of the load generator that sent it")
    connect_s: float | None = Field(
        default=None,
        description="Seconds spent opening a new connection before the send (not part of TTFT or E2E, which run "
        "from the request's write to the socket); null when an idle kept-alive connection was reused",
    )


# the stored row (PostgreSQL request_records and its COPY) in column order: the record's fields plus its run
RECORD_COLUMNS: tuple[str, ...] = (
    "job_id",
    "request_id",
    "run_id",
    "workload",
    "session_id",
    "turn",
    "start_s",
    "ttft_s",
    "e2e_s",
    "chunk_times_s",
    "chunk_tokens",
    "prompt_tokens",
    "output_tokens",
    "cached_tokens",
    "ok",
    "error",
    "shard",
    "connect_s",
)
# the per-request scalar columns of a packed batch (RecordsPacked), in stored order: a batch carries job, run and
# shard once and the chunk arrays packed
PACKED_COLUMNS: tuple[str, ...] = tuple(
    c for c in RECORD_COLUMNS if c not in ("job_id", "run_id", "shard", "chunk_times_s", "chunk_tokens")
)


# -- the columnar batch format (RecordsColumnar): every per-request scalar column as a little-endian machine array ---
# A consumer takes each array as it is (the reporter wraps the bytes as Arrow arrays without a Python object per
# value); JSON lists of 500 values cost a parse and a conversion per value on both sides (issue 18).
ColumnKind = Literal["text", "i4", "f8", "bool"]
# how each per-request scalar column travels; text is UTF-8 with int32 offsets (``NAME.offsets``), i4 int32, f8
# float64, bool one byte 0/1. A nullable column also carries ``NAME.valid``: one byte a request, 0 for null (the
# value slot then holds 0). A float that is not finite travels as null, as in JSON.
SCALAR_KINDS: Final[Mapping[str, ColumnKind]] = {
    "request_id": "text",
    "workload": "text",
    "session_id": "text",
    "turn": "i4",
    "start_s": "f8",
    "ttft_s": "f8",
    "e2e_s": "f8",
    "prompt_tokens": "i4",
    "output_tokens": "i4",
    "cached_tokens": "i4",
    "ok": "bool",
    "error": "text",
    "connect_s": "f8",
}
_TYPECODES: Final[Mapping[ColumnKind, str]] = {"i4": "i", "f8": "d", "bool": "B"}


def _admits_none(name: str) -> bool:
    annotation = RequestRecord.model_fields[name].annotation
    return isinstance(annotation, types.UnionType) and type(None) in get_args(annotation)


# the scalar columns a record may leave null (their fields admit None): the one answer for both sides
NULLABLE_COLUMNS: Final[frozenset[str]] = frozenset(name for name in SCALAR_KINDS if _admits_none(name))


def _little(values: array[Any]) -> bytes:
    if sys.byteorder != "little":
        values.byteswap()
    return values.tobytes()


def encode_scalar_columns(columns: Mapping[str, Sequence[Any]]) -> dict[str, bytes]:
    """Each column of SCALAR_KINDS (a value per request) as its arrays, by array name. Raises TypeError or
    ValueError on a value its kind cannot hold (a fractional count, text that is not a str)."""
    arrays: dict[str, bytes] = {}
    for name, kind in SCALAR_KINDS.items():
        values = columns[name]
        # the common case, no null and no float that is not finite, converts in C at once; a null or a value of
        # the wrong type stops it (TypeError) and the column is taken value by value, where a wrong type raises
        converted = _at_once(name, kind, values)
        valid: list[bool] | None = None
        if converted is None:
            valid = (
                [False] * len(values)  # a column nobody filled (errors, connect times): no test of each value
                if values.count(None) == len(values)
                else [v is not None and (kind != "f8" or math.isfinite(v)) for v in values]
            )
            if name not in NULLABLE_COLUMNS and not all(valid):
                raise ValueError(f"{name} is null where a value is required")
            values = [v if ok else _EMPTY[kind] for v, ok in zip(values, valid, strict=True)]
            converted = _value_by_value(name, kind, values)
        arrays.update(converted)
        if name in NULLABLE_COLUMNS:
            arrays[f"{name}.valid"] = b"\x01" * len(values) if valid is None else bytes(valid)
    return arrays


def _at_once(name: str, kind: ColumnKind, values: Sequence[Any]) -> dict[str, bytes] | None:
    try:
        if kind == "text":
            joined = "".join(values)
            data = joined.encode()
            if len(data) != len(joined):  # not all ASCII: byte offsets are not character offsets
                return None
            return _text(name, map(len, values), data)
        numbers = _numbers(name, kind, values)
    except TypeError:
        return None
    if kind == "f8" and not math.isfinite(sum(numbers)):  # a NaN or an infinity inside (or a sum past 1e308)
        return None
    return {name: _little(numbers)}


def _value_by_value(name: str, kind: ColumnKind, values: Sequence[Any]) -> dict[str, bytes]:
    if kind == "text":
        encoded = [_utf8(name, v) for v in values]
        return _text(name, map(len, encoded), b"".join(encoded))
    return {name: _little(_numbers(name, kind, values))}


def _text(name: str, lengths: Iterable[int], data: bytes) -> dict[str, bytes]:
    return {f"{name}.offsets": _little(array("i", itertools.accumulate(lengths, initial=0))), name: data}


def _numbers(name: str, kind: ColumnKind, values: Sequence[Any]) -> array[Any]:
    try:
        return array(_TYPECODES[kind], values)
    except OverflowError as exc:
        raise ValueError(f"{name} holds a value out of its range: {exc}") from exc


# what a null's slot holds in each kind's array (its flag says it is null)
_EMPTY: Final[Mapping[ColumnKind, object]] = {"text": "", "i4": 0, "f8": 0.0, "bool": False}


def _utf8(name: str, value: object) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{name} holds {type(value).__name__} where text belongs")
    return value.encode()


def decode_scalar_columns(arrays: Mapping[str, bytes | memoryview], count: int) -> dict[str, list[object]]:
    """The columns back as Python values (a column a producer left out: all null); the inverse of
    encode_scalar_columns, for readers outside the hot path. Raises ValueError when an array's length does not
    match ``count``."""
    columns: dict[str, list[object]] = {}
    for name, kind in SCALAR_KINDS.items():
        values: list[object]
        if name not in arrays:
            if name not in NULLABLE_COLUMNS:
                raise ValueError(f"a columnar batch without its {name}")
            columns[name] = [None] * count
            continue
        if kind == "text":
            offsets = array("i")
            offsets.frombytes(arrays[f"{name}.offsets"])
            if sys.byteorder != "little":
                offsets.byteswap()
            if len(offsets) != count + 1:
                raise ValueError(f"{name}: {len(offsets) - 1} offsets for {count} records")
            data = bytes(arrays[name])
            values = [data[a:b].decode() for a, b in itertools.pairwise(offsets)]
        else:
            typed = array(_TYPECODES[kind])
            typed.frombytes(arrays[name])
            if sys.byteorder != "little":
                typed.byteswap()
            if len(typed) != count:
                raise ValueError(f"{name}: {len(typed)} values for {count} records")
            values = [bool(v) for v in typed] if kind == "bool" else list(typed.tolist())
        valid = arrays.get(f"{name}.valid")
        if valid is not None:
            if len(valid) != count:
                raise ValueError(f"{name}.valid: {len(valid)} flags for {count} records")
            values = [v if flag else None for v, flag in zip(values, valid, strict=True)]
        columns[name] = values
    return columns
