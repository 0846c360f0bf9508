"""A real switch and a real host in network namespaces (reference/fabric.md section 7): net-snmp's snmpd as the
switch's agent (SNMP v2c and v3, AgentX master), lldpd on both sides (the switch's through AgentX, so its
LLDP-MIB remote table is served over SNMP), a veth pair as the cable, and a management veth from the test's
namespace to the switch's agent. Needs root, iproute2, snmpd and lldpd (``.ci/run`` installs them)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["GNMI_PASSWORD", "GNMI_USER", "FabricLab", "lab_available"]

V3_USER, V3_AUTH, V3_PRIV = "kvro", "authpass-lab", "privpass-lab"
PASS_PERSIST = Path(__file__).with_name("pass_persist_counters.py")
GNMI_TARGET = Path(__file__).with_name("gnmi_target.py")
GNMI_USER, GNMI_PASSWORD = "kvro", "gnmi-lab-password"


def lab_available() -> str | None:
    """None when the lab can run here, else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    missing = [b for b in ("ip", "snmpd", "lldpd", "lldpcli") if shutil.which(b) is None]
    if missing:
        return f"needs {', '.join(missing)} (apt-get install snmpd snmp lldpd iproute2)"
    return None


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


@dataclass
class FabricLab:
    workdir: Path
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        octet = int(self.tag, 16) % 250 + 1
        self.sw, self.h1 = f"kvsw{self.tag}", f"kvh{self.tag}"
        self.mgmt_root = f"kvm{self.tag}"
        self.agent_ip, self.root_ip = f"10.199.{octet}.1", f"10.199.{octet}.2"
        self.sw_ip, self.h1_ip = f"10.198.{octet}.1", f"10.198.{octet}.2"
        self.agent_port = 1161
        self.gnmi_port = 9339

    # -- topology -----------------------------------------------------------------------------
    def up(self) -> FabricLab:
        ip = "ip"
        _run(ip, "netns", "add", self.sw)
        _run(ip, "netns", "add", self.h1)
        _run(ip, "link", "add", "swp1", "netns", self.sw, "type", "veth", "peer", "name", "eth1", "netns", self.h1)
        _run(ip, "link", "add", self.mgmt_root, "type", "veth", "peer", "name", "mgmt0", "netns", self.sw)
        for ns in (self.sw, self.h1):
            _run(ip, "-n", ns, "link", "set", "lo", "up")
        _run(ip, "-n", self.sw, "link", "set", "swp1", "up", "mtu", "9000")
        _run(ip, "-n", self.h1, "link", "set", "eth1", "up", "mtu", "9000")
        # a queue on the switch port, so its output-queue counters (gNMI QoS paths) count real packets
        _run(ip, "netns", "exec", self.sw, "tc", "qdisc", "add", "dev", "swp1", "root", "pfifo", "limit", "1000")
        _run(ip, "-n", self.sw, "addr", "add", f"{self.sw_ip}/30", "dev", "swp1")
        _run(ip, "-n", self.h1, "addr", "add", f"{self.h1_ip}/30", "dev", "eth1")
        _run(ip, "-n", self.sw, "link", "set", "mgmt0", "up")
        _run(ip, "link", "set", self.mgmt_root, "up")
        _run(ip, "-n", self.sw, "addr", "add", f"{self.agent_ip}/30", "dev", "mgmt0")
        _run(ip, "addr", "add", f"{self.root_ip}/30", "dev", self.mgmt_root)
        self.start_snmpd()
        self._start_lldpd()
        self.start_gnmi()
        return self

    def start_snmpd(self) -> None:
        conf = self.workdir / "snmpd.conf"
        conf.write_text(
            f"agentAddress udp:{self.agent_ip}:{self.agent_port}\n"
            f"rocommunity lab-community {self.root_ip}/32\n"
            f'createUser {V3_USER} SHA "{V3_AUTH}" AES "{V3_PRIV}"\n'
            f"rouser {V3_USER} priv\n"
            "master agentx\n"
            f"agentXSocket {self.workdir}/agentx.sock\n"
            # per-priority PFC and 802.3x pause through pass_persist: net-snmp serves neither on Linux, so the test
            # writes their values (fabric.md section 7, test plan item 6)
            f"pass_persist .1.3.6.1.4.1.9.9.813 {sys.executable} {PASS_PERSIST} {self.workdir}/counters.json\n"
            f"pass_persist .1.3.6.1.2.1.10.7.10 {sys.executable} {PASS_PERSIST} {self.workdir}/counters.json\n"
        )
        self.set_counters({})
        env = {**os.environ, "SNMP_PERSISTENT_DIR": str(self.workdir / "snmp")}
        self.snmpd = self._spawn(
            [
                "ip",
                "netns",
                "exec",
                self.sw,
                "snmpd",
                "-f",
                "-Lf",
                str(self.workdir / "snmpd.log"),
                "-C",
                "-c",
                str(conf),
            ],
            env,
        )
        deadline = time.monotonic() + 10
        while not (self.workdir / "agentx.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    def set_counters(self, values: dict[str, tuple[str, int]]) -> None:
        """What the pass_persist script serves: numeric OID -> (net-snmp type, value)."""
        tmp = self.workdir / "counters.json.tmp"
        tmp.write_text(json.dumps(values))
        tmp.replace(self.workdir / "counters.json")

    def start_gnmi(self) -> None:
        """The switch's gNMI target (gnmi_target.py) on the management address, serving its namespace's counters."""
        self.set_gnmi_counters({})
        target = [sys.executable, str(GNMI_TARGET), "--address", self.agent_ip, "--port", str(self.gnmi_port)]
        target += ["--user", GNMI_USER, "--password", GNMI_PASSWORD, "--lldp-socket", self.sw_lldp]
        target += ["--extra", str(self.workdir / "gnmi-extra.json")]
        self.gnmi = self._spawn(["ip", "netns", "exec", self.sw, *target])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection((self.agent_ip, self.gnmi_port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the gNMI target did not listen within 15 s")

    def stop_gnmi(self) -> None:
        self._stop(self.gnmi)

    def set_gnmi_counters(self, values: dict[str, int | str]) -> None:
        """Counters the gNMI target adds to the kernel's: {"gnmi:<port>:<leaf>": value}."""
        tmp = self.workdir / "gnmi-extra.json.tmp"
        tmp.write_text(json.dumps(values))
        tmp.replace(self.workdir / "gnmi-extra.json")

    def if_index(self, netdev: str) -> int:
        return int(_run("ip", "-n", self.sw, "-o", "link", "show", netdev).split(":", 1)[0])

    def stop_snmpd(self) -> None:
        self._stop(self.snmpd)

    def _start_lldpd(self) -> None:
        self.sw_lldp, self.h1_lldp = str(self.workdir / "lldpd-sw.sock"), str(self.workdir / "lldpd-h1.sock")
        self._spawn(["ip", "netns", "exec", self.sw, "lldpd", "-d", "-u", self.sw_lldp, "-I", "swp1", "-x", "-X",
                     f"{self.workdir}/agentx.sock"])  # fmt: skip
        self._spawn(["ip", "netns", "exec", self.h1, "lldpd", "-d", "-u", self.h1_lldp, "-I", "eth1"])
        for ns, sock, commands in (
            (self.sw, self.sw_lldp, ["system hostname leaf1", "lldp portidsubtype ifname", "lldp tx-interval 1"]),
            (self.h1, self.h1_lldp, ["system hostname gpu-node-1", "lldp tx-interval 1"]),
        ):
            deadline = time.monotonic() + 10
            while not Path(sock).exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            for command in commands:  # the socket appears before lldpd answers on it: retry for a while
                for attempt in range(50):
                    try:
                        _run("ip", "netns", "exec", ns, "lldpcli", "-u", sock, "configure", *command.split())
                        break
                    except subprocess.CalledProcessError:
                        if attempt == 49:
                            raise
                        time.sleep(0.2)
            # a hostname set while lldpd is still starting can be overwritten by its own start-up (seen on a loaded
            # machine: the switch kept advertising the host's name): set it until lldpd says it holds
            name = commands[0].split()[-1]
            for _ in range(50):
                chassis = _run("ip", "netns", "exec", ns, "lldpcli", "-u", sock, "show", "chassis", "-f", "json0")
                if f'"{name}"' in chassis:
                    break
                _run("ip", "netns", "exec", ns, "lldpcli", "-u", sock, "configure", "system", "hostname", name)
                time.sleep(0.2)
            else:
                raise RuntimeError(f"lldpd in {ns} would not take the hostname {name}")

    def switch_queue_bytes(self) -> int:
        """Bytes the switch port's root qdisc has sent."""
        raw = _run("ip", "netns", "exec", self.sw, "tc", "-s", "-j", "qdisc", "show", "dev", "swp1")
        return int(next(q for q in json.loads(raw) if q.get("root"))["bytes"])

    def lldpctl_json0(self) -> str:
        return _run("ip", "netns", "exec", self.h1, "lldpctl", "-u", self.h1_lldp, "-f", "json0")

    def host_counter(self, stat: str) -> int:
        return int(_run("ip", "netns", "exec", self.h1, "cat", f"/sys/class/net/eth1/statistics/{stat}"))

    def burst(self, datagrams: int, size: int) -> None:
        """UDP from the host to the switch's port address, over the cable."""
        code = (
            "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            f"[s.sendto(b'x'*{size}, ('{self.sw_ip}', 9)) for _ in range({datagrams})]"
        )
        _run("ip", "netns", "exec", self.h1, "python3", "-c", code)

    # -- processes ------------------------------------------------------------------------------
    def _spawn(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env
        )
        self.procs.append(proc)
        return proc

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)

    def down(self) -> None:
        for proc in self.procs:
            self._stop(proc)
        for ns in (self.sw, self.h1):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", self.mgmt_root], check=False, capture_output=True)
