"""Run with any Python (stdlib only): the names an installed package's code can read, from its own source, in one
pass over each package (parsing an engine's thousands of modules is the cost):

- environment variable names: a string literal (``os.getenv("VLLM_NIXL_SIDE_CHANNEL_HOST")`` and vLLM's
  ``environment_variables`` registry, LMCache's ``LMCACHE_CONFIG_FILE``), a class attribute named after the variable
  (SGLang's ``Envs``: ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR = EnvStr(...)``), or, in a compiled extension (the
  routers are Rust), one of its binary's strings;
- which of some wanted keys the code holds: a KV connector reads its ``kv_connector_extra_config`` with
  ``.get("key")`` or ``get_from_extra_config("key", ...)``, or hands a nested dict to a constructor as keyword
  arguments (vLLM's secondary tiers: ``root_dir``, ``n_read_threads``), so a key is held as a string literal or as
  a parameter name.

A variable a recipe sets, or a key it writes, that no such name matches is read by nobody: it does nothing.

Usage: python source_names.py WANTED.json RESULTS.json PATH [PATH ...]   (site-packages/vllm, ..._rs.abi3.so)
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

from harness import source_nodes

_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
_NAME_BYTES = re.compile(rb"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")


def names(package: Path, wanted: set[str]) -> dict[str, list[str]]:
    """The environment variable names the package can read, and which wanted keys it holds."""
    if package.is_file():  # a compiled extension: the names among its strings
        strings = {m.decode() for m in _NAME_BYTES.findall(package.read_bytes())}
        return {"env": sorted(strings), "held": sorted(strings & wanted)}
    env: set[str] = set()
    held: set[str] = set()
    for _, node in source_nodes(package):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _NAME.fullmatch(node.value):
                env.add(node.value)
            if node.value in wanted:
                held.add(node.value)
        elif isinstance(node, ast.arg) and node.arg in wanted:
            held.add(node.arg)
        elif isinstance(node, ast.ClassDef):  # class attributes named after the variable (SGLang's Envs)
            for stmt in node.body:
                targets = [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
                targets = stmt.targets if isinstance(stmt, ast.Assign) else targets
                env.update(t.id for t in targets if isinstance(t, ast.Name) and _NAME.fullmatch(t.id))
    return {"env": sorted(env), "held": sorted(held)}


def main() -> None:
    wanted_path, results, *paths = sys.argv[1:]
    wanted = set(json.loads(Path(wanted_path).read_text()))
    Path(results).write_text(json.dumps({Path(p).name: names(Path(p), wanted) for p in paths}))


if __name__ == "__main__":
    main()
