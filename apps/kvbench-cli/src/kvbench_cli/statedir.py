"""Where the CLI finds the deployment `kvbench up` started, from any folder.

In order: ``--state-dir``; ``KVBENCH_STATE_DIR``; ``./.kvbench`` when a deployment's state is there; else the one
the user's last ``kvbench up`` recorded (``$XDG_CONFIG_HOME/kvbench/state-dir``, by default
``~/.config/kvbench/state-dir``). ``up`` and ``demo`` start in ``./.kvbench`` unless told otherwise.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["DEFAULT", "record_state_dir", "resolve_state_dir"]

DEFAULT = ".kvbench"
STATE_FILE = "state.json"


def _pointer() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "kvbench" / "state-dir"


def resolve_state_dir(given: str | None, starts_one: bool) -> str:
    if given:
        return given
    if env := os.environ.get("KVBENCH_STATE_DIR"):
        return env
    if starts_one or (Path(DEFAULT) / STATE_FILE).is_file():
        return DEFAULT
    with contextlib.suppress(OSError):
        recorded = _pointer().read_text(encoding="utf-8").strip()
        if recorded and (Path(recorded) / STATE_FILE).is_file():
            return recorded
    return DEFAULT


def record_state_dir(state_dir: str) -> None:
    """Remember the deployment `up` just started, for the user's commands from other folders (best effort)."""
    with contextlib.suppress(OSError):
        pointer = _pointer()
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.write_text(str(Path(state_dir).resolve()) + "\n", encoding="utf-8")
