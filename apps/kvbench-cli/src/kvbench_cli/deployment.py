"""A whole kvbench on this machine: embedded NATS and PostgreSQL, every service, a simulated cluster.

``up`` records every pid it started in a state file; ``down`` stops exactly those, services first
(agents stop their engines), then NATS, then PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kvbench_cli.bususers import BusUsers, agent_user
from kvbench_cli.democerts import make_certificates
from kvbench_core.bus import Bus, NatsAuth
from kvbench_core.embedded import EmbeddedNats, EmbeddedNatsCluster, EmbeddedPostgres, find_nats_server
from kvbench_core.procs import free_port, pid_alive, spawn, stop_pid, wait_port
from kvbench_core.sealing import SecretsKey
from kvbench_core.settings import read_secret_file

__all__ = [
    "DeploymentState",
    "LocalDeployment",
    "StartupError",
    "launch_nats",
    "launch_service",
    "postmaster_pid",
    "start_postgres",
    "state_lock",
]


class StartupError(RuntimeError):
    pass


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """One writer of the state file at a time: `up`, `down` and the supervisor (which records the pids it starts)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "state.lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass
class ServiceRecord:
    name: str
    pid: int
    log: str
    health_url: str | None = None
    module: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass
class DeploymentState:
    state_dir: str
    nats_url: str
    database_url: str
    api_url: str
    report_url: str
    nats_pid: int | None = None
    # every NATS server `up` started (one, or a cluster's): name, pid, url, listen, monitor_port
    nats_servers: list[dict[str, Any]] = field(default_factory=list)
    nats_users: bool = False  # the bus takes only its users (.kvbench/secrets/nats-users), each with its permissions
    nats_ca_file: str | None = None  # --nats-tls: the authority clients check the servers' certificate against
    pg_dir: str | None = None
    services: list[ServiceRecord] = field(default_factory=list)
    sim_machines: int = 0
    base_env: dict[str, str] = field(default_factory=dict)
    sim_switch: str | None = None  # the simulated leaf this deployment connected (disconnected by down)
    listen: str | None = None  # the address other machines reach the control plane at (--listen)
    nats_token_file: str | None = None  # the bus's token (mode 600); agents get a copy
    api_token_file: str | None = None  # the API's bearer token (mode 600), with --listen
    notes: list[str] = field(default_factory=list)  # what up decided that a person should know (ports moved)
    supervisor_pid: int | None = None  # what starts again whatever of the above dies (kvbench_cli.supervisor)

    def api_headers(self) -> dict[str, str]:
        """What a request to this deployment's planner or reporter carries: its API token, when it has one."""
        return {"Authorization": f"Bearer {read_secret_file(Path(self.api_token_file))}"} if self.api_token_file else {}

    def save(self, path: Path, *, locked: bool = False) -> None:
        """Written whole and renamed into place, under the state's lock (the supervisor writes pids into it too);
        ``locked``: the caller holds the lock already."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.nullcontext() if locked else state_lock(path.parent):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(self), indent=2))
            tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> DeploymentState:
        data = json.loads(path.read_text())
        data["services"] = [ServiceRecord(**s) for s in data.get("services", [])]
        return cls(**data)


SIM_SWITCH = "sim-leaf"
HOLD_DIR = "supervisor-hold"  # a file per program the supervisor must leave down (kvbench_cli.supervisor)
# the control plane's ports with --listen: the compose stack's, so agents' settings do not depend on how it runs
DEFAULT_PORTS = {"nats": 4222, "planner": 8700, "reporter": 8701}


class LocalDeployment:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.state_path = state_dir / "state.json"

    def load(self) -> DeploymentState | None:
        if not self.state_path.exists():
            return None
        return DeploymentState.load(self.state_path)

    def up(
        self,
        sim_machines: int = 2,
        nats_url: str | None = None,
        database_url: str | None = None,
        tie_to_parent: bool = False,
        say: object = None,
        loadgens: int = 1,
        sim_speed: float | None = None,
        listen: str | None = None,
        nats_cluster: int = 1,
        nats_tls: bool = False,
    ) -> DeploymentState:
        """``nats_cluster``: NATS servers to start, clustered with routes when more than one (every stream and bucket
        then has three replicas, so any one server may die)."""
        if nats_cluster < 1:
            raise StartupError("--nats-cluster: give at least 1 server (3 for a cluster that survives losing one)")
        if nats_cluster > 1 and nats_url:
            raise StartupError("--nats-cluster starts kvbench's own NATS servers; leave out --nats-url")
        if self.load() is not None:
            raise StartupError(f"kvbench is already up (state in {self.state_path}); run `kvbench down` first")
        log_dir = self.state_dir / "logs"
        state = DeploymentState(
            state_dir=str(self.state_dir),
            nats_url=nats_url or "",
            database_url=database_url or "",
            api_url="",
            report_url="",
            sim_machines=sim_machines,
            listen=listen,
        )
        host = listen or "127.0.0.1"
        try:
            users = BusUsers(self.state_dir)
            if not nats_url:
                # the bus takes only its users (kept across up and down, so agents keep theirs), each with the
                # subject permissions of its role: the services', and an agent per simulated machine
                for user, role in (("admin", "admin"), ("planner", "planner"), ("reporter", "reporter"),
                                   ("switch-poller", "switch_poller"), ("sim-switch", "sim_switch")):  # fmt: skip
                    users.ensure(user, role)  # type: ignore[arg-type]  # each a Role
                for i in range(loadgens):
                    users.ensure(f"loadgen-{i}", "loadgen", shard=f"loadgen-{i}")
                for i in range(sim_machines):
                    users.ensure(agent_user(f"sim-{i}"), "node_agent", node_id=f"sim-{i}")
                state.nats_users = True
                token = None
                tls = None
                if nats_tls:  # certificates made here, for the addresses the servers listen on
                    made = make_certificates(self.state_dir / "secrets" / "tls", [host])
                    tls, state.nats_ca_file = (made.cert_file, made.key_file), str(made.ca_file)
                if nats_cluster > 1:
                    ports = [
                        self._port(state, f"NATS server {k + 1}", host, DEFAULT_PORTS["nats"] + k if listen else 0)
                        for k in range(nats_cluster)
                    ]
                    cluster = EmbeddedNatsCluster(
                        self.state_dir / "nats", nats_cluster, host, token, ports, users.block(), tls
                    )
                    try:
                        cluster.start()
                    finally:  # recorded even when it failed to elect a leader, so `down` stops what did start
                        state.nats_servers = [_server_record(n) for n in cluster.servers]
                        state.save(self.state_path)
                    state.nats_url = cluster.url
                else:
                    port = self._port(state, "NATS", host, DEFAULT_PORTS["nats"] if listen else 0)
                    nats = EmbeddedNats(
                        self.state_dir / "nats", port=port, listen=host, token=token, users=users.block(), tls=tls
                    )
                    nats.start()
                    state.nats_url, state.nats_pid = nats.url, nats.pid
                    state.nats_servers = [_server_record(nats)]
                state.save(self.state_path)
                # the streams and buckets are the administrator's to create: no service may
                replicas = min(3, nats_cluster)
                asyncio.run(_create_streams(state.nats_url, users.auth("admin", state.nats_ca_file), replicas))
            if listen:
                state.api_token_file = str(self._secret_file("api-token"))
            if not database_url:
                pg = EmbeddedPostgres.kept_in(self.state_dir)
                state.pg_dir = str(pg.base_dir)
                state.save(self.state_path)
                pg.start()
                state.database_url = pg.dsn
            planner_port = self._port(state, "the planner", host, DEFAULT_PORTS["planner"] if listen else 0)
            reporter_port = self._port(state, "the reporter", host, DEFAULT_PORTS["reporter"] if listen else 0)
            state.api_url = f"http://{host}:{planner_port}"
            state.report_url = f"http://{host}:{reporter_port}"
            # secrets travel as the paths of files only their owner reads, never as values in an environment
            state.base_env = {
                "KVBENCH_NATS_URL": state.nats_url,
                "KVBENCH_DATABASE_URL": state.database_url,
                "KVBENCH_LOG_JSON": "true",
                "KVBENCH_PLANNER_HOST": host,
                "KVBENCH_PLANNER_PORT": str(planner_port),
                "KVBENCH_REPORTER_HOST": host,
                "KVBENCH_REPORTER_PORT": str(reporter_port),
            }
            if state.nats_token_file:
                state.base_env["KVBENCH_NATS_TOKEN_FILE"] = state.nats_token_file
            if state.nats_ca_file:
                state.base_env["KVBENCH_NATS_CA_FILE"] = state.nats_ca_file
            if nats_cluster > 1:  # three copies of every stream and bucket (all of them on a smaller cluster)
                state.base_env["KVBENCH_NATS_REPLICAS"] = str(min(3, nats_cluster))
            if state.api_token_file:
                state.base_env["KVBENCH_API_TOKEN_FILE"] = state.api_token_file
            env = self.env_for(state)

            def start(name: str, module: str, health: str | None, extra: dict[str, str] | None = None,
                      user: str | None = None) -> None:  # fmt: skip
                extra = {**(extra or {}), **(users.env(user or name) if state.nats_users else {})}
                log = log_dir / f"{name}.log"
                proc = spawn([sys.executable, "-m", module], log, {**env, **(extra or {})}, tie_to_parent=tie_to_parent)
                state.services.append(ServiceRecord(name, proc.pid, str(log), health, module, dict(extra or {})))
                state.save(self.state_path)

            def ops(variable: str) -> tuple[str, dict[str, str]]:
                """A service's /healthz on a port of its own, so `status` (and start-up) can ask every one."""
                port = free_port()
                return f"http://127.0.0.1:{port}/healthz", {variable: str(port)}

            start("reporter", "kvbench_reporter", f"{state.report_url}/healthz")
            # stored secrets are encrypted with a key only the planner and the switch poller are given
            secrets_key = {"KVBENCH_SECRETS_KEY_FILE": str(self._secrets_key_file())}
            # every job is split into one shard per load generator (they share the work queue)
            start(
                "planner",
                "kvbench_planner",
                f"{state.api_url}/healthz",
                {"KVBENCH_PLANNER_LOADGEN_SHARDS": str(loadgens), **secrets_key}
                | ({"KVBENCH_PLANNER_SIM_SPEED": f"{sim_speed:g}"} if sim_speed else {}),
            )
            for i in range(loadgens):
                health, port_env = ops("KVBENCH_LOADGEN_OPS_PORT")
                start(
                    f"loadgen-{i}" if i else "loadgen",
                    "kvbench_loadgen",
                    health,
                    {"KVBENCH_LOADGEN_SHARD_ID": f"loadgen-{i}", **port_env},
                    user=f"loadgen-{i}",
                )
            health, port_env = ops("KVBENCH_SWITCH_POLLER_OPS_PORT")
            start(
                "switch-poller",
                "kvbench_switch_poller",
                health,
                {"KVBENCH_SWITCH_POLLER_INTERVAL_S": "2", **port_env, **secrets_key},
            )
            switch_port, community = free_port(), secrets.token_urlsafe(18)
            # one name per deployment: deployments that share a NATS must not read each other's simulated switch
            state.sim_switch = f"{SIM_SWITCH}-{secrets.token_hex(2)}" if sim_machines else None
            if sim_machines:  # the simulated machines' leaf switch, read over SNMP like a real one
                switch = [sys.executable, "-m", "kvbench_sim.switch", "--name", str(state.sim_switch)]
                switch += ["--port", str(switch_port), "--machines", str(sim_machines), "--nats-url", state.nats_url]
                log = log_dir / "sim-switch.log"
                switch_env = {**env, "KVBENCH_SIM_SWITCH_COMMUNITY": community}
                if state.nats_users:
                    switch_env |= users.env("sim-switch")
                proc = spawn(switch, log, switch_env, tie_to_parent=tie_to_parent)
                state.services.append(ServiceRecord("sim-switch", proc.pid, str(log), None, "kvbench_sim.switch", {}))
                state.save(self.state_path)
            for i in range(sim_machines):
                health, port_env = ops("KVBENCH_NODE_AGENT_OPS_PORT")
                start(
                    f"node-agent-sim-{i}",
                    "kvbench_node_agent",
                    health,
                    user=agent_user(f"sim-{i}"),
                    extra={
                        **port_env,
                        "KVBENCH_NODE_AGENT_NODE_ID": f"sim-{i}",
                        "KVBENCH_NODE_AGENT_SIMULATED": "true",
                        "KVBENCH_NODE_AGENT_GROUP": "sim",
                        "KVBENCH_NODE_AGENT_STATE_DIR": str(self.state_dir / "node-agent"),
                        "KVBENCH_NODE_AGENT_SIM_SWITCH": str(state.sim_switch),
                    },
                )
            self._wait_ready(state)
            if sim_machines:
                self._connect_switch(state, switch_port, community)
            self._start_supervisor(state, tie_to_parent)
        except BaseException:
            self.down()
            raise
        return state

    def _start_supervisor(self, state: DeploymentState, tie_to_parent: bool) -> None:
        """From now on, whatever dies is started again (the supervisor's log: logs/supervisor.log)."""
        argv = [sys.executable, "-m", "kvbench_cli.supervisor", "--state-dir", str(self.state_dir)]
        if tie_to_parent:
            argv.append("--tie-to-parent")
        proc = spawn(argv, self.state_dir / "logs" / "supervisor.log", self.env_for(state), tie_to_parent=tie_to_parent)
        state.supervisor_pid = proc.pid
        state.save(self.state_path)

    @staticmethod
    def nats_name(state: DeploymentState, index: int) -> str:
        """A NATS server's name to the supervisor and `status`: "nats" alone, its server name in a cluster."""
        return str(state.nats_servers[index].get("name") or "nats") if len(state.nats_servers) > 1 else "nats"

    def supervised(self) -> bool:
        """Whether a supervisor runs for this deployment (then it, not the caller, starts what died)."""
        state = self.load()
        return state is not None and bool(state.supervisor_pid) and pid_alive(int(state.supervisor_pid or 0))

    def hold(self, name: str, held: bool = True) -> None:
        """Keep the supervisor from starting ``name`` again (a long outage, in the fault tests), or let it."""
        path = self.state_dir / HOLD_DIR / name
        if held:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        else:
            path.unlink(missing_ok=True)

    def _await_new_pid(self, read_pid: Callable[[DeploymentState], int | None], old: int | None, what: str,
                       timeout_s: float = 60.0) -> DeploymentState:  # fmt: skip
        """The state once the supervisor has started ``what`` again (its pid changed and the process runs)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self._state()
            pid = read_pid(state)
            if pid and pid != old and pid_alive(pid):
                return state
            time.sleep(0.1)
        raise StartupError(f"the supervisor did not start {what} again within {timeout_s:.0f} s; see "
                           f"{self.state_dir}/logs/supervisor.log")  # fmt: skip

    def _secrets_key_file(self) -> Path:
        """The key stored secrets are encrypted with (kvbench_core.sealing), kept with the state like the tokens."""
        directory = self.state_dir / "secrets"
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        path = directory / "secrets-key"
        SecretsKey.create(path)
        return path

    def _secret_file(self, name: str) -> Path:
        """A generated secret kept in the state directory, readable by its owner only; the same across restarts."""
        directory = self.state_dir / "secrets"
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        path = directory / name
        if not path.exists():
            path.touch(mode=0o600)
            path.write_text(secrets.token_urlsafe(32) + "\n")
        path.chmod(0o600)
        return path

    @staticmethod
    def _port(state: DeploymentState, what: str, host: str, wanted: int) -> int:
        """``wanted`` (a documented default) when it is free on ``host``, else a free one, and a note saying so."""
        if not wanted:
            return free_port(host)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((host, wanted))
        except OSError:
            chosen = free_port(host)
            state.notes.append(f"port {wanted} for {what} is busy on {host}; {what} listens on {chosen} instead")
            return chosen
        return wanted

    @staticmethod
    def _connect_switch(state: DeploymentState, port: int, community: str) -> None:
        """Register the simulated switch with the planner, as a user connects a real one (the community is stored
        as a secret there and never shown again)."""
        body = {
            "name": state.sim_switch,
            "address": "127.0.0.1",
            "port": port,
            "snmp_version": "2c",
            "credential": community,
        }
        with httpx.Client(timeout=10.0) as client:
            response = client.post(f"{state.api_url}/v1/switches", json=body, headers=state.api_headers())
        if response.status_code != 201:
            raise StartupError(f"could not connect the simulated switch: HTTP {response.status_code}")

    @staticmethod
    def env_for(state: DeploymentState) -> dict[str, str]:
        env = {**os.environ, **state.base_env}
        env.pop("KVBENCH_PLANNER_API_TOKEN", None)  # the embedded stack runs without auth, and says so
        return env

    def restart(self, name: str, *, kill: bool = True, tie_to_parent: bool = False) -> ServiceRecord:
        """Stop one service (SIGKILL by default, as a crash would) and start it again with the same settings."""
        state = self.load()
        if state is None:
            raise StartupError("kvbench is not up")
        service = next((s for s in state.services if s.name == name), None)
        if service is None:
            raise StartupError(f"no service {name}; known: {', '.join(s.name for s in state.services)}")
        supervised = self.supervised()
        if kill:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(service.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(service.pid, 0)
        else:
            stop_pid(service.pid, timeout_s=15, group=True)
        if supervised:  # it starts the service again by itself
            old = service.pid
            state = self._await_new_pid(lambda s: next(x.pid for x in s.services if x.name == name), old, name)
            self._wait_ready(state)
            return next(x for x in state.services if x.name == name)
        service.pid = launch_service(state, service, tie_to_parent).pid
        state.save(self.state_path)
        self._wait_ready(state)
        return service

    def _wait_ready(self, state: DeploymentState, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            for service in state.services:
                while True:
                    if not pid_alive(service.pid):
                        tail = Path(service.log).read_text(errors="replace")[-2000:]
                        raise StartupError(f"{service.name} exited during start-up; its log ends with:\n{tail}")
                    if service.health_url is None:
                        break
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(service.health_url).status_code == 200:
                            break
                    if time.monotonic() > deadline:
                        raise StartupError(f"{service.name} did not answer {service.health_url} in {timeout_s:.0f} s")
                    time.sleep(0.1)
            while state.sim_machines:
                with contextlib.suppress(httpx.HTTPError):
                    answer = client.get(f"{state.api_url}/v1/nodes", headers=state.api_headers())
                    nodes = _planner_json(answer)
                    if nodes is None:
                        raise StartupError(
                            f"something other than the planner answers on {state.api_url} (HTTP "
                            f"{answer.status_code} to /v1/nodes): another process took its port; run `kvbench down` "
                            "and `kvbench up` again"
                        )
                    if isinstance(nodes, list) and len(nodes) >= state.sim_machines:
                        return
                if time.monotonic() > deadline:
                    raise StartupError(
                        "the simulated machines' agents did not register in time; see "
                        f"{state.state_dir}/logs/node-agent-*.log"
                    )
                time.sleep(0.1)

    def kill_nats(self, index: int = 0, hold: bool = True) -> int:
        """SIGKILL NATS server ``index``, as a crash would (the fault tests); returns its pid. ``hold``: the supervisor
        leaves it down until ``restart_nats`` (an outage as long as the caller wants)."""
        state = self._state()
        if hold:
            self.hold(self.nats_name(state, index))
        pid = int(state.nats_servers[index]["pid"])
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        return pid

    def restart_nats(self, index: int = 0) -> None:
        """Start NATS server ``index`` again as it was (its configuration, port, users and store kept on disk): the
        supervisor does, once its hold is lifted, where one runs."""
        state = self._state()
        record = state.nats_servers[index]
        if self.supervised():
            old = record.get("pid")
            self.hold(self.nats_name(state, index), held=False)
            state = self._await_new_pid(lambda s: s.nats_servers[index].get("pid"), old, "the NATS server")
            record = state.nats_servers[index]
            host, _, port = record["url"].split("//", 1)[1].rpartition(":")
            wait_port(int(port), host=host)
            return
        proc = launch_nats(record)
        record["pid"] = proc.pid
        if index == 0 and state.nats_pid:
            state.nats_pid = proc.pid
        state.save(self.state_path)
        host, _, port = record["url"].split("//", 1)[1].rpartition(":")
        wait_port(int(port), host=host)

    def kill_postgres(self, hold: bool = True) -> int:
        """SIGKILL the embedded PostgreSQL's server process, as a crash would; returns its pid. ``hold``: the
        supervisor leaves it down until ``restart_postgres``."""
        state = self._state()
        if not state.pg_dir:
            raise StartupError("this deployment uses a PostgreSQL of its own (--database-url)")
        if hold:
            self.hold("postgresql")
        pid = postmaster_pid(state.pg_dir)
        if pid is None:
            raise StartupError(f"PostgreSQL is not running (no postmaster.pid under {state.pg_dir})")
        os.kill(pid, signal.SIGKILL)
        return pid

    def restart_postgres(self) -> None:
        """Start the embedded PostgreSQL again on its port (it recovers from its write-ahead log)."""
        state = self._state()
        pg_dir = str(state.pg_dir)
        if self.supervised():
            old = postmaster_pid(pg_dir)
            self.hold("postgresql", held=False)
            self._await_new_pid(lambda _: postmaster_pid(pg_dir), old, "PostgreSQL")
            wait_port(database_port(state))
            return
        deadline = time.monotonic() + 30
        while (Path(pg_dir) / "data" / "postmaster.pid").exists() and time.monotonic() < deadline:
            pid = postmaster_pid(pg_dir)  # a killed postmaster's children leave with it
            if pid is not None and not pid_alive(pid):
                break
            time.sleep(0.2)
        start_postgres(state)

    def _state(self) -> DeploymentState:
        state = self.load()
        if state is None:
            raise StartupError("kvbench is not up")
        return state

    def down(self, wipe: bool = False) -> list[str]:
        """Stop exactly what ``up`` started; returns what was stopped. The results (PostgreSQL's data and NATS's
        streams) stay for the next ``up`` unless ``wipe``."""
        state = self.load()
        if state is None:
            if wipe:
                self._wipe(None)
            return []
        stopped: list[str] = []
        if state.supervisor_pid and pid_alive(state.supervisor_pid):  # first: nothing is started again from here on
            stop_pid(state.supervisor_pid, timeout_s=15)
            stopped.append("supervisor")
        shutil.rmtree(self.state_dir / HOLD_DIR, ignore_errors=True)
        if state.sim_switch:  # disconnect it first, so no poller keeps reading a switch that is gone
            token = read_secret_file(Path(state.api_token_file)) if state.api_token_file else None
            with contextlib.suppress(httpx.HTTPError, OSError), httpx.Client(timeout=5.0) as client:
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                client.delete(f"{state.api_url}/v1/switches/{state.sim_switch}", headers=headers)
        agents_first = sorted(state.services, key=lambda s: (not s.name.startswith("node-agent"), s.name == "reporter"))
        for service in agents_first:
            if pid_alive(service.pid):
                stop_pid(service.pid, timeout_s=15, group=True)
                stopped.append(service.name)
        pids = {int(server["pid"]): str(server["name"]) for server in state.nats_servers if server.get("pid")}
        if state.nats_pid:
            pids.setdefault(state.nats_pid, "nats")
        for pid, name in pids.items():
            if pid_alive(pid):
                stop_pid(pid, timeout_s=15)
                stopped.append(name)
        if state.pg_dir:
            # the results stay: the next `up` serves every earlier run's report (`make clean` removes them)
            EmbeddedPostgres(Path(state.pg_dir)).stop(remove=False)
            stopped.append("postgresql")
        self.state_path.unlink(missing_ok=True)
        if wipe:
            self._wipe(state.pg_dir)
        return stopped

    def _wipe(self, pg_dir: str | None) -> None:
        """Every result of earlier runs: the database (wherever it was kept) and the bus's stored streams."""
        shutil.rmtree(pg_dir or EmbeddedPostgres.kept_in(self.state_dir).base_dir, ignore_errors=True)
        shutil.rmtree(self.state_dir / "nats", ignore_errors=True)


def postmaster_pid(pg_dir: str | Path) -> int | None:
    """The embedded PostgreSQL's server pid, from its postmaster.pid (None: no such file, or not readable)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((Path(pg_dir) / "data" / "postmaster.pid").read_text().split()[0])
    return None


def database_port(state: DeploymentState) -> int:
    return int(state.database_url.rsplit(":", 1)[1].split("/")[0])


def start_postgres(state: DeploymentState) -> None:
    """The embedded PostgreSQL started again on its port (it recovers from its write-ahead log)."""
    EmbeddedPostgres(Path(str(state.pg_dir)), port=database_port(state)).start()


def launch_service(state: DeploymentState, record: ServiceRecord, tie_to_parent: bool) -> subprocess.Popen[bytes]:
    """A service `up` recorded, started again with its settings (its module, log and environment)."""
    env = {**LocalDeployment.env_for(state), **record.extra_env}
    return spawn([sys.executable, "-m", record.module], Path(record.log), env, tie_to_parent=tie_to_parent)


def launch_nats(record: dict[str, Any]) -> subprocess.Popen[bytes]:
    """A NATS server `up` recorded, started again as it was (its configuration, port, users and store on disk)."""
    data = Path(record["data_dir"])
    with open(data / "nats.log", "ab") as nats_log:
        return subprocess.Popen([find_nats_server(), "-c", str(data / "nats.conf")], stdout=nats_log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def _server_record(server: EmbeddedNats) -> dict[str, Any]:
    return {"name": server.server_name or "nats", "pid": server.pid, "url": server.url, "listen": server.listen,
            "monitor_port": server.monitor_port, "data_dir": str(server.data_dir)}  # fmt: skip


def nats_server_view(record: dict[str, Any]) -> dict[str, Any]:
    """A NATS server `up` started, as `kvbench status` shows it: its pid, URL, whether it runs and its role in the
    cluster's JetStream (leader, follower; standalone for a single server; down)."""
    server = EmbeddedNats(Path(record["data_dir"]), port=0, pid=record.get("pid"), listen=record.get("listen") or "",
                          server_name=record.get("name"),
                          monitor_port=int(record.get("monitor_port") or 0))  # fmt: skip
    alive = bool(server.pid) and pid_alive(int(server.pid or 0))
    return {"name": record["name"], "pid": record.get("pid"), "url": record["url"], "running": alive,
            "role": server.role() if alive else "down"}  # fmt: skip


async def _create_streams(url: str, auth: NatsAuth, replicas: int) -> None:
    """Every stream and bucket, created by the bus's administrator (the services may only use them)."""
    async with Bus.connect(url, name="kvbench-up", auth=auth, replicas=replicas):
        pass


def reload_bus_users(state: DeploymentState, block: str) -> None:
    """Every NATS server `up` started takes ``block`` (its users and their permissions) without a restart."""
    for record in state.nats_servers:
        if record.get("pid") and pid_alive(int(record["pid"])):
            EmbeddedNats(Path(record["data_dir"]), pid=int(record["pid"])).reload_users(block)


def _planner_json(answer: httpx.Response) -> object:
    """The body of an answer from the planner, which always answers JSON (FastAPI); None when what answered is
    something else (an ops server's "404: Not Found" on a port taken from under the planner)."""
    try:
        body: object = answer.json()
    except ValueError:
        return None
    return body
