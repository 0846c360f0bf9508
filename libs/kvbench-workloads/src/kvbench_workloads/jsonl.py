"""One line-numbered JSONL reader for every data set and trace, so a bad line is reported the same way."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["read_jsonl"]

T = TypeVar("T")


def read_jsonl(path: Path, parse: Callable[[dict[str, Any]], T], *, field: str, kind: str) -> Iterator[T]:
    """Each non-blank line of ``path`` through ``parse``; a line that is not JSON, or that ``parse`` rejects
    (a missing key, a wrong type), raises ``ValueError`` naming the plan field, the file and the line."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                yield parse(json.loads(line))
            except (KeyError, ValueError, TypeError) as exc:
                raise ValueError(f"{field}: {path} line {number} is not {kind}: {exc}") from exc
