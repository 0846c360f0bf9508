"""Facts (past tense) published by services. Subjects derive from each model's SUBJECT template."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from kvbench_contracts.envelope import Envelope
from kvbench_contracts.problem import Problem
from kvbench_contracts.records import (
    COUNTS_TYPECODE,
    OFFSETS_TYPECODE,
    SCALAR_KINDS,
    TIMES_TYPECODE,
    ChunkKind,
    RequestRecord,
    decode_scalar_columns,
    encode_scalar_columns,
    pack_chunks,
    unpack_chunks,
)

__all__ = [
    "SEND_LATE_MS",
    "ClientTiming",
    "EngineEndpoint",
    "EngineSampled",
    "EnginesRead",
    "EnginesRestarted",
    "JobFailed",
    "JobFinished",
    "JobProgressed",
    "JobStarted",
    "JobWindowEdge",
    "MachinePolicy",
    "NodeInventory",
    "NodeRegistered",
    "RecordsBatch",
    "RecordsBinary",
    "RecordsColumnar",
    "RecordsPacked",
    "RunCancelled",
    "RunFinished",
    "RunStarted",
    "RunSubmitted",
    "SampledRole",
    "StackFailed",
    "StackReady",
    "StackStopped",
    "WindowEdge",
    "split_binary_records",
]

RunStatus = Literal["pending", "queued", "running", "succeeded", "failed", "cancelled"]


class MachinePolicy(BaseModel):
    """What a plan may make a machine run or write, set by its operator in the agent's settings (never by a plan):
    the planner's review and the agent check it the same way (kvbench_core.allowlist)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    allowed_images: list[str] = Field(
        default_factory=list, description="Images a plan may choose (engine.args.image), globs; none: the stacks' own"
    )
    allowed_code_dirs: list[str] = Field(
        default_factory=list, description="Script directories a plan may name (engine.args.lmcache_examples)"
    )
    allowed_data_dirs: list[str] = Field(
        default_factory=list, description="Directories a plan's tiers must lie in; none: any the plan rules accept"
    )
    allowed_env: list[str] = Field(
        default_factory=list, description="Engine variables a plan may set (engine.env), globs; none: no variable"
    )


class NodeInventory(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    node_id: str = Field(description="Machine id (stable per machine)")
    hostname: str = Field(description="Host name the agent runs on")
    simulated: bool = Field(description="True for a machine of a simulated cluster")
    vendor: str | None = Field(None, description="GPU vendor: nvidia, amd or null when no GPU")
    gpu_model: str | None = Field(None, description="GPU model, e.g. L40S")
    gpus: int = Field(0, description="GPU count")
    gpu_memory_gb: float = Field(0, description="Memory per GPU, GB")
    ram_gb: float = Field(0, description="Host RAM, GB")
    cpus: int = Field(0, description="CPU cores")
    group: str | None = Field(None, description="Cluster group the machine was registered into")
    rdma: list[dict[str, str]] = Field(default_factory=list, description="RDMA ports: {device, state}")
    address: str | None = Field(None, description="Address other machines reach this one at")
    binaries: list[str] = Field(default_factory=list, description="Engine binaries found on PATH")
    disks: list[dict[str, Any]] = Field(default_factory=list, description="Mounts: {mount, fstype, total_gb, free_gb}")
    nics: list[dict[str, Any]] = Field(default_factory=list, description="NICs: {name, mac, mtu, speed_mbps, state}")
    lldp: list[dict[str, Any]] = Field(
        default_factory=list, description="LLDP neighbours of the NICs (lldpd): which switch port each is cabled to"
    )
    policy: MachinePolicy | None = Field(None, description="What a plan may run or write here (a real machine's)")
    public_key: str | None = Field(
        None,
        description="The agent's X25519 public key (base64): a secret it needs is sealed to it (kvbench_core.sealing)",
    )


class NodeRegistered(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.node.registered/1"
    SUBJECT: ClassVar[str] = "kvbench.node.{node_id}.registered"
    node_id: str
    inventory: NodeInventory


class EngineEndpoint(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    node_id: str = Field(description="Machine that runs the engine")
    engine_id: str = Field(description="Unique engine id within the deployment")
    role: Literal["both", "prefill", "decode", "router"] = Field("both", description="P/D role")
    base_url: str = Field(description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8100")
    metrics_url: str = Field(description="Prometheus /metrics URL")


class StackReady(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.stack.ready/1"
    SUBJECT: ClassVar[str] = "kvbench.stack.{node_id}.{deployment_id}.ready"
    deployment_id: str
    run_id: str
    node_id: str
    endpoints: list[EngineEndpoint]
    facts: dict[str, Any] = Field(default_factory=dict, description="e.g. attention block size read from logs")
    workload: str | None = Field(None, description="The plan's workload the stack serves (older agents: unset)")


class StackFailed(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.stack.failed/1"
    SUBJECT: ClassVar[str] = "kvbench.stack.{node_id}.{deployment_id}.failed"
    deployment_id: str
    run_id: str
    node_id: str
    reason: str


class StackStopped(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.stack.stopped/1"
    SUBJECT: ClassVar[str] = "kvbench.stack.{node_id}.{deployment_id}.stopped"
    deployment_id: str
    run_id: str
    node_id: str


class EnginesRestarted(Envelope):
    """A deployment's engines were restarted alone (RestartEngines), or could not be: ``error`` says why."""

    SCHEMA: ClassVar[str] = "kvbench.stack.engines_restarted/1"
    SUBJECT: ClassVar[str] = "kvbench.stack.{node_id}.{deployment_id}.engines_restarted"
    deployment_id: str
    run_id: str
    node_id: str
    engines: list[str] = Field(default_factory=list, description="The processes restarted, by name")
    kept: list[str] = Field(default_factory=list, description="The deployment's other processes, left running")
    took_s: float = Field(0.0, ge=0, description="From the first stop to the last engine healthy, s (monotonic)")
    error: str | None = Field(None, description="Why the engines could not be restarted (None: they were)")


class EnginesRead(Envelope):
    """A deployment's engines were read at an edge of a job (ReadEngines): the planner waits for this at the job's own
    edges, so that no request is sent before, nor the next job begun after, the counters it brackets were read."""

    SCHEMA: ClassVar[str] = "kvbench.stack.engines_read/1"
    SUBJECT: ClassVar[str] = "kvbench.stack.{node_id}.{deployment_id}.engines_read"
    deployment_id: str
    run_id: str
    node_id: str
    job_id: str
    edge: WindowEdge
    engines: int = Field(0, ge=0, description="Engines and cache servers read")
    failed: list[str] = Field(default_factory=list, description="Those whose /metrics did not answer")


class RunSubmitted(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.run.submitted/1"
    SUBJECT: ClassVar[str] = "kvbench.run.{run_id}.submitted"
    run_id: str
    plan_name: str
    plan: dict[str, Any] = Field(description="The plan as submitted (after defaults were merged)")
    jobs: list[dict[str, Any]] = Field(description="Expanded jobs: job_id, workload, stack, load_level, repeat")


class RunStarted(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.run.started/1"
    SUBJECT: ClassVar[str] = "kvbench.run.{run_id}.started"
    run_id: str


class RunCancelled(Envelope):
    """A person cancelled the run: load generators stop its jobs, agents keep serving until told to stop."""

    SCHEMA: ClassVar[str] = "kvbench.run.cancelled/1"
    SUBJECT: ClassVar[str] = "kvbench.run.{run_id}.cancelled"
    run_id: str


class RunFinished(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.run.finished/1"
    SUBJECT: ClassVar[str] = "kvbench.run.{run_id}.finished"
    run_id: str
    status: RunStatus
    reasons: list[Problem] = Field(
        default_factory=list, description="What went wrong, with the fix, when not succeeded"
    )


class JobStarted(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.job.started/1"
    SUBJECT: ClassVar[str] = "kvbench.job.{job_id}.started"
    job_id: str
    run_id: str
    workload: str
    shard: str


# a job's edges: its load's first request and last answer ("job_start", "job_end", read on the planner's command
# before the load starts and after it ends: every request the engines counted is the job's), and its measured
# window's ("start", "end", said by the load generator as they happen)
WindowEdge = Literal["job_start", "start", "end", "job_end"]


class JobWindowEdge(Envelope):
    """The instant a job's measured window starts or ends, said by the load generator as it happens: the planner has
    every engine of the job read then (ReadEngines), so engine counters are differenced over the window itself and
    not between the periodic scrapes nearest its edges."""

    SCHEMA: ClassVar[str] = "kvbench.job.window_edge/1"
    SUBJECT: ClassVar[str] = "kvbench.job.{job_id}.window_edge"
    job_id: str
    run_id: str
    shard_index: int = Field(0, ge=0)
    edge: WindowEdge
    at: float = Field(description="Wall-clock time of the edge on the load generator (Unix seconds)")


class JobProgressed(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.job.progressed/1"
    SUBJECT: ClassVar[str] = "kvbench.job.{job_id}.progressed"
    job_id: str
    run_id: str
    elapsed_s: float
    duration_s: float
    requests_done: int
    errors: int
    requests_expected: int | None = Field(
        None, description="Session-bounded shapes that know their length: the requests the job will send"
    )


# a scheduled send later than this counts as late (event-loop timers are millisecond-grained)
SEND_LATE_MS = 5.0


class ClientTiming(BaseModel):
    """How far the load generator itself fell behind while it ran a job (its own lag, not the engine's): the
    reporter marks TTFT and ITL unreliable when these pass its thresholds."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    loop_lag_samples: int = Field(0, ge=0, description="Wake-ups of the event-loop probe")
    loop_lag_p50_ms: float | None = Field(None, description="Median lateness of a timer on the event loop, ms")
    loop_lag_p99_ms: float | None = Field(None, description="99th percentile of the probe's lateness, ms")
    loop_lag_max_ms: float | None = Field(None, description="Worst lateness of the probe, ms")
    sends_scheduled: int = Field(0, ge=0, description="Requests sent against a schedule (request rate, trace)")
    send_late_p99_ms: float | None = Field(None, description="99th percentile of send time minus schedule, ms")
    sends_late_share: float | None = Field(
        None, description=f"Share of scheduled sends more than {SEND_LATE_MS:g} ms behind their schedule"
    )


class JobFinished(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.job.finished/1"
    SUBJECT: ClassVar[str] = "kvbench.job.{job_id}.finished"
    job_id: str
    run_id: str
    workload: str
    shard: str
    records: int = Field(description="Records this shard published for the job")
    load_duration_s: float = Field(description="Load end, seconds after load start")
    warmup_s: float
    offered_load: float = Field(description="Users (closed loop) or requests/s asked for")
    tokenizer: str = Field(description="How prompt token counts were produced")
    shard_index: int = Field(0, description="Which shard of the job this was")
    shards: int = Field(1, description="How many shards the job had")
    skipped_arrivals: int = Field(0, description="Rate mode: arrivals that found no session to send")
    replay_lag_p99_s: float | None = Field(None, description="Trace mode: p99 of actual minus scheduled send time")
    notes: list[str] = Field(default_factory=list, description="What the load generator wants the report to say")
    time_scale: float = Field(1.0, gt=0, description="Engine seconds per wall-clock second of the job's records")
    client_timing: ClientTiming | None = Field(None, description="The load generator's own lag during the job")
    prefix_cache_reset: dict[str, int] = Field(
        default_factory=dict,
        description="Engines whose local prefix cache it emptied before the load (RunLoad.reset_prefix_cache): "
        "engine id -> HTTP status of the engine's reset route (RunLoad.reset_route; 0: no answer)",
    )
    answers: dict[str, str] = Field(
        default_factory=dict,
        description="With RunLoad.keep_answers: each completed request's place in the schedule (session/turn) -> "
        "the SHA-256 of its answer's text (16 hex digits)",
    )


class JobFailed(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.job.failed/1"
    SUBJECT: ClassVar[str] = "kvbench.job.{job_id}.failed"
    job_id: str
    run_id: str
    reason: str
    shard_index: int = Field(0, description="Which shard of the job failed")


class RecordsBatch(Envelope):
    SCHEMA: ClassVar[str] = "kvbench.records.batch/1"
    SUBJECT: ClassVar[str] = "kvbench.records.{run_id}.{job_id}"
    run_id: str
    job_id: str
    shard: str
    records: list[RequestRecord]


def _pack(kind: ChunkKind, values: list[float] | list[int]) -> str:
    return base64.b64encode(pack_chunks(kind, values)).decode()


def _unpack(kind: ChunkKind, text: str) -> list[Any]:
    return unpack_chunks(kind, base64.b64decode(text))


def _flat_chunks(records: list[RequestRecord]) -> tuple[list[int], list[float], list[int]]:
    """Every record's chunk times and token counts end to end, and where each record's begin (one more offset than
    records). Token counts that do not match the times (a producer that left them out) count one a chunk."""
    offsets = [0]
    times: list[float] = []
    tokens: list[int] = []
    for r in records:
        times.extend(r.chunk_times_s)
        tokens.extend(r.chunk_tokens if len(r.chunk_tokens) == len(r.chunk_times_s) else [1] * len(r.chunk_times_s))
        offsets.append(len(times))
    return offsets, times, tokens


class _RecordColumns(Envelope):
    """The per-request columns both packed forms carry (no schema of its own: never sent as itself)."""

    run_id: str
    job_id: str
    shard: str
    request_id: list[str]
    workload: list[str]
    session_id: list[str | None]
    turn: list[int | None]
    start_s: list[float]
    ttft_s: list[float | None]
    e2e_s: list[float | None]
    prompt_tokens: list[int]
    output_tokens: list[int]
    cached_tokens: list[int | None]
    ok: list[bool]
    error: list[str | None]
    # empty from a producer older than the field: every request's connect time unknown
    connect_s: list[float | None] = Field(default_factory=list, description="per request; null: connection reused")

    @classmethod
    def _packed(
        cls, run_id: str, job_id: str, shard: str, records: list[RequestRecord], encode: Callable[[ChunkKind, Any], Any]
    ) -> Self:
        """The batch: scalar columns, and the chunk arrays flattened with each request's offsets, each array as
        ``encode`` writes it (base64 text or raw bytes, by form)."""
        offsets, times, tokens = _flat_chunks(records)
        return cls.model_validate(
            {
                "run_id": run_id,
                "job_id": job_id,
                "shard": shard,
                **{name: [getattr(r, name) for r in records] for name in _SCALAR_COLUMNS},
                "chunk_offsets": encode(OFFSETS_TYPECODE, offsets),
                "chunk_times": encode(TIMES_TYPECODE, times),
                "chunk_tokens": encode(COUNTS_TYPECODE, tokens),
            }
        )

    def _records(self, offsets: list[int], times: list[float], tokens: list[int]) -> list[RequestRecord]:
        connect = self.connect_s or [None] * len(self.request_id)
        return [
            RequestRecord(
                request_id=self.request_id[i],
                job_id=self.job_id,
                workload=self.workload[i],
                session_id=self.session_id[i],
                turn=self.turn[i],
                start_s=self.start_s[i],
                ttft_s=self.ttft_s[i],
                e2e_s=self.e2e_s[i],
                chunk_times_s=times[offsets[i] : offsets[i + 1]],
                chunk_tokens=tokens[offsets[i] : offsets[i + 1]],
                prompt_tokens=self.prompt_tokens[i],
                output_tokens=self.output_tokens[i],
                cached_tokens=self.cached_tokens[i],
                ok=self.ok[i],
                error=self.error[i],
                shard=self.shard,
                connect_s=connect[i],
            )
            for i in range(len(self.request_id))
        ]


_SCALAR_COLUMNS = tuple(c for c in _RecordColumns.model_fields if c not in ("run_id", "job_id", "shard")
                        and c not in Envelope.model_fields)  # fmt: skip


class RecordsPacked(_RecordColumns):
    """Per-request records as columns, on the same subject as RecordsBatch: scalars as lists, chunk arrays packed
    (base64 of little-endian float64 times and int32 tokens, with int64 offsets per request). A consumer stores
    500 records without parsing 500 JSON objects. The load generator sent this form until RecordsBinary; the
    reporter still reads it."""

    SCHEMA: ClassVar[str] = "kvbench.records.packed/1"
    SUBJECT: ClassVar[str] = "kvbench.records.{run_id}.{job_id}"
    chunk_offsets: str = Field(description="base64, int64 little-endian, len(request_id) + 1 values")
    chunk_times: str = Field(description="base64, float64 little-endian, seconds after each request's start")
    chunk_tokens: str = Field(description="base64, int32 little-endian, aligned with chunk_times")

    @classmethod
    def from_records(cls, run_id: str, job_id: str, shard: str, records: list[RequestRecord]) -> RecordsPacked:
        return cls._packed(run_id, job_id, shard, records, _pack)

    def to_records(self) -> list[RequestRecord]:
        return self._records(
            _unpack(OFFSETS_TYPECODE, self.chunk_offsets),
            _unpack(TIMES_TYPECODE, self.chunk_times),
            _unpack(COUNTS_TYPECODE, self.chunk_tokens),
        )


class RecordsBinary(_RecordColumns):
    """RecordsPacked's columns with the chunk arrays as raw bytes (what the load generator sends): the body is this
    model's JSON on one line (no array in it), a newline, then the arrays back to back (int64 offsets, float64
    times, int32 tokens, little-endian) of the byte lengths its ``binary`` field gives. A consumer parses a few
    kilobytes of JSON and slices the rest: no base64 on either side (decoding it cost more than the rest of
    ingestion together)."""

    SCHEMA: ClassVar[str] = "kvbench.records.packed/2"
    SUBJECT: ClassVar[str] = "kvbench.records.{run_id}.{job_id}"
    chunk_offsets: bytes = Field(default=b"", exclude=True, description="int64 LE, len(request_id) + 1 values")
    chunk_times: bytes = Field(default=b"", exclude=True, description="float64 LE, seconds after each start")
    chunk_tokens: bytes = Field(default=b"", exclude=True, description="int32 LE, aligned with chunk_times")

    @classmethod
    def from_records(cls, run_id: str, job_id: str, shard: str, records: list[RequestRecord]) -> RecordsBinary:
        return cls._packed(run_id, job_id, shard, records, pack_chunks)

    def to_bytes(self) -> bytes:
        lengths = [len(self.chunk_offsets), len(self.chunk_times), len(self.chunk_tokens)]
        head = self.model_dump_json(by_alias=True).encode()  # compact: no newline inside
        return b"".join((head[:-1], b',"binary":', json.dumps(lengths).encode(), b"}\n", self.chunk_offsets,
                         self.chunk_times, self.chunk_tokens))  # fmt: skip

    @classmethod
    def from_bytes(cls, body: bytes) -> RecordsBinary:
        """The message from its body; raises ValueError when it is not one (the arrays do not match the head)."""
        head, offsets, times, tokens = split_binary_records(body)
        return cls.model_validate({**head, "chunk_offsets": offsets, "chunk_times": times, "chunk_tokens": tokens})

    def to_records(self) -> list[RequestRecord]:
        return self._records(
            list(map(int, unpack_chunks(OFFSETS_TYPECODE, self.chunk_offsets))),
            list(map(float, unpack_chunks(TIMES_TYPECODE, self.chunk_times))),
            list(map(int, unpack_chunks(COUNTS_TYPECODE, self.chunk_tokens))),
        )


class RecordsColumnar(Envelope):
    """Per-request records with every column a little-endian machine array (what the load generator sends): the
    body is this model's JSON on one line (ids, the record count, and each array's name and byte length in order),
    a newline, then the arrays back to back. The arrays are records.SCALAR_KINDS' columns (with their ``.offsets``
    and ``.valid`` arrays) and the chunk arrays as RecordsBinary has them (``chunk_offsets``, ``chunk_times``,
    ``chunk_tokens``). A consumer parses a few hundred bytes of JSON and wraps the rest (issue 18: parsing and
    converting JSON lists of values was the reporter's largest cost a record). A consumer skips arrays it does not
    know and takes a nullable column that is absent as all null."""

    SCHEMA: ClassVar[str] = "kvbench.records.packed/3"
    SUBJECT: ClassVar[str] = "kvbench.records.{run_id}.{job_id}"
    run_id: str
    job_id: str
    shard: str
    count: int = Field(ge=0, description="records in the batch")
    arrays: dict[str, bytes] = Field(default_factory=dict, exclude=True, description="by name; sent after the head")

    @classmethod
    def from_records(cls, run_id: str, job_id: str, shard: str, records: list[RequestRecord]) -> RecordsColumnar:
        arrays = encode_scalar_columns({name: [getattr(r, name) for r in records] for name in SCALAR_KINDS})
        offsets, times, tokens = _flat_chunks(records)
        arrays["chunk_offsets"] = pack_chunks(OFFSETS_TYPECODE, offsets)
        arrays["chunk_times"] = pack_chunks(TIMES_TYPECODE, times)
        arrays["chunk_tokens"] = pack_chunks(COUNTS_TYPECODE, tokens)
        return cls(run_id=run_id, job_id=job_id, shard=shard, count=len(records), arrays=arrays)

    def to_bytes(self) -> bytes:
        head = self.model_dump_json(by_alias=True).encode()  # compact: no newline inside
        layout = json.dumps([[name, len(data)] for name, data in self.arrays.items()]).encode()
        return b"".join((head[:-1], b',"binary":', layout, b"}\n", *self.arrays.values()))

    @classmethod
    def from_bytes(cls, body: bytes) -> RecordsColumnar:
        """The message from its body; raises ValueError when it is not one (the arrays do not match the head)."""
        head, arrays = split_columnar_records(body)
        return cls.model_validate({**head, "arrays": {name: bytes(view) for name, view in arrays.items()}})

    def to_records(self) -> list[RequestRecord]:
        columns = decode_scalar_columns(self.arrays, self.count)
        offsets = unpack_chunks(OFFSETS_TYPECODE, self.arrays.get("chunk_offsets", b""))
        times = unpack_chunks(TIMES_TYPECODE, self.arrays.get("chunk_times", b""))
        tokens = unpack_chunks(COUNTS_TYPECODE, self.arrays.get("chunk_tokens", b""))
        if len(offsets) != self.count + 1:
            raise ValueError(f"{len(offsets) - 1} chunk offsets for {self.count} records")
        return [
            RequestRecord.model_validate(
                {
                    **{name: values[i] for name, values in columns.items()},
                    "job_id": self.job_id,
                    "shard": self.shard,
                    "chunk_times_s": times[int(offsets[i]) : int(offsets[i + 1])],
                    "chunk_tokens": tokens[int(offsets[i]) : int(offsets[i + 1])],
                }
            )
            for i in range(self.count)
        ]


def split_columnar_records(body: bytes, loads: Any = json.loads) -> tuple[dict[str, Any], dict[str, memoryview]]:
    """A RecordsColumnar body as (its JSON head, its arrays by name), each array a view of the body (no copy);
    ``loads``: a faster JSON parser where one is at hand. Raises ValueError when the arrays do not add up to the
    body's length or a name repeats."""
    cut = body.find(b"\n")
    if cut < 0:
        raise ValueError("columnar records: no head line")
    head = loads(body[:cut])
    layout = head.get("binary") if isinstance(head, dict) else None
    if not isinstance(layout, list):
        raise ValueError("columnar records: no array layout in the head")  # noqa: TRY004  # a bad message, not a bad call
    arrays: dict[str, memoryview] = {}
    rest, at = memoryview(body), cut + 1
    for entry in layout:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], int)
                and entry[1] >= 0):  # fmt: skip
            raise ValueError(f"columnar records: a layout entry is not [name, bytes]: {entry!r}")
        name, size = entry
        if name in arrays:
            raise ValueError(f"columnar records: the array {name} comes twice")
        arrays[name] = rest[at : at + size]
        at += size
    if at != len(body):
        raise ValueError("columnar records: the arrays do not match the lengths in the head")
    return head, arrays


def split_binary_records(body: bytes, loads: Any = json.loads) -> tuple[dict[str, Any], bytes, bytes, bytes]:
    """A RecordsBinary body as (its JSON head, the offsets', times' and tokens' bytes); ``loads``: a faster JSON
    parser where one is at hand (the reporter's orjson). Raises ValueError when the arrays do not match the head's
    lengths."""
    cut = body.find(b"\n")
    if cut < 0:
        raise ValueError("binary records: no head line")
    head = loads(body[:cut])
    sizes = head.get("binary") if isinstance(head, dict) else None
    rest = body[cut + 1 :]
    if not isinstance(sizes, list) or len(sizes) != 3 or sum(sizes) != len(rest):
        raise ValueError("binary records: the arrays do not match the lengths in the head")
    a, b = sizes[0], sizes[0] + sizes[1]
    return head, rest[:a], rest[a:b], rest[b:]


# what a sampled process is in its stack: an engine (both, prefill, decode), its router, or a cache server beside them
# kv_transfer: an engine's own KV transfer agent, read on its own endpoint (NIXL's telemetry exporter)
SampledRole = Literal["both", "prefill", "decode", "router", "cache_server", "kv_transfer"]


class EngineSampled(Envelope):
    """Raw counter values of one engine's /metrics at one instant (the reporter differences them)."""

    SCHEMA: ClassVar[str] = "kvbench.engine.sampled/1"
    SUBJECT: ClassVar[str] = "kvbench.engine.{node_id}.sampled"
    node_id: str
    run_id: str
    engine_id: str
    job_id: str | None = None
    role: SampledRole = Field(
        "both",
        description="The engine's part in its stack (a split stack's prefill or decode engines, its router), or a "
        "cache server beside the engines (an LMCache server, a Mooncake master) whose own counters are read too",
    )
    values: dict[str, float] = Field(description="Series name (with labels) -> value")
    normalized: dict[str, float] = Field(default_factory=dict, description="kvbench's engine-neutral counters")
    edge: WindowEdge | None = Field(
        None, description="A read on command at the edge of job_id's measured window (None: a periodic scrape)"
    )
    edge_at: float | None = Field(None, description="When that edge was, on the load generator (Unix seconds)")
    gpus: list[dict[str, float]] = Field(default_factory=list, description="GPU power and utilization, when sampled")
