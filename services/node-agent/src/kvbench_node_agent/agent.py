"""The node agent: registers, heartbeats, starts and stops stacks on command, scrapes engines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import time
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge

from kvbench_contracts.commands import ReadEngines, RestartEngines, StartStack, StopStack
from kvbench_contracts.envelope import Envelope, utc_now
from kvbench_contracts.events import (
    EngineSampled,
    EnginesRead,
    EnginesRestarted,
    NodeRegistered,
    SampledRole,
    StackFailed,
    StackReady,
    StackStopped,
)
from kvbench_contracts.fabric import NicSampled
from kvbench_contracts.node import Heartbeat
from kvbench_contracts.plan import SimCluster
from kvbench_core.allowlist import refusals
from kvbench_core.bus import Bus
from kvbench_core.logging import configure_logging
from kvbench_core.metrics import metric_name, new_registry, ops_server
from kvbench_core.sealing import AgentKey, SealingError
from kvbench_core.settings import load_settings
from kvbench_node_agent.disk_tier import census, fill_warning
from kvbench_node_agent.fabric import nic_counter_samples
from kvbench_node_agent.inventory import collect_inventory, gpu_samples
from kvbench_node_agent.launchers import Deployment, LaunchError, SimLauncher
from kvbench_node_agent.launchers.process import ProcessLauncher
from kvbench_node_agent.models import resolve_model
from kvbench_node_agent.normalize import normalize
from kvbench_node_agent.preflight import PreflightIssue, preflight
from kvbench_node_agent.scrape import parse_samples
from kvbench_node_agent.settings import NodeAgentSettings
from kvbench_stacks.catalog import CATALOG
from kvbench_stacks.recipes import PoolMachine, RenderContext, UnknownStackError, render

__all__ = ["NodeAgent", "main"]

log = logging.getLogger("kvbench_node_agent")


class NodeAgent:
    def __init__(self, settings: NodeAgentSettings, bus: Bus, registry: CollectorRegistry) -> None:
        self.settings = settings
        self.bus = bus
        self.node_id = settings.node_id
        declared = (settings.sim_gpu, settings.sim_gpus) if settings.sim_gpus else None
        self._key = AgentKey()  # made now, never written down: a secret for this machine is sealed to it
        self.inventory = collect_inventory(settings.node_id, settings.simulated, settings.group, settings.address,
                                           sim_switch=settings.sim_switch, sim_gpus=declared,
                                           policy=settings.policy()).model_copy(
            update={"public_key": self._key.public_key})  # fmt: skip
        state_dir = Path(settings.state_dir) / settings.node_id
        host = self.inventory.address or "127.0.0.1"
        # a simulated host of a group simulates the GPUs it declares when a plan has no sim section
        own = SimCluster(gpu=settings.sim_gpu, gpus_per_machine=max(1, settings.sim_gpus))
        self.sim = SimLauncher(settings.node_id, state_dir, settings.engine_health_timeout_s, settings.address, own)
        self.launchers: dict[str, ProcessLauncher] = {
            name: ProcessLauncher(name, settings.node_id, host, state_dir, settings.engine_health_timeout_s)
            for name in ("process", "docker")
        }
        self.deployments: dict[str, Deployment] = {}
        self._scrapers: dict[str, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()
        self._restarts: dict[str, EnginesRestarted] = {}  # RestartEngines handled: command id -> the answer
        self.m_deployments = Gauge(
            metric_name("node_agent", "deployments", "count"), "Running deployments", registry=registry
        )
        self.m_launch_failures = Counter(
            metric_name("node_agent", "launch_failures", "total"),
            "Stacks that failed to start",
            registry=registry,
        )

    async def register(self) -> None:
        await self.bus.publish(NodeRegistered(node_id=self.node_id, inventory=self.inventory))
        inventory = await self.bus.kv("kvbench_inventory")
        await inventory.put(self.node_id, self.inventory.model_dump_json().encode())
        await self.heartbeat()
        log.info("registered", extra={"node_id": self.node_id, "simulated": self.inventory.simulated})

    async def heartbeat(self) -> None:
        kv = await self.bus.kv("kvbench_nodes")
        beat = Heartbeat(inventory=self.inventory, at=time.time(), deployments=sorted(self.deployments))
        await kv.put(self.node_id, beat.model_dump_json().encode())

    async def heartbeat_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.heartbeat()
            except Exception:
                log.exception("heartbeat failed", extra={"node_id": self.node_id})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.settings.heartbeat_s)

    async def handle(self, command: Envelope) -> None:
        if isinstance(command, ReadEngines):  # at once: an edge read waits for nothing
            await self._read_at_edge(command)
            return
        async with self._lock:
            if isinstance(command, StartStack):
                await self._start(command)
            elif isinstance(command, StopStack):
                await self._stop(command.deployment_id, command.run_id)
            elif isinstance(command, RestartEngines):
                await self._restart_engines(command)

    async def _restart_engines(self, command: RestartEngines) -> None:
        """The engines of a deployment restarted alone, its cache servers and stores kept (a redelivered command is
        answered again with what was done, not done twice)."""
        ids = {"run_id": command.run_id, "deployment_id": command.deployment_id, "node_id": self.node_id}
        done = self._restarts.get(command.event_id)
        if done is not None:
            await self.bus.publish(done)
            return
        deployment = self.deployments.get(command.deployment_id)
        answer = EnginesRestarted(deployment_id=command.deployment_id, run_id=command.run_id, node_id=self.node_id)
        if deployment is None:
            answer = answer.model_copy(update={"error": f"{self.node_id} runs no deployment {command.deployment_id}"})
        else:
            log.info("restarting the engines alone", extra=ids)
            started = time.monotonic()
            try:
                engines, kept = await deployment.restart_engines()
            except LaunchError as exc:
                answer = answer.model_copy(update={"error": f"{self.node_id}: {exc}"})
            else:
                answer = answer.model_copy(
                    update={"engines": engines, "kept": kept, "took_s": time.monotonic() - started}
                )
        if answer.error:
            log.error("engines not restarted", extra={**ids, "reason": answer.error[:500]})
        else:
            log.info("engines restarted", extra={**ids, "engines": answer.engines, "took_s": round(answer.took_s, 2)})
        self._restarts[command.event_id] = answer
        await self.bus.publish(answer)

    async def _start(self, command: StartStack) -> None:
        ids = {"run_id": command.run_id, "deployment_id": command.deployment_id, "node_id": self.node_id}
        existing = self.deployments.get(command.deployment_id)
        if existing is not None:  # redelivered command: say again that it is up
            await self._publish_ready(existing)
            return
        if command.expires_at is not None and utc_now() > command.expires_at:
            # read too late (this agent was down, the run may have ended): the planner no longer waits for it
            log.warning("a start command expired before it was read: no engine started",
                        extra={**ids, "expired_at": command.expires_at.isoformat()})  # fmt: skip
            return
        log.info("starting stack", extra={**ids, "stack": command.stack, "launcher": command.launcher})
        tier_path = self._real_disk_tier(command)
        found = await asyncio.to_thread(census, tier_path) if tier_path else None
        try:
            deployment = await self._launch(command)
        except LaunchError as exc:
            await self._failed(command, str(exc))
            return
        except Exception as exc:
            # anything else is as deterministic (a bad setting, a missing profile): redelivering the command would
            # fail the same way while the run waited for health, so the run fails now, with the error's own words
            log.exception("stack could not be started", extra=ids)
            await self._failed(command, f"{self.node_id}: the stack could not be started: {type(exc).__name__}: {exc}")
            return
        deployment.workload = command.workload
        if tier_path:
            deployment.disk_tier_path = tier_path
            if found is not None:
                # records of earlier runs: they take disk the tier's size limit does not count (a process counts
                # only what it wrote), and one made under another model or block size is never a hit
                deployment.facts["disk_tier_found"] = f"{found[0]} files, {found[1] / 1e9:.2f} GB under {tier_path}"
                if found[0]:
                    extra = {**ids, "files": found[0], "bytes": found[1], "path": tier_path}
                    log.warning("the disk tier already holds records from before this stack", extra=extra)
                warning = fill_warning(command.sizing.disk_tier_gb, shutil.disk_usage(tier_path).free, found)
                if warning:
                    deployment.facts["disk_tier_warning"] = warning
                    log.warning(warning, extra=ids)
        self.deployments[command.deployment_id] = deployment
        self.m_deployments.set(len(self.deployments))
        self._scrapers[command.deployment_id] = asyncio.create_task(self._scrape_loop(deployment))
        await self._publish_ready(deployment)
        log.info("stack ready", extra={**ids, "endpoints": [e.base_url for e in deployment.endpoints]})

    def _real_disk_tier(self, command: StartStack) -> str | None:
        """The stack's local disk tier directory on this machine, when it has one and is not simulated (a simulated
        engine reports its simulated tier itself)."""
        stack = CATALOG.get(command.stack)
        path = command.sizing.disk_tier_path
        if self.inventory.simulated or stack is None or not path:
            return None
        return path if stack.has_disk_tier(command.kv_tier, command.sizing.disk_tier_gb) else None

    async def unreadable_command(self, data: bytes, error: str) -> None:
        """A command this agent cannot read (a planner of another kvbench version, a hand-made message): the stand-up
        it names fails at once with why, instead of the planner waiting out its stack-ready timeout."""
        try:
            raw = json.loads(data)
        except ValueError:
            return  # not JSON: nothing names a run to answer
        if not isinstance(raw, dict):
            return
        schema, run_id, deployment_id = raw.get("schema"), raw.get("run_id"), raw.get("deployment_id")
        answered = (StartStack.SCHEMA, RestartEngines.SCHEMA)
        if schema not in answered or not isinstance(run_id, str) or not isinstance(deployment_id, str):
            return
        first = error.strip().splitlines()
        reason = (
            f"The node agent on {self.node_id} could not read the {schema.split('/')[0].rsplit('.', 1)[-1]} command "
            f"({' '.join(first[:3])[:400]}). Install the same kvbench version on the planner and every node agent, "
            "then run the workload again."
        )
        self.m_launch_failures.inc()
        log.error("unreadable command answered", extra={"run_id": run_id, "deployment_id": deployment_id,
                                                        "node_id": self.node_id, "reason": reason})  # fmt: skip
        await self.bus.publish(StackFailed(deployment_id=deployment_id, run_id=run_id, node_id=self.node_id,
                                           reason=reason))  # fmt: skip

    async def _failed(self, command: StartStack, reason: str) -> None:
        self.m_launch_failures.inc()
        log.error("stack failed to start", extra={"run_id": command.run_id, "deployment_id": command.deployment_id,
                                                  "node_id": self.node_id, "reason": reason[:500]})  # fmt: skip
        await self.bus.publish(
            StackFailed(deployment_id=command.deployment_id, run_id=command.run_id, node_id=self.node_id, reason=reason)
        )

    async def _launch(self, command: StartStack) -> Deployment:
        if command.launcher == "sim":
            deployment: Deployment = await self.sim.start(command)
            return deployment
        launcher = self.launchers.get(command.launcher)
        if launcher is None:
            raise LaunchError(f"{self.node_id}: launcher {command.launcher!r} is not available; use process or docker")
        refused = refusals(command.engine.args, command.sizing, self.settings.policy(), command.engine.env)
        if refused:
            raise LaunchError(f"{self.node_id}: " + "; ".join(f"{p.field}: {p.message}. Fix: {p.fix}" for p in refused))
        machines = list(command.pool) or [
            PoolMachine(
                name=self.node_id,
                host=self.inventory.address or "127.0.0.1",
                gpus=self.inventory.gpus,
                vendor=self.inventory.vendor or "nvidia",
                gpu_model=self.inventory.gpu_model,
            )
        ]
        location = resolve_model(self.node_id, command.model, command.engine.args, self.settings.models_dir)
        if isinstance(location, PreflightIssue):
            raise LaunchError(f"preflight failed: {location}")
        # only vLLM and SGLang serve a local folder under the plan's id (--served-model-name)
        model_path = location.path if command.engine.name in ("vllm", "sglang") else None
        ctx = RenderContext.for_pool(command.stack, command.model, command.engine, command.kv_tier, command.sizing,
                                     command.network, machines, command.routing, command.open_reset_route,
                                     model_path)  # fmt: skip
        try:
            specs = render(ctx).get(self.node_id, [])
        except UnknownStackError as exc:
            raise LaunchError(f"{self.node_id}: {exc}") from exc
        token = self._secret(command)
        issues = preflight(
            self.node_id,
            specs,
            command.launcher,
            command.sizing.model_dump(mode="json"),
            self.inventory.ram_gb,
            command.model,
            has_token=token is not None,
        )
        if issues:
            raise LaunchError("preflight failed: " + "; ".join(str(i) for i in issues))
        vendor = next((m.vendor for m in machines if m.name == self.node_id), "nvidia")
        secrets_env = {"HF_TOKEN": token} if token else None
        deployment = await launcher.start_specs(
            command.deployment_id, command.run_id, command.stack, specs, secrets_env, vendor
        )
        deployment.facts["model_source"] = location.where
        return deployment

    def _secret(self, command: StartStack) -> str | None:
        """The Hugging Face token the planner sealed to this agent's key (an agent reads no stored secret itself)."""
        if not command.hf_token_sealed:
            return None
        try:
            return self._key.open(command.hf_token_sealed)
        except SealingError as exc:
            # sealed to this machine's previous agent (it restarted after the planner read its inventory)
            raise LaunchError(
                f"{self.node_id}: the Hugging Face token could not be opened ({exc}); run again"
            ) from None

    async def _publish_ready(self, deployment: Deployment) -> None:
        await self.bus.publish(
            StackReady(
                deployment_id=deployment.deployment_id,
                run_id=deployment.run_id,
                node_id=self.node_id,
                endpoints=deployment.endpoints,
                facts=deployment.facts,
                workload=deployment.workload,
            )
        )

    async def _stop(self, deployment_id: str, run_id: str) -> None:
        deployment = self.deployments.pop(deployment_id, None)
        scraper = self._scrapers.pop(deployment_id, None)
        if scraper:
            scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraper
        if deployment is not None:
            await asyncio.to_thread(deployment.stop)
        self.m_deployments.set(len(self.deployments))
        await self.bus.publish(StackStopped(deployment_id=deployment_id, run_id=run_id, node_id=self.node_id))
        log.info("stack stopped", extra={"deployment_id": deployment_id, "run_id": run_id, "node_id": self.node_id})

    async def _read_engines(
        self, deployment: Deployment, session: aiohttp.ClientSession, edge: ReadEngines | None = None
    ) -> tuple[int, list[str]]:
        """Every engine and cache server of ``deployment`` read once and published (``edge``: a read on command at
        an edge of a job's measured window; None: a periodic scrape). The reads go out together, so a window's edge
        is read on every engine at about the same instant."""
        stack = CATALOG.get(deployment.stack)
        # where an engine's unattributed connector hits come from, by its role (older vLLM cannot say itself)
        hits_tier = {role: stack.external_hits_tier(role) if stack else None
                     for role in ("both", "prefill", "decode", "router")}  # fmt: skip
        targets: list[tuple[str, str, SampledRole]] = [
            (e.engine_id, e.metrics_url, e.role) for e in deployment.endpoints
        ] + [(f"{self.node_id}-{name}", url, "cache_server") for name, url in deployment.scrape_only]
        targets += [(f"{self.node_id}-{name}", url, "kv_transfer") for name, url in deployment.transfer_agents]

        async def fetch(url: str) -> str | BaseException:
            try:
                async with session.get(url) as response:
                    return await response.text()
            except (aiohttp.ClientError, TimeoutError) as exc:
                return exc

        texts = await asyncio.gather(*(fetch(url) for _, url, _ in targets))
        read_at = utc_now()  # the counters' instant: what follows (the disk census, GPU samples) may take a while
        # one count of the disk tier a round, always carried by the first engine (the reporter sums engines, so the
        # machine's count must ride on one series only)
        tier = await asyncio.to_thread(census, deployment.disk_tier_path) if deployment.disk_tier_path else None
        gpus = await asyncio.to_thread(gpu_samples) if self.inventory.gpus else []
        failed: list[str] = []
        for index, ((engine_id, _, role), text) in enumerate(zip(targets, texts, strict=True)):
            if isinstance(text, BaseException):
                log.warning("engine scrape failed", extra={"engine_id": engine_id, "error": str(text)[:200]})
                failed.append(engine_id)
                continue
            normalized = normalize(values := parse_samples(text), external=hits_tier.get(role))
            if tier is not None and index == 0:
                normalized.update(disk_tier_records=float(tier[0]), disk_tier_bytes=float(tier[1]))
            await self.bus.publish(
                EngineSampled(
                    node_id=self.node_id,
                    run_id=deployment.run_id,
                    engine_id=engine_id,
                    role=role,
                    values=values,
                    normalized=normalized,
                    gpus=gpus if role not in ("cache_server", "kv_transfer") else [],
                    job_id=edge.job_id if edge else None,
                    edge=edge.edge if edge else None,
                    edge_at=edge.edge_at if edge else None,
                    occurred_at=read_at,
                )
            )
        return len(targets), failed

    async def _read_at_edge(self, command: ReadEngines) -> None:
        deployment = self.deployments.get(command.deployment_id)
        read, failed = 0, list[str]()
        if deployment is not None:  # else stopped meanwhile: nothing of this run to read here
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
                read, failed = await self._read_engines(deployment, session, command)
        await self.bus.publish(
            EnginesRead(
                deployment_id=command.deployment_id,
                run_id=command.run_id,
                node_id=self.node_id,
                job_id=command.job_id,
                edge=command.edge,
                engines=read,
                failed=failed,
            )
        )
        log.info("engines read at a window edge", extra={"run_id": command.run_id, "job_id": command.job_id,
                 "edge": command.edge, "late_s": round(time.time() - command.edge_at, 3)})  # fmt: skip

    async def _scrape_loop(self, deployment: Deployment) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            while True:
                await self._read_engines(deployment, session)
                if not self.inventory.simulated:  # the host side of each cable, for the NIC-to-port checks
                    host = self.inventory.hostname
                    samples = await asyncio.to_thread(nic_counter_samples, host)
                    if samples:
                        await self.bus.publish(
                            NicSampled(node_id=self.node_id, run_id=deployment.run_id, samples=samples)
                        )
                await asyncio.sleep(self.settings.scrape_interval_s)

    async def shutdown(self) -> None:
        """Agent stop: no engine outlives its agent."""
        for deployment_id in list(self.deployments):
            deployment = self.deployments.pop(deployment_id)
            task = self._scrapers.pop(deployment_id, None)
            if task:
                task.cancel()
            await asyncio.to_thread(deployment.stop)
        with contextlib.suppress(Exception):
            kv = await self.bus.kv("kvbench_nodes")
            await kv.delete(self.node_id)


async def run(settings: NodeAgentSettings, stop: asyncio.Event) -> None:
    registry = new_registry()
    async with AsyncExitStack() as stack:
        bus = await stack.enter_async_context(
            Bus.connect(
                settings.nats_url,
                name=f"node-agent-{settings.node_id}",
                registry=registry,
                service="node_agent",
                auth=settings.nats_auth(),
                replicas=settings.nats_replicas,
            )
        )
        agent = NodeAgent(settings, bus, registry)
        await stack.enter_async_context(ops_server(registry, settings.ops_port))
        await agent.register()
        heartbeat = asyncio.create_task(agent.heartbeat_loop(stop))
        bus.subscribe(
            [StartStack, StopStack, RestartEngines, ReadEngines],
            agent.handle,
            durable=f"node-agent-{settings.node_id}",
            filter_subject=f"kvbench.cmd.node.{settings.node_id}.>",
            ack_wait_s=300,
            batch=1,
            on_poison=agent.unreadable_command,
        )
        await stop.wait()
        log.info("stopping", extra={"node_id": settings.node_id})
        await agent.shutdown()
        await heartbeat


def main() -> None:
    from kvbench_core.service import run_service  # noqa: PLC0415

    settings = load_settings(NodeAgentSettings)
    configure_logging("node-agent", settings.log_level, settings.log_json)
    run_service(lambda stop: run(settings, stop))
