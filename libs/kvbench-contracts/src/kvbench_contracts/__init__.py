"""kvbench contracts: plain frozen pydantic models for the bus, the plan and records."""

from kvbench_contracts.commands import RunLoad, StartStack, StopStack
from kvbench_contracts.envelope import MESSAGES, Envelope, new_id, utc_now
from kvbench_contracts.events import (
    EngineEndpoint,
    EngineSampled,
    JobFailed,
    JobFinished,
    JobProgressed,
    JobStarted,
    NodeInventory,
    NodeRegistered,
    RecordsBatch,
    RecordsPacked,
    RunCancelled,
    RunFinished,
    RunStarted,
    RunSubmitted,
    StackFailed,
    StackReady,
    StackStopped,
)
from kvbench_contracts.plan import Plan, Workload
from kvbench_contracts.records import RequestRecord
from kvbench_contracts.registry import ALL_MESSAGES, messages_in
from kvbench_contracts.streams import BUCKETS, STREAMS, stream_for_subject

__all__ = [
    "ALL_MESSAGES",
    "BUCKETS",
    "MESSAGES",
    "STREAMS",
    "EngineEndpoint",
    "EngineSampled",
    "Envelope",
    "JobFailed",
    "JobFinished",
    "JobProgressed",
    "JobStarted",
    "NodeInventory",
    "NodeRegistered",
    "Plan",
    "RecordsBatch",
    "RecordsPacked",
    "RequestRecord",
    "RunCancelled",
    "RunFinished",
    "RunLoad",
    "RunStarted",
    "RunSubmitted",
    "StackFailed",
    "StackReady",
    "StackStopped",
    "StartStack",
    "StopStack",
    "Workload",
    "messages_in",
    "new_id",
    "stream_for_subject",
    "utc_now",
]
