from __future__ import annotations

import json
import logging

import pytest

from kvbench_core.logging import JsonFormatter
from kvbench_core.settings import ServiceSettings, load_settings


def test_bad_environment_fails_fast_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KVBENCH_NATS_URL", "http://wrong")
    with pytest.raises(SystemExit) as info:
        load_settings(ServiceSettings)
    assert info.value.code == 2
    assert "KVBENCH_NATS_URL" in capsys.readouterr().err


def test_secrets_never_reach_json_logs() -> None:
    record = logging.makeLogRecord(
        {"msg": "connect", "levelname": "INFO", "api_token": "s3cr3t", "run_id": "R1", "password": "hunter2"}
    )
    line = JsonFormatter("test").format(record)
    payload = json.loads(line)
    assert payload["run_id"] == "R1"
    assert "s3cr3t" not in line
    assert "hunter2" not in line
    assert payload["api_token"] == "***"
