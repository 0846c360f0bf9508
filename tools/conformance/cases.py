"""Every catalog stack rendered as the goldens render it (a 2-machine pool), as conformance cases per program.

Runs in the project's environment (it imports kvbench_stacks); the engine checks run in the engines' own.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvbench_stacks.catalog import get_stack
from kvbench_stacks.recipes import RECIPES, render
from kvbench_stacks.recipes.model import RenderContext

# the goldens' own pool and context (libs/kvbench-stacks/tests/test_recipes.py): what the suite checks is exactly
# what the golden files hold
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "libs" / "kvbench-stacks" / "tests"))
from test_recipes import context


@dataclass(frozen=True)
class Case:
    id: str  # stack/machine/process
    stack: str
    program: str  # vllm | sglang | lmcache | sglang-router | vllm-router | trtllm | other
    argv: list[str]  # after the program's own words (`vllm serve`, `python3 -m sglang.launch_server`, ...)
    model: str  # the model the stack serves (the engines' model argument)
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)


_PROGRAMS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("vllm", "serve"), "vllm"),
    (("python3", "-m", "sglang.launch_server"), "sglang"),
    (("python3", "-m", "sglang_router.launch_router"), "sglang-router"),
    (("lmcache", "server"), "lmcache"),
    (("vllm-router",), "vllm-router"),
    (("trtllm-serve",), "trtllm"),
    (("mooncake_master",), "mooncake-master"),
)


def _contexts(stack: str) -> list[tuple[str, RenderContext]]:
    """The golden context (case ids ``stack/...``) and one per other storage tier the stack offers (``stack@nvme/...``):
    an LMCache server's disk adapter is rendered only for the NVMe tier, which the goldens do not show."""
    ctx = context(stack)
    spec = get_stack(stack)
    others = [t for t in (spec.tiers if spec else ()) if t != ctx.kv_tier]
    return [(stack, ctx), *((f"{stack}@{t}", ctx.model_copy(update={"kv_tier": t})) for t in others)]


def cases() -> list[Case]:
    out: list[Case] = []
    for stack, (label, ctx) in ((s, c) for s in sorted(RECIPES) for c in _contexts(s)):
        for machine, procs in render(ctx).items():
            for proc in procs:
                program, rest = "other", list(proc.argv)
                for words, name in _PROGRAMS:
                    if tuple(proc.argv[: len(words)]) == words:
                        program, rest = name, list(proc.argv[len(words) :])
                        break
                if proc.argv[:2] == ["python3", "-m"] and program == "other":
                    program = proc.argv[2]
                out.append(
                    Case(
                        f"{label}/{machine}/{proc.name}",
                        stack,
                        program,
                        rest,
                        ctx.model,
                        dict(proc.env),
                        dict(proc.files),
                    )
                )
    return out


def main() -> None:
    json.dump([asdict(c) for c in cases()], sys.stdout, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--list":
        for c in cases():
            print(c.program.ljust(14), c.id, shlex.join(c.argv)[:100])
    else:
        main()
