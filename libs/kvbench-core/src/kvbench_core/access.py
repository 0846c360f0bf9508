"""Who may do what on the bus: one NATS user per service (per machine for agents), each with subject permissions.

A service publishes the messages it produces and nothing else; it reads through its own durable consumers only (the
JetStream API subjects that create, fetch from and acknowledge them name the consumer, and an agent's name its
filter: ``$JS.API.CONSUMER.CREATE.KVBENCH_CMD.node-agent-gpu1.kvbench.cmd.node.gpu1.>``), writes only its own keys
of the KV buckets it keeps, and gets replies on an inbox prefix of its own (nobody reads another's answers). So an
agent reads only its own commands and publishes only facts; a load generator only its jobs and their records; only
the planner and the switch poller read the secrets bucket (and what it holds is encrypted: kvbench_core.sealing).
Streams and buckets are created by the administrator (``kvbench up``), not by the services.

Derived from the contracts: which messages each role publishes is listed once here, and the subjects come from the
messages' own definitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvbench_contracts.commands import ReadEngines, RestartEngines, RunLoad, StartStack, StopStack
from kvbench_contracts.envelope import Envelope
from kvbench_contracts.events import (
    EngineSampled,
    EnginesRead,
    EnginesRestarted,
    JobFailed,
    JobFinished,
    JobProgressed,
    JobStarted,
    JobWindowEdge,
    NodeRegistered,
    RecordsBatch,
    RecordsBinary,
    RecordsColumnar,
    RecordsPacked,
    RunCancelled,
    RunFinished,
    RunStarted,
    RunSubmitted,
    StackFailed,
    StackReady,
    StackStopped,
)
from kvbench_contracts.fabric import NicSampled, SwitchSampled, SwitchUnread

__all__ = ["ROLES", "Permissions", "Role", "agent_user", "inbox_prefix", "permissions_for"]


def agent_user(node_id: str) -> str:
    """The bus user of a machine's agent: its permissions are scoped to this node id, so an agent started with
    another --node-id receives no command and is refused every publish of its own."""
    return f"agent-{node_id}"


Role = Literal["admin", "planner", "reporter", "loadgen", "switch_poller", "node_agent", "sim_switch"]
ROLES: tuple[Role, ...] = ("admin", "planner", "reporter", "loadgen", "switch_poller", "node_agent", "sim_switch")

# the messages each role produces (an agent's are scoped to its node id where their subject names it)
PUBLISHES: dict[Role, tuple[type[Envelope], ...]] = {
    "planner": (
        RunSubmitted,
        RunStarted,
        RunCancelled,
        RunFinished,
        StartStack,
        StopStack,
        RestartEngines,
        RunLoad,
        ReadEngines,
    ),
    "reporter": (),
    "loadgen": (
        JobStarted,
        JobWindowEdge,
        JobProgressed,
        JobFinished,
        JobFailed,
        RecordsBatch,
        RecordsPacked,
        RecordsBinary,
        RecordsColumnar,
    ),
    "switch_poller": (SwitchSampled, SwitchUnread),
    "node_agent": (
        NodeRegistered,
        StackReady,
        StackFailed,
        StackStopped,
        EnginesRestarted,
        EnginesRead,
        EngineSampled,
        NicSampled,
    ),
    "sim_switch": (),
}
# (stream, durable, filter) of the consumers each role reads through; {node_id} and {shard} filled per user
CONSUMERS: dict[Role, tuple[tuple[str, str, str | None], ...]] = {
    "planner": (("KVBENCH_CONTROL", "planner", None),),
    "reporter": (
        ("KVBENCH_CONTROL", "reporter-control", None),
        ("KVBENCH_RECORDS", "reporter-records", None),
        ("KVBENCH_TELEMETRY", "reporter-telemetry", None),
        ("KVBENCH_TELEMETRY", "reporter-fabric", None),
        ("KVBENCH_TELEMETRY", "reporter-nic", None),
    ),
    "loadgen": (
        ("KVBENCH_CMD", "loadgen", "kvbench.cmd.loadgen.>"),
        ("KVBENCH_CONTROL", "loadgen-{shard}-cancels", None),
        ("KVBENCH_CONTROL", "loadgen-{shard}-endings", None),
    ),
    "switch_poller": (),
    "node_agent": (("KVBENCH_CMD", "node-agent-{node_id}", "kvbench.cmd.node.{node_id}.>"),),
    "sim_switch": (),
}
# KV buckets each role reads (watches or gets) and the keys it writes ("*": any key)
KV_READS: dict[Role, tuple[str, ...]] = {
    "planner": (
        "kvbench_nodes",
        "kvbench_loadgens",
        "kvbench_runs",
        "kvbench_inventory",
        "kvbench_groups",
        "kvbench_secrets",
        "kvbench_switches",
    ),
    "reporter": ("kvbench_switches",),
    # the other load generators' heartbeats: a second shard of a job it already runs is left to a free one
    "loadgen": ("kvbench_loadgens",),
    "switch_poller": ("kvbench_switches", "kvbench_secrets"),
    "node_agent": (),
    "sim_switch": (),
}
KV_WRITES: dict[Role, tuple[tuple[str, str], ...]] = {
    "planner": (("kvbench_runs", "*"), ("kvbench_groups", "*"), ("kvbench_secrets", "*"), ("kvbench_switches", "*")),
    "reporter": (),
    "loadgen": (("kvbench_loadgens", "{shard}"),),
    "switch_poller": (),
    "node_agent": (("kvbench_nodes", "{node_id}"), ("kvbench_inventory", "{node_id}")),
    "sim_switch": (),
}
# core NATS subjects a role subscribes to beyond its consumers (the simulated switch reads the engines' samples live)
CORE_SUBSCRIBES: dict[Role, tuple[str, ...]] = {"sim_switch": ("kvbench.engine.>",)}


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def inbox_prefix(user: str) -> str:
    """Where a user's replies come back: its own, so no other client can read them."""
    return f"_INBOX_{user}"


def permissions_for(role: Role, user: str, node_id: str = "", shard: str = "") -> Permissions:
    """The subjects ``user`` (of ``role``; an agent's ``node_id``, a load generator's ``shard``) may publish and
    subscribe to."""
    if role == "admin":
        return Permissions(publish=(">",), subscribe=(">",))

    def fill(text: str) -> str:
        return text.replace("{node_id}", node_id).replace("{shard}", shard)

    # a stream's info only for the buckets a role uses (a bucket is opened by its stream's info): a stream's info
    # with a subject filter lists every subject in it, which is every run, job and deployment id of the others
    publish: list[str] = ["$JS.API.INFO", "$JS.API.STREAM.NAMES"]
    publish += [f"$JS.API.STREAM.INFO.KV_{bucket}"
                for bucket in dict.fromkeys([*KV_READS[role], *(bucket for bucket, _ in KV_WRITES[role])])]  # fmt: skip
    for message in PUBLISHES[role]:
        # an agent's facts only under its own node id, where their subject names the node
        publish.append(message.subject_filter(**({"node_id": node_id} if role == "node_agent" else {})))
    for stream, durable, filter_subject in CONSUMERS[role]:
        name = fill(durable)
        create = f"$JS.API.CONSUMER.CREATE.{stream}.{name}"
        # the filter rides in the create subject: an agent's is its own node's commands, no other
        creates = [f"{create}.{fill(filter_subject)}"] if filter_subject else [create, f"{create}.>"]
        publish += [*creates,
                    f"$JS.API.CONSUMER.INFO.{stream}.{name}", f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}",
                    f"$JS.ACK.{stream}.{name}.>"]  # fmt: skip
    for bucket in KV_READS[role]:
        stream = f"KV_{bucket}"
        # a watcher is an ordered consumer of the bucket's stream (flow control replies included); a get a direct read
        publish += [f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}.>",
                    f"$JS.API.CONSUMER.DELETE.{stream}.>", f"$JS.API.CONSUMER.INFO.{stream}.>", f"$JS.FC.{stream}.>",
                    f"$JS.API.DIRECT.GET.{stream}.>", f"$JS.API.STREAM.MSG.GET.{stream}"]  # fmt: skip
    for bucket, key in KV_WRITES[role]:
        publish.append(f"$KV.{bucket}.{'>' if key == '*' else fill(key)}")
        if key == "*":  # deletes and purges of any key
            publish.append(f"$JS.API.STREAM.MSG.DELETE.KV_{bucket}")
    subscribe = [f"{inbox_prefix(user)}.>", *CORE_SUBSCRIBES.get(role, ())]
    return Permissions(publish=tuple(dict.fromkeys(publish)), subscribe=tuple(subscribe))


def nats_users_block(users: Sequence[tuple[str, str, Permissions]]) -> str:
    """A NATS server ``authorization`` block for ``users`` (name, password, permissions), JSON-quoted."""
    import json  # noqa: PLC0415

    rows = []
    for name, password, allowed in users:
        rows.append(
            f"    {{ user: {json.dumps(name)}, password: {json.dumps(password)}, permissions: {{ "
            f"publish: {json.dumps(list(allowed.publish))}, subscribe: {json.dumps(list(allowed.subscribe))} }} }}"
        )
    return "authorization {\n  users: [\n" + ",\n".join(rows) + "\n  ]\n}"
