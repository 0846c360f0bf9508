"""Reporter persistence on a real PostgreSQL: migrations and idempotent ingestion."""

from __future__ import annotations

import asyncpg
import orjson
import pytest

from kvbench_contracts.engine import SIM_LATE_US, sim_late_counter
from kvbench_contracts.events import (
    ClientTiming,
    EngineSampled,
    JobFinished,
    JobStarted,
    RecordsBatch,
    RecordsBinary,
    RecordsColumnar,
    RecordsPacked,
    RunSubmitted,
)
from kvbench_contracts.records import RequestRecord
from kvbench_reporter.ingest import Ingestor
from kvbench_reporter.report import build_report
from kvbench_reporter.schema import Report
from kvbench_reporter.store import Store, apply_migrations

pytestmark = pytest.mark.integration


def _records(job_id: str, n: int) -> list[RequestRecord]:
    return [
        RequestRecord(
            request_id=f"r{i}",
            job_id=job_id,
            workload="w",
            start_s=2.0 + i,
            ttft_s=0.1,
            e2e_s=0.5,
            chunk_times_s=[0.1, 0.3, 0.5],
            chunk_tokens=[1, 1, 1],
            prompt_tokens=100,
            output_tokens=3,
            cached_tokens=64,
            ok=True,
        )
        for i in range(n)
    ]


async def test_migrations_apply_once(fresh_database: str) -> None:
    conn = await asyncpg.connect(fresh_database)
    try:
        assert await apply_migrations(conn) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
        assert await apply_migrations(conn) == []
    finally:
        await conn.close()


async def test_redelivered_batches_and_events_never_duplicate_rows(fresh_database: str) -> None:
    store = await Store.open(fresh_database)
    finished: list[str] = []

    async def on_finished(run_id: str) -> None:
        finished.append(run_id)

    ingestor = Ingestor(store, on_finished)
    try:
        plan = {
            "workloads": [
                {"name": "w", "stack": "vllm-prefix-gpu", "strategy": "own_cache", "measurement": {"repeats": 1}}
            ]
        }
        submitted = RunSubmitted(
            run_id="R1",
            plan_name="p",
            plan=plan,
            jobs=[{"job_id": "J1", "workload": "w", "stack": "vllm-prefix-gpu", "load_level": 4, "repeat": 0}],
        )
        started = JobStarted(job_id="J1", run_id="R1", workload="w", shard="lg")
        done = JobFinished(
            job_id="J1",
            run_id="R1",
            workload="w",
            shard="lg",
            records=20,
            load_duration_s=30,
            warmup_s=1,
            offered_load=4,
            tokenizer="words",
        )
        await ingestor.control([submitted, started, done])
        await ingestor.control([submitted, started, done])  # redelivered after a crash
        batch = _records("J1", 20)
        assert await store.insert_records("R1", batch) == 20
        assert await store.insert_records("R1", batch) == 0  # the same records again: the same batch key
        assert await store.pool.fetchval("SELECT count(*) FROM request_records") == 20
        assert await store.pool.fetchval("SELECT count(*) FROM events") == 3
        report = await build_report(store, "R1")
        assert report is not None
        Report.model_validate(report)  # the published schema holds
        workload = report["workloads"][0]
        assert workload["requests"] == 20
        assert workload["requests_measured"] == 20
        assert workload["cached_prompt_tokens"] == 20 * 64
        assert workload["ttft_ms"]["p50"] == pytest.approx(100.0)
        assert workload["jobs"][0]["first_request_ttft_ms"] == pytest.approx(100.0)
    finally:
        await store.close()


async def test_a_redelivered_message_adds_no_rows_and_every_field_reads_back_as_sent(fresh_database: str) -> None:
    """Redelivery is caught per message (its event id): a message seen before, in one fetch with new ones and
    twice over, adds nothing; every field reads back as sent, NULLs, non-ASCII text and uneven chunk counts
    included; a batch that misses a NOT NULL value is poison, and the good batches beside it still land."""
    store = await Store.open(fresh_database)

    async def nothing(_: str) -> None:
        return None

    ingestor = Ingestor(store, nothing)
    try:
        sent = [
            RequestRecord(
                request_id=f"q{i}",
                job_id="JB",
                workload="wé" if i % 2 else "w",
                session_id=None if i == 3 else f"sessión-{i}",
                turn=None if i == 4 else i,
                start_s=0.5 * i,
                ttft_s=None if i == 5 else 0.01 * i,
                e2e_s=None if i == 5 else 0.02 * i,
                chunk_times_s=[0.01 * k for k in range(i)],
                chunk_tokens=[k + 1 for k in range(i)],
                prompt_tokens=100 + i,
                output_tokens=i,
                cached_tokens=None if i % 3 else 16 * i,
                ok=i != 5,
                error="timeout" if i == 5 else None,
                connect_s=0.002 if i == 0 else None,
            )
            for i in range(8)
        ]
        seen = RecordsColumnar.from_records("RB", "JB", "lg", sent[:4])
        assert await ingestor.records_raw([seen.to_bytes()]) == []
        fresh = RecordsColumnar.from_records("RB", "JB", "lg", sent[4:])
        assert await ingestor.records_raw([seen.to_bytes(), fresh.to_bytes(), fresh.to_bytes()]) == []
        assert ingestor.last_batch_rows == 4
        assert await ingestor.records_raw([fresh.to_bytes()]) == []
        assert ingestor.last_batch_rows == 0
        stored = {r.request_id: r for r in await store.records("RB", "JB")}
        assert len(stored) == 8
        for record in sent:
            assert stored[record.request_id] == record.model_copy(update={"shard": "lg"})
        assert await store.pool.fetchval("SELECT count(*) FROM record_batches WHERE run_id = 'RB'") == 2

        # the forms of older load generators go the same way
        assert await ingestor.records_raw([RecordsBinary.from_records("RB", "JC", "lg", sent).to_bytes()]) == []
        assert {r.request_id: r for r in await store.records("RB", "JC")} == {
            r.request_id: r.model_copy(update={"job_id": "JC", "shard": "lg"}) for r in sent
        }
        old = RecordsBatch(
            run_id="RB", job_id="JO", shard="lg", records=[r.model_copy(update={"job_id": "JO"}) for r in sent]
        )
        assert await ingestor.records_raw([old.to_bytes()]) == []
        assert len(await store.records("RB", "JO")) == 8

        # a missing request id is refused where it is decoded; the batch beside it is stored
        broken = orjson.loads(RecordsPacked.from_records("RB", "JX", "lg", sent[:2]).to_bytes())
        broken["request_id"][1] = None
        good = RecordsBinary.from_records("RB", "JY", "lg", sent[:2])
        assert await ingestor.records_raw([orjson.dumps(broken), good.to_bytes()]) == [0]
        assert len(await store.records("RB", "JY")) == 2
        assert await store.records("RB", "JX") == []
    finally:
        await store.close()


async def test_a_sharded_job_is_done_when_every_shard_reported_and_sums_their_records(fresh_database: str) -> None:
    store = await Store.open(fresh_database)

    async def nothing(_: str) -> None:
        return None

    ingestor = Ingestor(store, nothing)
    try:
        plan = {"workloads": [{"name": "w", "stack": "vllm-prefix-gpu", "strategy": "own_cache"}]}
        job = {"job_id": "JS", "workload": "w", "stack": "vllm-prefix-gpu", "load_level": 8, "repeat": 0}
        await ingestor.control([RunSubmitted(run_id="RS", plan_name="p", plan=plan, jobs=[job])])

        def shard(index: int, records: int, end: float) -> JobFinished:
            return JobFinished(
                job_id="JS",
                run_id="RS",
                workload="w",
                shard=f"lg-{index}",
                records=records,
                load_duration_s=end,
                warmup_s=2,
                offered_load=8,
                tokenizer="words",
                shard_index=index,
                shards=2,
                skipped_arrivals=index,
            )

        first = shard(0, 40, 30.0)
        await ingestor.control([first])
        await ingestor.control([first])  # redelivered: still one shard of two
        row = await store.pool.fetchrow("SELECT * FROM jobs WHERE job_id = 'JS'")
        assert row is not None
        assert (row["status"], row["shards_finished"], row["records_expected"]) == ("pending", 1, 40)
        await ingestor.control([shard(1, 25, 31.5)])
        row = await store.pool.fetchrow("SELECT * FROM jobs WHERE job_id = 'JS'")
        assert row is not None
        assert (row["status"], row["shards_finished"], row["records_expected"]) == ("succeeded", 2, 65)
        assert row["load_duration_s"] == 31.5
        assert row["skipped_arrivals"] == 1
    finally:
        await store.close()


async def test_raw_record_batches_store_good_rows_and_terminate_poison(fresh_database: str, nats_url: str) -> None:
    import asyncio  # noqa: PLC0415
    import uuid  # noqa: PLC0415

    from kvbench_contracts.events import RecordsBatch, RecordsBinary, RecordsColumnar, RecordsPacked  # noqa: PLC0415
    from kvbench_core.bus import Bus  # noqa: PLC0415
    from kvbench_core.metrics import new_registry  # noqa: PLC0415

    store = await Store.open(fresh_database)

    async def nothing(_: str) -> None:
        return None

    ingestor = Ingestor(store, nothing)
    registry = new_registry()
    run_id = f"R{uuid.uuid4().hex[:8]}"
    durable = f"raw{uuid.uuid4().hex[:8]}"
    try:
        async with Bus.connect(nats_url, name="t-raw", registry=registry, service="test") as bus:
            good = RecordsBatch(run_id=run_id, job_id="J9", shard="s", records=_records("J9", 30))
            await bus.publish(good)
            await bus.js.publish(f"kvbench.records.{run_id}.J9", b'{"schema": "kvbench.records.batch/1"}')
            await bus.js.publish(f"kvbench.records.{run_id}.J9", b"not json at all")
            packed = RecordsPacked.from_records(run_id, "J9", "s", _records("J9", 40)[30:35])
            await bus.publish(packed)  # the older packed form
            # the same message again past JetStream's duplicate window (no Nats-Msg-Id): the store skips it
            await bus.js.publish(f"kvbench.records.{run_id}.J9", packed.to_bytes())
            binary = RecordsBinary.from_records(run_id, "J9", "s", _records("J9", 40)[35:38])
            await bus.publish(binary)  # the older binary form
            columnar = RecordsColumnar.from_records(run_id, "J9", "s", _records("J9", 40)[38:])
            await bus.publish(columnar)  # the load generator's columnar form
            await bus.js.publish(f"kvbench.records.{run_id}.J9", columnar.to_bytes()[:-8])  # truncated: poison
            bus.subscribe_raw(ingestor.records_raw, durable=durable, stream="KVBENCH_RECORDS", batch=10)
            for _ in range(100):
                poison = registry.get_sample_value("kvbench_test_bus_poison_messages_total", {"durable": durable})
                if poison == 3.0:
                    break
                await asyncio.sleep(0.1)
            assert poison == 3.0
            for _ in range(50):  # the binary batch may land after the poison is counted
                if await store.pool.fetchval("SELECT count(*) FROM request_records WHERE run_id = $1", run_id) == 40:
                    break
                await asyncio.sleep(0.1)
        rows = await store.pool.fetch("SELECT * FROM request_records WHERE run_id = $1", run_id)
        assert len(rows) == 40
        stored = await store.records(run_id, "J9")
        assert stored[0].chunk_times_s == [0.1, 0.3, 0.5]  # packed arrays read back exactly
    finally:
        await store.close()


async def _cabled_run(
    ingestor: Ingestor, run_id: str, node: str, switch: str, port: str, rdma: list[dict[str, str]] | None = None
) -> None:
    """A started run whose one machine (its eth1 cabled to ``switch``'s ``port``, as LLDP says) ran the pool."""
    from kvbench_contracts.events import NodeInventory, NodeRegistered, RunStarted, StackReady  # noqa: PLC0415
    from kvbench_contracts.fabric import LldpNeighbor  # noqa: PLC0415

    plan = {"workloads": [{"name": "w", "stack": "vllm-prefix-gpu", "strategy": "own_cache"}]}
    await ingestor.control([RunSubmitted(run_id=run_id, plan_name="p", plan=plan, jobs=[])])
    cable = LldpNeighbor(local_port="eth1", chassis_id="aa:bb", system_name=switch, port_id=port)
    inventory = NodeInventory(node_id=node, hostname=node, simulated=False, lldp=[cable.model_dump()], rdma=rdma or [])
    ready = StackReady(deployment_id=f"D-{run_id}", run_id=run_id, node_id=node, endpoints=[])
    await ingestor.control([NodeRegistered(node_id=node, inventory=inventory), ready, RunStarted(run_id=run_id)])


async def test_the_publish_gate_blocks_until_every_cabled_switch_was_read_around_the_run(fresh_database: str) -> None:
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    from kvbench_contracts.fabric import (  # noqa: PLC0415
        CounterSample,
        SwitchConfig,
        SwitchSampled,
        SwitchUnread,
    )
    from kvbench_reporter.fabric import fabric_section  # noqa: PLC0415

    store = await Store.open(fresh_database)

    async def nothing(_: str) -> None:
        return None

    ingestor = Ingestor(store, nothing)
    try:
        mlx5 = {"device": "mlx5_0", "state": "ACTIVE", "netdev": "eth1"}  # the RDMA port riding on eth1
        await _cabled_run(ingestor, "RF", "gpu-a", "leaf1", "swp1", rdma=[mlx5])
        t0 = datetime.now(UTC)
        t1 = t0 + timedelta(seconds=60)

        def read(at: datetime, octets: int) -> SwitchSampled:
            ns = int(at.timestamp() * 1e9)
            common = {"device": "leaf1", "device_kind": "switch", "port": "swp1", "ts_request_ns": ns,
                      "ts_response_ns": ns, "source": "snmp:test", "epoch": "boot1"}  # fmt: skip
            samples = [
                CounterSample.model_validate({**common, "counter": "if.in_octets", "value": octets, "unit": "octets"}),
                CounterSample.model_validate(
                    {**common, "counter": "if.speed", "value": 10_000, "unit": "mbps", "kind": "gauge"}
                ),
            ]
            return SwitchSampled(switch="leaf1", samples=samples, occurred_at=at)

        # nothing read yet: the gate names the switch
        section = await fabric_section(store, "RF", t0, t1)
        assert not section["publish_gate"]["publishable"]
        assert section["publish_gate"]["code"] == "switch_unread"
        assert section["publish_gate"]["switches"][0]["switch"] == "leaf1"
        await store.insert_switch_reads(
            [read(t0 - timedelta(seconds=10), 1_000), read(t1 + timedelta(seconds=10), 751_001_000)]
        )
        section = await fabric_section(store, "RF", t0, t1)
        assert section["publish_gate"]["publishable"], section
        port = section["switches"][0]["ports"][0]
        assert port["if.in_octets_delta"] == 751_000_000
        assert port["in_utilization"] == pytest.approx(8 * 751_000_000 / (80 * 10e9))
        # the machine's own NIC counters over the same window: the cable's checks run
        from kvbench_contracts.fabric import NicSampled  # noqa: PLC0415

        def nic(at: datetime, octets: int) -> NicSampled:
            ns = int(at.timestamp() * 1e9)
            sample = CounterSample.model_validate(
                {"device": "gpu-a", "device_kind": "host", "port": "eth1", "counter": "if.out_octets", "value": octets,
                 "unit": "octets", "ts_request_ns": ns, "ts_response_ns": ns, "source": "sysfs:test"}
            )  # fmt: skip
            return NicSampled(node_id="gpu-a", run_id="RF", samples=[sample], occurred_at=at)

        await store.insert_switch_reads(
            [nic(t0 - timedelta(seconds=9), 5_000), nic(t1 + timedelta(seconds=9), 751_005_000)]
        )
        section = await fabric_section(store, "RF", t0, t1)
        (cable,) = section["switches"][0]["agreement"]
        verdicts = {c["check"]: c["verdict"] for c in cable["checks"]}
        assert verdicts["bytes (host tx vs switch rx)"] == "PASS"
        assert verdicts["cable"] == "WARN"  # the switch exported no LLDP-MIB entry in this test
        assert cable["congestion"] == {}

        def congestion(at: datetime, ecn: int, pfc: int) -> NicSampled:
            ns = int(at.timestamp() * 1e9)
            common = {"device": "gpu-a", "device_kind": "host", "ts_request_ns": ns, "ts_response_ns": ns,
                      "source": "test"}  # fmt: skip
            samples = [
                CounterSample.model_validate(
                    {**common, "port": "mlx5_0/1", "counter": "ecn.marked_packets", "value": ecn, "unit": "packets"}
                ),
                CounterSample.model_validate(
                    {**common, "port": "eth1", "counter": "pfc.rx_frames", "qualifier": {"priority": 3},
                     "value": pfc, "unit": "frames"}
                ),
            ]  # fmt: skip
            return NicSampled(node_id="gpu-a", run_id="RF", samples=samples, occurred_at=at)

        await store.insert_switch_reads(
            [congestion(t0 - timedelta(seconds=9), 100, 7), congestion(t1 + timedelta(seconds=9), 1_600, 57)]
        )
        section = await fabric_section(store, "RF", t0, t1)
        (cable,) = section["switches"][0]["agreement"]
        # the RDMA port riding on eth1 saw 1,500 ECN-marked packets; eth1 received 50 PFC frames on priority 3
        assert cable["congestion"] == {"ecn_marked_packets": 1_500, "pfc_frames_received": 50}
        assert section["bottleneck"]["verdict"] == "not network-limited"
        # a poll that failed in the middle is reported, not fatal: the bracketing reads still hold
        await store.insert_switch_reads(
            [SwitchUnread(switch="leaf1", reason="timed out", occurred_at=t0 + timedelta(seconds=30))]
        )
        section = await fabric_section(store, "RF", t0, t1)
        assert section["publish_gate"]["publishable"]
        assert "timed out" in section["switches"][0]["note"]
        # no good read after the end (the last poll failed): unread, with the poller's reason
        later = t1 + timedelta(seconds=20)
        await store.insert_switch_reads([SwitchUnread(switch="leaf1", reason="timed out", occurred_at=later)])
        section = await fabric_section(store, "RF", t0, later)
        assert not section["publish_gate"]["publishable"]
        assert section["publish_gate"]["switches"][0]["reason"] == "timed out"
        # unless the user marked the switch as carrying no benchmark traffic
        quiet = SwitchConfig(name="leaf1", address="10.0.0.1", secret="s", no_benchmark_traffic=True)
        section = await fabric_section(store, "RF", t0, later, configs={"leaf1": quiet})
        assert section["publish_gate"]["publishable"]
        assert section["switches"][0]["ignored"]
        # per job: the cabled ports' deltas between the reads bracketing each job's measured window, with the guard
        await store.insert_switch_reads([read(t0 + timedelta(seconds=30), 500_001_000)])
        jobs = [
            {"job_id": "a", "workload": "w", "start": t0, "end": t0 + timedelta(seconds=20), "kv_bytes": 400e6},
            {"job_id": "b", "workload": "w", "start": t0 + timedelta(seconds=40), "end": t1, "kv_bytes": None},
            {
                "job_id": "c",
                "workload": "w",
                "start": t1 + timedelta(seconds=15),
                "end": t1 + timedelta(seconds=300),
                "kv_bytes": None,
            },
        ]
        section = await fabric_section(store, "RF", t0, t1, jobs=jobs)
        first, second, unbracketed = section["switches"][0]["jobs"]
        assert first["ports"][0]["if.in_octets_delta"] == 500_000_000  # reads at -10 s and +30 s
        assert first["port_bytes"] == 500_000_000
        assert first["ports_over_engines"] == pytest.approx(1.25)
        assert second["ports"][0]["if.in_octets_delta"] == 251_000_000  # reads at +30 s and +70 s
        assert "ports_over_engines" not in second  # its engines reported no KV bytes
        assert unbracketed["note"].startswith("no good reads bracket the job's measured window")
        # back to back with the next job (no read between them): unknown, never the next job's traffic
        jobs[2]["start"] = t1
        _, touching, _ = (await fabric_section(store, "RF", t0, t1, jobs=jobs))["switches"][0]["jobs"]
        assert "ports" not in touching
        assert "without reaching into another job's" in touching["note"]
    finally:
        await store.close()


async def _one_finished_job(
    store: Store,
    run_id: str,
    job_id: str,
    stack: str,
    time_scale: float = 1.0,
    client: ClientTiming | None = None,
    published: int = 20,
) -> JobStarted:
    """A run of one workload ``w`` whose one job finished with 20 records over a 2..30 s window."""

    async def nothing(_: str) -> None:
        return None

    plan = {"workloads": [{"name": "w", "stack": stack, "strategy": "own_cache"}]}
    job = {"job_id": job_id, "workload": "w", "stack": stack, "load_level": 1, "repeat": 0}
    started = JobStarted(job_id=job_id, run_id=run_id, workload="w", shard="lg")
    done = JobFinished(job_id=job_id, run_id=run_id, workload="w", shard="lg", records=published, load_duration_s=30,
                       warmup_s=2, offered_load=1, tokenizer="words", time_scale=time_scale,
                       client_timing=client)  # fmt: skip
    submitted = RunSubmitted(run_id=run_id, plan_name="p", plan=plan, jobs=[job])
    await Ingestor(store, nothing).control([submitted, started, done])
    await store.insert_records(run_id, _records(job_id, 20))
    return started


async def test_a_switch_first_read_while_fifty_stacks_stood_up_is_read_before_the_load(fresh_database: str) -> None:
    """Fifty machines' stacks took 29 s to stand up on one host, and the poller's first read of a switch connected
    just before the run came 14 s into it: that read still precedes every byte of load, so the switch was read.
    A switch whose reads stop before the run ends is not, and the reason says which of the two went wrong."""
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    from kvbench_contracts.fabric import CounterSample, SwitchSampled  # noqa: PLC0415
    from kvbench_reporter.fabric import fabric_section  # noqa: PLC0415

    store = await Store.open(fresh_database)

    async def nothing(_: str) -> None:
        return None

    ingestor = Ingestor(store, nothing)
    try:
        await _cabled_run(ingestor, "RL", "gpu-l", "leaf9", "swp12")
        t0 = datetime.now(UTC)
        t1 = t0 + timedelta(seconds=60)

        def read(at: datetime, octets: int) -> SwitchSampled:
            ns = int(at.timestamp() * 1e9)
            sample = CounterSample.model_validate(
                {"device": "leaf9", "device_kind": "switch", "port": "swp12", "ts_request_ns": ns,
                 "ts_response_ns": ns, "source": "snmp:test", "epoch": "boot1", "counter": "if.in_octets",
                 "value": octets, "unit": "octets"}
            )  # fmt: skip
            return SwitchSampled(switch="leaf9", samples=[sample], occurred_at=at)

        await store.insert_switch_reads(
            [read(t0 + timedelta(seconds=14), 1_000), read(t1 + timedelta(seconds=3), 9_000)]
        )
        section = await fabric_section(store, "RL", t0, t1)  # the run's start alone: read too late
        (switch,) = section["switches"]
        assert not switch["read"]
        assert switch["reason"].startswith("its first good read came 14 s after the run started")
        section = await fabric_section(store, "RL", t0, t1, load_began=t0 + timedelta(seconds=29))
        assert section["publish_gate"]["publishable"], section
        assert section["switches"][0]["ports"][0]["if.in_octets_delta"] == 8_000
        # a load that began before the first read: that read came after traffic, so the switch is still unread
        section = await fabric_section(store, "RL", t0, t1, load_began=t0 + timedelta(seconds=10))
        assert not section["publish_gate"]["publishable"]
        # reads that stop 20 s before the run ends: the poller stopped, and the reason says so
        section = await fabric_section(
            store, "RL", t0, t1 + timedelta(seconds=23), load_began=t0 + timedelta(seconds=29)
        )
        assert section["switches"][0]["reason"].startswith("its last good read came 20 s before the run ended")
    finally:
        await store.close()


async def test_a_simulated_clusters_engine_seconds_map_onto_the_wall_clock_scrapes(fresh_database: str) -> None:
    """Engines paced 10x real time: the job's records say a 2..30 engine-second window, which the engines lived
    between 0.2 and 3.0 wall seconds after the job started; the engine counters are differenced over that."""
    from datetime import timedelta  # noqa: PLC0415

    store = await Store.open(fresh_database)
    try:
        started = await _one_finished_job(store, "RT", "JT", "vllm-prefix-gpu", time_scale=10.0)

        def sample(after_s: float, prompt_tokens: float) -> EngineSampled:
            return EngineSampled(node_id="n", run_id="RT", engine_id="e", job_id="JT", values={},
                                 normalized={"prompt_tokens": prompt_tokens},
                                 occurred_at=started.occurred_at + timedelta(seconds=after_s))  # fmt: skip

        # 100 tokens before the window, 1,000 inside it (0.2..3.0 s), 5,000 after it (had the window been read
        # as wall seconds, 2..30 s, the delta would be 5,000)
        await store.insert_engine_samples(
            [sample(0.1, 100), sample(0.2, 100), sample(3.0, 1100), sample(3.5, 6100), sample(30.0, 6100)]
        )
        report = await build_report(store, "RT")
        assert report is not None
        Report.model_validate(report)
        workload = report["workloads"][0]
        assert workload["time_scale"] == 10.0
        assert workload["jobs"][0]["time_scale"] == 10.0
        assert workload["engine_counters"]["prompt_tokens"] == 1000
    finally:
        await store.close()


async def test_a_split_stacks_prompts_count_once_with_each_sides_sources(fresh_database: str) -> None:
    """A prefill engine computed 1,000 prompt tokens and a decode engine got 990 of them over the link and computed
    the last 10: the headline says 1,000 prompt tokens (not 2,000), 99% transferred; by_role keeps each side."""
    from datetime import timedelta  # noqa: PLC0415

    store = await Store.open(fresh_database)
    try:
        started = await _one_finished_job(store, "RP", "JP", "vllm-pd-nixl")

        def sample(engine: str, role: str, after_s: float, counters: dict[str, float]) -> EngineSampled:
            at = started.occurred_at + timedelta(seconds=after_s)
            return EngineSampled.model_validate(
                {
                    "node_id": "n",
                    "run_id": "RP",
                    "engine_id": engine,
                    "role": role,
                    "values": {},
                    "normalized": counters,
                    "occurred_at": at,
                }
            )

        zero = {"prompt_tokens": 0.0, "prompt_tokens_recomputed": 0.0, "prompt_tokens_transferred": 0.0}
        await store.insert_engine_samples(
            [
                sample("p0", "prefill", 1, zero),
                sample("p0", "prefill", 29, {**zero, "prompt_tokens": 1000, "prompt_tokens_recomputed": 1000}),
                sample("d0", "decode", 1, zero),
                sample(
                    "d0",
                    "decode",
                    29,
                    {"prompt_tokens": 1000, "prompt_tokens_recomputed": 10, "prompt_tokens_transferred": 990},
                ),
            ]
        )
        report = await build_report(store, "RP")
        assert report is not None
        Report.model_validate(report)
        sources = report["workloads"][0]["prompt_token_sources"]
        assert sources["prompt_tokens"] == 1000
        assert sources["tokens"]["transferred"] == 990
        assert sources["tokens"]["recomputed"] == 10
        assert sources["by_role"]["prefill"]["tokens"]["recomputed"] == 1000
        assert sources["by_role"]["decode"]["prompt_tokens"] == 1000
    finally:
        await store.close()


async def test_a_lagging_client_or_pacer_marks_timing_unreliable_and_a_calm_one_does_not(fresh_database: str) -> None:
    from datetime import timedelta  # noqa: PLC0415

    store = await Store.open(fresh_database)
    try:
        calm = ClientTiming(loop_lag_samples=5000, loop_lag_p50_ms=0.4, loop_lag_p99_ms=1.1, loop_lag_max_ms=3.0)
        await _one_finished_job(store, "RC", "JC", "vllm-prefix-gpu", client=calm)
        report = await build_report(store, "RC")
        assert report is not None
        Report.model_validate(report)
        (workload,) = report["workloads"]
        assert workload["timing"] == {"reliable": True, "reasons": []}
        assert not any("unreliable" in r for r in workload["validity"]["reasons"])

        busy = ClientTiming(loop_lag_samples=5000, loop_lag_p50_ms=3.0, loop_lag_p99_ms=42.0, loop_lag_max_ms=300.0)
        started = await _one_finished_job(store, "RB", "JB", "vllm-prefix-gpu", client=busy)
        # the simulated engine wrote 30 of its 1,000 tokens of the window more than 5 ms late
        await store.insert_engine_samples(
            [
                EngineSampled(
                    node_id="n",
                    run_id="RB",
                    engine_id="e",
                    job_id="JB",
                    values={},
                    normalized={"sim_tokens_written": written, sim_late_counter(SIM_LATE_US): late},
                    occurred_at=started.occurred_at + timedelta(seconds=at),
                )
                for at, written, late in ((1.0, 100, 0), (29.0, 1100, 30))
            ]
        )
        report = await build_report(store, "RB")
        assert report is not None
        (workload,) = report["workloads"]
        timing = workload["jobs"][0]["timing"]
        assert not timing["reliable"]
        assert timing["figures"]["loop_lag_p99_ms"] == 42.0
        assert timing["figures"]["engine_late_token_share"] == pytest.approx(0.03)
        assert any("event loop ran 42.0 ms late" in r for r in timing["reasons"])
        assert any("simulated engines wrote 3.0% of tokens" in r for r in timing["reasons"])
        assert workload["timing"]["reliable"] is False
        assert workload["validity"]["verdict"] != "valid"
        assert any("TTFT and ITL unreliable" in r for r in workload["validity"]["reasons"])
        assert "timing" in report["definitions"]
    finally:
        await store.close()


async def test_a_report_built_while_records_are_missing_says_so(fresh_database: str) -> None:
    store = await Store.open(fresh_database)
    try:
        await _one_finished_job(store, "RM", "JM", "vllm-prefix-gpu", published=25)  # 25 published, 20 stored
        report = await build_report(store, "RM")
        assert report is not None
        (workload,) = report["workloads"]
        assert workload["validity"]["verdict"] == "invalid"
        assert any("20 of the 25 records" in r for r in workload["validity"]["reasons"])
    finally:
        await store.close()


async def test_connect_times_travel_packed_and_are_stored_apart_from_ttft(fresh_database: str) -> None:
    import orjson  # noqa: PLC0415

    from kvbench_contracts.events import RecordsPacked  # noqa: PLC0415

    store = await Store.open(fresh_database)

    async def nothing(_: str) -> None:
        return None

    ingestor = Ingestor(store, nothing)
    try:
        records = [r.model_copy(update={"connect_s": 0.25 if i % 4 == 0 else None}) for i, r in
                   enumerate(_records("JC", 8))]  # fmt: skip
        packed = RecordsPacked.from_records("RC", "JC", "s", records)
        assert await ingestor.records_raw([packed.to_bytes()]) == []
        # a load generator older than the field sends no connect times: its rows store them as unknown
        old = orjson.loads(RecordsPacked.from_records("RC", "JO", "s", _records("JO", 3)).to_bytes())
        del old["connect_s"]
        assert await ingestor.records_raw([orjson.dumps(old)]) == []
        stored = await store.records("RC", "JC")
        assert sorted(r.connect_s for r in stored if r.connect_s is not None) == [0.25, 0.25]
        assert all(r.connect_s is None for r in await store.records("RC", "JO"))
        figures_of = (await store.job_columns("RC", "JC")).connect_s
        assert int((figures_of == 0.25).sum()) == 2
    finally:
        await store.close()


@pytest.mark.parametrize("completed", [248.0, 0.0])
async def test_lmcache_server_counters_split_the_connector_hits_and_a_tier_that_wrote_nothing_is_invalid(
    fresh_database: str, completed: float
) -> None:
    """vLLM 0.25.1 behind LMCache counts its connector's hits unattributed; the LMCache server, scraped beside it,
    says which tier served them (figures of the real H200 run after a restart: every hit from disk). A disk tier
    that completed none of its writes (the real O_DIRECT failure) makes the job invalid, with the fix."""
    from datetime import timedelta  # noqa: PLC0415

    store = await Store.open(fresh_database)
    run_id = f"RL{int(completed)}"
    try:
        started = await _one_finished_job(store, run_id, f"JL{int(completed)}", "vllm-lmcache-mp")

        def sample(engine: str, at: float, **values: float) -> EngineSampled:
            when = started.occurred_at + timedelta(seconds=at)
            return EngineSampled(node_id="n", run_id=run_id, engine_id=engine, job_id=started.job_id, values={},
                                 normalized=values, occurred_at=when)  # fmt: skip

        await store.insert_engine_samples([
            sample("vllm", 1.0, prompt_tokens=0, prompt_tokens_external=0, prompt_tokens_recomputed=0),
            sample("vllm", 29.0, prompt_tokens=128_016, prompt_tokens_external=126_976, prompt_tokens_recomputed=1_040),
            sample("lmcache", 1.0, cache_server_hit_tokens_host=0, cache_server_hit_tokens_disk=0,
                   kv_store_chunks_submitted=0, kv_store_chunks_completed=0),
            sample("lmcache", 29.0, cache_server_hit_tokens_host=0, cache_server_hit_tokens_disk=126_976,
                   kv_store_chunks_submitted=248, kv_store_chunks_completed=completed),
        ])  # fmt: skip
        report = await build_report(store, run_id)
        assert report is not None
        (workload,) = report["workloads"]
        tokens = workload["prompt_token_sources"]["tokens"]
        assert tokens["disk"] == pytest.approx(126_976)
        assert tokens["external_unattributed"] == 0
        assert tokens["host_tier"] == pytest.approx(0)
        assert "as the LMCache server counted" in workload["prompt_token_sources"]["source"]
        reasons = workload["validity"]["reasons"]
        if completed:
            assert not any("disk tier" in r for r in reasons)
        else:
            assert workload["validity"]["verdict"] == "invalid"
            assert any("stored none of the 248 chunks" in r and "disk_tier_direct_io: false" in r for r in reasons)
    finally:
        await store.close()
