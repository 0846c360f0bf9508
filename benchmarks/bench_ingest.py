"""Reporter ingestion: request records from JetStream into PostgreSQL (goal: at least 100,000 records/s).

Method: embedded NATS and PostgreSQL on this machine; N records (32-token outputs, so 32 chunk times each) are
published first in columnar batches of 500 (RecordsColumnar, as the load generator sends them); then the
reporter's records consumer (durable pull, two batches in flight, every column an Arrow array over the message's own
bytes, written by ADBC's PostgreSQL driver as one binary COPY) is started and timed until every row is in
PostgreSQL. Several rounds (fresh data each), median reported: this shared machine is noisy. Each round first
times the same ingestion with the load generator's previous form (RecordsBinary), the baseline. Other baselines in
the same run: the reporter's writer alone from memory (no bus), and asyncpg's
COPY of the same rows as Python tuples (what the reporter did before), decoding alone per record, the binary form
and the columnar form against the previous ones (RecordsBinary: scalar columns as JSON lists, what the load generator
sent before; RecordsPacked: the same with base64 arrays), COPY alone into the previous schema's
table (a primary key over three text columns, where redeliveries are now caught by one key per batch), and
PostgreSQL's binary COPY rows built in Python straight from the packed columns (timed to build, then to COPY the
prebuilt bytes): slower to build than Arrow's columns. Goal of issue 18: 250,000 records/s.
"""

from __future__ import annotations

import asyncio
import io
import multiprocessing
import os
import random
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import orjson

from kvbench_contracts.envelope import new_id
from kvbench_contracts.events import RecordsBinary, RecordsColumnar, RecordsPacked, split_binary_records
from kvbench_contracts.records import RECORD_COLUMNS, RequestRecord
from kvbench_core.bus import Bus
from kvbench_core.columns import pack_floats, pack_ints
from kvbench_core.embedded import EmbeddedNats, EmbeddedPostgres
from kvbench_reporter.ingest import Ingestor, decode_batch
from kvbench_reporter.store import Store

N = int(os.environ.get("KVBENCH_BENCH_RECORDS", "200000"))
WORKERS = int(os.environ.get("KVBENCH_BENCH_WORKERS", "1"))
ROUNDS = int(os.environ.get("KVBENCH_BENCH_ROUNDS", "5"))
# PostgreSQL as `kvbench up` runs it (fsync, full-page writes, synchronous commit) instead of the test fixtures' fast
# server (fsync off), whose figures the earlier notes give
DURABLE = os.environ.get("KVBENCH_BENCH_DURABLE", "0") == "1"
BATCH = 500


def make_records(job_id: str, n: int) -> list[RequestRecord]:
    rng = random.Random(1)
    out = []
    for i in range(n):
        ttft = rng.uniform(0.05, 0.5)
        chunks = [ttft + 0.02 * k for k in range(32)]
        out.append(
            RequestRecord(
                request_id=new_id(),
                job_id=job_id,
                workload="w",
                session_id=f"u{i % 64}",
                turn=i % 4,
                start_s=i * 0.001,
                ttft_s=ttft,
                e2e_s=chunks[-1],
                chunk_times_s=chunks,
                chunk_tokens=[1] * 32,
                prompt_tokens=2048,
                output_tokens=32,
                cached_tokens=1024,
                ok=True,
            )
        )
    return out


def record_rows(run_id: str, records: list[RequestRecord]) -> list[tuple[object, ...]]:
    """Records as Python tuples in RECORD_COLUMNS order: what the reporter COPYd through asyncpg before (baseline)."""
    return [
        (r.job_id, r.request_id, run_id, r.workload, r.session_id, r.turn, r.start_s, r.ttft_s, r.e2e_s,
         pack_floats(r.chunk_times_s), pack_ints(r.chunk_tokens), r.prompt_tokens, r.output_tokens, r.cached_tokens,
         r.ok, r.error, r.shard, r.connect_s)
        for r in records
    ]  # fmt: skip


# PostgreSQL's binary COPY format: a signature, flags and header extension, then per row a field count and each field
# as its length (-1 for NULL) and its bytes, then -1 as the trailer
_COPY_HEADER, _COPY_TRAILER, _NULL = b"PGCOPY\n\xff\r\n\x00" + bytes(8), b"\xff\xff", b"\xff\xff\xff\xff"
_LEN, _INT4, _FLOAT8 = struct.Struct(">i").pack, struct.Struct(">ii").pack, struct.Struct(">id").pack


def binary_copy_rows(body: bytes) -> bytes:
    """One RecordsBinary body as binary COPY rows in RECORD_COLUMNS order (the alternative measured, not used)."""
    head, offsets_b, times, tokens = split_binary_records(body, orjson.loads)
    count = len(head["request_id"])
    offsets = struct.unpack(f"<{count + 1}q", offsets_b)
    encoded: dict[str, bytes] = {}

    def text(value: str | None) -> bytes:
        if value is None:
            return _NULL
        if value not in encoded:
            raw = value.encode()
            encoded[value] = _LEN(len(raw)) + raw
        return encoded[value]

    lead, run, shard = b"\x00\x12" + text(head["job_id"]), text(head["run_id"]), text(head["shard"])
    columns = [head[name] for name in ("request_id", "workload", "session_id", "turn", "start_s", "ttft_s", "e2e_s",
                                       "prompt_tokens", "output_tokens", "cached_tokens", "ok", "error")]  # fmt: skip
    connect = head.get("connect_s") or [None] * count
    int4, float8, length, null = _INT4, _FLOAT8, _LEN, _NULL
    rows = []
    for rid, workload, session, turn, start, ttft, e2e, prompt, output, cached, ok, error, conn, a, b in zip(
        *columns, connect, offsets[:-1], offsets[1:], strict=True
    ):
        rows.append(b"".join((
            lead, text(rid), run, text(workload), text(session), null if turn is None else int4(4, turn),
            float8(8, start), null if ttft is None else float8(8, ttft), null if e2e is None else float8(8, e2e),
            length(8 * (b - a)), times[8 * a : 8 * b], length(4 * (b - a)), tokens[4 * a : 4 * b], int4(4, prompt),
            int4(4, output), null if cached is None else int4(4, cached),
            b"\x00\x00\x00\x01\x01" if ok else b"\x00\x00\x00\x01\x00", text(error), shard,
            null if conn is None else float8(8, conn),
        )))  # fmt: skip
    return b"".join(rows)


def tree_cpu_s(root: int) -> float | None:
    """CPU seconds (user + system) used so far by process ``root`` and its descendants, from /proc (None where
    there is no /proc): what PostgreSQL's backends and the NATS server spent, beside the reporter's own."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    parent_of: dict[int, int] = {}
    used: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
        parent_of[int(entry.name)] = int(fields[1])
        used[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    total = 0.0
    for pid, seconds in used.items():
        walk = pid
        while walk > 1 and walk != root:
            walk = parent_of.get(walk, 0)
        if walk == root:
            total += seconds
    return total


def worker(nats_url: str, dsn: str, stored: Any, ready: Any, go: Any, tag: str, cpu: Any) -> None:
    """One reporter replica's records consumer (the same durable: JetStream shares the batches out)."""

    async def run() -> None:
        store = await Store.open(dsn)
        ingestor = Ingestor(store, lambda _: asyncio.sleep(0))

        async def consume(bodies: list[bytes]) -> list[int]:  # the reporter's hot path, counted
            poison = await ingestor.records_raw(bodies)
            with stored.get_lock():
                stored.value += ingestor.last_batch_rows
            return poison

        async with Bus.connect(nats_url, name="bench-worker") as bus:
            with ready.get_lock():
                ready.value += 1
            await asyncio.to_thread(go.wait)  # start together, once every replica has imported and connected
            started = time.process_time()

            bus.subscribe_raw(consume, durable=f"bench-{tag}", stream="KVBENCH_RECORDS", batch=100)
            while stored.value < N:
                await asyncio.sleep(0.05)
            with cpu.get_lock():
                cpu.value += time.process_time() - started
        await store.close()

    asyncio.run(run())


async def one_round(
    bus: Bus,
    store: Store,
    servers: tuple[EmbeddedNats, EmbeddedPostgres],
    records: list[RequestRecord],
    tag: str,
    form: type[RecordsColumnar] | type[RecordsBinary] = RecordsColumnar,
) -> tuple[float, dict[str, float | None]]:
    """Publish every record, then time the reporter process(es) draining them into PostgreSQL; returns the time and
    the CPU seconds each party spent meanwhile (the reporters, PostgreSQL's processes, the NATS server)."""
    nats, pg = servers
    nats_url, dsn = nats.url, pg.dsn
    await bus.js.purge_stream("KVBENCH_RECORDS")
    await store.pool.execute("TRUNCATE request_records")
    # the previous round's baselines wrote about 800,000 rows: write them out now, or the checkpoint they cause
    # lands inside this round and times PostgreSQL flushing the benchmark's own leftovers (the second round was
    # consistently the slowest before this). Ingestion's own writes and checkpoints are still timed.
    await store.pool.execute("CHECKPOINT")
    pending = []
    for start in range(0, N, BATCH):
        msg = form.from_records("R", "J1", "s", records[start : start + BATCH])
        pending.append(bus.js.publish(msg.subject(), msg.to_bytes(), headers={"Nats-Msg-Id": msg.event_id}))
        if len(pending) >= 64:
            await asyncio.gather(*pending)
            pending = []
    await asyncio.gather(*pending)
    ctx = multiprocessing.get_context("spawn")
    stored, ready, go, cpu = ctx.Value("q", 0), ctx.Value("q", 0), ctx.Event(), ctx.Value("d", 0.0)
    workers = [ctx.Process(target=worker, args=(nats_url, dsn, stored, ready, go, tag, cpu)) for _ in range(WORKERS)]
    for process in workers:
        process.start()
    while ready.value < WORKERS:
        await asyncio.sleep(0.05)
    postmaster = int((pg.data_dir / "postmaster.pid").read_text().split()[0])
    before = {"postgresql": tree_cpu_s(postmaster), "nats": tree_cpu_s(nats.pid or 0)}
    t0 = time.perf_counter()
    go.set()
    while stored.value < N:
        await asyncio.sleep(0.02)
    ingest_s = time.perf_counter() - t0
    after = {"postgresql": tree_cpu_s(postmaster), "nats": tree_cpu_s(nats.pid or 0)}
    for process in workers:
        process.join(timeout=30)
    assert await store.pool.fetchval("SELECT count(*) FROM request_records") == N
    spent: dict[str, float | None] = {"reporter": cpu.value}
    for party, at_go in before.items():
        at_end = after[party]
        spent[party] = None if at_go is None or at_end is None else at_end - at_go
    return ingest_s, spent


async def main() -> None:
    nats = EmbeddedNats(Path(tempfile.mkdtemp())).start()
    pg = EmbeddedPostgres.in_temp_dir(durable=DURABLE).start()
    try:
        async with Bus.connect(nats.url, name="bench") as bus:
            store = await Store.open(pg.dsn)  # applies the migrations before the workers start
            # the previous schema's table, for the baseline: every row under a primary key of three text columns
            await store.pool.execute("CREATE TABLE keyed_records (LIKE request_records)")
            await store.pool.execute("ALTER TABLE keyed_records ADD PRIMARY KEY (run_id, job_id, request_id)")
            ingest_rates: list[float] = []
            previous_form_rates: list[float] = []
            cpu_us: dict[str, list[float]] = {"reporter": [], "postgresql": [], "nats": []}
            copy_rates: list[float] = []
            writer_rates: list[float] = []
            keyed_rates: list[float] = []
            binary_rates: list[float] = []
            build_us: list[float] = []
            for round_no in range(ROUNDS):
                records = make_records("J1", N)  # fresh request ids: each round is new data, not a redelivery
                # baseline first, in the same round: the load generator's previous form (scalar columns as JSON)
                baseline_s, _ = await one_round(bus, store, (nats, pg), records, f"b{round_no}", RecordsBinary)
                previous_form_rates.append(N / baseline_s)
                ingest_s, spent = await one_round(bus, store, (nats, pg), records, f"r{round_no}")
                ingest_rates.append(N / ingest_s)
                for party, seconds in spent.items():
                    if seconds is not None:
                        cpu_us[party].append(seconds / N * 1e6)
                rows = record_rows("R", records)
                conn = await asyncpg.connect(pg.dsn)
                for table, rates in (("request_records", copy_rates), ("keyed_records", keyed_rates)):
                    await conn.execute(f"TRUNCATE {table}")
                    t0 = time.perf_counter()
                    await conn.copy_records_to_table(table, records=rows, columns=RECORD_COLUMNS)
                    rates.append(N / (time.perf_counter() - t0))
                bodies = [RecordsBinary.from_records("R", "J1", "s", records[i : i + BATCH]).to_bytes()
                          for i in range(0, N, BATCH)]  # fmt: skip
                # the reporter's writer alone (decoded tables from memory, claims and ADBC's COPY, groups of 100)
                decoded_batches = [
                    decode_batch(RecordsColumnar.from_records("R", "J1", "s", records[i : i + BATCH]).to_bytes())[0]
                    for i in range(0, N, BATCH)
                ]
                await conn.execute("TRUNCATE request_records, record_batches")
                t0 = time.perf_counter()
                for i in range(0, len(decoded_batches), 100):
                    await store.insert_batches(decoded_batches[i : i + 100])
                writer_rates.append(N / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                payload = _COPY_HEADER + b"".join(binary_copy_rows(body) for body in bodies) + _COPY_TRAILER
                build_us.append((time.perf_counter() - t0) / N * 1e6)
                await conn.execute("TRUNCATE request_records")
                t0 = time.perf_counter()
                await conn.copy_to_table("request_records", source=io.BytesIO(payload), columns=RECORD_COLUMNS,
                                         format="binary")  # fmt: skip
                binary_rates.append(N / (time.perf_counter() - t0))
                if round_no == 0:  # the same rows as the reporter's decoding gives, value for value
                    stored = await conn.fetch("SELECT * FROM request_records ORDER BY start_s LIMIT 3")
                    decoded = decode_batch(bodies[0])[0].table.slice(0, 3).to_pylist()
                    assert [dict(r) for r in stored] == decoded, "binary COPY rows differ from the decoded ones"
                await conn.close()
            await store.close()
        print(
            f"records: {N:,} per round (32 chunk times each), batches of {BATCH}, {ROUNDS} rounds; PostgreSQL "
            + ("durable (fsync on, as kvbench up runs it)" if DURABLE else "with fsync off (the test fixtures' server)")
        )
        print(
            f"ingestion JetStream -> PostgreSQL, {WORKERS} reporter process(es): median "
            f"{statistics.median(ingest_rates):,.0f} records/s (goal 100,000); rounds: "
            + ", ".join(f"{r:,.0f}" for r in ingest_rates)
        )
        print(
            "baseline, the same with the previous form (RecordsBinary: scalar columns as JSON lists): median "
            f"{statistics.median(previous_form_rates):,.0f} records/s; rounds: "
            + ", ".join(f"{r:,.0f}" for r in previous_form_rates)
        )
        if all(cpu_us.values()):
            per_record = {party: statistics.median(values) for party, values in cpu_us.items()}
            total, cores = sum(per_record.values()), os.cpu_count() or 1
            print(
                "CPU a record during ingestion (medians): "
                + ", ".join(f"{party} {us:.2f} us" for party, us in per_record.items())
                + f"; {total:.2f} us in all, so {cores} cores ingest at most {cores / total * 1e6:,.0f} records/s with "
                f"every core busy, and PostgreSQL's share alone caps one COPY stream at "
                f"{1e6 / per_record['postgresql']:,.0f} records/s (issue 18's goal: 250,000)"
            )
        sample = make_records("J1", 20_000)
        for form in (RecordsPacked, RecordsBinary, RecordsColumnar):
            bodies = [
                form.from_records("R", "J1", "s", sample[i : i + BATCH]).to_bytes() for i in range(0, 20_000, BATCH)
            ]
            decode_batch(bodies[0])  # pyarrow compiles some kernels on first use: not a cost a record
            t0 = time.perf_counter()
            for body in bodies:
                decode_batch(body)
            per_record_us = (time.perf_counter() - t0) / 20_000 * 1e6
            print(f"decoding alone, {form.__name__} ({form.SCHEMA}): {per_record_us:.2f} us a record")
        print(
            f"the reporter's writer alone from memory (Arrow tables, ADBC's COPY): median "
            f"{statistics.median(writer_rates):,.0f} records/s; rounds: " + ", ".join(f"{r:,.0f}" for r in writer_rates)
        )
        print(
            f"baseline, asyncpg's COPY alone of Python tuples from memory (the reporter's writer before): median "
            f"{statistics.median(copy_rates):,.0f} records/s; rounds: " + ", ".join(f"{r:,.0f}" for r in copy_rates)
        )
        print(
            "baseline, COPY alone into the previous schema (a primary key over run, job and request ids): median "
            f"{statistics.median(keyed_rates):,.0f} records/s; rounds: " + ", ".join(f"{r:,.0f}" for r in keyed_rates)
        )
        print(
            f"alternative, binary COPY rows built in Python from the packed batches: build median "
            f"{statistics.median(build_us):.2f} us a record (decoding to tuples above), COPY of the built bytes median "
            f"{statistics.median(binary_rates):,.0f} records/s; rounds: " + ", ".join(f"{r:,.0f}" for r in binary_rates)
        )
    finally:
        pg.stop()
        nats.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
