"""The reporter's OpenAPI document describes its endpoints, and every schema it refers to is in it."""

from __future__ import annotations

from typing import Any

from kvbench_reporter.openapi import openapi_document


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def test_every_endpoint_is_described_and_every_reference_resolves() -> None:
    doc = openapi_document()
    assert {"/v1/runs/{run_id}/report", "/v1/runs/{run_id}/report.html", "/v1/runs/{run_id}/records"} <= set(
        doc["paths"]
    )
    schemas = doc["components"]["schemas"]
    for ref in _refs(doc):
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.rsplit("/", 1)[1] in schemas, ref
    assert "workloads" in schemas["Report"]["properties"]
    assert "ttft_s" in schemas["RequestRecord"]["properties"]
