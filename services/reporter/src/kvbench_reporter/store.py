"""PostgreSQL access: migrations, idempotent bulk writes (a key per message, then COPY), report reads."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import queue
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any, TypeAlias

import adbc_driver_postgresql.dbapi as adbc_pg
import asyncpg
import pyarrow as pa
from asyncpg.pool import PoolConnectionProxy

from kvbench_contracts.envelope import Envelope
from kvbench_contracts.events import EngineSampled
from kvbench_contracts.fabric import NicSampled, SwitchSampled, SwitchUnread
from kvbench_contracts.records import RECORD_COLUMNS, RequestRecord
from kvbench_core.columns import Columns, unpack_floats, unpack_ints
from kvbench_reporter.record_tables import requests_table

__all__ = ["Conn", "RecordBatch", "RecordWriter", "Store", "apply_migrations"]

# a plain connection or one borrowed from the pool: both run the same queries
Conn: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """One message's records as stored rows: the unit a redelivery repeats (its event id is the message's)."""

    event_id: str
    run_id: str
    job_id: str | None
    table: pa.Table  # RECORD_SCHEMA (kvbench_reporter.record_tables)


# one statement claims a whole fetched group's event ids: the group travels as one JSON parameter (never as SQL text)
_CLAIM = (
    "INSERT INTO record_batches (event_id, run_id, job_id, records) "
    "SELECT event_id, run_id, job_id, records FROM jsonb_to_recordset($1::jsonb) "
    "AS claim(event_id text, run_id text, job_id text, records integer) "
    "ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
)


class RecordWriter:
    """Writes record batches through ADBC's PostgreSQL driver (libpq, and a binary COPY built in C++ from the Arrow
    tables with the GIL released): the claim of the batches' event ids and the COPY of the rows claimed, in one
    transaction. Blocking: called in a worker thread. Up to ``connections`` writes at once, each on a connection
    of its own; a connection that failed is closed, not reused."""

    def __init__(self, dsn: str, connections: int = 2) -> None:
        self._dsn = dsn
        self._idle: queue.LifoQueue[adbc_pg.Connection] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(connections)

    def write(self, batches: Sequence[RecordBatch]) -> int:
        with self._slots:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                conn = adbc_pg.connect(self._dsn)
            try:
                stored = self._write(conn, batches)
            except BaseException:
                with contextlib.suppress(Exception):
                    conn.rollback()
                with contextlib.suppress(Exception):
                    conn.close()
                raise
            self._idle.put(conn)
            return stored

    @staticmethod
    def _write(conn: adbc_pg.Connection, batches: Sequence[RecordBatch]) -> int:
        claims = [
            {"event_id": b.event_id, "run_id": b.run_id, "job_id": b.job_id, "records": b.table.num_rows}
            for b in batches
        ]
        with conn.cursor() as cursor:
            cursor.execute(_CLAIM, (json.dumps(claims),))
            new = {row[0] for row in cursor.fetchall()}
            tables = [b.table for b in batches if b.event_id in new]
            stored = int(sum(t.num_rows for t in tables))
            if stored:
                cursor.adbc_ingest("request_records", pa.concat_tables(tables), mode="append")
        conn.commit()
        return stored

    def close(self) -> None:
        while True:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                return
            with contextlib.suppress(Exception):
                conn.close()


def _migrations() -> list[tuple[int, str]]:
    folder = resources.files("kvbench_reporter").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            found.append((int(entry.name.split("_", 1)[0]), entry.read_text()))
    return sorted(found)


async def apply_migrations(conn: Conn) -> list[int]:
    """Apply each migration once, in order, under an advisory lock (several reporters may start)."""
    applied: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(7217001)")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, sql in _migrations():
            if version in done:
                continue
            await conn.execute(sql)
            await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", version)
            applied.append(version)
    return applied


def _record(row: asyncpg.Record) -> RequestRecord:
    data = dict(row)
    data["chunk_times_s"] = unpack_floats(data["chunk_times_s"])
    data["chunk_tokens"] = unpack_ints(data["chunk_tokens"])
    return RequestRecord.model_validate(data)


def _ids(event: Envelope) -> tuple[str | None, str | None, str | None]:
    return (getattr(event, "run_id", None), getattr(event, "job_id", None), getattr(event, "node_id", None))


class Store:
    def __init__(self, pool: asyncpg.Pool, records: RecordWriter) -> None:
        self.pool = pool
        self.record_writer = records

    @classmethod
    async def open(cls, dsn: str) -> Store:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=8)
        async with pool.acquire() as conn:
            await apply_migrations(conn)
        return cls(pool, RecordWriter(dsn))

    async def close(self) -> None:
        await self.pool.close()
        await asyncio.to_thread(self.record_writer.close)

    # -- writes -------------------------------------------------------------------------------
    async def insert_events(self, conn: Conn, events: Sequence[Envelope]) -> None:
        rows = []
        for event in events:
            run_id, job_id, node_id = _ids(event)
            rows.append(
                (
                    event.event_id,
                    event.schema_name,
                    event.subject(),
                    run_id,
                    job_id,
                    node_id,
                    event.occurred_at,
                    event.model_dump_json(by_alias=True),
                )
            )
        await conn.executemany(
            "INSERT INTO events (event_id, schema, subject, run_id, job_id, node_id, occurred_at, payload) "
            "VALUES ($1,$2,$3,$4,$5,$6,$7,$8::jsonb) ON CONFLICT (event_id) DO NOTHING",
            rows,
        )

    async def insert_records(self, run_id: str, records: Sequence[RequestRecord], batch_id: str | None = None) -> int:
        """Records outside a message (an import, a test): the batch key is the message's id where there is one,
        else one derived from the run and the request ids, so inserting the same records again stores nothing."""
        if batch_id is None:
            digest = hashlib.sha256("\n".join([run_id, *(f"{r.job_id}/{r.request_id}" for r in records)]).encode())
            batch_id = f"records:{digest.hexdigest()[:32]}"
        job_ids = {r.job_id for r in records}
        job_id = job_ids.pop() if len(job_ids) == 1 else None
        return await self.insert_batches([RecordBatch(batch_id, run_id, job_id, requests_table(run_id, records))])

    async def insert_batches(self, batches: Sequence[RecordBatch]) -> int:
        """One transaction: claim each batch's event id, then one COPY of the rows of the batches claimed now. A
        redelivered batch (its id already stored, or claimed by another reporter that is committing it) adds no
        rows. Returns the rows stored."""
        unique = list({b.event_id: b for b in batches if b.table.num_rows}.values())
        if not unique:
            return 0
        return await asyncio.to_thread(self.record_writer.write, unique)

    async def insert_engine_samples(self, samples: Sequence[EngineSampled]) -> None:
        async with self.pool.acquire() as conn:
            await conn.executemany(
                "INSERT INTO engine_samples (event_id, run_id, node_id, engine_id, sampled_at, samples, normalized, "
                "gpus, role, job_id, edge, edge_at) VALUES ($1,$2,$3,$4,$5,$6::jsonb,$7::jsonb,$8::jsonb,$9,$10,$11,"
                "$12) "
                "ON CONFLICT (event_id) DO NOTHING",
                [
                    (
                        s.event_id,
                        s.run_id,
                        s.node_id,
                        s.engine_id,
                        s.occurred_at,
                        json.dumps(s.values),
                        json.dumps(s.normalized),
                        json.dumps(s.gpus),
                        s.role,
                        s.job_id,
                        s.edge,
                        datetime.fromtimestamp(s.edge_at, UTC) if s.edge_at is not None else None,
                    )
                    for s in samples
                ],
            )

    async def insert_switch_reads(self, events: Sequence[Envelope]) -> None:
        """Switch reads: the outcome of each (for the publish gate) and, when good, every counter sample; and the
        machines' own NIC samples (the host side of each cable)."""
        reads: list[tuple[str, str, bool, str | None, datetime, str]] = []
        samples: list[tuple[object, ...]] = []
        for e in events:
            if isinstance(e, SwitchSampled):
                lldp = json.dumps([n.model_dump() for n in e.lldp_remote])
                reads.append((e.event_id, e.switch, True, None, e.occurred_at, lldp))
            elif isinstance(e, SwitchUnread):
                reads.append((e.event_id, e.switch, False, e.reason, e.occurred_at, "[]"))
            if isinstance(e, SwitchSampled | NicSampled):
                samples += [
                    (
                        e.event_id,
                        s.device,
                        s.port,
                        s.counter,
                        json.dumps(s.qualifier, sort_keys=True) if s.qualifier else "",
                        s.value,
                        s.unit,
                        s.source,
                        None,
                        datetime.fromtimestamp(s.ts_response_ns / 1e9, tz=UTC),
                        s.epoch,
                    )
                    for s in e.samples
                ]
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.executemany(
                "INSERT INTO switch_reads (event_id, switch, ok, reason, read_at, lldp_remote) "
                "VALUES ($1,$2,$3,$4,$5,$6::jsonb) ON CONFLICT (event_id) DO NOTHING",
                reads,
            )
            await conn.executemany(
                "INSERT INTO fabric_samples (event_id, device, port, counter, qualifier, value, unit, source, "
                "device_ts, poll_ts, epoch) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11) ON CONFLICT DO NOTHING",
                samples,
            )

    # -- reads --------------------------------------------------------------------------------
    async def run(self, run_id: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow("SELECT * FROM runs WHERE run_id = $1", run_id)

    async def jobs(self, run_id: str) -> list[asyncpg.Record]:
        return list(
            await self.pool.fetch("SELECT * FROM jobs WHERE run_id = $1 ORDER BY workload, load_level, repeat", run_id)
        )

    async def workloads(self, run_id: str) -> list[asyncpg.Record]:
        return list(await self.pool.fetch("SELECT * FROM workloads WHERE run_id = $1", run_id))

    async def record_counts(self, run_id: str) -> dict[str, int]:
        rows = await self.pool.fetch(
            "SELECT job_id, count(*) AS n FROM request_records WHERE run_id = $1 GROUP BY job_id", run_id
        )
        return {r["job_id"]: int(r["n"]) for r in rows}

    async def records(self, run_id: str, job_id: str) -> list[RequestRecord]:
        rows = await self.pool.fetch(
            f"SELECT {', '.join(c for c in RECORD_COLUMNS if c != 'run_id')} "  # noqa: S608 (fixed columns)
            "FROM request_records WHERE run_id = $1 AND job_id = $2 ORDER BY start_s",
            run_id,
            job_id,
        )
        return [_record(row) for row in rows]

    async def job_columns(self, run_id: str, job_id: str) -> Columns:
        """A job's records as columns: no Python object per request (the report's path for large runs)."""
        rows = await self.pool.fetch(
            "SELECT start_s, ttft_s, e2e_s, ok, prompt_tokens, output_tokens, cached_tokens, chunk_times_s, "
            "chunk_tokens, connect_s FROM request_records WHERE run_id = $1 AND job_id = $2",
            run_id,
            job_id,
        )
        return Columns.from_rows(rows)

    async def run_records(self, run_id: str, batch: int = 5000) -> AsyncIterator[list[RequestRecord]]:
        """Every record of a run in the export format, in batches (a cursor, so memory stays flat)."""
        columns = ", ".join(c for c in RECORD_COLUMNS if c != "run_id")
        async with self.pool.acquire() as conn, conn.transaction():
            cursor = conn.cursor(
                f"SELECT {columns} FROM request_records WHERE run_id = $1 "  # noqa: S608 (fixed columns)
                "ORDER BY job_id, start_s",
                run_id,
                prefetch=batch,
            )
            chunk: list[RequestRecord] = []
            async for row in cursor:
                chunk.append(_record(row))
                if len(chunk) >= batch:
                    yield chunk
                    chunk = []
            if chunk:
                yield chunk

    async def engine_samples(self, run_id: str, start: datetime, end: datetime) -> list[asyncpg.Record]:
        return list(
            await self.pool.fetch(
                "SELECT engine_id, node_id, role, sampled_at, samples, normalized, gpus, job_id, edge, edge_at "
                "FROM engine_samples "
                "WHERE run_id = $1 "
                "AND sampled_at BETWEEN $2 AND $3 ORDER BY engine_id, sampled_at",
                run_id,
                start,
                end,
            )
        )

    async def events(self, run_id: str) -> list[asyncpg.Record]:
        return list(
            await self.pool.fetch(
                "SELECT schema, subject, occurred_at, node_id, job_id, payload FROM events WHERE run_id = $1 "
                "AND schema <> 'kvbench.job.progressed/1' ORDER BY occurred_at",
                run_id,
            )
        )

    async def inventories(self, node_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The machines' inventories as their agents last registered them (GPUs, cores, memory)."""
        rows = await self.pool.fetch("SELECT node_id, inventory FROM node_inventory WHERE node_id = ANY($1)", node_ids)
        return {
            str(r["node_id"]): json.loads(r["inventory"]) if isinstance(r["inventory"], str) else dict(r["inventory"])
            for r in rows
        }

    async def save_report(self, run_id: str, report: dict[str, Any], html: str) -> None:
        await self.pool.execute(
            "INSERT INTO reports (run_id, report, html) VALUES ($1, $2::jsonb, $3) "
            "ON CONFLICT (run_id) DO UPDATE SET report = EXCLUDED.report, html = EXCLUDED.html, created_at = now()",
            run_id,
            json.dumps(report),
            html,
        )

    async def load_report(self, run_id: str) -> tuple[dict[str, Any], str] | None:
        row = await self.pool.fetchrow("SELECT report, html FROM reports WHERE run_id = $1", run_id)
        if row is None:
            return None
        return json.loads(row["report"]), str(row["html"])
