from __future__ import annotations

from typing import Any

from kvbench_reporter.html import bar_chart, render_html


def test_report_page_is_self_contained_and_escapes_text(workload: Any) -> None:
    report = {
        "run_id": "R1",
        "plan_name": "p",
        "status": "succeeded",
        "reasons": [],
        "submitted_at": "2026",
        "generated_at": "2026",
        "definitions": {"ttft": "first chunk - send"},
        "workloads": [workload("off", 300.0, 0), workload("gpu", 50.0, 900)],
        "events": [],
    }
    page = render_html(report)
    # TTFT, TPOT, throughput, throughput vs latency, TTFT by load, hit ratio over time, sources, KV moved
    assert page.count("<svg") == 8
    assert page.count("<polyline") == 6  # two workloads x three line charts
    assert "<script" not in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "short &lt;window&gt;" in page
    assert "Workloads compared" in page
    assert "90.0%" in page


def test_bar_chart_scales_to_the_largest_value() -> None:
    svg = bar_chart("t", "ms", ["a", "b"], {"p50": [10.0, 20.0]}, width=300, height=200)
    assert svg.count("<rect") == 3  # two bars and one legend swatch
