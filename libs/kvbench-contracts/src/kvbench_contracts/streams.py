"""JetStream streams and KV buckets, declared as data. Every subject falls in exactly one stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["BUCKETS", "STREAMS", "KvBucket", "StreamSpec", "stream_for_subject", "subject_matches"]


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    retention: Literal["limits", "workqueue"]
    max_age_s: float
    duplicate_window_s: float = 120.0
    description: str = ""


@dataclass(frozen=True)
class KvBucket:
    name: str
    ttl_s: float | None
    description: str = ""


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(
        "KVBENCH_CONTROL",
        ("kvbench.run.>", "kvbench.job.>", "kvbench.stack.>", "kvbench.node.>"),
        "limits",
        max_age_s=30 * 86400,
        description="Lifecycle facts of runs, jobs, stacks and nodes (audit trail)",
    ),
    StreamSpec(
        "KVBENCH_CMD",
        ("kvbench.cmd.>",),
        "workqueue",
        max_age_s=86400,
        description="Commands to node agents and load generators; each taken once",
    ),
    StreamSpec(
        "KVBENCH_RECORDS",
        ("kvbench.records.>",),
        "limits",
        max_age_s=7 * 86400,
        description="Per-request records in batches",
    ),
    StreamSpec(
        "KVBENCH_TELEMETRY",
        ("kvbench.engine.>", "kvbench.switch.>", "kvbench.nic.>"),
        "limits",
        max_age_s=2 * 86400,
        description="Engine metric samples and fabric counters",
    ),
)

BUCKETS: tuple[KvBucket, ...] = (
    KvBucket("kvbench_nodes", ttl_s=15.0, description="Node heartbeats; a missing key means the node is lost"),
    KvBucket(
        "kvbench_loadgens",
        ttl_s=15.0,
        description="Load generator heartbeats (the jobs each runs); a missing key means the load generator is lost",
    ),
    KvBucket("kvbench_runs", ttl_s=None, description="Run state, so a restarted planner resumes"),
    KvBucket("kvbench_inventory", ttl_s=None, description="Last inventory each machine registered"),
    KvBucket("kvbench_groups", ttl_s=None, description="Cluster groups: name -> machines"),
    KvBucket("kvbench_secrets", ttl_s=None, description="Named secrets (HF token); never returned by the API"),
    KvBucket("kvbench_switches", ttl_s=None, description="Connected switches: name -> SwitchConfig (no credentials)"),
)


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` is one token, ``>`` is one or more trailing tokens."""
    p_tokens, s_tokens = pattern.split("."), subject.split(".")
    for i, part in enumerate(p_tokens):
        if part == ">":
            return len(s_tokens) > i
        if i >= len(s_tokens) or (part not in ("*", s_tokens[i])):
            return False
    return len(p_tokens) == len(s_tokens)


def stream_for_subject(subject: str) -> StreamSpec:
    matches = [s for s in STREAMS if any(subject_matches(p, subject) for p in s.subjects)]
    if len(matches) != 1:
        raise LookupError(f"subject {subject!r} falls in {len(matches)} streams, expected exactly one")
    return matches[0]
