"""What a plan may make a machine run or write, checked against the machine's policy (its operator's settings,
never the plan's): container images a plan chooses (``engine.args.image``), script directories
(``engine.args.lmcache_examples``, code the machine runs), and the directories its tiers write
(``sizing.disk_tier_path``, ``sizing.shared_mount_path``). The planner's review and the agent both call it.

A plan is anyone's who can reach the planner; the agent runs as whoever started it, often root, on GPU machines.
The plan contract already refuses the obvious (``..``, ``/etc``, ``/proc``, the agent's own state); this is the
positive list on top.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping

from kvbench_contracts.events import MachinePolicy
from kvbench_contracts.plan import Sizing
from kvbench_contracts.problem import Problem

__all__ = ["DEFAULT_CODE_DIRS", "refusals"]

DEFAULT_CODE_DIRS = ("/opt/lmcache/examples",)  # where `kvbench-agent --fetch-lmcache-examples` puts the P/D proxies


def _inside(path: str, roots: list[str] | tuple[str, ...]) -> bool:
    real = os.path.realpath(path)  # a link out of an allowed directory is not inside it
    return any(real == (r := os.path.realpath(root)) or real.startswith(r.rstrip("/") + "/") for root in roots)


def refusals(
    args: Mapping[str, object], sizing: Sizing, policy: MachinePolicy, env: Mapping[str, str] | None = None
) -> list[Problem]:
    """Everything the engine arguments, variables (``engine.env``) and sizing ask of a machine that its policy does
    not allow (code ``not_allowed``, the field, and the setting that would allow it)."""
    out: list[Problem] = []
    for name in sorted(env or {}):
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in policy.allowed_env):
            allowed = ", ".join(policy.allowed_env) or "none"
            out.append(
                Problem(
                    code="not_allowed",
                    field=f"engine.env.{name}",
                    message=f"the machine does not let a plan set {name} on its engines (allowed: {allowed})",
                    fix=f"Leave engine.env.{name} out, or have the machine's operator allow it: "
                    "KVBENCH_NODE_AGENT_ALLOWED_ENV=<glob>[,<glob>...] in its agent's settings",
                )
            )
    image = args.get("image")
    if image is not None and not any(fnmatch.fnmatchcase(str(image), p) for p in policy.allowed_images):
        allowed = ", ".join(policy.allowed_images) or "none: only the stacks' own images"
        out.append(
            Problem(
                code="not_allowed",
                field="engine.args.image",
                message=f"the machine does not run the image {image!s} (allowed: {allowed})",
                fix="Leave engine.args.image out to use the stack's image, or have the machine's operator allow it: "
                "KVBENCH_NODE_AGENT_ALLOWED_IMAGES=<glob>[,<glob>...] in its agent's settings",
            )
        )
    examples = args.get("lmcache_examples")
    code_dirs = (*DEFAULT_CODE_DIRS, *policy.allowed_code_dirs)
    if examples is not None and not _inside(str(examples), code_dirs):
        out.append(
            Problem(
                code="not_allowed",
                field="engine.args.lmcache_examples",
                message=f"{examples!s} is not a directory the machine runs scripts from "
                f"(allowed: {', '.join(code_dirs)})",
                fix="Leave it out (/opt/lmcache/examples, where kvbench-agent --fetch-lmcache-examples puts them), "
                "or have the machine's operator allow the "
                "directory: KVBENCH_NODE_AGENT_ALLOWED_CODE_DIRS=<dir>[,<dir>...]",
            )
        )
    if policy.allowed_data_dirs:
        for name in ("disk_tier_path", "shared_mount_path"):
            path = getattr(sizing, name)
            if path and not _inside(path, policy.allowed_data_dirs):
                out.append(
                    Problem(
                        code="not_allowed",
                        field=f"sizing.{name}",
                        message=f"{path} is outside the directories the machine lets a plan write "
                        f"({', '.join(policy.allowed_data_dirs)})",
                        fix="Choose a directory under one of them, or have the machine's operator add it: "
                        "KVBENCH_NODE_AGENT_ALLOWED_DATA_DIRS=<dir>[,<dir>...]",
                    )
                )
    return out
