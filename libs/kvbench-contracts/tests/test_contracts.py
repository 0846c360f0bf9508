from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from kvbench_contracts import ALL_MESSAGES, STREAMS, JobFinished, RecordsBatch, RequestRecord, StartStack
from kvbench_contracts.plan import Plan, deep_merge
from kvbench_contracts.records import RECORD_COLUMNS
from kvbench_contracts.streams import stream_for_subject, subject_matches


def test_every_message_subject_falls_in_exactly_one_stream() -> None:
    for model in ALL_MESSAGES:
        subject = model.subject_filter().replace("*", "x1")
        stream = stream_for_subject(subject)
        assert stream.name in {s.name for s in STREAMS}, model


def test_every_message_registers_itself_fabric_ones_too() -> None:
    from kvbench_contracts.fabric import NicSampled, SwitchSampled, SwitchUnread  # noqa: PLC0415

    assert {NicSampled, SwitchSampled, SwitchUnread, StartStack, JobFinished} <= set(ALL_MESSAGES)
    assert len({m.SCHEMA for m in ALL_MESSAGES}) == len(ALL_MESSAGES)


def test_two_messages_with_one_schema_are_refused() -> None:
    from typing import ClassVar  # noqa: PLC0415

    from kvbench_contracts.envelope import Envelope  # noqa: PLC0415

    with pytest.raises(TypeError, match="both declare the schema"):

        class Impostor(Envelope):
            SCHEMA: ClassVar[str] = JobFinished.SCHEMA
            SUBJECT: ClassVar[str] = "kvbench.job.{job_id}.finished"
            job_id: str


def test_subject_is_derived_from_fields_and_rejects_dots() -> None:
    event = JobFinished(
        job_id="J1",
        run_id="R1",
        workload="w",
        shard="s",
        records=3,
        load_duration_s=10,
        warmup_s=1,
        offered_load=4,
        tokenizer="words",
    )
    assert event.subject() == "kvbench.job.J1.finished"
    bad = JobFinished(
        job_id="a.b",
        run_id="R1",
        workload="w",
        shard="s",
        records=0,
        load_duration_s=1,
        warmup_s=0,
        offered_load=1,
        tokenizer="t",
    )
    with pytest.raises(ValueError, match="cannot be a subject token"):
        bad.subject()
    assert StartStack.subject_filter(node_id="n1") == "kvbench.cmd.node.n1.start_stack"
    assert RecordsBatch.subject_filter(run_id="R") == "kvbench.records.R.*"


def test_envelope_round_trip_carries_schema_and_tolerates_unknown_fields() -> None:
    event = JobFinished(
        job_id="J1",
        run_id="R1",
        workload="w",
        shard="s",
        records=3,
        load_duration_s=10,
        warmup_s=1,
        offered_load=4,
        tokenizer="words",
    )
    raw = json.loads(event.to_bytes())
    assert raw["schema"] == "kvbench.job.finished/1"
    raw["a_future_field"] = 1
    again = JobFinished.model_validate(raw)
    assert again == event
    assert len(event.event_id) == 26  # ULID


def test_wildcards() -> None:
    assert subject_matches("kvbench.>", "kvbench.a.b")
    assert not subject_matches("kvbench.>", "kvbench")
    assert subject_matches("kvbench.*.x", "kvbench.a.x")
    assert not subject_matches("kvbench.*.x", "kvbench.a.b.x")


def _plan(**workload: object) -> dict[str, object]:
    return {
        "version": 1,
        "name": "p1",
        "defaults": {"cluster": {"sim": {"machines": 2}}, "measurement": {"repeats": 1}},
        "workloads": [{"name": "a", "strategy": "own_cache", "stack": "vllm-prefix-gpu", **workload}],
    }


def test_plan_defaults_are_deep_merged_under_workloads() -> None:
    plan = Plan.model_validate(_plan(measurement={"warmup_s": 5}))
    workload = plan.workloads[0]
    assert workload.measurement.repeats == 1  # from defaults
    assert workload.measurement.warmup_s == 5  # from the workload
    assert workload.cluster.sim is not None
    assert workload.cluster.sim.machines == 2


def test_plan_forbids_unknown_keys_and_names_the_field() -> None:
    with pytest.raises(ValidationError) as info:
        Plan.model_validate(_plan(sizng={"host_memory_gb": 1}))
    assert "sizng" in str(info.value)


def test_deep_merge_replaces_lists_and_scalars() -> None:
    merged = deep_merge({"a": {"b": 1, "c": [1]}, "d": 1}, {"a": {"c": [2]}, "d": 2})
    assert merged == {"a": {"b": 1, "c": [2]}, "d": 2}


def test_request_record_keeps_the_public_field_names() -> None:
    # written out here on purpose: a rename must fail this test, whatever the code's own column lists say
    public = "request_id job_id workload session_id turn start_s ttft_s e2e_s chunk_times_s chunk_tokens prompt_tokens"
    assert set(f"{public} output_tokens cached_tokens ok error".split()) <= set(RequestRecord.model_fields)
    # every stored column but the run is a record field
    assert set(RECORD_COLUMNS) - {"run_id"} <= set(RequestRecord.model_fields)


def test_packed_records_round_trip_exactly() -> None:
    from kvbench_contracts.events import RecordsBinary, RecordsColumnar, RecordsPacked  # noqa: PLC0415

    records = [
        RequestRecord(
            request_id=f"r{i}",
            job_id="J",
            workload="w",
            session_id=None if i else "u0",
            turn=i,
            start_s=1.5 * i,
            ttft_s=0.1 if i else None,
            e2e_s=0.3 if i else None,
            chunk_times_s=[0.1, 0.2, 0.3][:i],
            chunk_tokens=[1, 2, 3][:i],
            prompt_tokens=10,
            output_tokens=i,
            cached_tokens=None if i == 2 else 4,
            ok=i > 0,
            error=None if i else "timeout",
            shard="lg",
        )
        for i in range(4)
    ]
    packed = RecordsPacked.from_records("R", "J", "lg", records)
    assert packed.subject() == "kvbench.records.R.J"
    again = RecordsPacked.model_validate_json(packed.to_bytes())
    assert again.to_records() == records
    # the binary forms: a JSON head line, then the arrays as they are (the chunk arrays; columnar: every column)
    for form in (RecordsBinary, RecordsColumnar):
        binary = form.from_records("R", "J", "lg", records)
        assert binary.subject() == packed.subject()
        body = binary.to_bytes()
        assert body.count(b"\n", 0, body.index(b"\n") + 1) == 1
        assert form.from_bytes(body).to_records() == records
        with pytest.raises(ValueError, match="do not match"):
            form.from_bytes(body[:-4])  # a truncated body is refused, not read short


def test_the_columnar_form_refuses_what_its_arrays_cannot_hold() -> None:
    from kvbench_contracts.records import encode_scalar_columns  # noqa: PLC0415

    good: dict[str, list[object]] = {
        "request_id": ["a"], "workload": ["w"], "session_id": [None], "turn": [None], "start_s": [0.0],
        "ttft_s": [float("nan")], "e2e_s": [None], "prompt_tokens": [1], "output_tokens": [1], "cached_tokens": [None],
        "ok": [True], "error": [None], "connect_s": [None],
    }  # fmt: skip
    arrays = encode_scalar_columns(good)
    assert arrays["ttft_s.valid"] == b"\x00"  # not a number travels as null, as JSON has it
    assert "request_id.valid" not in arrays  # a column that is never null carries no flags
    for column, value, error in (("prompt_tokens", 2.5, TypeError), ("output_tokens", 2**40, ValueError),
                                 ("request_id", None, ValueError), ("workload", 3, TypeError)):  # fmt: skip
        with pytest.raises(error):
            encode_scalar_columns({**good, column: [value]})


@pytest.mark.parametrize("name", ["leaf1.", "leaf1..b", ".leaf1", "a" * 64, "leaf1.lab", "leaf 1", "leaf*", "leaf>"])
def test_a_switch_name_that_cannot_be_a_kv_key_or_a_subject_token_is_refused(name: str) -> None:
    from kvbench_contracts.fabric import SwitchSpec  # noqa: PLC0415

    with pytest.raises(ValidationError):
        SwitchSpec(name=name, address="10.0.0.1")


def test_a_switch_name_of_one_subject_token_is_accepted() -> None:
    from kvbench_contracts.fabric import SwitchSpec  # noqa: PLC0415

    assert SwitchSpec(name="leaf1-dc_2", address="leaf1.dc-2.lab").name == "leaf1-dc_2"
