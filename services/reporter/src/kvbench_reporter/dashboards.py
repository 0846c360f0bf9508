"""Grafana dashboards, built with grafana-foundation-sdk (the Grafana 11.6 flavour, schemaVersion 41).

Panels read PostgreSQL with the report's definitions written in SQL (percentile_cont interpolates linearly,
as numpy does) and Prometheus for the services' own metrics. ``$run_id`` is a dashboard variable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from grafana_foundation_sdk.builders import prometheus, table, timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard, QueryVariable, Row
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

__all__ = ["PANEL_SQL", "build_dashboards", "export_dashboards", "push_dashboards"]

PG = DataSourceRef(type_val="grafana-postgresql-datasource", uid="kvbench-pg")
PROM = DataSourceRef(type_val="prometheus", uid="kvbench-prom")

_MEASURED = """WITH measured AS (
  SELECT r.*, j.started_at, j.time_scale FROM request_records r JOIN jobs j USING (job_id)
  WHERE r.run_id = '$run_id' AND j.status = 'succeeded' AND r.ok
    AND r.start_s >= j.warmup_s AND r.start_s + r.e2e_s <= j.load_duration_s
), windows AS (
  SELECT workload, sum(load_duration_s - warmup_s) AS window_s FROM jobs
  WHERE run_id = '$run_id' AND status = 'succeeded' GROUP BY workload
)"""

# the run's span with a minute either side (switch polls bracket the run; a run still going ends now)
_RUN_SPAN = """WITH span AS (
  SELECT coalesce(started_at, submitted_at) - interval '1 minute' AS t0,
    coalesce(finished_at, now()) + interval '1 minute' AS t1
  FROM runs WHERE run_id = '$run_id'
)"""

PANEL_SQL: dict[str, str] = {
    "workloads_compared": _MEASURED
    + """
SELECT m.workload,
  count(*) AS requests_measured,
  percentile_cont(0.5) WITHIN GROUP (ORDER BY m.ttft_s) * 1000 AS ttft_p50_ms,
  percentile_cont(0.9) WITHIN GROUP (ORDER BY m.ttft_s) * 1000 AS ttft_p90_ms,
  percentile_cont(0.99) WITHIN GROUP (ORDER BY m.ttft_s) * 1000 AS ttft_p99_ms,
  sum(m.output_tokens) / max(w.window_s) AS output_tokens_per_s,
  sum(coalesce(m.cached_tokens, 0))::float8 / nullif(sum(m.prompt_tokens), 0) AS cache_hit_ratio
FROM measured m JOIN windows w USING (workload) GROUP BY m.workload ORDER BY m.workload""",
    "requests": """SELECT workload, count(*) AS requests, count(*) FILTER (WHERE NOT ok) AS errors
FROM request_records WHERE run_id = '$run_id' GROUP BY workload ORDER BY workload""",
    "ttft_over_time": _MEASURED
    + """
SELECT m.started_at + make_interval(secs => m.start_s / m.time_scale) AS time, m.workload AS metric,
  m.ttft_s * 1000 AS value
FROM measured m ORDER BY 1""",
    "kv_usage": """SELECT sampled_at AS time, engine_id AS metric, (normalized->>'kv_usage')::float8 AS value
FROM engine_samples WHERE run_id = '$run_id' AND normalized ? 'kv_usage' ORDER BY 1""",
    "runs": """SELECT run_id, plan_name, status, submitted_at, finished_at FROM runs ORDER BY submitted_at DESC
LIMIT 200""",
    "switch_port_bits": _RUN_SPAN  # noqa: S608 (constant text; $run_id is Grafana's variable)
    + """, steps AS (
  SELECT s.poll_ts, s.device, s.port, s.counter, s.value, s.epoch,
    lag(s.value) OVER w AS prev_value, lag(s.poll_ts) OVER w AS prev_ts
  FROM fabric_samples s, span
  WHERE s.counter IN ('if.in_octets', 'if.out_octets') AND s.poll_ts BETWEEN span.t0 AND span.t1
    AND s.device IN (SELECT DISTINCT switch FROM switch_reads)
  WINDOW w AS (PARTITION BY s.device, s.port, s.counter, s.epoch ORDER BY s.poll_ts)
)
SELECT poll_ts AS time,
  device || ' ' || port || CASE counter WHEN 'if.in_octets' THEN ' in' ELSE ' out' END AS metric,
  8 * (value - prev_value)::float8 / extract(epoch FROM poll_ts - prev_ts) AS value
FROM steps WHERE prev_ts IS NOT NULL AND value >= prev_value AND poll_ts > prev_ts ORDER BY 1, 2""",
    "switch_pause_frames": _RUN_SPAN  # noqa: S608 (constant text; $run_id is Grafana's variable)
    + """, steps AS (
  SELECT s.poll_ts, s.device, s.port, s.counter, s.qualifier, s.value,
    lag(s.value) OVER w AS prev_value, lag(s.poll_ts) OVER w AS prev_ts
  FROM fabric_samples s, span
  WHERE s.counter IN ('pause.in_frames', 'pause.out_frames', 'pfc.requests', 'pfc.indications')
    AND s.poll_ts BETWEEN span.t0 AND span.t1 AND s.device IN (SELECT DISTINCT switch FROM switch_reads)
  WINDOW w AS (PARTITION BY s.device, s.port, s.counter, s.qualifier, s.epoch ORDER BY s.poll_ts)
)
SELECT poll_ts AS time,
  device || ' ' || port || ' ' || counter
    || CASE WHEN qualifier = '' THEN '' ELSE ' p' || (qualifier::jsonb->>'priority') END AS metric,
  (value - prev_value)::float8 / extract(epoch FROM poll_ts - prev_ts) AS value
FROM steps WHERE prev_ts IS NOT NULL AND value >= prev_value AND poll_ts > prev_ts ORDER BY 1, 2""",
    "switch_reads": _RUN_SPAN
    + """
SELECT r.switch, count(*) FILTER (WHERE r.ok) AS good_reads, count(*) FILTER (WHERE NOT r.ok) AS failed_reads,
  max(r.read_at) FILTER (WHERE r.ok) AS last_good_read,
  (array_agg(r.reason ORDER BY r.read_at DESC) FILTER (WHERE NOT r.ok))[1] AS last_failure
FROM switch_reads r, span WHERE r.read_at BETWEEN span.t0 AND span.t1 GROUP BY r.switch ORDER BY r.switch""",
}


class _SQLQuery(cogvariants.Dataquery):
    """The SDK has no PostgreSQL query type; this is the data source's raw-SQL target."""

    def __init__(self, sql: str, ref_id: str, fmt: str) -> None:
        self.sql, self.ref_id, self.fmt = sql, ref_id, fmt

    def to_json(self) -> dict[str, Any]:
        return {
            "refId": self.ref_id,
            "datasource": PG.to_json(),
            "rawSql": self.sql,
            "format": self.fmt,
            "rawQuery": True,
            "editorMode": "code",
        }


class _SQL(cogbuilder.Builder[cogvariants.Dataquery]):
    def __init__(self, name: str, fmt: str = "table", ref_id: str = "A") -> None:
        self._query = _SQLQuery(PANEL_SQL[name], ref_id, fmt)

    def build(self) -> cogvariants.Dataquery:
        return self._query


def _run_dashboard() -> Any:
    run_id = (
        QueryVariable("run_id")
        .label("Run")
        .datasource(PG)
        .query("SELECT run_id FROM runs ORDER BY submitted_at DESC LIMIT 100")
    )
    return (
        Dashboard("kvbench run")
        .uid("kvbench-run")
        .tags(["kvbench"])
        .refresh("30s")
        .time("now-24h", "now")
        .with_variable(run_id)
        .with_row(Row("Workloads compared"))
        .with_panel(
            table.Panel()
            .title("Workloads compared (measured requests)")
            .datasource(PG)
            .height(7)
            .span(24)
            .with_target(_SQL("workloads_compared"))
        )
        .with_panel(
            table.Panel()
            .title("Requests sent (all rows)")
            .datasource(PG)
            .height(5)
            .span(8)
            .with_target(_SQL("requests"))
        )
        .with_panel(
            timeseries.Panel()
            .title("TTFT of measured requests")
            .datasource(PG)
            .unit("ms")
            .height(8)
            .span(16)
            .with_target(_SQL("ttft_over_time", "time_series"))
        )
        .with_row(Row("Underneath"))
        .with_panel(
            timeseries.Panel()
            .title("Engine KV cache usage")
            .datasource(PG)
            .unit("percentunit")
            .height(8)
            .span(12)
            .with_target(_SQL("kv_usage", "time_series"))
        )
        .with_panel(
            timeseries.Panel()
            .title("Records ingested (reporter)")
            .datasource(PROM)
            .unit("ops")
            .height(8)
            .span(12)
            .with_target(
                prometheus.Dataquery()
                .expr("sum(rate(kvbench_reporter_records_ingested_total[1m]))")
                .legend_format("records/s")
                .ref_id("A")
            )
        )
        .with_row(Row("Network"))
        .with_panel(
            timeseries.Panel()
            .title("Switch ports: bits per second between polls")
            .datasource(PG)
            .unit("bps")
            .height(8)
            .span(12)
            .with_target(_SQL("switch_port_bits", "time_series"))
        )
        .with_panel(
            timeseries.Panel()
            .title("Pause and PFC frames per second (switch side)")
            .datasource(PG)
            .unit("ops")
            .height(8)
            .span(12)
            .with_target(_SQL("switch_pause_frames", "time_series"))
        )
        .with_panel(
            table.Panel()
            .title("Switch reads around the run (the publish gate needs good ones before and after)")
            .datasource(PG)
            .height(5)
            .span(24)
            .with_target(_SQL("switch_reads"))
        )
        .build()
    )


def _overview_dashboard() -> Any:
    return (
        Dashboard("kvbench runs")
        .uid("kvbench-overview")
        .tags(["kvbench"])
        .refresh("1m")
        .time("now-7d", "now")
        .with_panel(table.Panel().title("Runs").datasource(PG).height(12).span(24).with_target(_SQL("runs")))
        .build()
    )


def build_dashboards() -> dict[str, dict[str, Any]]:
    """Dashboard JSON by uid."""
    out: dict[str, dict[str, Any]] = {}
    for dashboard in (_run_dashboard(), _overview_dashboard()):
        data = json.loads(json.dumps(dashboard, cls=JSONEncoder))
        out[data["uid"]] = data
    return out


def export_dashboards(directory: Path) -> list[Path]:
    """Write one file per dashboard, as Grafana's file provisioning reads them."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for uid, data in build_dashboards().items():
        path = directory / f"{uid}.json"
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written


def push_dashboards(url: str, token: str, timeout_s: float = 10.0) -> list[str]:
    """POST each dashboard to a Grafana's HTTP API (overwriting); returns the uids pushed."""
    pushed = []
    with httpx.Client(
        base_url=url.rstrip("/"), timeout=timeout_s, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        for uid, data in build_dashboards().items():
            response = client.post("/api/dashboards/db", json={"dashboard": data, "overwrite": True, "folderUid": ""})
            response.raise_for_status()
            pushed.append(uid)
    return pushed
