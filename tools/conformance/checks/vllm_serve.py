"""Run inside a vLLM environment: every `vllm serve` command through vLLM's own CLI parser and config resolution.

Reads cases from the JSON file named first ([{"id", "argv", "env"}], argv after `vllm serve`, the model replaced
by a local directory holding its config.json) and writes one result per case to the file named second (vLLM logs to
stdout). Stdlib and vLLM only (and harness.py beside it); the conformance runner executes it with the engine's Python.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from harness import keys_read, run_cases

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _serve_parser() -> argparse.ArgumentParser:
    """The parser `vllm serve` builds (vllm/entrypoints/cli/serve.py: a `serve` subparser given to
    make_arg_parser, which adds the positional model_tag), without importing the API server itself."""
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser  # 0.33
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef]
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older layouts
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef,attr-defined]
    top = FlexibleArgumentParser(prog="vllm")
    subparsers = top.add_subparsers(dest="subparser")
    make_arg_parser(subparsers.add_parser("serve"))
    return top


def _validator() -> object:
    for module in ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            return getattr(__import__(module, fromlist=["x"]), "validate_parsed_serve_args", None)
        except ImportError:
            continue
    return None


def _use_cpu_platform() -> None:
    """What a CPU build of vLLM resolves to by itself (its version says "cpu"); a CUDA build on a machine without a
    GPU finds no platform (vLLM 0.25.1: "Failed to infer device type"), so the CPU one is set before anything asks."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()


def _connector_names(config: object) -> list[str]:
    names: list[str] = []
    kv = getattr(config, "kv_transfer_config", None)
    if kv is None or not getattr(kv, "kv_connector", None):
        return names
    names.append(kv.kv_connector)
    if kv.kv_connector == "MultiConnector":
        for sub in (kv.kv_connector_extra_config or {}).get("connectors", []):
            names.append(sub.get("kv_connector", ""))
    return names


def check_serve(argv: list[str], env: dict[str, str]) -> dict[str, object]:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.engine.arg_utils import AsyncEngineArgs

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        args = _serve_parser().parse_args(["serve", *argv])
        if getattr(args, "model_tag", None):
            args.model = args.model_tag
        validate = _validator()
        if validate is not None:
            validate(args)
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
        unknown = [n for n in _connector_names(config) if n not in KVConnectorFactory._registry]
        if unknown:
            return {
                "ok": False,
                "error": f"unknown KV connector(s) {unknown}; vLLM registers {sorted(KVConnectorFactory._registry)}",
            }
        return {"ok": True, "resolved": {"kv_transfer": str(getattr(config, "kv_transfer_config", None))}}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_mooncake_store_config(text: str) -> dict[str, object]:
    """A MooncakeStoreConnector config file (MOONCAKE_CONFIG_PATH) through vLLM's own MooncakeStoreConfig.from_file;
    it reads keys with .get, so a key it never reads is silently ignored: those are read off its source and any
    other key of the file is a mismatch."""
    import tempfile

    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker import MooncakeStoreConfig
    except ImportError:
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake_store_connector import (  # type: ignore
            MooncakeStoreConfig,
        )
    read = keys_read(MooncakeStoreConfig.from_file)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(text)
    try:
        config = MooncakeStoreConfig.from_file(f.name)
        ignored = sorted(set(json.loads(text)) - read)
        if ignored:
            return {"ok": False, "error": f"keys vLLM never reads (ignored): {ignored}; it reads {sorted(read)}"}
        return {"ok": True, "resolved": {"config": repr(config)[:400]}}
    finally:
        os.unlink(f.name)


def check(case: dict[str, Any]) -> dict[str, object]:
    if case.get("kind") == "mooncake_store_config":
        return check_mooncake_store_config(case["text"])
    return check_serve(case["argv"], case.get("env", {}))


def main() -> None:
    _use_cpu_platform()
    run_cases(check)


if __name__ == "__main__":
    main()
