"""The HTML report opened in headless Chromium (Debian's, driven by Playwright; no browser download)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvbench_reporter.html import render_html

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def test_report_renders_charts_without_console_errors(tmp_path: Path, workload: Any) -> None:
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing in CI: .ci/run installs Debian's chromium package")
        pytest.skip("no Chromium here: apt-get install -y chromium (CI installs it)")
    from playwright.sync_api import sync_playwright  # noqa: PLC0415

    report = {
        "run_id": "R1",
        "plan_name": "browser",
        "status": "succeeded",
        "reasons": [],
        "submitted_at": "2026",
        "generated_at": "2026",
        "definitions": {"ttft": "first chunk - send"},
        "workloads": [workload("prefix-off", 343.9, 0), workload("prefix-gpu", 55.5, 950)],
        "events": [],
    }
    page_path = tmp_path / "report.html"
    page_path.write_text(render_html(report))
    artifacts = Path(__file__).resolve().parents[3] / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_path.as_uri())
            page.wait_for_function("document.querySelectorAll('div.chart .main-svg').length >= 10")
            charts = page.locator("div.chart")
            assert charts.count() == 10
            for i in range(charts.count()):
                chart = charts.nth(i)
                box = chart.bounding_box()
                assert box is not None
                assert box["width"] > 300
                assert box["height"] > 200
                # every chart has a title and both axis titles, drawn by plotly.js
                assert chart.locator(".gtitle").count() == 1, chart.get_attribute("id")
                assert (chart.locator(".xtitle").text_content() or "").strip(), chart.get_attribute("id")
                assert (chart.locator(".ytitle").text_content() or "").strip(), chart.get_attribute("id")
                chart.screenshot(path=str(artifacts / f"{chart.get_attribute('id')}.png"))
            # one colour per workload: its bars in the TTFT chart and its line in the CDF share it
            ttft_bar = page.locator("#chart-ttft_ms .trace.bars").first.locator("path").first.get_attribute("style")
            cdf_line = page.locator("#chart-ttft_ms-cdf .scatterlayer .trace").first.locator("path.js-line")
            assert ttft_bar is not None
            assert "rgb(37, 99, 235)" in ttft_bar
            assert "rgb(37, 99, 235)" in (cdf_line.get_attribute("style") or "")
            table = page.locator("#compared").inner_text()
            assert "prefix-gpu" in table
            assert "55.5" in table
            assert "343.9" in table
            assert "What limited performance?" in page.locator("body").inner_text()
            page.screenshot(path=str(artifacts / "report.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert [url for url in requests if not url.startswith("file://")] == []  # nothing fetched: works offline
    assert (artifacts / "report.png").stat().st_size > 10_000
