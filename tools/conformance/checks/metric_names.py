"""Run with any Python (stdlib only): the Prometheus metrics an installed engine package defines, read from its
own source (every call of a Counter/Gauge/Histogram/Summary constructor, or of a class attribute holding one,
whose name is a string literal), with each one's type. OpenTelemetry instruments (``meter.create_counter(NAME,
unit=UNIT)``, LMCache's MP server) are given under the name OpenTelemetry's Prometheus exporter writes: dots become
underscores and the unit is appended (``lmcache_mp.lookup_hit`` in tokens is ``lmcache_mp_lookup_hit_tokens``,
exposed as ``..._total``).

Also which of some wanted strings (label names and values the normaliser selects by) the package holds as string
literals anywhere (an Enum's value, a labels() argument, a labelnames list).

Usage: python metric_names.py PACKAGE_DIR RESULTS.json [PREFIX [WANTED,WANTED,...]]   (site-packages/vllm, ...)
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

from harness import source_nodes

TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary"}


def _kind(func: ast.expr) -> str | None:
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    lowered = name.lower().lstrip("_").removeprefix("create_")  # LMCache's self._create_counter(name=...) too
    for word, kind in TYPES.items():
        # prometheus_client.Counter, self._counter_cls, self._gauge_cls, Histogram, ...
        if lowered.startswith(word) and (lowered == word or lowered.endswith(("_cls", "cls", "_class"))):
            return kind
    return None


def _literal_name(call: ast.Call) -> str | None:
    for kw in call.keywords:
        if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
            return kw.value.value
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def scan(package: Path) -> dict[str, dict[str, object]]:
    found: dict[str, dict[str, object]] = {}
    for path, node in source_nodes(package):
        if not isinstance(node, ast.Call):
            continue
        kind = _kind(node.func)
        name = _literal_name(node) if kind else None
        if kind and name and (":" in name or "_" in name) and "." not in name:  # dotted: OpenTelemetry's (below)
            labels: list[str] = []
            for kw in node.keywords:
                if kw.arg == "labelnames" and isinstance(kw.value, (ast.List, ast.Tuple)):
                    labels = [e.value for e in kw.value.elts if isinstance(e, ast.Constant)]
            entry = found.setdefault(name, {"type": kind, "files": [], "labels": labels})
            rel = str(path.relative_to(package.parent))
            if rel not in entry["files"]:  # type: ignore[operator]
                entry["files"].append(rel)  # type: ignore[union-attr]
    return found


def mentioned(package: Path, prefix: str) -> tuple[list[str], list[str]]:
    """Names built where no constructor call shows them (class constants, f"{prefix}kv_offload_{kind}_bytes"): every
    string literal starting with the prefix, and every f-string doing so as a regular expression."""
    import re

    names: set[str] = set()
    patterns: set[str] = set()
    for _, node in source_nodes(package):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(prefix):
            names.add(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and str(first.value).startswith(prefix):
                parts = [re.escape(str(v.value)) if isinstance(v, ast.Constant) else "[a-z0-9_]+"
                         for v in node.values]  # fmt: skip
                patterns.add("".join(parts))
    return sorted(names), sorted(patterns)


OTEL_KINDS = {
    "create_counter": "counter",
    "create_observable_counter": "counter",
    "create_up_down_counter": "gauge",
    "create_observable_up_down_counter": "gauge",
    "create_gauge": "gauge",
    "create_observable_gauge": "gauge",
    "create_histogram": "histogram",
}
# the exporter's unit words for the UCUM units it knows; any other unit is appended as written
OTEL_UNITS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": "ratio"}


def otel_family(name: str, unit: str | None) -> str:
    family = name.replace(".", "_").replace("-", "_")
    word = OTEL_UNITS.get(unit or "", unit or "")
    if word and "/" not in word and not family.endswith("_" + word):
        family += "_" + word
    return family


def scan_otel(package: Path) -> dict[str, dict[str, object]]:
    found: dict[str, dict[str, object]] = {}
    for path, node in source_nodes(package):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        kind = OTEL_KINDS.get(node.func.attr)
        name = _literal_name(node) if kind else None
        if not kind or not name:
            continue
        unit = next((kw.value.value for kw in node.keywords if kw.arg == "unit" and isinstance(kw.value, ast.Constant)
                     and isinstance(kw.value.value, str)), None)  # fmt: skip
        entry = found.setdefault(otel_family(name, unit), {"type": kind, "files": [], "labels": [], "otel": name})
        rel = str(path.relative_to(package.parent))
        if rel not in entry["files"]:  # type: ignore[operator]
            entry["files"].append(rel)  # type: ignore[union-attr]
    return found


def strings_held(package: Path, wanted: set[str]) -> list[str]:
    held = {
        node.value
        for _, node in source_nodes(package)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in wanted
    }
    return sorted(held)


def main() -> None:
    package, out = Path(sys.argv[1]), sys.argv[2]
    prefix = sys.argv[3] if len(sys.argv) > 3 else package.name + ":"
    wanted = set(sys.argv[4].split(",")) if len(sys.argv) > 4 and sys.argv[4] else set()
    names, patterns = mentioned(package, prefix)
    with open(out, "w") as f:
        defined = {**scan_otel(package), **scan(package)}
        held = strings_held(package, wanted)
        json.dump({"defined": defined, "mentioned": names, "patterns": patterns, "held": held}, f, indent=1,
                  sort_keys=True)  # fmt: skip


if __name__ == "__main__":
    main()
