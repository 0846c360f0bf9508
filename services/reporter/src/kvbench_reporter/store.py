"""PostgreSQL access: migrations, idempotent bulk writes (a key per message, then COPY), report reads."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from kvbench_contracts.envelope import Envelope
from kvbench_contracts.events import EngineSampled
from kvbench_contracts.fabric import NicSampled, SwitchSampled, SwitchUnread
from kvbench_contracts.records import RECORD_COLUMNS, RequestRecord
from kvbench_core.columns import Columns, pack_floats, pack_ints, unpack_floats, unpack_ints

__all__ = ["Conn", "RecordBatch", "Store", "apply_migrations", "record_rows"]

# a plain connection or one borrowed from the pool: both run the same queries
Conn: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """One message's records as COPY rows: the unit a redelivery repeats (its event id is the message's)."""

    event_id: str
    run_id: str
    job_id: str | None
    rows: list[tuple[object, ...]]


def record_rows(run_id: str, records: Sequence[RequestRecord]) -> list[tuple[object, ...]]:
    """Records as rows in RECORD_COLUMNS order, for COPY (chunk arrays packed as bytea)."""
    return [
        (
            r.job_id,
            r.request_id,
            run_id,
            r.workload,
            r.session_id,
            r.turn,
            r.start_s,
            r.ttft_s,
            r.e2e_s,
            pack_floats(r.chunk_times_s),
            pack_ints(r.chunk_tokens),
            r.prompt_tokens,
            r.output_tokens,
            r.cached_tokens,
            r.ok,
            r.error,
            r.shard,
            r.connect_s,
        )
        for r in records
    ]


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
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @classmethod
    async def open(cls, dsn: str) -> Store:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=8)
        async with pool.acquire() as conn:
            await apply_migrations(conn)
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

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
        return await self.insert_batches([RecordBatch(batch_id, run_id, job_id, record_rows(run_id, records))])

    async def insert_batches(self, batches: Sequence[RecordBatch]) -> int:
        """One transaction: claim each batch's event id, then one COPY of the rows of the batches claimed now. A
        redelivered batch (its id already stored, or claimed by another reporter that is committing it) adds no
        rows. Returns the rows stored."""
        unique = list({b.event_id: b for b in batches if b.rows}.values())
        if not unique:
            return 0
        async with self.pool.acquire() as conn, conn.transaction():
            claimed = await conn.fetch(
                "INSERT INTO record_batches (event_id, run_id, job_id, records) "
                "SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int[]) "
                "ON CONFLICT (event_id) DO NOTHING RETURNING event_id",
                [b.event_id for b in unique],
                [b.run_id for b in unique],
                [b.job_id for b in unique],
                [len(b.rows) for b in unique],
            )
            new = {r["event_id"] for r in claimed}
            if len(new) == len(unique) and len(unique) == 1:
                rows = unique[0].rows
            else:
                rows = [row for b in unique if b.event_id in new for row in b.rows]
            if rows:
                await conn.copy_records_to_table("request_records", records=rows, columns=RECORD_COLUMNS)
        return len(rows)

    async def insert_engine_samples(self, samples: Sequence[EngineSampled]) -> None:
        async with self.pool.acquire() as conn:
            await conn.executemany(
                "INSERT INTO engine_samples (event_id, run_id, node_id, engine_id, sampled_at, samples, normalized, "
                "gpus, role) VALUES ($1,$2,$3,$4,$5,$6::jsonb,$7::jsonb,$8::jsonb,$9) "
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
                "SELECT engine_id, node_id, role, sampled_at, samples, normalized, gpus FROM engine_samples "
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
