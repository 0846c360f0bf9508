from __future__ import annotations

from kvbench_reporter.html import bar_chart, render_html


def _workload(name: str, p50: float, cached: int) -> dict[str, object]:
    stats = {"mean": p50, "p50": p50, "p90": p50 * 2, "p95": p50 * 2, "p99": p50 * 3, "count": 3.0}
    return {
        "name": name,
        "stack": f"vllm-{name}",
        "strategy": "own_cache",
        "requests": 10,
        "requests_measured": 8,
        "errors": 0,
        "window_s": 30.0,
        "ttft_ms": stats,
        "tpot_ms": stats,
        "itl_ms": stats,
        "e2e_ms": stats,
        "output_tokens_per_s": 123.4,
        "cached_prompt_tokens": cached,
        "prompt_tokens": 1000,
        "cache_hit_ratio": cached / 1000,
        "prompt_token_sources": {"tokens": {"gpu_hit": cached, "recomputed": 1000 - cached}},
        "engine_counters": None,
        "validity": {"verdict": "preliminary", "reasons": ["short <window>"]},
        "jobs": [
            {
                "job_id": "J",
                "load_level": 8.0,
                "repeat": 0,
                "status": "succeeded",
                "requests": 10,
                "requests_measured": 8,
                "ttft_ms": stats,
                "output_tokens_per_s": 123.4,
            }
        ],
    }


def test_report_page_is_self_contained_and_escapes_text() -> None:
    report = {
        "run_id": "R1",
        "plan_name": "p",
        "status": "succeeded",
        "reasons": [],
        "submitted_at": "2026",
        "generated_at": "2026",
        "definitions": {"ttft": "first chunk - send"},
        "workloads": [_workload("off", 300.0, 0), _workload("gpu", 50.0, 900)],
        "events": [],
    }
    page = render_html(report)
    assert page.count("<svg") == 4
    assert "<script" not in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "short &lt;window&gt;" in page
    assert "Workloads compared" in page
    assert "90.0%" in page


def test_bar_chart_scales_to_the_largest_value() -> None:
    svg = bar_chart("t", "ms", ["a", "b"], {"p50": [10.0, 20.0]}, width=300, height=200)
    assert svg.count("<rect") == 3  # two bars and one legend swatch
