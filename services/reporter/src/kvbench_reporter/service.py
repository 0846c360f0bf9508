"""The reporter: the only writer to PostgreSQL; builds and serves reports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack

import asyncpg
import httpx
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from kvbench_contracts.envelope import Envelope, utc_now
from kvbench_contracts.events import EngineSampled
from kvbench_contracts.fabric import NicSampled, SwitchConfig, SwitchSampled, SwitchUnread
from kvbench_core.bus import Bus
from kvbench_core.kvmirror import KvMirror
from kvbench_core.logging import configure_logging
from kvbench_core.metrics import metric_name, new_registry, ops_server
from kvbench_core.service import run_service
from kvbench_core.settings import load_settings
from kvbench_reporter.dashboards import push_dashboards
from kvbench_reporter.fabric import fabric_section
from kvbench_reporter.html import render_html
from kvbench_reporter.ingest import CONTROL_MODELS, Ingestor
from kvbench_reporter.openapi import openapi_document
from kvbench_reporter.report import build_report, records_complete
from kvbench_reporter.schema import report_json_schema
from kvbench_reporter.settings import ReporterSettings
from kvbench_reporter.store import Store

__all__ = ["Reporter", "main", "run"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

log = logging.getLogger("kvbench_reporter")


# what asyncpg raises while PostgreSQL does not answer (refused, restarting, a pool whose connections broke)
DATABASE_DOWN = (OSError, asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError, asyncpg.InterfaceError,
                 TimeoutError)  # fmt: skip


def _database_down_is_503(handler: Handler) -> Handler:
    """PostgreSQL down: 503 naming it (and when to ask again), not a bare 500 and a traceback a request."""

    async def answered(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except DATABASE_DOWN as exc:
            log.warning("PostgreSQL does not answer: a report request refused with 503",
                        extra={"path": request.path, "error": f"{type(exc).__name__}: {exc}"[:300]})  # fmt: skip
            return web.json_response(
                {"detail": "PostgreSQL, where the reporter keeps every record and report, does not answer "
                 f"({type(exc).__name__}); ask again once it is back (kvbench status shows it)"},
                status=503, headers={"Retry-After": "5"},
            )  # fmt: skip

    return answered


class Reporter:
    def __init__(self, store: Store, settings: ReporterSettings, registry: CollectorRegistry) -> None:
        self.store = store
        self.settings = settings
        self.ingestor = Ingestor(store, self.on_run_finished)
        self._tasks: set[asyncio.Task[None]] = set()
        self._finalizing: set[str] = set()  # runs whose report waits for records and switch reads
        self.switches: KvMirror | None = None  # set by run(): the connected switches
        self.m_records = Counter(
            metric_name("reporter", "records_ingested", "total"), "Request records stored", registry=registry
        )
        self.m_lag = Gauge(
            metric_name("reporter", "ingest_lag", "seconds"),
            "Age of the newest ingested batch when it was written",
            ["stream"],
            registry=registry,
        )
        self.m_reports = Counter(metric_name("reporter", "reports_built", "total"), "Reports built", registry=registry)

    def _lag(self, stream: str, events: Sequence[Envelope]) -> None:
        if events:
            newest = max(e.occurred_at for e in events)
            self.m_lag.labels(stream).set(max(0.0, (utc_now() - newest).total_seconds()))

    async def on_control(self, events: list[Envelope]) -> None:
        await self.ingestor.control(events)
        self._lag("control", events)

    async def on_records(self, bodies: list[bytes]) -> list[int]:
        poison = await self.ingestor.records_raw(bodies)
        self.m_records.inc(self.ingestor.last_batch_rows)
        if self.ingestor.last_batch_at is not None:
            self.m_lag.labels("records").set(max(0.0, (utc_now() - self.ingestor.last_batch_at).total_seconds()))
        return poison

    async def on_telemetry(self, samples: list[Envelope]) -> None:
        await self.store.insert_engine_samples([s for s in samples if isinstance(s, EngineSampled)])
        self._lag("telemetry", samples)

    async def on_fabric(self, events: list[Envelope]) -> None:
        await self.store.insert_switch_reads(events)
        self._lag("fabric", events)

    async def on_run_finished(self, run_id: str) -> None:
        self._finalizing.add(run_id)
        task = asyncio.create_task(self.finalize(run_id), name=f"report:{run_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def finalize(self, run_id: str) -> None:
        """Wait until every finished job's records are stored, then build and keep the report."""
        try:
            # records come through another consumer: poll the table until every job's count is reached
            for _ in range(max(1, int(self.settings.completeness_timeout_s / 0.25))):
                if await records_complete(self.store, run_id):
                    break
                await asyncio.sleep(0.25)
            await self._await_switch_reads(run_id)
            await self.build(run_id)
        except Exception:  # a background task must not die silently: the report would never be built
            log.exception("report could not be built", extra={"run_id": run_id})
        finally:
            self._finalizing.discard(run_id)

    def switch_configs(self) -> dict[str, SwitchConfig]:
        """The connected switches (the ``kvbench_switches`` bucket), for ports to ignore and switches that carry no
        benchmark traffic."""
        if self.switches is None:
            return {}
        out = {}
        for name, raw in self.switches.snapshot().items():
            with contextlib.suppress(ValueError):
                out[name] = SwitchConfig.model_validate_json(raw)
        return out

    async def _await_switch_reads(self, run_id: str) -> None:
        """The switches' first reads after the run come a poll interval later: give them that long."""
        run = await self.store.run(run_id)
        if run is None:
            return
        began = [job["started_at"] for job in await self.store.jobs(run_id) if job["started_at"] is not None]
        deadline = time.monotonic() + self.settings.fabric_wait_s
        while time.monotonic() < deadline:
            section = await fabric_section(
                self.store,
                run_id,
                run["started_at"],
                run["finished_at"],
                configs=self.switch_configs(),
                load_began=min(began, default=None),
            )
            if section["publish_gate"]["publishable"] or any(
                s.get("failed_reads") for s in section["switches"] if not s["read"]
            ):
                return
            await asyncio.sleep(1.0)
        log.warning("switches still unread after the fabric wait", extra={"run_id": run_id})

    async def build(self, run_id: str) -> tuple[dict[str, object], str] | None:
        report = await build_report(
            self.store,
            run_id,
            {
                "price_per_gpu_hour": self.settings.price_per_gpu_hour,
                "target_goodput_rps": self.settings.target_goodput_rps,
                "switches": self.switch_configs(),
            },
        )
        if report is None:
            return None
        html = render_html(report)
        await self.store.save_report(run_id, report, html)
        self.m_reports.inc()
        log.info("report built", extra={"run_id": run_id, "workloads": len(report["workloads"])})
        return report, html

    async def report_for(self, run_id: str) -> tuple[dict[str, object], str] | None:
        if run_id in self._finalizing:
            return None  # records or switch reads are still coming: the caller hears 409 and asks again
        stored = await self.store.load_report(run_id)
        if stored is not None:
            return stored
        run = await self.store.run(run_id)
        if run is None or run["finished_at"] is None:
            return None
        return await self.build(run_id)

    def routes(self) -> list[web.RouteDef]:
        async def report_json(request: web.Request) -> web.Response:
            run_id = request.match_info["run_id"]
            found = await self.report_for(run_id)
            if found is None:
                return await self._not_ready(run_id)
            return web.json_response(found[0])

        async def report_html(request: web.Request) -> web.Response:
            run_id = request.match_info["run_id"]
            found = await self.report_for(run_id)
            if found is None:
                return await self._not_ready(run_id)
            return web.Response(text=found[1], content_type="text/html")

        async def records_jsonl(request: web.Request) -> web.StreamResponse:
            """The run's request records in the public export format, streamed as JSON Lines."""
            run_id = request.match_info["run_id"]
            if await self.store.run(run_id) is None:
                return web.json_response({"detail": f"no run {run_id}"}, status=404)
            response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
            await response.prepare(request)
            async for chunk in self.store.run_records(run_id):
                await response.write("".join(r.model_dump_json() + "\n" for r in chunk).encode())
            await response.write_eof()
            return response

        async def report_schema(_: web.Request) -> web.Response:
            return web.json_response(report_json_schema())

        async def openapi(_: web.Request) -> web.Response:
            return web.json_response(openapi_document())

        def guarded(handler: Handler) -> Handler:
            return self._guarded(_database_down_is_503(handler))

        return [
            web.get("/v1/runs/{run_id}/report", guarded(report_json)),
            web.get("/v1/runs/{run_id}/report.html", guarded(report_html)),
            web.get("/v1/runs/{run_id}/records", guarded(records_jsonl)),
            web.get("/v1/reports/schema", report_schema),
            web.get("/openapi.json", openapi),
        ]

    def _guarded(self, handler: Handler) -> Handler:
        """A run's reports and records need the API's bearer token when one is set, as the planner's reads do."""
        expected = self.settings.bearer_token()
        if expected is None:
            return handler

        async def checked(request: web.Request) -> web.StreamResponse:
            given = request.headers.get("Authorization", "").removeprefix("Bearer ").encode("utf-8", "surrogateescape")
            if not secrets.compare_digest(given, expected.encode("utf-8")):
                return web.json_response(
                    {"detail": "a valid bearer token is required (Authorization: Bearer ...; KVBENCH_API_TOKEN)"},
                    status=401,
                )
            return await handler(request)

        return checked

    async def _not_ready(self, run_id: str) -> web.Response:
        run = await self.store.run(run_id)
        if run is None:
            return web.json_response(
                {
                    "detail": f"no run {run_id} in this reporter's database: a run submitted a moment ago shows up "
                    "within seconds; an id from another deployment, or one whose results were wiped "
                    "(`kvbench down --wipe`, `make clean`), never will"
                },
                status=404,
            )
        if run_id in self._finalizing:
            return web.json_response({"detail": f"run {run_id} ended; its report is being built"}, status=409)
        return web.json_response(
            {"detail": f"run {run_id} is {run['status']}; the report comes when it ends"}, status=409
        )

    async def drain(self) -> None:
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await task


async def run(settings: ReporterSettings, stop: asyncio.Event) -> None:
    registry = new_registry()
    async with AsyncExitStack() as stack:
        store = await Store.open(settings.database_url)
        stack.push_async_callback(store.close)
        bus = await stack.enter_async_context(
            Bus.connect(
                settings.nats_url,
                name="reporter",
                registry=registry,
                service="reporter",
                auth=settings.nats_auth(),
                replicas=settings.nats_replicas,
            )
        )
        reporter = Reporter(store, settings, registry)
        reporter.switches = await bus.kv_mirror("kvbench_switches")
        stack.push_async_callback(reporter.switches.stop)

        async def healthy() -> bool:
            return bus.nc.is_connected

        await stack.enter_async_context(
            ops_server(registry, settings.port, healthy, host=settings.host, extra_routes=reporter.routes())
        )
        bus.subscribe_batch(
            CONTROL_MODELS,
            reporter.on_control,
            durable="reporter-control",
            ack_wait_s=10.0,
            stream="KVBENCH_CONTROL",
            batch=200,
        )
        # short ack waits: a batch commits in about a second, and a batch held by a crashed reporter comes back
        # to the next one after ack_wait, well inside the report's completeness wait
        bus.subscribe_raw(
            reporter.on_records, durable="reporter-records", stream="KVBENCH_RECORDS", batch=100, ack_wait_s=10.0
        )
        bus.subscribe_batch(
            [EngineSampled],
            reporter.on_telemetry,
            durable="reporter-telemetry",
            filter_subject="kvbench.engine.>",
            batch=200,
        )
        bus.subscribe_batch(
            [SwitchSampled, SwitchUnread],
            reporter.on_fabric,
            durable="reporter-fabric",
            filter_subject="kvbench.switch.>",
            batch=100,
        )
        bus.subscribe_batch(
            [NicSampled], reporter.on_fabric, durable="reporter-nic", filter_subject="kvbench.nic.>", batch=100
        )
        if settings.grafana_url and settings.grafana_token:
            try:
                pushed = await asyncio.to_thread(
                    push_dashboards, settings.grafana_url, settings.grafana_token.get_secret_value()
                )
                log.info("dashboards pushed to Grafana", extra={"dashboards": pushed})
            except httpx.HTTPError as exc:
                log.warning("could not push dashboards to Grafana", extra={"error": str(exc)[:300]})
        log.info("reporter ready", extra={"port": settings.port})
        await stop.wait()
        await reporter.drain()


def main() -> None:
    settings = load_settings(ReporterSettings)
    configure_logging("reporter", settings.log_level, settings.log_json)
    run_service(lambda stop: run(settings, stop))
