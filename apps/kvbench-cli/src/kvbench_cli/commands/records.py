"""`kvbench records export`: a run's request records as JSON Lines, CSV or Parquet."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import httpx

from kvbench_cli.api import ApiError, fetch_report, resolve_endpoints
from kvbench_cli.commands.runs import add_endpoint_args
from kvbench_cli.console import (
    console,
)

__all__ = ["export_metadata", "metadata_path", "register"]


def cmd_records_export(args: argparse.Namespace) -> int:
    endpoints = resolve_endpoints(Path(args.state_dir), args.api, args.report_api)
    out = Path(args.output or f"{args.run_id}.{args.format}")
    with (
        httpx.Client(timeout=httpx.Timeout(30.0, read=300.0)) as client,
        client.stream(
            "GET", f"{endpoints.report_url}/v1/runs/{args.run_id}/records", headers=endpoints.headers()
        ) as response,
    ):
        if response.status_code != 200:
            raise ApiError(f"records of {args.run_id}: HTTP {response.status_code}", response.status_code)
        lines = (line for line in response.iter_lines() if line.strip())
        count = write_records(lines, out, args.format)
    meta = metadata_path(out)
    meta.write_text(json.dumps(export_metadata(fetch_report(endpoints, args.run_id)), indent=2) + "\n")
    console.print(f"wrote {count:,} records to {out}, and what was tested and each job's window to {meta}")
    return 0


def metadata_path(records: Path) -> Path:
    """The export's metadata file beside it: ``RUN.jsonl`` -> ``RUN.jsonl.meta.json``."""
    return records.with_name(records.name + ".meta.json")


def export_metadata(report: dict[str, Any]) -> dict[str, Any]:
    """What the records measured (the report's ``tested``) and each job's measured window as the report used it, so
    `kvbench report analyze` of the export computes the report's figures by default."""
    return {
        "run_id": report.get("run_id"),
        "plan_name": report.get("plan_name"),
        "tested": report.get("tested") or [],
        "jobs": {
            str(job["job_id"]): {
                "workload": w["name"],
                "warmup_s": job.get("warmup_s"),
                "load_duration_s": job.get("load_duration_s"),
                "label": job.get("label"),
            }
            for w in report.get("workloads", [])
            for job in w.get("jobs", [])
        },
    }


def write_records(lines: Any, out: Path, fmt: str) -> int:
    """JSON Lines in; jsonl, csv (list fields as JSON) or parquet out. Returns the number of records."""
    count = 0
    if fmt == "jsonl":
        with out.open("w") as fh:
            for line in lines:
                fh.write(line + "\n")
                count += 1
        return count
    rows = [json.loads(line) for line in lines]
    if fmt == "csv":
        import csv  # noqa: PLC0415

        fields = list(rows[0]) if rows else ["request_id"]
        with out.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()})
        return len(rows)
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    pq.write_table(pa.Table.from_pylist(rows), out)
    return len(rows)


def register(sub: Any) -> None:
    records = sub.add_parser("records", help="request records").add_subparsers(dest="records_command", required=True)
    export = records.add_parser("export", help="export a run's request records")
    export.add_argument("run_id")
    export.add_argument("--format", choices=("jsonl", "csv", "parquet"), default="jsonl")
    export.add_argument("--output", default=None, help="file to write (default RUN_ID.FORMAT)")
    add_endpoint_args(export)
    export.set_defaults(func=cmd_records_export)
