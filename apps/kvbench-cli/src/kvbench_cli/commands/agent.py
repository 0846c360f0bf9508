"""`kvbench agent ...`: the node agent of this machine (``kvbench-agent``, from the node agent's own package).

The CLI imports nothing of the agent: it runs it as a program, with the same arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Any

from kvbench_cli.console import err_console

__all__ = ["register"]


def cmd_agent(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("kvbench_node_agent") is None:
        err_console.print(
            "[red]error:[/red] the node agent is not installed here; on a GPU machine install it with "
            "`uv sync --package kvbench-node-agent` (docs/cluster.md)"
        )
        return 2
    argv = [sys.executable, "-m", "kvbench_node_agent.cli", *args.agent_args]
    os.execv(sys.executable, argv)  # noqa: S606 (our own interpreter and module)
    return 0  # not reached: execv replaces this process


def register(sub: Any) -> None:
    agent = sub.add_parser(
        "agent",
        help="run this machine's node agent (the same as kvbench-agent; `kvbench agent --help`)",
        add_help=False,
    )
    # its arguments are the agent's own: main() hands every one it does not know to the agent (parse_known_args)
    agent.set_defaults(func=cmd_agent, agent_args=[], passes_unknown_arguments=True)
