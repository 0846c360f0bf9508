"""The `sim` launcher: simulated engines (kvbench_sim) as real child processes of the agent.

The agent and the simulator meet through one typed contract: for each process the launcher writes a spec file
(``kvbench_contracts.sim``) in the deployment's directory and starts ``python -m kvbench_sim {serve|store|route}
--spec FILE``. The simulator works out its tiers, capacities and records from the spec; the agent imports none of
it, so a node agent on a GPU machine installs no simulator. Which stacks have a simulated form, which are split and
which share a store are the catalog's facts (``kvbench_stacks``).
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path
from typing import Literal, NamedTuple, get_args

from kvbench_contracts.commands import StartStack
from kvbench_contracts.events import EngineEndpoint
from kvbench_contracts.plan import SimCluster
from kvbench_contracts.sim import SimEngineSpec, SimRouterSpec, SimRoutingPolicy, SimStoreSpec, SimWorkload
from kvbench_core.procs import AGREED_PORTS_FROM, AGREED_PORTS_SPAN, free_port
from kvbench_node_agent.launchers.base import (
    Deployment,
    LaunchError,
    read_block_size,
)
from kvbench_node_agent.launchers.process import launch_process
from kvbench_stacks.catalog import CATALOG, SIMULATED_STACKS
from kvbench_stacks.recipes.model import Role
from kvbench_stacks.recipes.servers import group_engines
from kvbench_stacks.recipes.sim import SimVerb, simulated_process
from kvbench_stacks.topology import SimEngineCounts, sim_engine_counts

__all__ = ["SimLauncher", "sim_engine_spec", "sim_workload"]

_POLICIES: tuple[str, ...] = get_args(SimRoutingPolicy)


def sim_workload(command: StartStack, own: SimCluster | None = None) -> tuple[SimWorkload, SimCluster]:
    """The command's workload and simulated cluster as the simulator's contract; a stack with no simulated form
    or settings the contract refuses fail here, before anything starts (retrying would not help)."""
    if command.stack not in SIMULATED_STACKS:
        known = ", ".join(SIMULATED_STACKS)
        raise LaunchError(f"stack {command.stack} has no simulated server form; simulated stacks: {known}")
    workload = SimWorkload(stack=command.stack, model=command.model, engine=command.engine, sizing=command.sizing,
                           kv_tier=command.kv_tier)  # fmt: skip
    if command.sim is not None:
        return workload, command.sim
    # a group of simulated hosts: the pool is the command's, each host simulating the GPUs it declares
    cluster = (own or SimCluster()).model_copy(update={"machines": max(1, len(command.pool))})
    return workload, cluster


def sim_engine_spec(
    command: StartStack,
    port: int,
    pd_role: Literal["prefill", "decode"] | None = None,
    shared_store_url: str | None = None,
    records_dir: str | None = None,
    host: str = "127.0.0.1",
    own: SimCluster | None = None,
) -> SimEngineSpec:
    workload, cluster = sim_workload(command, own)
    return SimEngineSpec(host=host, port=port, workload=workload, cluster=cluster, pd_role=pd_role,
                         shared_store_url=shared_store_url, records_dir=records_dir)  # fmt: skip


def store_port(command: StartStack) -> int:
    """The shared store's port, the same on every machine of the pool (each agent works it out on its own)."""
    key = f"{command.run_id}/{command.workload}/{command.stack}/" + ",".join(p.name for p in command.pool)
    digest = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big")
    return AGREED_PORTS_FROM + digest % AGREED_PORTS_SPAN


def records_dir(state_dir: Path, command: StartStack, owner: str, path: str | None) -> Path:
    """Where a simulated file tier keeps its records: per run (a run starts with none, as a freshly cleaned disk
    would), per machine (``owner``; "shared" for a shared filesystem) and per configured path, so a stack restarted
    within the run (cache_state: empty, a lost engine) finds what it stored, as LMCache finds its disk records."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", (path or "default").strip("/")) or "default"
    return state_dir / "sim-records" / command.run_id / owner / slug


class _CacheServer(NamedTuple):
    url: str  # ws://HOST:PORT
    here: bool  # it runs on this machine


class SplitSlot(NamedTuple):
    role: Literal["prefill", "decode"]
    number: int  # within its role
    machine: int  # index in the pool
    port: int


def split_layout(command: StartStack, counts: SimEngineCounts, gpus_per_machine: int, tp: int) -> list[SplitSlot]:
    """Where each engine of a split stack runs: prefill engines first, then decode, filling each machine with as
    many engines as its GPUs hold (``prefill_machines: 1`` on two one-GPU machines: prefill on the first, decode
    on the second, as the plan's review shows); ports from the command, the same on every machine's agent."""
    per_machine = max(1, gpus_per_machine // max(1, tp))
    machines = max(1, len(command.pool))
    base = store_port(command) + 1
    slots: list[SplitSlot] = []
    prefill: list[Literal["prefill", "decode"]] = ["prefill"] * counts.prefill
    decode: list[Literal["prefill", "decode"]] = ["decode"] * counts.engines
    roles = prefill + decode
    seen: dict[str, int] = {"prefill": 0, "decode": 0}
    for k, role in enumerate(roles):
        slots.append(SplitSlot(role, seen[role], min(k // per_machine, machines - 1), base + k))
        seen[role] += 1
    return slots


_STORE_LINE = re.compile(r"shared store: (\d+) chunks; link ([0-9.]+) GB/s")


def _store_size(log_path: Path) -> str:
    """The capacity and link the store worked out from its spec, as it logged them ("" when it did not say)."""
    try:
        found = _STORE_LINE.findall(log_path.read_text(errors="replace"))
    except OSError:
        return ""
    return f"{found[-1][0]} chunks, {found[-1][1]} GB/s shared, " if found else ""


class SimLauncher:
    name = "sim"

    def __init__(self, node_id: str, state_dir: Path, health_timeout_s: float, address: str | None = None,
                 own_cluster: SimCluster | None = None) -> None:  # fmt: skip
        self._node_id = node_id
        self._own_cluster = own_cluster or SimCluster()
        self._state_dir = state_dir
        self._health_timeout_s = health_timeout_s
        # an agent given an address (a simulated host of a lab, in a network of its own) serves its engines there,
        # where the load generator and the pool's other machines reach them; else on loopback (kvbench up)
        self._host = address or "127.0.0.1"

    def _deployment(self, command: StartStack) -> Deployment:
        return Deployment(deployment_id=command.deployment_id, run_id=command.run_id, stack=command.stack,
                          endpoints=[], processes=[])  # fmt: skip

    async def start(self, command: StartStack) -> Deployment:
        workload, _ = sim_workload(command, self._own_cluster)
        stack = CATALOG[command.stack]
        if stack.split:
            return await self._start_split(command)
        deployment = self._deployment(command)
        port = free_port(self._host)
        store_url = await self._shared_store(deployment, command)
        disk: Path | None = None
        if stack.has_disk_tier(workload.kv_tier, workload.sizing.disk_tier_gb):
            disk = records_dir(self._state_dir, command, self._node_id, workload.sizing.disk_tier_path)
            deployment.facts["disk_records"] = str(disk)
        server = await self._cache_server(deployment, command, disk)
        spec = sim_engine_spec(command, port, shared_store_url=store_url, records_dir=str(disk) if disk else None,
                               host=self._host, own=self._own_cluster)  # fmt: skip
        spec = spec.model_copy(update={
            "engine_id": self._endpoint("engine0", "both", port).engine_id,
            "cache_server_url": server.url if server else None,
            "cache_server_here": server.here if server else True,
        })  # fmt: skip
        argv = await self._engine(deployment, command, spec, "engine0", "both")
        deployment.facts["engine_argv"] = " ".join(argv[1:])
        return deployment

    async def _shared_store(self, deployment: Deployment, command: StartStack) -> str | None:
        """Stacks with a shared tier: the pool's first machine starts the store process; every engine of the pool
        connects to it (and waits for it, when its machine came up first)."""
        store = CATALOG[command.stack].shared_store
        if store is None:
            return None
        port = store_port(command)
        head = command.pool[0].host if command.pool and self._host != "127.0.0.1" else "127.0.0.1"
        url = f"ws://{head}:{port}/ws"
        if command.pool and command.pool[0].name != self._node_id:
            return url
        workload, cluster = sim_workload(command, self._own_cluster)
        mount = None
        if store == "shared-fs":  # a file-backed pool keeps its index across restarts
            mount = records_dir(self._state_dir, command, "shared", workload.sizing.shared_mount_path)
            deployment.facts["shared_records"] = str(mount)
        spec = SimStoreSpec(host=self._host, port=port, workload=workload, cluster=cluster,
                            records_dir=str(mount) if mount else None)  # fmt: skip
        try:
            await self._process(deployment, command, "store", "store", spec)
        except LaunchError as exc:
            raise LaunchError(f"the shared store could not listen on port {port}: {exc}") from None
        deployment.facts["shared_store"] = f"{store}, {_store_size(deployment.processes[-1].log_path)}port {port}"
        return url

    async def _cache_server(
        self, deployment: Deployment, command: StartStack, disk: Path | None
    ) -> _CacheServer | None:
        """LMCache stacks whose engines share servers (``sizing.engines_per_cache_server`` above one): grouped as the
        recipe groups them, the machine of a group's first engine starts the group's simulated LMCache server (its L1
        and disk tiers, their capacity and links) and every engine of the group connects to it. A simulated machine
        runs one engine, so by default (a server per machine) each engine keeps its server's tiers itself."""
        per = command.sizing.engines_per_cache_server
        if not CATALOG[command.stack].lmcache_server or not per or per <= 1:
            return None
        names = [p.name for p in command.pool] or [self._node_id]
        mine = names.index(self._node_id) if self._node_id in names else 0
        servers = group_engines([(m, 0) for m in range(len(names))], len(names), per)
        number, server = next((k, s) for k, s in enumerate(servers) if (mine, 0) in s.engines)
        port = store_port(command) + 1 + number  # the same on every machine: each agent works it out alike
        remote = self._host != "127.0.0.1"
        host = command.pool[server.machine].host if remote and command.pool else "127.0.0.1"
        shared = _CacheServer(f"ws://{host}:{port}", server.machine == mine)
        if not shared.here:
            deployment.facts["cache_server"] = f"shared, on {names[server.machine]} port {port}"
            return shared
        workload, cluster = sim_workload(command, self._own_cluster)
        kept = disk / f"cache-server-{number}" if disk else None
        spec = SimStoreSpec(host=self._host, port=port, workload=workload, cluster=cluster,
                            records_dir=str(kept) if kept else None, cache_server=number)  # fmt: skip
        try:
            await self._process(deployment, command, f"lmcache-{number}", "store", spec)
        except LaunchError as exc:
            raise LaunchError(f"the simulated LMCache server could not listen on port {port}: {exc}") from None
        users = ", ".join(names[m] for m, _ in server.engines)
        deployment.facts["cache_server"] = f"LMCache server {number} (simulated) here, port {port}, for {users}"
        if kept:
            deployment.facts["disk_records"] = str(kept)
        return shared

    async def _start_split(self, command: StartStack) -> Deployment:
        """P/D, placed as the plan says: the pool's engines are laid out in order, prefill first, over its machines
        (each machine runs as many as its GPUs hold), and every agent starts the engines on its own machine, on
        ports every agent works out alike; the pool's first machine also runs the router, pointed at all of them."""
        deployment = self._deployment(command)
        workload, cluster = sim_workload(command, self._own_cluster)
        counts = sim_engine_counts(command.stack, workload.sizing, cluster, workload.engine.tensor_parallel_size)
        layout = split_layout(command, counts, workload.sizing.gpus_per_machine or cluster.gpus_per_machine,
                              workload.engine.tensor_parallel_size)  # fmt: skip
        names = [p.name for p in command.pool] or [self._node_id]
        mine = names.index(self._node_id) if self._node_id in names else 0
        remote = self._host != "127.0.0.1"
        urls: dict[str, list[str]] = {"prefill": [], "decode": []}
        try:
            for slot in layout:
                host = command.pool[slot.machine].host if remote and command.pool else self._host
                urls[slot.role].append(f"http://{host}:{slot.port}")
                if slot.machine != mine:
                    continue
                spec = sim_engine_spec(command, slot.port, pd_role=slot.role, host=self._host, own=self._own_cluster)
                await self._engine(deployment, command, spec, f"{slot.role}{slot.number}", slot.role)
            if mine != 0:
                deployment.facts["note"] = "split stack: this machine's engines; the router runs on the first machine"
                return deployment
            policy = command.routing if command.routing in _POLICIES else "pd_aware"
            router = SimRouterSpec(
                host=self._host,
                port=free_port(self._host),
                policy=policy,  # type: ignore[arg-type]  # checked against the contract's policies above
                engines=urls["decode"],
                prefill=urls["prefill"],
            )
            argv = await self._process(deployment, command, "router", "route", router)
        except LaunchError:
            deployment.stop()
            raise
        deployment.endpoints.insert(0, self._endpoint("router", "router", router.port))
        deployment.facts["router_argv"] = " ".join(argv[1:])
        deployment.facts["routing"] = policy
        return deployment

    async def _process(self, deployment: Deployment, command: StartStack, name: str, verb: SimVerb,
                       spec: SimEngineSpec | SimStoreSpec | SimRouterSpec) -> list[str]:  # fmt: skip
        """Start one simulated process as the process launcher starts any (its spec file first, then a health
        check; the deployment is stopped when it does not answer); returns its command line."""
        role: Role = "store" if verb == "store" else "router" if verb == "route" else "engine"
        process_spec = simulated_process(name, verb, role, spec, sys.executable, self._host, spec.port)
        run_dir = self._state_dir / "runs" / command.deployment_id
        log_path = self._state_dir / "logs" / f"{command.deployment_id}-{name}.log"
        try:
            process = await launch_process(process_spec, run_dir, log_path, self._health_timeout_s, host=self._host)
        except LaunchError:
            deployment.stop()
            raise
        deployment.processes.append(process)
        return [a.replace("{run_dir}", str(run_dir)) for a in process_spec.argv]

    def _endpoint(self, name: str, role: Literal["both", "prefill", "decode", "router"], port: int) -> EngineEndpoint:
        return EngineEndpoint(
            node_id=self._node_id,
            engine_id=f"{self._node_id}-{'e' + name[6:] if name.startswith('engine') else name}",
            role=role,
            base_url=f"http://{self._host}:{port}",
            metrics_url=f"http://{self._host}:{port}/metrics",
        )

    async def _engine(self, deployment: Deployment, command: StartStack, spec: SimEngineSpec, name: str,
                      role: Literal["both", "prefill", "decode"]) -> list[str]:  # fmt: skip
        argv = await self._process(deployment, command, name, "serve", spec)
        deployment.endpoints.append(self._endpoint(name, role, spec.port))
        block_size = read_block_size(self._state_dir / "logs" / f"{command.deployment_id}-{name}.log")
        if block_size:
            deployment.facts["attention_block_size"] = block_size
        return argv

    async def stop(self, deployment: Deployment) -> None:
        deployment.stop()
