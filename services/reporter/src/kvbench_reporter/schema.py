"""The report's published shape (``GET /v1/reports/schema``, ``kvbench report schema``).

Models allow extra keys, so the report can grow without breaking readers; every documented key is required
to be there with its type. ``build_report``'s output is validated against ``Report`` in the tests.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Report", "report_json_schema"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Summary(_Open):
    mean: float | None = Field(description="Mean")
    p50: float | None = Field(description="Median (linear interpolation)")
    p90: float | None = Field(description="90th percentile")
    p95: float | None = Field(description="95th percentile")
    p99: float | None = Field(description="99th percentile")
    count: float = Field(description="Number of values")


class Validity(_Open):
    verdict: Literal["valid", "preliminary", "invalid"] = Field(description="One verdict for the workload")
    reasons: list[str] = Field(description="Why it is not valid, or what to keep in mind")


class Timing(_Open):
    reliable: bool = Field(description="False when the client's or the simulated engines' own lag passed a threshold")
    reasons: list[str] = Field(description="Which lag passed which threshold (definitions.timing)")


class Interval(_Open):
    n: int = Field(description="Repeats with a value")
    mean: float | None = Field(description="Mean over repeats")
    std: float | None = Field(description="Sample standard deviation")
    ci95: list[float] | None = Field(description="Student-t 95% interval [low, high]")


class TestPoint(_Open):
    load_level: float = Field(description="Users (closed loop) or requests/s")
    repeats: int = Field(description="Jobs measured at this load level")
    ttft_ms: Summary = Field(description="TTFT of the pooled measured requests (TTFT by concurrency)")
    tpot_ms: Summary = Field(description="TPOT of the pooled measured requests")
    output_tokens_per_s: float = Field(description="Output tokens / summed windows")
    across_repeats: dict[str, Interval] = Field(description="Per-repeat figures: mean, std, 95% interval")


class Sources(_Open):
    source: str = Field(description="Engine counters, or the requests' cached_tokens when no counters exist")
    prompt_tokens: float = Field(description="Prompt tokens the sources add up to")
    tokens: dict[str, float] = Field(description="gpu_hit, host_tier, disk, shared_store, transferred, recomputed")
    cross_check: dict[str, float] | None = Field(description="Engine vs per-request cached share")
    cross_check_compared: str | None = Field(
        None,
        description="What the cross-check compared: every request of the jobs against the reads at the jobs' "
        "own edges, or (where those are missing) the measured requests against the windows' counters",
    )
    engine_hit_rates: dict[str, dict[str, Any]] | None = Field(
        None,
        description="Hit rates the engines count themselves over the windows, each with its own denominator: "
        "prefix_cache (vLLM's GPU prefix cache, tokens), external (its KV connector, tokens), kv_blocks "
        "(TensorRT-LLM's reused / reused + missed blocks): {rate, hits, queries, definition}",
    )
    by_role: dict[str, dict[str, Any]] | None = Field(
        None,
        description="Split stacks: each side's own prompt tokens and sources ({prefill, decode}: {prompt_tokens, "
        "tokens}); the headline counts each prompt once, as the decode engines got it",
    )
    counters_complete: bool | None = Field(
        None,
        description="Engine counters: False when some engine's samples span too little of a job's measured window "
        "(short_coverage), so that the counts above are low; null without engine counters",
    )
    short_coverage: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Each such engine: {job_id, engine_id, role, window_s, counted_s, from_s, to_s (from the "
        "window's start), scrape_interval_s} in wall-clock seconds",
    )


class DiskTier(_Open):
    """A local disk tier over one job: what it held when the job started and when it ended (the agent counts the
    tier directory's files on each machine; a simulated engine reports its simulated tier)."""

    records_before: float = Field(description="Files (records) the disk tier held at the job's start, every machine")
    records_after: float = Field(description="Files (records) it held at the job's end")
    bytes_before: float = Field(description="Bytes it held at the job's start")
    bytes_after: float = Field(description="Bytes it held at the job's end")
    reclaimed: bool = Field(
        description="Whether eviction reclaimed space during the job: its bytes fell, or its writer counted "
        "evictions (LMCache's L2)"
    )
    engines: int = Field(description="Engine sample series that carried a count")


class Job(_Open):
    job_id: str = Field(description="Job id")
    load_level: float = Field(description="Users or requests/s")
    repeat: int = Field(description="Repeat index, from 0")
    status: str = Field(description="succeeded, failed, ...")
    requests: int = Field(description="Rows stored for the job")
    shards: int = Field(1, description="Load generator shards that shared the job")
    skipped_arrivals: int = Field(0, description="Rate mode: arrivals that found no session to send")
    replay_lag_p99_s: float | None = Field(None, description="Trace mode: p99 of actual minus scheduled send time, s")
    load_notes: list[str] = Field(default_factory=list, description="What the load generator said about its input")
    first_request_ttft_ms: float | None = Field(
        None, description="TTFT of the job's first request, measured or not (after a stack restart: the cold start)"
    )
    time_scale: float = Field(
        1.0,
        description="Engine seconds per wall-clock second (a simulated cluster paced faster than real time); every "
        "time in the report is engine seconds",
    )
    timing: Timing | None = Field(
        None, description="Whether TTFT and ITL can be trusted: the load generator's lag, merged reads, pacing slip"
    )
    disk_tier: DiskTier | None = Field(
        None, description="The stack's local disk tier before and after the job; null when the stack has none"
    )


class StackStarted(_Open):
    at: str = Field(description="When the stack was ready (UTC, ISO 8601)")
    node_id: str | None = Field(description="Machine")
    deployment_id: str | None = Field(description="Deployment id")
    facts: dict[str, str] = Field(
        description="What the agent read as the stack started: the attention block size each engine logged "
        "(`<process>.attention_block_size`), what the disk tier held before (`disk_tier_found`), command lines"
    )


class CrossInstancePair(_Open):
    computed_by: str = Field(description="The engine that computed and stored the tokens")
    reused_by: str = Field(description="The engine that loaded them instead of computing them")
    tokens: float = Field(description="Prompt tokens, over the measured windows")


class CrossInstanceHits(_Open):
    definition: str = Field(description="What is counted")
    tokens: float = Field(description="Every pair's tokens")
    share_of_prompt_tokens: float | None = Field(description="tokens / the engines' prompt tokens")
    pairs: list[CrossInstancePair] = Field(description="By pair, most first")


class Workload(_Open):
    name: str = Field(description="Workload name from the plan")
    stack: str = Field(description="Stack id")
    strategy: str = Field(description="Strategy")
    requests: int = Field(description="Every request the workload's jobs sent (rows in request_records)")
    requests_measured: int = Field(description="Requests inside the measured windows")
    accuracy: dict[str, Any] | None = Field(
        None,
        description="The accuracy gate (measurement.accuracy_gate): verdict (passed, failed, reference, not "
        "checked), answers compared with the baseline's to the same requests, how many differ, the rule, and the "
        "first differing requests (job:session/turn)",
    )
    errors: int = Field(description="Errors that started inside the windows")
    window_s: float = Field(description="Summed measured windows, s")
    time_scale: float = Field(
        1.0, description="Engine seconds per wall-clock second: times are engine seconds (simulated engines' speed)"
    )
    ttft_ms: Summary = Field(description="Time to first token")
    tpot_ms: Summary = Field(description="Time per output token, per request")
    itl_ms: Summary = Field(description="Per-token gaps")
    icl_ms: Summary = Field(description="Gaps between chunks")
    e2e_ms: Summary = Field(description="End to end latency")
    output_tokens_per_s: float = Field(description="Throughput")
    goodput_rps: float = Field(description="Requests meeting every SLO per second")
    good_fraction: float | None = Field(description="Good / (successes + errors)")
    prompt_tokens: int = Field(description="Prompt tokens of measured requests")
    cached_prompt_tokens: int = Field(description="Cached prompt tokens of measured requests (usage field)")
    cache_hit_ratio: float | None = Field(
        description="cached_prompt_tokens / prompt_tokens; split stacks: the engines' cache hits only (tokens "
        "transferred from a prefill engine are not cached; see transferred_ratio)"
    )
    test_points: list[TestPoint] = Field(description="Per load level")
    prompt_token_sources: Sources = Field(description="Where prompt tokens came from")
    hit_ratio_over_time: list[dict[str, Any]] = Field(description="Cache hit ratio per time slice")
    engine_counters: dict[str, float] | None = Field(description="Normalised engine counters over the windows")
    cross_instance_hits: CrossInstanceHits | None = Field(
        None, description="Who computed what another engine reused from a shared tier (simulated engines count it)"
    )
    limits: dict[str, Any] = Field(description="Break-even bandwidth, tier rates, GPU power, capacity, cost")
    validity: Validity = Field(description="Did it work?")
    timing: Timing = Field(description="TTFT and ITL reliable in every job, or the reasons they are not")
    comparison: dict[str, Any] = Field(
        description="Against the run's baseline: {baseline, verdict, speedup: {ttft_p50, ttft_p99, "
        "output_tokens_per_s, goodput_rps: {n, mean, std, ci95, verdict}}} (definitions.comparison)"
    )
    jobs: list[Job] = Field(description="What happened underneath, per job")
    stacks: list[StackStarted] = Field(
        default_factory=list, description="What each machine said of the workload's stacks as they came up"
    )
    acceptance: dict[str, Any] | None = Field(
        None,
        description="kvbench accept: {verdict, passed, steps: [{step, name, status (passed | failed | not applicable "
        "| not checked), evidence, reason}], passes: {cold, warm, reset, restart: {ttft_p50_ms, hit_rate, tokens}}}",
    )


class Report(_Open):
    run_id: str = Field(description="Run id")
    plan_name: str = Field(description="Plan name")
    status: str = Field(description="succeeded, failed or cancelled")
    reasons: list[dict[str, Any]] = Field(description="Why a run failed: {code, message, fix}")
    submitted_at: str = Field(description="ISO 8601, UTC")
    finished_at: str | None = Field(description="ISO 8601, UTC")
    generated_at: str = Field(description="ISO 8601, UTC")
    definitions: dict[str, str] = Field(description="Every figure's definition, as the report computed it")
    baseline: str | None = Field(description="The workload the others are compared with (None: no own_cache one)")
    tested: list[dict[str, Any]] = Field(
        default_factory=list,
        description="What was tested, per workload: model, engine and the version its engines reported, tensor "
        "parallel size and engine arguments, stack, tier and sizing, traffic shape with its parameters, arrivals, "
        "measurement, the machines with their GPUs, and each engine's command line as its agent started it",
    )
    workloads: list[Workload] = Field(
        description="Workloads compared (the baseline first, then the plan's order), then each one's five questions"
    )
    fabric: dict[str, Any] = Field(
        default_factory=dict,
        description="Switches the machines are cabled to, whether each was read around the run, port deltas "
        "and utilisation, and the publish gate (switch_unread)",
    )
    events: list[dict[str, Any]] = Field(description="The run's events, machine by machine")


def report_json_schema() -> dict[str, Any]:
    return Report.model_json_schema()
