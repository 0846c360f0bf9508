"""The plan, version 1 (PLAN.md). Users write these files, so names are a public interface.

Every plan model forbids unknown keys: a misspelled key must fail loudly, never be dropped and run
half-configured. ``defaults`` is deep-merged under each workload before the workload is validated.
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvbench_contracts.problem import Problem
from kvbench_contracts.search import Search

__all__ = [
    "ACCEPTANCE_PHASES",
    "AcceptancePhase",
    "Arrivals",
    "CacheStart",
    "ClusterRef",
    "DocumentsSpec",
    "EngineSpec",
    "JobPoint",
    "Measurement",
    "NetworkSpec",
    "Plan",
    "SimCluster",
    "Sizing",
    "Slo",
    "SyntheticSpec",
    "TraceSpec",
    "Traffic",
    "Workload",
    "acceptance_plan",
    "deep_merge",
]

EngineName = Literal["vllm", "sglang", "trtllm"]
KvTier = Literal["gpu", "cpu_ram", "nvme"]
Strategy = Literal["own_cache", "spill", "shared_pool", "split", "split_offload"]
Orchestrator = Literal["bare_metal", "dynamo", "llm-d", "production-stack"]
Shape = Literal[
    "agentic_replay",
    "synthetic_sessions",
    "shared_prompt",
    "per_user_history",
    "trace_replay",
    "document_reuse",
]
Routing = Literal["round_robin", "session_affinity", "prefix_aware", "pd_aware"]
CacheState = Literal["empty", "warm"]
MAX_JOB_S = 7 * 86400  # one job's load: a week is far past any benchmark
CacheStart = Literal["fresh", "restarted", "warm"]  # what a job finds: see Workload.cache_start
# `kvbench accept`: the same requests on a cold stack, again on its warm caches, again after the engines' local prefix
# cache was emptied (only the external tier can serve them), and again after the whole stack restarted (only a disk
# tier survives that). One job each, in this order, all with the same requests (one seed).
AcceptancePhase = Literal["cold", "warm", "reset", "restart"]
ACCEPTANCE_PHASES: tuple[AcceptancePhase, ...] = ("cold", "warm", "reset", "restart")


class JobPoint(NamedTuple):
    """One job of a workload: a load level and a repeat of it."""

    load_level: float
    repeat: int


AGENTIC_DEFAULT_LOAD_DURATION_S = 1200


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (``Sizing``, or ``SimCluster | None``'s), None for a plain value."""
    candidates = [annotation, *getattr(annotation, "__args__", ())]
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


class StrictModel(BaseModel):
    """Plan models refuse unknown keys (a typo must fail) and are immutable once parsed."""

    # no infinities or NaN (a rate of inf hung a job, a duration of inf was a 500), and no unbounded strings
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, str_max_length=4096)


FLAG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
# variables kvbench sets itself on an engine (its GPUs, its hashing seed, the sealed token): a plan never overrides them
RESERVED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "PYTHONHASHSEED", "HF_TOKEN", "PATH",
                          "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH"})  # fmt: skip
MAX_ENGINE_ARGS_BYTES = 8192  # engine flags pass through to the engine's command line: a few hundred bytes in practice

# paths a plan may never point kvbench at: the machine's own configuration, secrets and kernel interfaces
FORBIDDEN_PATHS = ("/etc", "/proc", "/sys", "/dev", "/boot", "/root", "/run", "/var/run", "/var/lib/kvbench/agent")
# a RAM-backed directory is a fair disk tier to test with (a place the plan names, not one kvbench creates)
ALLOWED_UNDER_FORBIDDEN = ("/dev/shm",)  # noqa: S108


def path_problem(path: str, *, absolute: bool) -> str | None:
    """Why a plan may not use ``path`` (None when it may): no parent-directory steps, nothing under the system's
    own directories, and absolute where the engines on every machine must find the same place."""
    if "\x00" in path:
        return "holds a NUL character"
    parts = PurePosixPath(path).parts
    if ".." in parts:
        return "steps out with '..'; give the directory itself"
    if absolute and not path.startswith("/"):
        return "is relative; give an absolute path, the same on every machine"
    normal = "/" + "/".join(p for p in parts if p not in ("/", "."))
    if normal.startswith("/var/lib/kvbench/pg-"):  # the control plane's kept databases
        return "is a kvbench database's directory; use a data directory"
    if any(normal == a or normal.startswith(a + "/") for a in ALLOWED_UNDER_FORBIDDEN):
        return None
    for forbidden in FORBIDDEN_PATHS:
        if normal == forbidden or normal.startswith(forbidden + "/"):
            return f"is under {forbidden}, which kvbench never reads or writes; use a data directory"
    return None


def _checked_path(value: str | None, field: str, *, absolute: bool) -> str | None:
    if value is not None and (problem := path_problem(value, absolute=absolute)):
        raise ValueError(f"{field} {problem}")
    return value


class EngineSpec(StrictModel):
    name: EngineName = Field("vllm", description="Serving engine: vllm, sglang or trtllm (NVIDIA only)")
    version: str | None = Field(None, description="Engine version or container image; null = the validated default")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs per engine (tensor parallel size)")
    args: dict[str, Any] = Field(default_factory=dict, description="Extra engine arguments, passed through verbatim")
    cache_server_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra arguments of the stack's cache server (`lmcache server`), passed through verbatim; only "
        "for stacks that start one, and not the flags kvbench sets from the plan (ports, chunk size, tiers)",
    )

    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables for the engine processes (e.g. VLLM_USE_FLASHINFER_SAMPLER: '0'); each "
        "machine runs only the names its operator allows (KVBENCH_NODE_AGENT_ALLOWED_ENV=<glob>[,<glob>...])",
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not ENV_NAME.match(name):
                raise ValueError(f"engine.env: {name[:40]!r} is not a variable name (capitals, digits and '_')")
            if name in RESERVED_ENV:
                raise ValueError(f"engine.env: {name} is set by kvbench itself (or by the machine); leave it out")
        size = len(json.dumps(value))
        if size > MAX_ENGINE_ARGS_BYTES:
            raise ValueError(f"engine.env: {size:,} bytes of variables; at most {MAX_ENGINE_ARGS_BYTES:,}")
        return value

    @field_validator("args", "cache_server_args")
    @classmethod
    def _bounded_args(cls, value: dict[str, Any], info: Any) -> dict[str, Any]:
        where = f"engine.{info.field_name}"
        for key in value:
            if not FLAG_NAME.match(key):
                raise ValueError(f"{where}: {key[:40]!r} is not a flag name (letters, digits, '-' and '_')")
        size = len(json.dumps(value, default=str))
        if size > MAX_ENGINE_ARGS_BYTES:
            raise ValueError(f"{where}: {size:,} bytes of arguments; at most {MAX_ENGINE_ARGS_BYTES:,}")
        return value


class SimCluster(StrictModel):
    machines: int = Field(2, ge=1, le=64, description="Number of simulated machines")
    gpu: str = Field("L40S", description="GPU model of every machine (L40S, H100, H200, MI300X, GB10)")
    gpus_per_machine: int = Field(1, ge=1, le=16, description="GPUs on each simulated machine")
    host_memory_gb: float = Field(256, gt=0, description="RAM of each simulated machine, GB")
    nic_gbps: float = Field(200, gt=0, description="Network card speed of each machine, Gb/s")
    rdma: bool = Field(True, description="Whether the machines have active RDMA cards")
    disk_gbps: float = Field(6, gt=0, description="Local disk bandwidth, GB/s")
    speed: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="Simulated engines run this many times faster than real time (reports stay in engine seconds); "
        "unset: the planner's default (`kvbench up --sim-speed`), else 1",
    )


class ClusterRef(StrictModel):
    group: str | None = Field(None, description="Name of a registered cluster group")
    sim: SimCluster | None = Field(None, description="A simulated cluster description (runs anywhere)")

    @model_validator(mode="after")
    def _one_of(self) -> ClusterRef:
        if (self.group is None) == (self.sim is None):
            raise ValueError("cluster needs exactly one of 'group' (a registered cluster group) or 'sim'")
        return self


class NetworkSpec(StrictModel):
    transfer_backend: str = Field("auto", description="KV transfer backend; auto picks the stack's default")
    rdma_device: str | None = Field(None, description="RDMA card the pool uses, on machines with several")


class Sizing(StrictModel):
    gpus_per_machine: int | None = Field(None, ge=1, description="GPUs each machine gives the pool; null = every GPU")
    host_memory_gb: float | None = Field(None, gt=0, description="RAM per machine for offloaded KV, GB")
    shared_store_gb: float | None = Field(None, gt=0, description="Size of the shared Valkey/Mooncake store, GB")
    disk_tier_gb: float | None = Field(None, gt=0, description="Local disk tier size per machine, GB")
    disk_tier_path: str | None = Field(None, description="Disk tier path, the same on every machine")
    disk_tier_direct_io: bool = Field(
        True,
        description="LMCache's disk tier opens its files with O_DIRECT, so its reads measure the disk and not the "
        "page cache; false where the filesystem refuses it (LMCache 0.5.1 then fails every write silently: the "
        "report flags a tier that stored nothing)",
    )
    shared_mount_path: str | None = Field(None, description="Shared filesystem mount path for a shared file tier")
    engines_per_cache_server: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Stacks with an LMCache server: engines sharing one server, grouped in placement order across "
        "machines (null: one server per machine, shared by the engines there; 1: a server per engine)",
    )
    prefill_machines: int | None = Field(None, ge=1, description="Split stacks: machines that run prefill")
    prefill_gpus: int | None = Field(None, ge=1, description="Split stacks: GPUs that run prefill")

    @field_validator("disk_tier_path", "shared_mount_path")
    @classmethod
    def _engine_paths(cls, value: str | None, info: Any) -> str | None:
        return _checked_path(value, f"sizing.{info.field_name}", absolute=True)


class SyntheticSpec(StrictModel):
    prefix_tokens: int = Field(1024, ge=0, description="Shared prefix length per group, tokens")
    groups: int = Field(4, ge=1, description="Number of groups, each with its own shared prefix")
    users_per_group: int = Field(4, ge=1, description="Users in each group")
    turns: int = Field(4, ge=1, description="Turns per session; history is resent on each turn")
    input_tokens: int = Field(128, ge=1, description="New input tokens per turn")
    output_tokens: int = Field(64, ge=1, description="Output tokens per turn")
    think_time_s: float = Field(0.0, ge=0, description="Pause between a response and the user's next turn, s")


class TraceSpec(StrictModel):
    format: Literal["mooncake", "azure", "servegen"] = Field(description="Trace file format")
    path: str = Field(description="Path of the trace file")
    time_scale: float = Field(1.0, gt=0, description="Multiply trace inter-arrival gaps by this factor")
    jitter: bool = Field(False, description="Spread requests that share a timestamp evenly until the next one")

    @field_validator("path")
    @classmethod
    def _trace_path(cls, value: str) -> str:
        return _checked_path(value, "traffic.trace.path", absolute=False) or value

    block_tokens: int = Field(512, ge=1, description="Tokens per hash id (Mooncake: 512)")


class DocumentsSpec(StrictModel):
    count: int = Field(ge=1, description="Distinct documents")
    tokens: int = Field(ge=1, description="Tokens per document")
    question_tokens: int = Field(16, ge=0, description="Question tokens appended to each visit")
    output_tokens: int = Field(16, ge=1, description="Output tokens per visit")
    rounds: int = Field(2, ge=1, description="Times each document is visited")
    order: Literal["tile", "interleave", "random"] = Field("tile", description="Visit order within a round")
    measure_rounds: list[int] = Field(default_factory=lambda: [2], description="Rounds that are measured (from 1)")


class Arrivals(StrictModel):
    mode: Literal["closed_loop", "request_rate", "trace"] = Field(
        "closed_loop", description="Closed loop users, a request rate, or the trace's own timestamps"
    )
    users: list[Annotated[int, Field(gt=0, le=100_000)]] | None = Field(
        None, max_length=64, description="closed_loop: concurrent users per load level (at most 100,000)"
    )
    rates: list[Annotated[float, Field(gt=0, le=100_000)]] | None = Field(
        None, max_length=64, description="request_rate: requests/s per load level (at most 100,000)"
    )
    distribution: Literal["poisson", "gamma"] = Field("poisson", description="request_rate: inter-arrival distribution")
    burstiness: float = Field(1.0, gt=0, description="Gamma shape; 1.0 = Poisson, lower = burstier")
    max_concurrency: int | None = Field(None, ge=1, description="Cap on requests in flight")
    gaps: Literal["recorded", "none"] = Field(
        "recorded", description="Think times, pre_gap and delay: wait them (recorded) or send at once (none)"
    )

    @model_validator(mode="after")
    def _levels(self) -> Arrivals:
        if self.mode == "closed_loop" and self.rates is not None:
            raise ValueError("'rates' is for mode request_rate; closed_loop uses 'users'")
        if self.mode == "request_rate" and self.users is not None:
            raise ValueError("'users' is for mode closed_loop; request_rate uses 'rates'")
        if self.mode == "trace" and (self.users is not None or self.rates is not None):
            raise ValueError("mode trace sends at the trace's timestamps: remove 'users' and 'rates'")
        return self

    def load_levels(self) -> list[float]:
        if self.mode == "trace":
            return [1.0]  # one test point: the trace as scheduled (time_scale sets its speed)
        if self.mode == "closed_loop":
            return [float(u) for u in (self.users or [16])]
        return list(self.rates or [2.0])


class Traffic(StrictModel):
    shape: Shape = Field("agentic_replay", description="What the pool serves")
    dataset: str | None = Field(None, description="agentic_replay only: dataset name or path (default sammshen)")
    synthetic: SyntheticSpec | None = Field(None, description="synthetic_sessions / shared_prompt / per_user_history")
    trace: TraceSpec | None = Field(None, description="trace_replay: the trace to replay")
    documents: DocumentsSpec | None = Field(None, description="document_reuse: the documents and rounds")
    arrivals: Arrivals = Field(default_factory=Arrivals, description="Arrival process and load levels")
    duration_s: float | None = Field(
        None, gt=0, le=MAX_JOB_S, description="Bound for each job of non-agentic shapes, s (at most 7 days)"
    )

    @field_validator("dataset")
    @classmethod
    def _dataset_path(cls, value: str | None) -> str | None:
        return _checked_path(value, "traffic.dataset", absolute=False)

    @model_validator(mode="after")
    def _trace_arrivals(self) -> Traffic:
        # a trace brings its own arrival times: they drive it unless the plan chose another arrival mode
        if self.shape == "trace_replay" and "arrivals" not in self.model_fields_set:
            object.__setattr__(self, "arrivals", Arrivals(mode="trace"))
        if self.arrivals.mode == "trace" and self.shape != "trace_replay":
            raise ValueError("arrivals mode 'trace' needs shape trace_replay (other shapes have no timestamps)")
        return self


class Slo(StrictModel):
    ttft_ms: float | None = Field(None, gt=0, description="Time to first token limit, ms")
    tpot_ms: float | None = Field(None, gt=0, description="Time per output token limit, ms")
    e2e_ms: float | None = Field(None, gt=0, description="End-to-end latency limit, ms")


class Measurement(StrictModel):
    repeats: int = Field(3, ge=1, le=100, description="Repeats per test point; fewer than 3 is preliminary")
    load_duration_s: float | None = Field(
        None, description="agentic_replay only: how long users keep sending (120..14400; default 1200)"
    )
    warmup_s: float = Field(300, description="Seconds discarded from the start of the load (0..3600)")
    working_set_ratio: float | None = Field(None, gt=0, description="> 1: conversations larger than GPU KV memory")
    routing: Routing = Field("round_robin", description="How the router spreads requests over engines")
    cache_state: CacheState = Field("empty", description="Cache state before each test point")
    slo: Slo = Field(default_factory=Slo, description="Latency targets for goodput")
    accuracy_gate: bool = Field(
        False,
        description="Keep a digest of every answer (greedy decoding; up to 10,000 a job) and compare each workload's "
        "with the baseline workload's to the same requests: identical for a dense model, up to 10% differing for a "
        "hybrid one; a workload beyond that is invalid, its differing requests named",
    )
    acceptance: bool = Field(
        False,
        description="The store-and-reload acceptance test (kvbench accept): one job per phase (cold, warm, reset, "
        "restart) of the same requests at the first load level",
    )


class Workload(StrictModel):
    """One compared configuration: ``defaults`` deep-merged with the workload's own keys."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=63, description="Workload name, unique in the plan")
    strategy: Strategy = Field(description="How machines share KV cache")
    stack: str = Field(description="Stack id from the catalog")
    model: str = Field("Qwen/Qwen3-8B", description="Hugging Face model id")
    hf_token_secret: str | None = Field(None, description="Name of a stored secret holding the HF token")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="Serving engine settings")
    kv_tier: KvTier = Field("gpu", description="KV Cache Storage Tier: gpu, cpu_ram or nvme")
    cluster: ClusterRef = Field(description="Step 1: the machines")
    orchestrator: Orchestrator = Field("bare_metal", description="Step 3: bare_metal (others are locked)")
    network: NetworkSpec = Field(default_factory=NetworkSpec, description="Step 3: network and transfer backend")
    sizing: Sizing = Field(default_factory=Sizing, description="Step 4: resources each machine gives the pool")
    traffic: Traffic = Field(default_factory=Traffic, description="Step 5: what the pool serves")
    measurement: Measurement = Field(default_factory=Measurement, description="Step 6: how to measure")

    def effective_load_duration_s(self) -> float:
        """Seconds of load per job; 0 means one session per user (the job ends when they are done)."""
        if self.traffic.shape == "agentic_replay":
            if self.measurement.load_duration_s is None and "load_duration_s" in self.measurement.model_fields_set:
                return 0.0  # an explicit null: one session per user
            return self.measurement.load_duration_s or AGENTIC_DEFAULT_LOAD_DURATION_S
        return self.traffic.duration_s or 0.0

    def effective_warmup_s(self) -> float:
        """The warm-up applies to agentic replay; other shapes are measured over the whole run unless the plan
        sets a warm-up for them explicitly (the guide's "Warm-up" and "Load duration")."""
        if self.traffic.shape == "agentic_replay" or "warmup_s" in self.measurement.model_fields_set:
            return self.measurement.warmup_s
        return 0.0

    def with_values(self, values: dict[str, Any]) -> Workload:
        """This workload with each plan path (``sizing.host_memory_gb``) set to its value, validated again (a value a
        field does not take raises pydantic's ValidationError; a path the workload does not have, KeyError). A load
        path (``traffic.arrivals.rates`` or ``users``) takes one value: that load level alone."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        for path, value in values.items():
            *parents, leaf = path.split(".")
            node = data
            model: type[BaseModel] = type(self)
            for part in parents:
                field = model.model_fields.get(part)
                annotation = _model_of(field.annotation) if field is not None else None
                if annotation is None:
                    raise KeyError(path)
                model = annotation
                node = node.setdefault(part, {})
            if leaf not in model.model_fields:
                raise KeyError(path)
            # a load path takes one value: that load level alone (users are whole)
            node[leaf] = (
                [round(value)] if path == "traffic.arrivals.users" else [value] if path.endswith("rates") else value
            )
        return type(self).model_validate(data)

    def job_grid(self) -> list[JobPoint]:
        """The workload's jobs in run order: each load level, its repeats innermost; an acceptance test's phases at
        the first level (the repeat numbers the phase)."""
        levels = self.traffic.arrivals.load_levels()
        if self.measurement.acceptance:
            return [JobPoint(levels[0], phase) for phase in range(len(ACCEPTANCE_PHASES))]
        return [JobPoint(level, repeat) for level in levels for repeat in range(self.measurement.repeats)]

    def acceptance_phase(self, job_index: int) -> AcceptancePhase | None:
        return ACCEPTANCE_PHASES[job_index] if self.measurement.acceptance else None

    def job_seed(self, point: JobPoint) -> int:
        """The seed of a job's requests: its repeat, except in an acceptance test, whose phases send the same."""
        return 0 if self.measurement.acceptance else point.repeat

    def cache_start(self, job_index: int) -> CacheStart:
        """How the job at ``job_index`` of the workload's run finds its caches: the first on a freshly started
        stack; each later one on a restarted stack (``cache_state: empty``) or on the caches the one before left
        (``warm``). An acceptance test restarts the stack for its restart phase only."""
        if job_index == 0:
            return "fresh"
        if self.measurement.acceptance:
            return "restarted" if ACCEPTANCE_PHASES[job_index] == "restart" else "warm"
        return "restarted" if self.measurement.cache_state == "empty" else "warm"


def acceptance_plan(data: object, workload: str | None) -> tuple[dict[str, Any] | None, Problem | None]:
    """A plan document (parsed, not yet validated) made the acceptance test of one of its workloads: that workload
    alone, ``measurement.acceptance`` on, one repeat (the phases are the jobs). ``workload``: its name; may be left
    out when the plan has one. The result is reviewed like any plan."""
    workloads = data.get("workloads") if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or not isinstance(workloads, list)
        or not workloads
        or not all(isinstance(w, dict) for w in workloads)
    ):
        return None, Problem(code="invalid_field", field="workloads", message="The plan has no workloads to accept",
                             fix="Give the plan the workload to test.")  # fmt: skip
    names = [str(w.get("name")) for w in workloads]
    if workload is None and len(workloads) > 1:
        return None, Problem(
            code="missing_field",
            field="workload",
            message=f"The plan has {len(workloads)} workloads ({', '.join(names)}); the acceptance test runs one",
            fix="Name it: kvbench accept PLAN --workload NAME (POST /v1/accept?workload=NAME).",
        )
    if workload is not None and workload not in names:
        return None, Problem(code="invalid_field", field="workload", message=f"The plan has no workload {workload!r}",
                             fix=f"Choose one of {', '.join(names)}.")  # fmt: skip
    chosen = dict(workloads[names.index(workload) if workload is not None else 0])
    measurement = chosen.get("measurement")
    chosen["measurement"] = {**(measurement if isinstance(measurement, dict) else {}), "acceptance": True, "repeats": 1}
    assert isinstance(data, dict)
    plan = {k: v for k, v in data.items() if k != "baseline"}  # the baseline named another workload
    plan["name"] = f"{str(data.get('name') or 'plan')[:50]}-accept"
    plan["workloads"] = [chosen]
    return plan, None


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` wins; nested mappings merge key by key; lists and scalars are replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class Plan(StrictModel):
    version: Literal[1] = Field(1, description="Plan format version")
    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9-]*$", max_length=63, description="Plan name: lowercase letters, digits, dashes"
    )
    defaults: dict[str, Any] = Field(default_factory=dict, description="Deep-merged under every workload")
    workloads: list[Workload] = Field(min_length=1, description="The compared workloads")
    baseline: str | None = Field(
        None,
        max_length=63,
        description="The workload every other is compared with in the report (default: the first own_cache one)",
    )
    search: Search | None = Field(
        None,
        description="A question instead of a grid: the values of some fields, and the load, that meet an SLO, and "
        "the best of them (kvbench sim search answers it on the simulator)",
    )
    when_busy: Literal["queue", "refuse"] = Field(
        "queue",
        description="When another run holds the machines it needs: wait for them (state queued), or refuse the "
        "run at once (409 machines_busy)",
    )

    @model_validator(mode="before")
    @classmethod
    def _merge_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        defaults = data.get("defaults") or {}
        workloads = data.get("workloads")
        if not isinstance(defaults, dict) or not isinstance(workloads, list):
            return data
        merged = [deep_merge(defaults, w) if isinstance(w, dict) else w for w in workloads]
        return {**data, "workloads": merged}
