from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from kvbench_contracts.commands import StartStack
from kvbench_contracts.events import EngineEndpoint
from kvbench_core.procs import stop_pid

__all__ = ["ENGINE_ROLES", "Deployment", "LaunchError", "Launcher", "ManagedProcess", "read_block_size", "wait_healthy"]

ENGINE_ROLES = ("engine", "prefill", "decode")
_BLOCK_SIZE_LINE = re.compile(r"Setting attention block size to (\d+) tokens")


class LaunchError(RuntimeError):
    """A stack could not start; the message says what to fix."""


@dataclass
class ManagedProcess:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    container: str | None = None  # docker launcher: the container to stop; proc follows its logs
    role: str = ""  # the recipe's role: engine, prefill, decode, router, store, lmcache, ...
    # start it again as it was started, healthy when it returns (None: it cannot be restarted alone)
    relaunch: Callable[[], Awaitable[ManagedProcess]] | None = None

    @property
    def is_engine(self) -> bool:
        return self.role in ENGINE_ROLES

    def stop(self) -> None:
        if self.container:
            subprocess.run(["docker", "stop", "-t", "20", self.container], capture_output=True, timeout=60, check=False)
        if self.proc.poll() is None:
            stop_pid(self.proc.pid, timeout_s=10, group=True)


@dataclass
class Deployment:
    deployment_id: str
    run_id: str
    stack: str
    endpoints: list[EngineEndpoint]
    processes: list[ManagedProcess] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    # the directory of the stack's local disk tier on this machine, counted at each scrape (not for a simulated
    # stack: its engines report what their simulated tier holds themselves)
    disk_tier_path: str | None = None
    workload: str | None = None  # the plan's workload it serves, said with its facts
    # processes beside the engines whose /metrics are read too (an LMCache server's hits by tier and L2 writes, a
    # Mooncake master's): (process name, metrics URL); never sent requests
    scrape_only: list[tuple[str, str]] = field(default_factory=list)
    # an engine's own further endpoints (NIXL's telemetry): (name, url), read as its KV transfer agent
    transfer_agents: list[tuple[str, str]] = field(default_factory=list)

    def stop(self) -> None:
        # reverse start order: routers before engines before stores
        for process in reversed(self.processes):
            process.stop()

    async def restart_engines(self) -> tuple[list[str], list[str]]:
        """Stop each engine process and start it again as it was, healthy before the next (cache servers, stores
        and routers keep running); returns (restarted, kept). Raises LaunchError when one cannot be restarted."""
        engines = [p for p in self.processes if p.is_engine]
        if not engines:
            raise LaunchError(f"deployment {self.deployment_id} runs no engine process to restart")
        if any(p.relaunch is None for p in engines):
            raise LaunchError(f"deployment {self.deployment_id}: its launcher cannot restart an engine alone")
        for index, process in enumerate(self.processes):
            if process.is_engine and process.relaunch is not None:
                await asyncio.to_thread(process.stop)
                self.processes[index] = await process.relaunch()
        return [p.name for p in engines], [p.name for p in self.processes if not p.is_engine]


class Launcher(Protocol):
    name: str

    async def start(self, command: StartStack) -> Deployment: ...

    async def stop(self, deployment: Deployment) -> None: ...


async def wait_healthy(url: str, process: ManagedProcess, timeout_s: float) -> None:
    """Poll the health endpoint until it answers 200; never a fixed sleep."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while time.monotonic() < deadline:
            if process.proc.poll() is not None:
                tail = process.log_path.read_text(errors="replace")[-1500:]
                raise LaunchError(
                    f"{process.name} exited with code {process.proc.returncode} before it was "
                    f"healthy; last log lines:\n{tail}"
                )
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.1)
    raise LaunchError(f"{process.name} did not answer {url} within {timeout_s:.0f} s")


def read_block_size(log_path: Path) -> int | None:
    """The effective block size, from the engine's own log (the connector may have changed it)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return None
    matches = _BLOCK_SIZE_LINE.findall(text)
    return int(matches[-1]) if matches else None
