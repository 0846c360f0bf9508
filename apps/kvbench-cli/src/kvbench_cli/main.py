"""The ``kvbench`` command (everything but ``kvbench load``'s fast path, which ``entry`` takes)."""

from __future__ import annotations

import sys

import httpx

from kvbench_cli.api import ApiError
from kvbench_cli.console import err_console
from kvbench_cli.deployment import StartupError
from kvbench_cli.parser import build_parser
from kvbench_cli.statedir import resolve_state_dir

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args, unknown = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if getattr(args, "passes_unknown_arguments", False):
        args.agent_args = unknown
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if hasattr(args, "state_dir"):
        starts_one = getattr(args, "command", None) in ("up", "demo")
        args.state_dir = resolve_state_dir(args.state_dir, starts_one)
    try:
        code = args.func(args)
    except (ApiError, StartupError) as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        code = 1
    except httpx.TransportError as exc:  # a service that is not up, or not at that address
        where = exc.request.url if exc.__dict__.get("_request") is not None else "the service"
        err_console.print(f"[red]error:[/red] cannot reach {where}: {exc}; is kvbench up? (`kvbench status`, --api)")
        code = 1
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError) as exc:
        # a file the user named (a plan, records, a trace) that cannot be read or written: no traceback
        name = f"{exc.filename}: " if exc.filename else ""
        err_console.print(f"[red]error:[/red] {name}{exc.strerror or exc}; check the path and its permissions")
        code = 2
    except KeyboardInterrupt:
        code = 130
    raise SystemExit(code)
