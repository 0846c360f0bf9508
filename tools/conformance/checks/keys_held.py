"""Run with any Python (stdlib only): which of some wanted keys an installed package's source can read. A KV
connector reads its ``kv_connector_extra_config`` with ``.get("key")`` or ``get_from_extra_config("key", ...)``, or
hands a nested dict to a constructor as keyword arguments (vLLM's secondary tiers: ``root_dir``, ``n_read_threads``):
so a key is held when the source has it as a string literal or as a parameter name. A key held nowhere is read by
nobody: the engine ignores it without a word.

Usage: python keys_held.py WANTED.json RESULTS.json PACKAGE_DIR [PACKAGE_DIR ...]   (WANTED: a JSON list)
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

from harness import source_nodes


def held(packages: list[Path], wanted: set[str]) -> set[str]:
    found: set[str] = set()
    for package in packages:
        for _, node in source_nodes(package):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in wanted:
                found.add(node.value)
            elif isinstance(node, ast.arg) and node.arg in wanted:
                found.add(node.arg)
    return found


def main() -> None:
    wanted_path, results, *packages = sys.argv[1:]
    wanted = set(json.loads(Path(wanted_path).read_text()))
    Path(results).write_text(json.dumps(sorted(held([Path(p) for p in packages], wanted))))


if __name__ == "__main__":
    main()
