"""Run inside an environment with vllm-router or sglang-router: every router command through the router's own
launcher parser (`parse_router_args`), its argument validation and the construction of the Rust router from them,
stopping short of `start()`.

Usage: python router.py MODULE CASES.json RESULTS.json   (MODULE: vllm_router | sglang_router)
"""

from __future__ import annotations

import importlib
import sys

from harness import run_cases


def check(module: str, argv: list[str]) -> dict[str, object]:
    launch = importlib.import_module(f"{module}.launch_router")
    router_module = importlib.import_module(f"{module}.router")
    args = launch.parse_router_args(argv)
    validate = getattr(args, "_validate_router_args", None)
    if validate is not None:
        validate()
    router = router_module.Router.from_args(args)
    return {"ok": True, "resolved": {"router": type(router).__name__}}


def main() -> None:
    module = sys.argv[1]
    run_cases(lambda case: check(module, case["argv"]))


if __name__ == "__main__":
    main()
