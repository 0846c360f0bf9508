"""The `sim` launcher: simulated engines (kvbench_sim) as real child processes of the agent."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

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
from kvbench_sim.stacks import SIM_STACKS

__all__ = ["SIM_STACK_FLAGS", "SimLauncher", "sim_engine_argv"]

# Stacks with a simulated form in server mode (kvbench_sim.stacks maps each to engine settings and tiers);
# split (P/D) stacks are simulated in batch mode (`kvbench sim run`) only.
SIM_STACK_FLAGS: dict[str, list[str]] = {stack: [] for stack in SIM_STACKS if "-pd-" not in stack}


def sim_engine_argv(command: StartStack, port: int) -> list[str]:
    if command.stack not in SIM_STACK_FLAGS:
        known = ", ".join(sorted(SIM_STACK_FLAGS))
        hint = " (split stacks run in batch mode: kvbench sim run PLAN)" if "-pd-" in command.stack else ""
        raise LaunchError(f"stack {command.stack} has no simulated server form{hint}; simulated stacks: {known}")
    sim: dict[str, Any] = command.sim or {}
    engine = command.engine or {}
    layout = {
        "workload": {
            "stack": command.stack,
            "model": command.model,
            "engine": engine,
            "sizing": command.sizing,
            "kv_tier": command.kv_tier,
        },
        "cluster": sim,
    }
    return [
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
        str(sim.get("speed", 1.0)),
        "--layout",
        json.dumps(layout),
    ]


class SimLauncher:
    name = "sim"

    def __init__(self, node_id: str, state_dir: Path, health_timeout_s: float) -> None:
        self._node_id = node_id
        self._state_dir = state_dir
        self._health_timeout_s = health_timeout_s

    async def start(self, command: StartStack) -> Deployment:
        port = free_port()
        argv = sim_engine_argv(command, port)
        log_path = self._state_dir / "logs" / f"{command.deployment_id}-engine0.log"
        process = ManagedProcess("sim-engine", spawn(argv, log_path), log_path)
        deployment = Deployment(
            deployment_id=command.deployment_id,
            run_id=command.run_id,
            stack=command.stack,
            endpoints=[
                EngineEndpoint(
                    node_id=self._node_id,
                    engine_id=f"{self._node_id}-e0",
                    base_url=f"http://127.0.0.1:{port}",
                    metrics_url=f"http://127.0.0.1:{port}/metrics",
                )
            ],
            processes=[process],
        )
        try:
            await wait_healthy(f"http://127.0.0.1:{port}/health", process, self._health_timeout_s)
        except LaunchError:
            deployment.stop()
            raise
        block_size = read_block_size(log_path)
        if block_size:
            deployment.facts["attention_block_size"] = block_size
        deployment.facts["engine_argv"] = " ".join(argv[1:])
        return deployment

    async def stop(self, deployment: Deployment) -> None:
        deployment.stop()
