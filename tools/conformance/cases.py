"""Every catalog stack rendered as the goldens render it (a 2-machine pool), as conformance cases per program.

Runs in the project's environment (it imports kvbench_stacks); the engine checks run in the engines' own.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import asdict, dataclass, field

from kvbench_stacks.recipes import RECIPES, EngineSettings, PoolMachine, RenderContext, render

# the goldens' pool (libs/kvbench-stacks/tests/test_recipes.py): what the suite checks is exactly what they hold
SIZING = {
    "host_memory_gb": 64,
    "shared_store_gb": 100,
    "shared_mount_path": "/mnt/kv",
    "disk_tier_gb": 500,
    "disk_tier_path": "/nvme/kv",
    "prefill_machines": 1,
}


NETWORK = {"rdma_device": "mlx5_0"}


@dataclass(frozen=True)
class Case:
    id: str  # stack/machine/process
    stack: str
    program: str  # vllm | sglang | lmcache | sglang-router | vllm-router | trtllm | other
    argv: list[str]  # after the program's own words (`vllm serve`, `python3 -m sglang.launch_server`, ...)
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)


_PROGRAMS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("vllm", "serve"), "vllm"),
    (("python3", "-m", "sglang.launch_server"), "sglang"),
    (("python3", "-m", "sglang_router.launch_router"), "sglang-router"),
    (("lmcache", "server"), "lmcache"),
    (("vllm-router",), "vllm-router"),
    (("trtllm-serve",), "trtllm"),
)


def context(stack: str) -> RenderContext:
    engine = "sglang" if stack.startswith("sglang") else "trtllm" if stack.startswith("trtllm") else "vllm"
    sizing = dict(SIZING)
    if stack == "vllm-pd-nixl-lmcache":
        sizing["gpus_per_machine"] = 1
    vendor = "amd" if "mori" in stack else "nvidia"
    return RenderContext(
        stack=stack,
        model="Qwen/Qwen3-8B",
        engine=EngineSettings(name=engine, version="1.0.0"),
        kv_tier="cpu_ram" if "lmcache" in stack else "gpu",
        sizing=sizing,
        network=NETWORK,
        routing="pd_aware",
        machines=[
            PoolMachine(name="gpu-a", host="10.0.0.1", gpus=2, vendor=vendor),
            PoolMachine(name="gpu-b", host="10.0.0.2", gpus=2, vendor=vendor),
        ],
    )


def cases() -> list[Case]:
    out: list[Case] = []
    for stack in sorted(RECIPES):
        for machine, procs in render(context(stack)).items():
            for proc in procs:
                program, rest = "other", list(proc.argv)
                for words, name in _PROGRAMS:
                    if tuple(proc.argv[: len(words)]) == words:
                        program, rest = name, list(proc.argv[len(words) :])
                        break
                if proc.argv[:2] == ["python3", "-m"] and program == "other":
                    program = proc.argv[2]
                out.append(
                    Case(f"{stack}/{machine}/{proc.name}", stack, program, rest, dict(proc.env), dict(proc.files))
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
