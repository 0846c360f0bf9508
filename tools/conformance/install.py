"""Build the conformance environments of envs.toml under .kvbench/conformance/ (skipped when already built from the
same spec). Downloads are cached by uv (its cache is shared by every environment, so a rebuild fetches nothing).

Usage: python tools/conformance/install.py [ENV ...]     (UV=path/to/uv; default: uv on PATH)
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ENVS_DIR = ROOT / ".kvbench" / "conformance"


def load_spec() -> dict[str, dict[str, object]]:
    spec = tomllib.loads((HERE / "envs.toml").read_text())
    common = spec["common"]
    envs: dict[str, dict[str, object]] = {}
    for name, env in spec["env"].items():
        deps = env.get("deps", [])
        envs[name] = {
            "torch": common["torch"],
            # "cpu": the CPU wheel; "pypi": PyPI's own build with its CUDA libraries (they load without a GPU), for
            # engines that import torchvision, whose PyPI build needs them; "none": no torch at all
            "torch_build": env.get("torch_build", "cpu"),
            "with_torch": list(env.get("with_torch", [])),
            "no_deps": list(env.get("no_deps", [])),
            "deps": list(_deps(common, deps)),
            "checks": dict(env.get("checks", {})),
        }
    return envs


def _deps(common: dict[str, object], deps: object) -> list[str]:
    """An env's `deps`: a list, or the name of a shared list in [common] (`vllm_deps`, or a table's `deps`)."""
    if not isinstance(deps, str):
        return list(deps)  # type: ignore[call-overload]
    shared = common[deps]
    return list(shared["deps"] if isinstance(shared, dict) else shared)


def torch_requirement(version: str) -> list[str]:
    """The CPU torch wheel: an explicit file, else a +cpu build from the find-links pip is configured with."""
    wheel = os.environ.get("KVBENCH_TORCH_CPU_WHEEL")
    if wheel:
        return [wheel]
    for links in ("/opt/wheels", *os.environ.get("KVBENCH_FIND_LINKS", "").split()):
        found = sorted(glob.glob(f"{links}/torch-{version}+cpu-cp3{sys.version_info.minor}-*.whl"))
        if found:
            return [found[-1]]
    # PyPI has no CPU build for Linux; PyTorch's own index does
    return ["--index-url", "https://download.pytorch.org/whl/cpu", f"torch=={version}+cpu"]


def python_of(env: str) -> Path:
    return ENVS_DIR / env / "bin" / "python"


def build(uv: str, name: str, env: dict[str, object]) -> None:
    target = ENVS_DIR / name
    digest = hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]
    stamp = target / ".kvbench-spec"
    if stamp.exists() and stamp.read_text() == digest and python_of(name).exists():
        print(f"conformance env {name}: up to date", flush=True)
        return
    started = time.monotonic()
    print(f"conformance env {name}: building ({', '.join(map(str, env['no_deps']))})", flush=True)
    shutil.rmtree(target, ignore_errors=True)
    py = str(python_of(name))
    run = lambda *args: subprocess.run([uv, *args], check=True)  # noqa: E731
    run("venv", "--quiet", "--python", sys.executable, str(target))
    if env["torch_build"] == "pypi":
        run("pip", "install", "--quiet", "--python", py, f"torch=={env['torch']}", *map(str, env["with_torch"]))
    elif env["torch_build"] == "none":  # a check that runs no engine Python (the Mooncake master's binary)
        pass
    else:
        run("pip", "install", "--quiet", "--python", py, *torch_requirement(str(env["torch"])))
    run("pip", "install", "--quiet", "--python", py, "--no-deps", *map(str, env["no_deps"]))
    if env["deps"]:
        run("pip", "install", "--quiet", "--python", py, *map(str, env["deps"]))
    stamp.write_text(digest)
    print(f"conformance env {name}: built in {time.monotonic() - started:.0f} s", flush=True)


def main() -> None:
    uv = os.environ.get("UV") or shutil.which("uv") or "uv"
    envs = load_spec()
    wanted = sys.argv[1:] or list(envs)
    unknown = [w for w in wanted if w not in envs]
    if unknown:
        sys.exit(f"unknown conformance env(s) {unknown}; envs.toml has {sorted(envs)}")
    ENVS_DIR.mkdir(parents=True, exist_ok=True)
    for name in wanted:
        build(uv, name, envs[name])


if __name__ == "__main__":
    main()
