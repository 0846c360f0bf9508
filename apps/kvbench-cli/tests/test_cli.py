from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from kvbench_cli.deployment import LocalDeployment
from kvbench_cli.main import main


def test_plan_validate_offline_json_and_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ok:
        main(["plan", "validate", "examples/demo.yaml", "--json"])
    assert ok.value.code == 0
    body = json.loads(capsys.readouterr().out)
    assert body["valid"] is True
    assert body["jobs"] == 9  # three workloads, one load level, three repeats
    assert body["errors"] == []
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: Bad Name\nworkloads: []\n")
    with pytest.raises(SystemExit) as refused:
        main(["plan", "validate", str(bad), "--json"])
    assert refused.value.code == 2
    body = json.loads(capsys.readouterr().out)
    assert body["valid"] is False
    assert {e["field"] for e in body["errors"]} == {"name", "workloads"}


def test_down_without_up_stops_nothing(tmp_path: Path) -> None:
    assert LocalDeployment(tmp_path).down() == []


def test_report_is_a_group_whose_default_shows_a_run(capsys: pytest.CaptureFixture[str]) -> None:
    # `kvbench report RUN_ID` is `report show RUN_ID`; a planner that is not up is an error, not a traceback
    with pytest.raises(SystemExit) as unreachable:
        main(["report", "01RUN", "--api", "http://127.0.0.1:9", "--report-api", "http://127.0.0.1:9"])
    assert unreachable.value.code == 1
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err
    with pytest.raises(SystemExit) as schema:
        main(["report", "schema"])
    assert schema.value.code == 0
    assert "$defs" in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "argv", [["report", "analyze", "/nonexistent/records.jsonl"], ["plan", "validate", "/nonexistent/plan.yaml"]]
)
def test_a_missing_file_is_an_error_naming_it_not_a_traceback(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert argv[-1] in err
    assert "Traceback" not in err


def _workload(name: str, stack: str, comparison: dict[str, Any], reasons: list[str]) -> dict[str, Any]:
    stats = {"mean": 101.2, "p50": 100.5, "p90": 150.2, "p99": 214.1}
    return {"name": name, "stack": stack, "validity": {"verdict": "preliminary", "reasons": reasons},
            "ttft_ms": stats, "tpot_ms": stats, "output_tokens_per_s": 392.5, "cache_hit_ratio": 0.93,
            "requests": 1234, "requests_measured": 999, "comparison": comparison}  # fmt: skip


def test_the_console_comparison_fits_80_columns_and_says_whether_it_helped(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console  # noqa: PLC0415

    from kvbench_cli import console as console_module  # noqa: PLC0415

    screen = Console(width=80, record=True, file=io.StringIO())
    monkeypatch.setattr(console_module, "console", screen)
    interval = {"n": 3, "mean": 3.98, "std": 0.05, "ci95": [3.85, 4.11], "verdict": "helped"}
    speedup = dict.fromkeys(("ttft_p50", "ttft_p99", "output_tokens_per_s", "goodput_rps"), interval)
    report: dict[str, Any] = {
        "plan_name": "demo-prefix-cache",
        "run_id": "01KBXYZ",
        "status": "failed",
        "baseline": "prefix-gpu",
        "reasons": [{"code": "node_lost", "message": "A node stopped responding", "fix": "Check the agent."}],
        "workloads": [
            _workload(
                "prefix-gpu",
                "vllm-prefix-gpu",
                {"baseline": "prefix-gpu", "is_baseline": True, "verdict": "baseline"},
                [],
            ),
            _workload(
                "shared-store-with-a-long-name",
                "vllm-mooncake-store",
                {"baseline": "prefix-gpu", "verdict": "helped", "speedup": speedup},
                ["measured window 20 s is under 300 s"],
            ),
        ],
    }
    report["workloads"][1]["jobs"] = [
        {"disk_tier": {"records_before": 0, "records_after": 120, "bytes_before": 0, "bytes_after": 9e9,
                       "reclaimed": False}},
        {"disk_tier": {"records_before": 120, "records_after": 377, "bytes_before": 9e9, "bytes_after": 32e9,
                       "reclaimed": False}},
    ]  # fmt: skip
    console_module.print_comparison(report)
    text = screen.export_text()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "…" not in text  # nothing truncated
    assert text.index("node_lost") < text.index("prefix-gpu")  # the run's reasons first
    assert "3.98x helped" in text
    assert "helped against prefix-gpu: TTFT p50 3.98x (3.85-4.11)" in text
    assert "measured window 20 s is under 300 s" in text
    assert "disk tier: 377 records, 32.0 GB left after the last job; nothing evicted" in text


def test_up_says_when_something_else_answers_on_the_planners_port(tmp_path: Path) -> None:
    """Another process's ops server on the port chosen for the planner answers its health check (200) and
    "404: Not Found" as text elsewhere: start-up says what happened instead of failing on the text as JSON."""
    import threading  # noqa: PLC0415
    from http.server import BaseHTTPRequestHandler, HTTPServer  # noqa: PLC0415

    from kvbench_cli.deployment import DeploymentState, StartupError  # noqa: PLC0415

    class OpsServer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == "/healthz"
            body = b"ok" if found else b"404: Not Found"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), OpsServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        state = DeploymentState(str(tmp_path), "nats://x", "postgresql://x", url, url, sim_machines=2)
        with pytest.raises(StartupError, match=r"something other than the planner answers on .*HTTP 404"):
            LocalDeployment(tmp_path)._wait_ready(state, timeout_s=5)
    finally:
        server.shutdown()
        server.server_close()


def _port(name: str, gb: float | None, reset: bool = False) -> dict[str, Any]:
    octets = None if gb is None else int(gb * 1e9 / 2)
    return {"port": name, "window_s": 60.0, "if.in_octets_delta": octets, "if.out_octets_delta": octets,
            "in_utilization": 0.0 if gb is None else gb / 100, "out_utilization": 0.0, "reset": reset}  # fmt: skip


def test_a_leaf_of_fifty_machines_lists_its_busiest_ports_and_sums_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console  # noqa: PLC0415

    from kvbench_cli import console as console_module  # noqa: PLC0415

    screen = Console(width=120, record=True, file=io.StringIO())
    monkeypatch.setattr(console_module, "console", screen)
    ports = [_port(f"swp{i}", 0.0) for i in range(1, 51)]
    ports[11] = _port("swp12", 3.0)  # the busiest two, among idle ones
    ports[39] = _port("swp40", 1.5)
    ports[4] = _port("swp5", None, reset=True)
    console_module.print_fabric({"switches": [{"switch": "leaf-1", "read": True, "reads": 15, "ports": ports}]})
    lines = screen.export_text().splitlines()
    assert len(lines) == 1 + 1 + console_module.PORTS_LISTED + 1, lines  # switch, unknown, busiest, the rest
    assert lines[1].strip() == "swp5: unknown over 60 s (its counters reset)"  # unknown is never counted as 0
    assert lines[2].strip().startswith("swp12: 3.00 GB")  # the busiest first
    assert lines[3].strip().startswith("swp40: 1.50 GB")
    assert lines[-1].strip().startswith(f"{49 - console_module.PORTS_LISTED} more ports: 0.00 GB in all")


def test_a_pair_of_machines_lists_every_port_in_the_switchs_order(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console  # noqa: PLC0415

    from kvbench_cli import console as console_module  # noqa: PLC0415

    screen = Console(width=120, record=True, file=io.StringIO())
    monkeypatch.setattr(console_module, "console", screen)
    ports = [_port("swp1", 0.0), _port("swp2", 2.0)]
    console_module.print_fabric({"switches": [{"switch": "leaf-1", "read": True, "reads": 9, "ports": ports}]})
    lines = [line.strip() for line in screen.export_text().splitlines()]
    assert [line.split(":")[0] for line in lines[1:]] == ["swp1", "swp2"]


def test_sim_run_outside_a_terminal_says_what_it_simulates_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a log, in CI or beside --json's report (stdout's): plain progress lines on stderr, one as each job starts,
    never minutes of silence."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "version: 1\nname: quick\ndefaults:\n  cluster: {sim: {machines: 1, gpu: H100, gpus_per_machine: 1}}\n"
        "  traffic: {shape: shared_prompt, arrivals: {mode: request_rate, rates: [5]}, duration_s: 20}\n"
        "  measurement: {repeats: 2, warmup_s: 2}\n"
        "workloads: [{name: w, strategy: own_cache, stack: vllm-prefix-gpu}]\n"
    )
    with pytest.raises(SystemExit) as ok:
        main(["sim", "run", str(plan), "--json"])
    assert ok.value.code == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["plan_name"] == "quick"
    lines = out.err.splitlines()
    assert lines[0].startswith("simulating w: load 5, repeat 1/2 · 0 of 20 simulated s · 0 requests · job 1 of 2")
    assert any(line.startswith("simulating w: load 5, repeat 2/2 · 0 of 20 simulated s") for line in lines)
