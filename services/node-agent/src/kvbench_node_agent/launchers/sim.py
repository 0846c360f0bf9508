"""The `sim` launcher: simulated engines (kvbench_sim) as real child processes of the agent."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Literal

from kvbench_contracts.commands import StartStack
from kvbench_contracts.events import EngineEndpoint
from kvbench_core.embedded import free_port
from kvbench_core.procs import spawn
from kvbench_node_agent.launchers.base import (
    Deployment,
    LaunchError,
    ManagedProcess,
    read_block_size,
    wait_healthy,
)
from kvbench_sim.profiles import load_profile
from kvbench_sim.records import file_backed, tier_signature
from kvbench_sim.router import POLICIES
from kvbench_sim.stacks import SIM_STACKS, SimLayout, layout_for
from kvbench_sim.tiers import Tier

__all__ = ["SIM_STACK_FLAGS", "SimLauncher", "sim_engine_argv", "sim_router_argv"]

# Stacks with a simulated form in server mode (kvbench_sim.stacks maps each to engine settings and tiers). Split
# (P/D) stacks run whole on the pool's first machine: its prefill and decode engines and the router in front.
SIM_STACK_FLAGS: dict[str, list[str]] = {stack: [] for stack in SIM_STACKS}


def _layout(command: StartStack) -> dict[str, Any]:
    return {
        "workload": {
            "stack": command.stack,
            "model": command.model,
            "engine": command.engine or {},
            "sizing": command.sizing,
            "kv_tier": command.kv_tier,
        },
        "cluster": command.sim or {},
    }


# engines that share a store hash prompt words alike (Python's string hash is salted per process otherwise)
SIM_ENV = {**os.environ, "PYTHONHASHSEED": "0"}


def store_port(command: StartStack) -> int:
    """The shared store's port, the same on every machine of the pool (each agent works it out on its own)."""
    key = f"{command.run_id}/{command.workload}/{command.stack}/" + ",".join(str(p.get("name")) for p in command.pool)
    return 20000 + int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big") % 10000


def sim_store_argv(
    port: int,
    capacity_chunks: int,
    bandwidth_gbps: float,
    speed: float,
    records: tuple[Path, dict[str, object]] | None = None,
) -> list[str]:
    """The pool's store, timing every engine's transfers on its one link; ``records``: for a file-backed pool, where
    it keeps its index and what must agree for the index to be used."""
    argv = [
        sys.executable,
        "-m",
        "kvbench_sim",
        "store",
        "--port",
        str(port),
        "--capacity-chunks",
        str(capacity_chunks),
    ]
    argv += ["--bandwidth-gbps", f"{bandwidth_gbps:g}", "--speed", f"{speed:g}"]
    if records is not None:
        argv += ["--records-dir", str(records[0]), "--records-signature", json.dumps(records[1])]
    return argv


def records_dir(state_dir: Path, command: StartStack, owner: str, path: str | None) -> Path:
    """Where a simulated file tier keeps its records: per run (a run starts with none, as a freshly cleaned disk
    would), per machine (``owner``; "shared" for a shared filesystem) and per configured path, so a stack restarted
    within the run (cache_state: empty, a lost engine) finds what it stored, as LMCache finds its disk records."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", (path or "default").strip("/")) or "default"
    return state_dir / "sim-records" / command.run_id / owner / slug


def sim_engine_argv(command: StartStack, port: int, pd_role: str | None = None) -> list[str]:
    if command.stack not in SIM_STACK_FLAGS:
        known = ", ".join(sorted(SIM_STACK_FLAGS))
        raise LaunchError(f"stack {command.stack} has no simulated server form; simulated stacks: {known}")
    sim: dict[str, Any] = command.sim or {}
    argv = [
        sys.executable,
        "-m",
        "kvbench_sim",
        "serve",
        "--port",
        str(port),
        "--model",
        command.model,
        "--gpu",
        str(sim.get("gpu", "L40S")),
        "--speed",
        str(sim.get("speed") or 1.0),
        "--layout",
        json.dumps(_layout(command)),
    ]
    return [*argv, "--pd-role", pd_role] if pd_role else argv


def sim_router_argv(port: int, policy: str, engines: list[str], prefill: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "kvbench_sim", "route", "--port", str(port), "--policy", policy]
    for url in engines:
        argv += ["--engine", url]
    for url in prefill:
        argv += ["--prefill", url]
    return argv


class SimLauncher:
    name = "sim"

    def __init__(self, node_id: str, state_dir: Path, health_timeout_s: float) -> None:
        self._node_id = node_id
        self._state_dir = state_dir
        self._health_timeout_s = health_timeout_s

    async def start(self, command: StartStack) -> Deployment:
        if "-pd-" in command.stack:
            return await self._start_split(command)
        port = free_port()
        argv = sim_engine_argv(command, port)
        deployment = Deployment(deployment_id=command.deployment_id, run_id=command.run_id, stack=command.stack,
                                endpoints=[], processes=[])  # fmt: skip
        layout = layout_for(_layout(command)["workload"], command.sim or {})
        store_url = await self._shared_store(deployment, command, layout)
        if store_url:
            argv += ["--shared-store", store_url]
        if any(t.name == "disk" for t in layout.engine.tiers):
            disk = records_dir(self._state_dir, command, self._node_id, command.sizing.get("disk_tier_path"))
            argv += ["--records-dir", str(disk)]
            deployment.facts["disk_records"] = str(disk)
        await self._engine(deployment, command, argv, port, "engine0", "both")
        deployment.facts["engine_argv"] = " ".join(argv[1:])
        return deployment

    async def _shared_store(self, deployment: Deployment, command: StartStack, layout: SimLayout) -> str | None:
        """Stacks with a shared tier: the pool's first machine starts the store process; every engine of the pool
        connects to it (and waits for it, when its machine came up first)."""
        shared = [t for t in layout.engine.tiers if t.store_id]
        if not shared:
            return None
        port = store_port(command)
        if command.pool and command.pool[0].get("name") != self._node_id:
            return f"ws://127.0.0.1:{port}/ws"
        profile = load_profile(str((command.sim or {}).get("gpu", "L40S")), command.model, layout.engine)
        tier = Tier(shared[0], profile.block_size, profile.model.kv_bytes_per_token, profile.state_bytes_per_block)
        records = None
        if file_backed(tier):
            mount = records_dir(self._state_dir, command, "shared", command.sizing.get("shared_mount_path"))
            records = (mount, tier_signature(tier, command.model))
            deployment.facts["shared_records"] = str(mount)
        try:
            speed = float((command.sim or {}).get("speed") or 1.0)
            argv = sim_store_argv(port, tier.capacity_chunks, shared[0].bw_gbps, speed, records)
            await self._process(deployment, command, "store", argv, port)
        except LaunchError as exc:
            raise LaunchError(f"the shared store could not listen on port {port}: {exc}") from None
        deployment.facts["shared_store"] = (
            f"{shared[0].store_id}, {tier.capacity_chunks} chunks, {shared[0].bw_gbps:g} GB/s shared, port {port}"
        )
        return f"ws://127.0.0.1:{port}/ws"

    async def _start_split(self, command: StartStack) -> Deployment:
        """P/D: the pool's first machine runs every prefill and decode engine of the simulated cluster and the
        router; the other machines' agents start nothing (their share runs there)."""
        deployment = Deployment(deployment_id=command.deployment_id, run_id=command.run_id, stack=command.stack,
                                endpoints=[], processes=[])  # fmt: skip
        head = not command.pool or command.pool[0].get("name") == self._node_id
        if not head:
            deployment.facts["note"] = "split stack: its engines and router run on the pool's first machine"
            return deployment
        layout = layout_for(_layout(command)["workload"], command.sim or {})
        urls: dict[str, list[str]] = {"prefill": [], "decode": []}
        try:
            roles: tuple[tuple[Literal["prefill", "decode"], int], ...] = (
                ("prefill", layout.prefill_engines),
                ("decode", layout.engines),
            )
            for role, count in roles:
                for index in range(count):
                    port = free_port()
                    argv = sim_engine_argv(command, port, pd_role=role)
                    await self._engine(deployment, command, argv, port, f"{role}{index}", role)
                    urls[role].append(f"http://127.0.0.1:{port}")
            policy = command.routing if command.routing in POLICIES else "pd_aware"
            port = free_port()
            argv = sim_router_argv(port, policy, urls["decode"], urls["prefill"])
            await self._process(deployment, command, "router", argv, port)
        except LaunchError:
            deployment.stop()
            raise
        deployment.endpoints.insert(0, self._endpoint("router", "router", port))
        deployment.facts["router_argv"] = " ".join(argv[1:])
        deployment.facts["routing"] = policy
        return deployment

    async def _process(self, deployment: Deployment, command: StartStack, name: str, argv: list[str],
                       port: int) -> Path:  # fmt: skip
        """Start one process of the deployment and wait until it answers on ``port`` (the deployment is stopped
        when it does not); returns its log."""
        log_path = self._state_dir / "logs" / f"{command.deployment_id}-{name}.log"
        process = ManagedProcess(f"sim-{name}", spawn(argv, log_path, SIM_ENV), log_path)
        deployment.processes.append(process)
        try:
            await wait_healthy(f"http://127.0.0.1:{port}/health", process, self._health_timeout_s)
        except LaunchError:
            deployment.stop()
            raise
        return log_path

    def _endpoint(self, name: str, role: Literal["both", "prefill", "decode", "router"], port: int) -> EngineEndpoint:
        return EngineEndpoint(
            node_id=self._node_id,
            engine_id=f"{self._node_id}-{'e' + name[6:] if name.startswith('engine') else name}",
            role=role,
            base_url=f"http://127.0.0.1:{port}",
            metrics_url=f"http://127.0.0.1:{port}/metrics",
        )

    async def _engine(self, deployment: Deployment, command: StartStack, argv: list[str], port: int, name: str,
                      role: Literal["both", "prefill", "decode"]) -> None:  # fmt: skip
        log_path = await self._process(deployment, command, name, argv, port)
        deployment.endpoints.append(self._endpoint(name, role, port))
        block_size = read_block_size(log_path)
        if block_size:
            deployment.facts["attention_block_size"] = block_size

    async def stop(self, deployment: Deployment) -> None:
        deployment.stop()
