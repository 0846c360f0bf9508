"""Run inside an LMCache environment: every `lmcache server` command through LMCache's own CLI, up to the moment it
would start serving (the launch function is replaced by one that keeps the configs it was given), and every
in-process LMCache config file through LMCache's own config loader.

Cases from the JSON file named first ([{"id", "kind": "server"|"config", "argv" | "text"}]); one result per case
to the file named second.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from typing import Any

from harness import run_cases

LAUNCHERS = ("lmcache.v1.multiprocess.http_server", "run_http_server")


class _Launched(Exception):
    def __init__(self, kwargs: dict[str, Any]) -> None:
        self.kwargs = kwargs


def _capture(*args: Any, **kwargs: Any) -> None:
    raise _Launched(kwargs)


def _l2_adapters(argv: list[str]) -> list[dict[str, Any]]:
    """The JSON of every --l2-adapter the command passes."""
    return [json.loads(argv[at + 1]) for at, arg in enumerate(argv) if arg == "--l2-adapter"]


def check_mooncake_adapters(argv: list[str], keys: list[str], required: list[str]) -> str:
    """What LMCache's own mooncake_store adapter config hands Mooncake (``from_dict(...).setup_config``) against the
    keys Mooncake's RealClient::setup_internal(ConfigDict) reads (recorded/mooncake.toml): a key it never reads is
    ignored without a word, a required one missing fails the setup. Returns the mismatch, or ""."""
    from lmcache.v1.distributed.l2_adapters.mooncake_store_l2_adapter import MooncakeStoreL2AdapterConfig

    for adapter in _l2_adapters(argv):
        if adapter.get("type") != "mooncake_store":
            continue
        forwarded = set(MooncakeStoreL2AdapterConfig.from_dict(adapter).setup_config)
        unread, missing = sorted(forwarded - set(keys)), sorted(set(required) - forwarded)
        if unread or missing:
            return (f"LMCache forwards to Mooncake's setup_internal keys it never reads {unread}"
                    f"{f' and lacks the required {missing}' if missing else ''}")  # fmt: skip
    return ""


def check_adapter_keys(argv: list[str]) -> str:
    """Every key of every other L2 adapter must be one its config class reads (its from_dict, which reads with
    .get and ignores the rest; LMCache's own registry gives the class). Returns the mismatch, or ""."""
    from harness import keys_read
    from lmcache.v1.distributed.l2_adapters.config import get_l2_adapter_config_class

    for adapter in _l2_adapters(argv):
        if adapter.get("type") == "mooncake_store":  # forwarded to Mooncake: check_mooncake_adapters
            continue
        config_cls = get_l2_adapter_config_class(str(adapter.get("type")))
        unread = sorted(set(adapter) - {"type"} - keys_read(config_cls.from_dict))
        if unread:
            return f"the {adapter.get('type')} L2 adapter's config ({config_cls.__name__}) never reads {unread}"
    return ""


def check_server(argv: list[str], mooncake: dict[str, list[str]] | None = None) -> dict[str, object]:
    if mooncake and (mismatch := check_mooncake_adapters(argv, mooncake["keys"], mooncake["required"])):
        return {"ok": False, "error": mismatch}
    if mismatch := check_adapter_keys(argv):
        return {"ok": False, "error": mismatch}
    import importlib

    import lmcache.cli.commands as commands

    module = importlib.import_module(LAUNCHERS[0])
    setattr(module, LAUNCHERS[1], _capture)
    tokens = ["server", *argv]
    parser = argparse.ArgumentParser(prog="lmcache")
    subparsers = parser.add_subparsers(dest="command")
    if hasattr(commands, "register_commands"):  # 0.5.6
        commands.register_commands(subparsers, tokens)
    else:  # 0.5.1: lmcache/cli/main.py registers ALL_COMMANDS
        for command in commands.ALL_COMMANDS:
            command.register(subparsers)
    try:
        args = parser.parse_args(tokens)
        args.func(args)
    except _Launched as launched:
        return {"ok": True, "resolved": {k: repr(v)[:400] for k, v in launched.kwargs.items()}}
    return {"ok": False, "error": "lmcache server returned without launching"}


class _UnknownKeys(logging.Handler):
    """LMCache's config loader only logs a key it does not know ("Unknown configuration key: ...", config_base.py)
    and drops it: the setting does nothing, so the check collects those."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.keys: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("Unknown configuration key"):
            self.keys.append(str(record.args[0]) if record.args else record.getMessage())


def check_config(text: str) -> dict[str, object]:
    from lmcache.v1.config import LMCacheEngineConfig

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    unknown = _UnknownKeys()
    loader_log = logging.getLogger("lmcache.v1.config_base")
    loader_log.addHandler(unknown)
    try:
        config = LMCacheEngineConfig.from_file(f.name)
        if hasattr(config, "validate"):
            config.validate()
        if unknown.keys:
            return {
                "ok": False,
                "error": f"LMCache's config loader does not know {sorted(unknown.keys)} (it drops them)",
            }
        return {"ok": True, "resolved": {"config": repr(config)[:600]}}
    finally:
        loader_log.removeHandler(unknown)
        os.unlink(f.name)


def check(case: dict[str, Any]) -> dict[str, object]:
    if case["kind"] == "server":
        return check_server(case["argv"], case.get("mooncake"))
    return check_config(case["text"])


if __name__ == "__main__":
    run_cases(check)
