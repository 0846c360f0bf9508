"""Run inside an environment with vllm-router or sglang-router: every router command through the router's own
launcher parser (`parse_router_args`), its argument validation and the construction of the Rust router from them,
stopping short of `start()`.

Usage: python router.py MODULE CASES.json RESULTS.json   (MODULE: vllm_router | sglang_router)
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import sys
import traceback


def check(module: str, argv: list[str]) -> dict[str, object]:
    launch = importlib.import_module(f"{module}.launch_router")
    router_module = importlib.import_module(f"{module}.router")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = launch.parse_router_args(argv)
        validate = getattr(args, "_validate_router_args", None)
        if validate is not None:
            validate()
        router = router_module.Router.from_args(args)
        return {"ok": True, "resolved": {"router": type(router).__name__}}
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        return {"ok": False, "error": "argument parser: " + (lines[-1] if lines else "exited")}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=-12)}


def main() -> None:
    module, cases_path, results_path = sys.argv[1:4]
    results = []
    for case in json.loads(open(cases_path).read()):
        with contextlib.redirect_stdout(sys.stderr):
            results.append({"id": case["id"], **check(module, case["argv"])})
    with open(results_path, "w") as out:
        json.dump(results, out)


if __name__ == "__main__":
    main()
