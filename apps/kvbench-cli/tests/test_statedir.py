"""The CLI finds the deployment from any folder: the flag, the variable, ./.kvbench, then the user's last `up`."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench_cli.statedir import record_state_dir, resolve_state_dir


def test_the_deployment_is_found_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("KVBENCH_STATE_DIR", raising=False)
    lab = tmp_path / "lab" / ".kvbench"
    lab.mkdir(parents=True)
    (lab / "state.json").write_text("{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert resolve_state_dir(None, starts_one=False) == ".kvbench"  # nothing recorded yet
    record_state_dir(str(lab))  # what `kvbench up` does
    assert resolve_state_dir(None, starts_one=False) == str(lab.resolve())
    assert resolve_state_dir(None, starts_one=True) == ".kvbench"  # `up` starts here unless told otherwise
    assert resolve_state_dir("/given", starts_one=False) == "/given"
    monkeypatch.setenv("KVBENCH_STATE_DIR", "/from-env")
    assert resolve_state_dir(None, starts_one=False) == "/from-env"
    monkeypatch.delenv("KVBENCH_STATE_DIR")
    (lab / "state.json").unlink()  # `down --wipe`d, or moved: not followed
    assert resolve_state_dir(None, starts_one=False) == ".kvbench"
