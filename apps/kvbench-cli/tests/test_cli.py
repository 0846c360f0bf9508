from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench_cli.deployment import LocalDeployment
from kvbench_cli.main import main


def test_plan_validate_offline_json_and_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ok:
        main(["plan", "validate", "examples/demo.yaml", "--json"])
    assert ok.value.code == 0
    body = json.loads(capsys.readouterr().out)
    assert body["valid"] is True
    assert body["jobs"] == 3  # three workloads, one load level, one repeat
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
