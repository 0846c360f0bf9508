"""Per-request records: the public export format of DESIGN.md section 6."""

from __future__ import annotations

import struct
import sys
from array import array
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "COUNTS_TYPECODE",
    "OFFSETS_TYPECODE",
    "PACKED_COLUMNS",
    "RECORD_COLUMNS",
    "TIMES_TYPECODE",
    "RequestRecord",
    "chunk_size",
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
    error: str | None = Field(default=None, description="timeout | http_<status> | connection_reset | bad_stream | ...")
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
