"""Run with any Python (stdlib only): the environment variable names an installed package can read, from its own
source. An engine reads a variable either by its name as a string literal (``os.getenv("VLLM_NIXL_SIDE_CHANNEL_HOST")``
and vLLM's ``environment_variables`` registry, LMCache's ``LMCACHE_CONFIG_FILE``) or, in SGLang's ``Envs`` class, as a
class attribute named after it (``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR = EnvStr(...)``). A compiled extension
(the routers are Rust) reads it by a name among its binary's strings. A variable a recipe sets that no such name
matches is read by nobody: the setting silently does nothing.

Usage: python env_names.py RESULTS.json PATH [PATH ...]   (site-packages/vllm, site-packages/vllm_router_rs.abi3.so)
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

from harness import source_nodes

_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")


def names(package: Path) -> set[str]:
    if package.is_file():  # a compiled extension: the names among its strings
        return {m.decode() for m in re.findall(rb"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+", package.read_bytes())}
    found: set[str] = set()
    for _, node in source_nodes(package):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _NAME.fullmatch(node.value):
            found.add(node.value)
        elif isinstance(node, ast.ClassDef):  # class attributes named after the variable (SGLang's Envs)
            for stmt in node.body:
                targets = [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
                targets = stmt.targets if isinstance(stmt, ast.Assign) else targets
                found.update(t.id for t in targets if isinstance(t, ast.Name) and _NAME.fullmatch(t.id))
    return found


def main() -> None:
    results, *packages = sys.argv[1:]
    out = {Path(p).name: sorted(names(Path(p))) for p in packages}
    Path(results).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
