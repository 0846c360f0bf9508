from __future__ import annotations

from typing import Any

from kvbench_reporter.charts import plotly_bundle
from kvbench_reporter.html import render_html


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
    # TTFT, TPOT, throughput, TTFT and ITL CDFs, TTFT over time, throughput vs latency, hit ratio, KV moved, sources
    assert page.count('<div class="chart"') == 10
    assert page.count(plotly_bundle()) == 1  # plotly.js inlined once: no CDN, works offline
    assert "<script src" not in page
    assert "<link" not in page
    assert "short &lt;window&gt;" in page
    for question in ("Did it work?", "How fast?", "Did distributed KV help?", "What limited performance?",
                     "What happened underneath?"):  # fmt: skip
        assert page.count(question) == 2  # in each workload's section
    assert "KVBENCH_REPORTER_PRICE_PER_GPU_HOUR" in page
    assert "Workloads compared" in page
    assert "90.0%" in page


def test_a_run_that_measured_nothing_draws_no_charts_and_says_why(workload: Any) -> None:
    empty = workload("off", 0.0, 0)
    empty["requests_measured"] = 0
    empty["validity"] = {"verdict": "invalid", "reasons": ["1 of 1 jobs did not succeed: J: stack failed"]}
    report = {"run_id": "R", "plan_name": "p", "status": "failed", "submitted_at": "2026", "generated_at": "2026",
              "reasons": [{"code": "stack_failed", "message": "The engine did not start", "fix": "Read its log."}],
              "definitions": {}, "workloads": [empty], "events": []}  # fmt: skip
    page = render_html(report)
    assert '<div class="chart"' not in page
    assert page.index("stack_failed") < page.index("Workloads compared")
    assert "no valid result: 1 of 1 jobs did not succeed" in page


def test_network_section_shows_ports_cables_and_jobs_escaped(workload: Any) -> None:
    port = {"port": "swp1", "if.in_octets_delta": 2_000_000_000, "in_utilization": 0.5, "speed_mbps": 400_000}
    fabric = {
        "definition": "d",
        "publish_gate": {"publishable": True},
        "switches": [
            {
                "switch": "leaf1",
                "read": True,
                "cabled": [{"node": "<gpu-a>", "nic": "eth1", "port": "swp1"}],
                "ports": [port],
                "agreement": [
                    {
                        "node": "<gpu-a>",
                        "nic": "eth1",
                        "port": "swp1",
                        "checks": [{"check": "pause_symmetry", "verdict": "FAIL", "detail": "host 5, switch 900"}],
                        "congestion": {"ecn_marked_packets": 1500},
                    }
                ],
                "jobs": [
                    {
                        "job_id": "j1",
                        "workload": "off",
                        "ports": [port],
                        "port_bytes": 2_000_000_000,
                        "engine_kv_bytes": 1_500_000_000,
                        "bottleneck": {"verdict": "not network-limited"},
                    },
                    {"job_id": "j2", "workload": "gpu", "note": "no good reads bracket the job's measured window"},
                ],
            }
        ],
    }
    report = {"run_id": "R1", "plan_name": "p", "status": "succeeded", "reasons": [], "submitted_at": "2026",
              "generated_at": "2026", "definitions": {}, "workloads": [workload("off", 300.0, 0)], "events": [],
              "fabric": fabric}  # fmt: skip
    page = render_html(report)
    assert "&lt;gpu-a&gt; eth1 &rarr; swp1" in page
    assert "<gpu-a>" not in page
    assert "pause_symmetry: <b>FAIL</b>" in page
    assert "ecn_marked_packets 1,500" in page
    assert "<td>j1</td><td>off</td><td>2.000</td><td>1.500</td>" in page
    assert "no good reads bracket the job" in page


def test_a_split_stack_and_a_fast_simulated_cluster_are_said_in_words(workload: Any) -> None:
    split = workload("pd", 80.0, 0)
    split["time_scale"] = 20.0
    split["prompt_token_sources"]["by_role"] = {
        "decode": {"prompt_tokens": 1000.0, "tokens": {"transferred": 990.0, "recomputed": 10.0}},
        "prefill": {"prompt_tokens": 1000.0, "tokens": {"recomputed": 1000.0, "gpu_hit": 0.0}},
    }
    report = {"run_id": "R", "plan_name": "p", "status": "succeeded", "reasons": [], "submitted_at": "2026",
              "generated_at": "2026", "definitions": {}, "workloads": [split], "events": []}  # fmt: skip
    page = render_html(report)
    assert "the simulated engines ran 20x faster than real time" in page
    assert "decode engines: transferred 990, recomputed 10; prefill engines: recomputed 1,000" in page


def test_snmp_epochs_a_second_apart_are_one_boot_and_a_reboot_is_not() -> None:
    from kvbench_reporter.fabric import same_boot  # noqa: PLC0415

    assert same_boot("leaf1:1764590000", "leaf1:1764590000")
    assert same_boot("leaf1:1764590000", "leaf1:1764590001")  # response time less sysUpTime, rounded
    assert not same_boot("leaf1:1764590000", "leaf1:1764593600")  # rebooted an hour later
    assert not same_boot("leaf1:1764590000", "leaf2:1764590000")
    assert not same_boot("boot1", "boot2")


def test_an_unknown_port_figure_shows_as_unknown_never_zero(workload: Any) -> None:
    reset = {"port": "swp1", "if.in_octets_delta": None, "if.out_octets_delta": None, "reset": True}
    fabric = {"definition": "d", "publish_gate": {"publishable": True},
              "switches": [{"switch": "leaf1", "read": True, "cabled": [], "ports": [reset]}]}  # fmt: skip
    report = {"run_id": "R", "plan_name": "p", "status": "succeeded", "reasons": [], "submitted_at": "2026",
              "generated_at": "2026", "definitions": {}, "workloads": [workload("off", 300.0, 0)], "events": [],
              "fabric": fabric}  # fmt: skip
    page = render_html(report)
    assert "swp1 <small>(counters reset)</small></td><td>unknown</td><td>unknown</td>" in page


def test_every_prompt_token_source_has_a_colour_of_its_own() -> None:
    from kvbench_reporter.charts import KIND_COLOURS, SOURCES  # noqa: PLC0415

    assert len(set(KIND_COLOURS)) == len(KIND_COLOURS) >= len(SOURCES)
