"""Per-request records: the public export format of DESIGN.md section 6."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RequestRecord"]


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
