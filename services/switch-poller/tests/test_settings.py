from __future__ import annotations

import pytest

from kvbench_core.settings import load_settings
from kvbench_switch_poller.service import SwitchPollerSettings


def test_interval_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVBENCH_SWITCH_POLLER_INTERVAL_S", "0")
    with pytest.raises(SystemExit):
        load_settings(SwitchPollerSettings)
    monkeypatch.setenv("KVBENCH_SWITCH_POLLER_INTERVAL_S", "5")
    assert load_settings(SwitchPollerSettings).interval_s == 5
