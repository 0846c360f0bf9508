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
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.as_uri())
            charts = page.locator("svg.chart")
            assert charts.count() == 8
            for i in range(charts.count()):
                box = charts.nth(i).bounding_box()
                assert box is not None
                assert box["width"] > 100
                assert box["height"] > 100
            table = page.locator("#compared").inner_text()
            assert "prefix-gpu" in table
            assert "55.5" in table
            assert "343.9" in table
            page.screenshot(path=str(artifacts / "report.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert (artifacts / "report.png").stat().st_size > 10_000
