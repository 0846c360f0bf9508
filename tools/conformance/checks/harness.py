"""What every engine-side check shares (stdlib only; the checks run with the engine's own Python, from this folder):
read the cases, run each with the engine's output kept off stdout, turn what the engine raised into a result, and
write the results.

A check takes one case and returns its result ({"ok": True, "resolved": ...} or a failure it found itself); what
the engine raises is the finding: SystemExit from its argument parser (the parser's last line of stderr says why),
any other exception with its type, message and the end of its traceback.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import gc
import io
import json
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Result = dict[str, object]


def keys_read(obj: object) -> set[str]:
    """The constant keys ``obj``'s source reads with ``.get("key", ...)``: what an engine's config loader that reads
    with .get takes (any other key of a config is ignored silently, so it is a mismatch)."""
    import ast
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(obj))  # type: ignore[arg-type]
    return {
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    }


@functools.lru_cache(maxsize=1)
def _modules(package: Path) -> tuple[tuple[Path, ast.Module], ...]:
    """Every module of the package that parses. Parsing is the cost (vLLM: 3,000 modules, most of a minute); the
    last package parsed is kept, so the several passes of one check over it (metric_names.py) parse it once."""
    # millions of nodes kept alive, none in a cycle: out of the collector's sight while they are made and after
    # (else every collection walks them all, and the passes took longer than parsing again)
    out = []
    gc.disable()
    try:
        for path in sorted(package.rglob("*.py")):
            try:
                out.append((path, ast.parse(path.read_text(encoding="utf-8", errors="replace"))))
            except SyntaxError:
                continue
    finally:
        gc.freeze()
        gc.enable()
    return tuple(out)


def source_nodes(package: Path) -> Iterator[tuple[Path, ast.AST]]:
    """Every AST node of every module of an installed package that parses, with its file: what the checks that
    read an engine's own source (metric names, environment variables, config keys) walk."""
    for path, tree in _modules(package):
        for node in ast.walk(tree):
            yield path, node


def _run_one(check: Callable[[dict[str, Any]], Result], case: dict[str, Any]) -> Result:
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(sys.stderr), contextlib.redirect_stderr(err):
            return check(case)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        return {"ok": False, "error": "argument parser: " + (lines[-1] if lines else "exited")}
    except Exception as exc:  # the engine's own error is the finding
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=-12)}
    finally:
        sys.stderr.write(err.getvalue())  # the engine's own log stays in the check's log file


def run_cases(
    check: Callable[[dict[str, Any]], Result], prepare: Callable[[list[dict[str, Any]]], None] | None = None
) -> None:
    """The last two arguments: the cases file and the results file. ``prepare`` sees every case first."""
    cases_path, results_path = sys.argv[-2], sys.argv[-1]
    with open(cases_path) as f:
        cases = json.load(f)
    if prepare is not None:
        prepare(cases)
    results = [{"id": case["id"], **_run_one(check, case)} for case in cases]
    with open(results_path, "w") as out:
        json.dump(results, out)
