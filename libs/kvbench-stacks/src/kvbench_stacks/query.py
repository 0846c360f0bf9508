"""The catalog as a table for a query (engine, GPU vendor, engine version): the same rows for the planner's
``GET /v1/catalog/stacks`` and for ``kvbench catalog``."""

from __future__ import annotations

import re
from typing import Any

from kvbench_stacks.catalog import CATALOG

__all__ = ["stack_rows", "version_tuple"]


def version_tuple(text: str) -> tuple[int, ...]:
    digits: list[int] = []
    for part in text.lstrip("v").split("."):
        match = re.match(r"[0-9]+", part)  # ASCII digits only: "0.25.1rc2" -> (0, 25, 1)
        if match is None:
            break
        digits.append(int(match.group()))
    return tuple(digits)


def stack_rows(
    engine: str | None = None, vendor: str | None = None, version: str | None = None
) -> list[dict[str, Any]]:
    """Every stack, with why it cannot be chosen for the query (the same table as `kvbench catalog`)."""
    rows = []
    for spec in CATALOG.values():
        why: list[str] = []
        if engine and spec.engine != engine:
            why.append(f"runs on {spec.engine}, not {engine}")
        if vendor and vendor.lower() not in spec.vendors:
            why.append(f"does not run on {vendor.upper()} ({' and '.join(v.upper() for v in spec.vendors)} only)")
        if version and spec.min_version and (not engine or engine == spec.engine):
            have = version_tuple(version)
            if have and have < version_tuple(spec.min_version):
                why.append(f"needs {spec.engine} {spec.min_version} or newer")
        row = spec.model_dump(mode="json")
        row["selectable"] = not why
        row["why_not"] = "; ".join(why) or None
        wanted = version.lstrip("v") if version else None
        # a real run recorded on the version asked for; validated_on is what the engines' parsers accepted
        row["validated"] = wanted is not None and any(v.split()[-1] == wanted for v in spec.live_runs)
        row["conformance_checked"] = wanted is not None and wanted in spec.checked_releases()
        rows.append(row)
    return rows
