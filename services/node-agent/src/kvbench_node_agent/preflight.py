"""Checks before a stack starts on this machine; each failure names the machine and the fix."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench_stacks.recipes.model import ProcessSpec

__all__ = [
    "GATED_PREFIXES",
    "PreflightIssue",
    "check_binaries",
    "check_host_code",
    "check_ports",
    "check_sizing",
    "preflight",
]

# organisations whose models are gated on the Hugging Face Hub: they need the HF token secret
GATED_PREFIXES = ("meta-llama/", "mistralai/", "google/gemma")


@dataclass(frozen=True)
class PreflightIssue:
    machine: str
    check: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.machine}: {self.message}. Fix: {self.fix}"


def _binary_present(binary: str) -> bool:
    if binary.startswith("python-module:"):
        module = binary.split(":", 1)[1]
        if importlib.util.find_spec(module) is not None:
            return True
        python = shutil.which("python3")
        if python is None:
            return False
        result = subprocess.run([python, "-c", f"import {module}"], capture_output=True, timeout=60, check=False)
        return result.returncode == 0
    return shutil.which(binary) is not None


def check_binaries(machine: str, specs: list[ProcessSpec], launcher: str) -> list[PreflightIssue]:
    issues: list[PreflightIssue] = []
    if launcher == "docker":
        if shutil.which("docker") is None:
            return [
                PreflightIssue(
                    machine,
                    "binary",
                    "docker is not installed",
                    "Install Docker and the NVIDIA or ROCm container toolkit, or use the process launcher.",
                )
            ]
        for image in sorted({s.image for s in specs if s.image}):
            found = subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=30, check=False)
            if found.returncode != 0:
                issues.append(
                    PreflightIssue(
                        machine, "image", f"the image {image} is not present", f"Pull it first: docker pull {image}"
                    )
                )
        return issues
    for binary in sorted({s.binary for s in specs}):
        if not _binary_present(binary):
            what = binary.split(":", 1)[-1]
            issues.append(
                PreflightIssue(
                    machine,
                    "binary",
                    f"{what} is not installed",
                    f"Install {what} on this machine (or use the docker launcher).",
                )
            )
    return issues


def check_host_code(machine: str, specs: list[ProcessSpec]) -> list[PreflightIssue]:
    """The scripts a stack runs from this machine's disk (under either launcher: the docker one mounts them)."""
    return [
        PreflightIssue(
            machine,
            "host_code",
            f"{path} is not on this machine ({spec.name} runs it, and no image or package holds it)",
            f"Fetch LMCache's examples, at the release its image runs: kvbench-agent --fetch-lmcache-examples "
            f"{Path(path).parents[1]} (or set engine.args.lmcache_examples to a folder that holds them).",
        )
        for spec in specs
        for path in spec.host_code
        if not Path(path).is_file()
    ]


def _writable_with_space(path: str, need_gb: float) -> tuple[bool, str]:
    if not os.path.isdir(path):
        return False, f"{path} does not exist"
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".kvbench-preflight-"):
            pass
    except OSError:
        return False, f"{path} is not writable"
    free_gb = shutil.disk_usage(path).free / 1e9
    if need_gb and free_gb < need_gb:
        return False, f"{path} has {free_gb:.0f} GB free and the tier needs {need_gb:g} GB"
    return True, ""


def check_sizing(machine: str, sizing: dict[str, Any], ram_gb: float) -> list[PreflightIssue]:
    issues: list[PreflightIssue] = []
    for key, size_key in (("disk_tier_path", "disk_tier_gb"), ("shared_mount_path", None)):
        path = sizing.get(key)
        if path:
            ok, why = _writable_with_space(str(path), float(sizing.get(size_key) or 0) if size_key else 0.0)
            if not ok:
                issues.append(
                    PreflightIssue(
                        machine,
                        key,
                        why,
                        f"Create {path} on every machine, writable by the engines, with the space the tier needs."
                        if key == "disk_tier_path"
                        else f"Mount the shared filesystem at {path} on every machine, writable by the engines.",
                    )
                )
    host_gb = sizing.get("host_memory_gb")
    if host_gb and ram_gb and float(host_gb) > 0.8 * ram_gb:
        issues.append(
            PreflightIssue(
                machine,
                "host_memory_gb",
                f"the host memory tier ({float(host_gb):g} GB) is above 80% of this machine's RAM ({ram_gb:.0f} GB)",
                "Keep the host memory tier well below the machine's RAM.",
            )
        )
    return issues


def check_ports(machine: str, specs: list[ProcessSpec]) -> list[PreflightIssue]:
    issues: list[PreflightIssue] = []
    for spec in specs:
        for name, port in spec.ports.items():
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind(("0.0.0.0", port))  # noqa: S104 (the engines listen on every address)
                except OSError:
                    issues.append(
                        PreflightIssue(
                            machine,
                            "port",
                            f"port {port} ({spec.name} {name}) is in use",
                            f"Stop what listens on {port} (ss -ltnp 'sport = :{port}').",
                        )
                    )
    return issues


def check_model(machine: str, model: str, has_token: bool) -> list[PreflightIssue]:
    if model.startswith(GATED_PREFIXES) and not has_token:
        return [
            PreflightIssue(
                machine,
                "model",
                f"{model} is gated on the Hugging Face Hub and no token was given",
                "Store the token (PUT /v1/secrets/hf-token) and set hf_token_secret in the plan.",
            )
        ]
    return []


def hub_cache() -> Path:
    """Where the engines look for downloaded models: the Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub)."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"


def preflight(
    machine: str,
    specs: list[ProcessSpec],
    launcher: str,
    sizing: dict[str, Any],
    ram_gb: float,
    model: str,
    has_token: bool,
) -> list[PreflightIssue]:
    issues = check_binaries(machine, specs, launcher)
    issues += check_host_code(machine, specs)
    issues += check_sizing(machine, sizing, ram_gb)
    issues += check_ports(machine, specs)
    issues += check_model(machine, model, has_token)
    with contextlib.suppress(Exception):
        issues.sort(key=lambda i: i.check)
    return issues
