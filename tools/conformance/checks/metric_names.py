"""Run with any Python (stdlib only): the Prometheus metrics an installed engine package defines, read from its
own source (every call of a Counter/Gauge/Histogram/Summary constructor, or of a class attribute holding one,
whose name is a string literal), with each one's type.

Usage: python metric_names.py PACKAGE_DIR RESULTS.json [PREFIX]   (PACKAGE_DIR: site-packages/vllm, ...)
"""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Iterator
from pathlib import Path

TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary"}


def _kind(func: ast.expr) -> str | None:
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    lowered = name.lower().lstrip("_")
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


def _nodes(package: Path) -> Iterator[tuple[Path, ast.AST]]:
    """Every node of every module of the package that parses, with its file."""
    for path in sorted(package.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            yield path, node


def scan(package: Path) -> dict[str, dict[str, object]]:
    found: dict[str, dict[str, object]] = {}
    for path, node in _nodes(package):
        if not isinstance(node, ast.Call):
            continue
        kind = _kind(node.func)
        name = _literal_name(node) if kind else None
        if kind and name and (":" in name or "_" in name):
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
    for _, node in _nodes(package):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(prefix):
            names.add(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and str(first.value).startswith(prefix):
                parts = [re.escape(str(v.value)) if isinstance(v, ast.Constant) else "[a-z0-9_]+"
                         for v in node.values]  # fmt: skip
                patterns.add("".join(parts))
    return sorted(names), sorted(patterns)


def main() -> None:
    package, out = Path(sys.argv[1]), sys.argv[2]
    prefix = sys.argv[3] if len(sys.argv) > 3 else package.name + ":"
    names, patterns = mentioned(package, prefix)
    with open(out, "w") as f:
        json.dump({"defined": scan(package), "mentioned": names, "patterns": patterns}, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
