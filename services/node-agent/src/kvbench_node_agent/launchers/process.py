"""The `process` launcher (bare metal) and the `docker` launcher: rendered recipes as real processes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shlex
import subprocess
import time
from collections.abc import Collection
from pathlib import Path

import aiohttp

from kvbench_contracts.events import EngineEndpoint
from kvbench_core.procs import spawn
from kvbench_node_agent.launchers.base import Deployment, LaunchError, ManagedProcess, read_block_size, wait_healthy
from kvbench_node_agent.preflight import hub_cache
from kvbench_stacks.recipes.model import ProcessSpec

__all__ = ["ProcessLauncher", "docker_argv", "launch_process", "materialize"]


def materialize(spec: ProcessSpec, run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """Write the spec's config files and resolve {run_dir} in its argv and env."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, content in spec.files.items():
        (run_dir / name).write_text(content)
    argv = [a.replace("{run_dir}", str(run_dir)) for a in spec.argv]
    env = {k: v.replace("{run_dir}", str(run_dir)) for k, v in spec.env.items()}
    return argv, env


def docker_argv(
    spec: ProcessSpec,
    deployment_id: str,
    run_dir: Path,
    vendor: str = "nvidia",
    rdma: bool = False,
    secret_names: Collection[str] = (),
) -> list[str]:
    """``docker run`` for one process, its command line run as it is (``--entrypoint`` is its program, whatever the
    image's own entrypoint). ``secret_names``: variables the container gets from the environment of the
    ``docker`` command itself (``-e NAME``, no value): a secret's value never appears on a command line, where any
    user of the machine could read it (``ps``)."""
    argv, env = materialize(spec, run_dir)
    out = [
        "docker",
        "run",
        "-d",
        "--rm",
        "--name",
        f"kvbench-{deployment_id}-{spec.name}",
        "--network",
        "host",
        "--ipc",
        "host",
        "-v",
        f"{run_dir}:{run_dir}",
        # the models where the agent's preflight found them (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/...), as
        # a host path: an agent in a container (deploy/compose/agent.yaml) sets HF_HOME to the host's own path
        "-v",
        f"{hub_cache()}:/root/.cache/huggingface/hub",
    ]
    if spec.gpus:
        if vendor == "amd":
            out += ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video"]
        else:
            out += ["--gpus", f'"device={",".join(str(g) for g in spec.gpus)}"']
    if rdma:
        out += ["--device", "/dev/infiniband", "--ulimit", "memlock=-1", "--cap-add", "IPC_LOCK"]
    for folder in sorted({str(Path(path).parent) for path in spec.host_code}):
        out += ["-v", f"{folder}:{folder}:ro"]  # scripts no image holds, read-only: the container runs, never edits
    for key, value in sorted(env.items()):
        out += ["-e", f"{key}={value}"]
    for name in sorted(secret_names):
        out += ["-e", name]
    # the recipe's command line is the whole command: an image's own entrypoint (vllm/vllm-openai's is `vllm serve`,
    # older ones `python3 -m vllm.entrypoints.openai.api_server`) would be prefixed to it and double it up
    return [*out, "--entrypoint", argv[0], spec.image or "MISSING-IMAGE", *argv[1:]]


async def launch_process(
    spec: ProcessSpec,
    run_dir: Path,
    log_path: Path,
    timeout_s: float,
    extra_env: dict[str, str] | None = None,
    host: str = "127.0.0.1",
) -> ManagedProcess:
    """Write the spec's files, start it (dying with the agent) and wait until its health check answers on ``host``;
    a process that exits or never answers raises LaunchError with its log's end. The caller keeps the process, to
    stop it with the rest of its deployment."""
    argv, env = materialize(spec, run_dir)
    process = ManagedProcess(spec.name, spawn(argv, log_path, {**os.environ, **env, **(extra_env or {})}), log_path,
                             role=spec.role)  # fmt: skip
    process.relaunch = functools.partial(launch_process, spec, run_dir, log_path, timeout_s, extra_env, host)
    try:
        kind, port, path = spec.health
        if kind == "http":
            await wait_healthy(f"http://{host}:{port}{path}", process, timeout_s)
        else:
            await wait_tcp(port, process, timeout_s)
    except LaunchError:
        process.stop()
        raise
    return process


class ProcessLauncher:
    """Starts each process in order, waits for its health check, and stops them in reverse order."""

    def __init__(self, name: str, node_id: str, host: str, state_dir: Path, health_timeout_s: float) -> None:
        self.name = name  # "process" or "docker"
        self._node_id = node_id
        self._host = host
        self._state_dir = state_dir
        self._health_timeout_s = health_timeout_s

    async def start_specs(
        self,
        deployment_id: str,
        run_id: str,
        stack: str,
        specs: list[ProcessSpec],
        secrets_env: dict[str, str] | None = None,
        vendor: str = "nvidia",
    ) -> Deployment:
        run_dir = self._state_dir / "runs" / deployment_id
        deployment = Deployment(deployment_id=deployment_id, run_id=run_id, stack=stack, endpoints=[])
        try:
            for spec in specs:
                log_path = run_dir / f"{spec.name}.log"
                if self.name == "docker":
                    argv = docker_argv(spec, deployment_id, run_dir, vendor, secret_names=list(secrets_env or {}))
                    container = argv[argv.index("--name") + 1]
                    docker_env = {**os.environ, **(secrets_env or {})}
                    await asyncio.to_thread(subprocess.run, argv, check=True, capture_output=True, timeout=600,
                                            env=docker_env)  # fmt: skip
                    logs = ["docker", "logs", "-f", container]
                    proc = spawn(logs, log_path, tie_to_parent=True)
                    process = ManagedProcess(spec.name, proc, log_path, container=container, role=spec.role)
                    process.relaunch = functools.partial(self._rerun_container, spec, argv, container, log_path,
                                                         docker_env)  # fmt: skip
                    deployment.processes.append(process)
                    await self._wait(spec, process)
                else:
                    process = await launch_process(spec, run_dir, log_path, self._health_timeout_s, secrets_env)
                    deployment.processes.append(process)
                    port = spec.health[1]
                if spec.role in ("engine", "prefill", "decode"):
                    block = read_block_size(log_path)
                    if block:
                        deployment.facts[f"{spec.name}.attention_block_size"] = block
                    # what was tested, as it ran: the command line as started (secrets travel in the environment,
                    # never on it) and the version the engine itself reports
                    deployment.facts[f"{spec.name}.command"] = shlex.join(materialize(spec, run_dir)[0])
                    version = await engine_version(f"http://127.0.0.1:{spec.health[1]}")
                    if version:
                        deployment.facts[f"{spec.name}.version"] = version
                for telemetry_port, telemetry_path in spec.telemetry:
                    deployment.transfer_agents.append(
                        (f"{spec.name}-nixl", f"http://127.0.0.1:{telemetry_port}{telemetry_path}")
                    )
                if spec.metrics and not spec.serves_requests and spec.role in ("lmcache", "master", "store"):
                    deployment.scrape_only.append((spec.name, f"http://127.0.0.1:{spec.metrics[0]}{spec.metrics[1]}"))
                if spec.serves_requests or spec.role in ("engine", "prefill", "decode"):
                    metrics = spec.metrics or (port, "/metrics")
                    deployment.endpoints.append(
                        EngineEndpoint(
                            node_id=self._node_id,
                            engine_id=f"{self._node_id}-{spec.name}",
                            role="router"
                            if spec.role == "router"
                            else spec.role
                            if spec.role in ("prefill", "decode")
                            else "both",
                            base_url=f"http://{self._host}:{spec.ports.get('http', port)}",
                            metrics_url=f"http://{self._host}:{metrics[0]}{metrics[1]}",
                        )
                    )
        except (LaunchError, subprocess.SubprocessError, OSError) as exc:
            deployment.stop()
            raise LaunchError(f"{self._node_id}: {exc}") from exc
        return deployment

    async def _wait(self, spec: ProcessSpec, process: ManagedProcess) -> None:
        kind, port, path = spec.health
        if kind == "http":
            await wait_healthy(f"http://127.0.0.1:{port}{path}", process, self._health_timeout_s)
        else:
            await wait_tcp(port, process, self._health_timeout_s)

    async def _rerun_container(self, spec: ProcessSpec, argv: list[str], container: str, log_path: Path,
                               env: dict[str, str]) -> ManagedProcess:  # fmt: skip
        """The container run again as it was first run (stopping removed it: containers run with --rm)."""
        await asyncio.to_thread(subprocess.run, ["docker", "rm", "-f", container], capture_output=True, timeout=60,
                                check=False)  # fmt: skip
        await asyncio.to_thread(subprocess.run, argv, check=True, capture_output=True, timeout=600, env=env)
        proc = spawn(["docker", "logs", "-f", container], log_path, tie_to_parent=True)
        process = ManagedProcess(spec.name, proc, log_path, container=container, role=spec.role)
        process.relaunch = functools.partial(self._rerun_container, spec, argv, container, log_path, env)
        await self._wait(spec, process)
        return process

    async def stop(self, deployment: Deployment) -> None:
        await asyncio.to_thread(deployment.stop)


async def engine_version(base_url: str) -> str | None:
    """The version an engine reports: vLLM's and TensorRT-LLM's ``GET /version`` ({"version": "0.25.1"}), SGLang's
    ``GET /get_server_info`` ("version"); None when it says none."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        for path in ("/version", "/get_server_info"):
            try:
                async with session.get(base_url + path) as response:
                    if response.status != 200:
                        continue
                    body = await response.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError):
                continue
            if isinstance(body, dict) and isinstance(body.get("version"), str):
                return str(body["version"])
    return None


async def wait_tcp(port: int, process: ManagedProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.proc.poll() is not None and process.container is None:
            raise LaunchError(
                f"{process.name} exited with code {process.proc.returncode} before it listened on "
                f"{port}; see {process.log_path}"
            )
        with contextlib.suppress(OSError):
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1.0)
            writer.close()
            return
        await asyncio.sleep(0.1)
    raise LaunchError(f"{process.name} did not listen on port {port} within {timeout_s:.0f} s")
