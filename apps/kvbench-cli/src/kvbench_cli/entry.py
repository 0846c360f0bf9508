"""The ``kvbench`` executable: ``kvbench load`` starts without importing the control-plane client (its
start-up is part of what a load generator is measured on); everything else goes to ``kvbench_cli.main``."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    if sys.argv[1:2] == ["load"]:
        import argparse  # noqa: PLC0415

        from kvbench_cli.load import add_load_parser  # noqa: PLC0415

        parser = argparse.ArgumentParser(prog="kvbench")
        add_load_parser(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(sys.argv[1:])
        try:
            code = args.func(args)
        except KeyboardInterrupt:
            code = 130
        raise SystemExit(code)
    from kvbench_cli.main import main as full  # noqa: PLC0415

    full()
