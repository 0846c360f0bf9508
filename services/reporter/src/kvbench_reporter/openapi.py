"""The reporter's endpoints as an OpenAPI document (served at /openapi.json), with the report's and the request
record's schemas from their own models, so a client of the reports is generated like one of the planner."""

from __future__ import annotations

from typing import Any

from kvbench_contracts.records import RequestRecord
from kvbench_reporter.schema import Report

__all__ = ["openapi_document"]

_RUN_ID = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}, "description": "A run's id"}
_NOT_YET = {
    "404": {"description": "No such run in this reporter's database"},
    "409": {"description": "The run has not ended, or its report is being built"},
}


def openapi_document() -> dict[str, Any]:
    report = Report.model_json_schema(ref_template="#/components/schemas/{model}")
    record = RequestRecord.model_json_schema(ref_template="#/components/schemas/{model}")
    components = {**report.pop("$defs", {}), **record.pop("$defs", {}), "Report": report, "RequestRecord": record}
    ref = {"$ref": "#/components/schemas/Report"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "kvbench reporter", "version": "0.1.0"},
        "paths": {
            "/v1/runs/{run_id}/report": {
                "get": {
                    "summary": "A run's report (JSON)",
                    "parameters": [_RUN_ID],
                    "responses": {
                        "200": {"description": "The report", "content": {"application/json": {"schema": ref}}},
                        **_NOT_YET,
                    },
                }
            },
            "/v1/runs/{run_id}/report.html": {
                "get": {
                    "summary": "A run's report as one self-contained HTML page (charts inline, works offline)",
                    "parameters": [_RUN_ID],
                    "responses": {"200": {"description": "The page", "content": {"text/html": {}}}, **_NOT_YET},
                }
            },
            "/v1/runs/{run_id}/records": {
                "get": {
                    "summary": "Every request record of a run, JSON Lines (the public export format)",
                    "parameters": [_RUN_ID],
                    "responses": {
                        "200": {
                            "description": "One RequestRecord per line",
                            "content": {
                                "application/x-ndjson": {"schema": {"$ref": "#/components/schemas/RequestRecord"}}
                            },
                        }
                    },
                }
            },
            "/v1/reports/schema": {
                "get": {"summary": "The report's JSON Schema", "responses": {"200": {"description": "JSON Schema"}}}
            },
            "/healthz": {"get": {"summary": "Health", "responses": {"200": {"description": "Up"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "Text"}}}},
        },
        "components": {"schemas": components},
    }
