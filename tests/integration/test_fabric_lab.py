"""The switch-poller and the node agent's fabric readers against a real snmpd and lldpd (fabric.md §5, §7)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvbench_contracts.envelope import Envelope
from kvbench_contracts.fabric import SwitchConfig, SwitchSampled, SwitchUnread
from kvbench_core.sealing import SecretsKey
from kvbench_node_agent.fabric import parse_lldpctl_json0
from kvbench_reporter.agreement import HostSide, SwitchSide, agreement_checks
from kvbench_switch_poller.gnmi import FEC_CODES, GnmiError, poll_gnmi
from kvbench_switch_poller.poller import Poller
from kvbench_switch_poller.reading import SwitchPoll
from kvbench_switch_poller.snmp import SnmpError, SnmpPoll, poll_snmp

from .fabric_lab import GNMI_PASSWORD, GNMI_USER, V3_AUTH, V3_PRIV, V3_USER, FabricLab, lab_available

pytestmark = [pytest.mark.integration, pytest.mark.skipif(lab_available() is not None, reason=str(lab_available()))]


@pytest.fixture(scope="module")
def lab() -> Iterator[FabricLab]:
    # straight under /tmp, world-traversable: lldpd's privilege-separated side must reach its socket
    workdir = Path(tempfile.mkdtemp(prefix="kvbench-fabric-"))
    workdir.chmod(0o755)
    built = FabricLab(workdir)
    try:
        yield built.up()
    finally:
        built.down()
        shutil.rmtree(workdir, ignore_errors=True)


def _config(lab: FabricLab, version: str = "3") -> SwitchConfig:
    return SwitchConfig(name="leaf1", address=lab.agent_ip, port=lab.agent_port, snmp_version=version, secret="leaf1")  # type: ignore[arg-type]


V3_SECRET = f"{V3_USER}:{V3_AUTH}:{V3_PRIV}"


def _port(poll: SwitchPoll, counter: str, port: str = "swp1") -> int:
    values = [s.value for s in poll.samples if s.port == port and s.counter == counter]
    assert values, f"no {counter} for {port}"
    return values[0]


async def test_snmp_v3_and_v2c_read_the_ports_state(lab: FabricLab) -> None:
    poll = await poll_snmp(_config(lab), V3_SECRET)
    assert _port(poll, "if.speed") == 10_000  # veth reports 10 Gb/s
    assert _port(poll, "if.mtu") == 9000
    assert _port(poll, "if.oper_status") == 1
    v2 = await poll_snmp(_config(lab, "2c"), "lab-community")
    assert _port(v2, "if.mtu") == 9000
    with pytest.raises(SnmpError):
        await poll_snmp(_config(lab), f"{V3_USER}:wrong-auth-key:{V3_PRIV}", timeout_s=1.0)


async def test_switch_counters_agree_with_the_kernels(lab: FabricLab) -> None:
    """Host tx bytes and switch ifHCInOctets for the same cable, after a bounded burst (the agent serves cached
    values, so read until it has caught up)."""
    before_host = lab.host_counter("tx_bytes")
    before_switch = _port(await poll_snmp(_config(lab), V3_SECRET), "if.in_octets")
    lab.burst(2000, 8000)
    after_host = lab.host_counter("tx_bytes")
    deadline = time.monotonic() + 15
    while True:
        after_switch = _port(await poll_snmp(_config(lab), V3_SECRET), "if.in_octets")
        if after_switch - before_switch >= after_host - before_host or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    host_delta, switch_delta = after_host - before_host, after_switch - before_switch
    assert host_delta >= 2000 * 8000
    # background frames (LLDP every second, ARP) differ between the two reads; a few kB at most
    assert abs(switch_delta - host_delta) <= max(0.001 * host_delta, 8192)


async def test_lldp_maps_the_cable_from_both_sides(lab: FabricLab) -> None:
    deadline = time.monotonic() + 20
    while True:
        host_view = [n for n in parse_lldpctl_json0(lab.lldpctl_json0()) if n.system_name == "leaf1"]
        switch_view = [
            n for n in (await poll_snmp(_config(lab), V3_SECRET)).lldp_remote if n.system_name == "gpu-node-1"
        ]
        if (host_view and switch_view) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert [(n.local_port, n.port_id, n.port_id_subtype) for n in host_view] == [("eth1", "swp1", "ifname")]
    assert host_view[0].mgmt_addresses  # the switch advertises where it is managed
    assert [(n.local_port, n.port_descr) for n in switch_view] == [("swp1", "eth1")]


def _host_side(lab: FabricLab) -> dict[str, Any]:
    """The node agent's own readers, run inside the host's namespace (its /sys is that namespace's)."""
    code = (
        "import json; from kvbench_node_agent.fabric import nic_counter_samples; "
        "from kvbench_node_agent.inventory import nics; "
        "print(json.dumps({'nics': nics(), 'samples': [s.model_dump() for s in nic_counter_samples('gpu-node-1')]}))"
    )
    argv = ["ip", "netns", "exec", lab.h1, sys.executable, "-c", code]
    found: dict[str, Any] = json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)
    return found


async def test_nic_and_switch_port_agree_and_a_cross_wired_map_fails(lab: FabricLab) -> None:
    before_host = _host_side(lab)
    before_switch = await poll_snmp(_config(lab), V3_SECRET)
    lab.burst(1000, 4000)
    after_host = _host_side(lab)
    deadline = time.monotonic() + 15
    while True:  # the agent serves cached counters: wait until it has caught up with the burst
        after_switch = await poll_snmp(_config(lab), V3_SECRET)
        if _port(after_switch, "if.in_octets") - _port(before_switch, "if.in_octets") >= 1000 * 4000:
            break
        assert time.monotonic() < deadline
        time.sleep(0.5)

    def host_deltas() -> dict[str, int]:
        def values(side: dict[str, Any]) -> dict[str, int]:
            return {s["counter"]: s["value"] for s in side["samples"] if s["port"] == "eth1"}

        a, b = values(before_host), values(after_host)
        return {k: b[k] - a[k] for k in b}

    nic = next(n for n in after_host["nics"] if n["name"] == "eth1")
    lldp = next(n for n in parse_lldpctl_json0(lab.lldpctl_json0()) if n.local_port == "eth1")
    host = HostSide(
        host="gpu-node-1", nic="eth1", mac=nic["mac"], state=nic["state"], speed_mbps=nic["speed_mbps"], mtu=nic["mtu"],
        lldp_switch=lldp.system_name, lldp_port=lldp.port_id, deltas=host_deltas(),
    )  # fmt: skip
    switch_deltas = {
        c: _port(after_switch, c) - _port(before_switch, c)
        for c in ("if.in_octets", "if.out_octets", "if.in_errors", "if.out_errors")
    }
    remote = [r.model_dump() for r in after_switch.lldp_remote if r.local_port == "swp1"]
    switch = SwitchSide(
        switch="leaf1", port="swp1", oper_status=_port(after_switch, "if.oper_status"),
        speed_mbps=_port(after_switch, "if.speed"), mtu=_port(after_switch, "if.mtu"), lldp_remote=remote,
        deltas=switch_deltas,
    )  # fmt: skip
    checks = {c.check: c for c in agreement_checks(host, switch)}
    assert {name: c.verdict for name, c in checks.items()} == {
        "cable": "PASS",
        "link_state": "PASS",
        "speed": "PASS",
        "mtu": "PASS",
        "bytes (host tx vs switch rx)": "PASS",
        "bytes (switch tx vs host rx)": "PASS",
        "errors": "PASS",
        "fec": "WARN",  # a veth has no FEC ...
        "pause_symmetry": "WARN",  # ... and counts no pause frames: said, not passed
    }, checks
    assert nic["fec"] is None
    crossed = SwitchSide(switch="leaf1", port="swp2", oper_status=1, speed_mbps=10_000, mtu=9000, lldp_remote=[])
    assert agreement_checks(host, crossed)[0].verdict == "FAIL"
    smaller = HostSide(**{**host.__dict__, "mtu": 1500})
    assert next(c for c in agreement_checks(smaller, switch) if c.check == "mtu").verdict == "FAIL"


async def test_pause_and_per_priority_pfc_come_through_a_real_agent(lab: FabricLab) -> None:
    index = lab.if_index("swp1")
    lab.set_counters(
        {
            f"1.3.6.1.2.1.10.7.10.1.3.{index}": ("counter", 17),  # dot3InPauseFrames
            f"1.3.6.1.2.1.10.7.10.1.4.{index}": ("counter", 4),  # dot3OutPauseFrames
            f"1.3.6.1.4.1.9.9.813.1.2.1.2.{index}.3": ("counter64", 1234),  # cpfcIfRequests, priority 3
            f"1.3.6.1.4.1.9.9.813.1.2.1.3.{index}.3": ("counter64", 56),  # cpfcIfIndications, priority 3
        }
    )
    poll = await poll_snmp(_config(lab), V3_SECRET)
    assert _port(poll, "pause.in_frames") == 17
    assert _port(poll, "pause.out_frames") == 4
    pfc = {(s.counter, s.qualifier.get("priority")): s.value for s in poll.samples if s.counter.startswith("pfc.")}
    assert pfc == {("pfc.requests", 3): 1234, ("pfc.indications", 3): 56}
    sources = {s.source for s in poll.samples if s.counter == "pfc.requests"}
    assert sources == {f"snmp:1.3.6.1.4.1.9.9.813.1.2.1.2.{index}.3"}


def _gnmi_config(lab: FabricLab) -> SwitchConfig:
    return SwitchConfig(
        name="leaf1", address=lab.agent_ip, port=lab.gnmi_port, protocol="gnmi", gnmi_tls="plaintext", secret="leaf1"
    )


GNMI_SECRET = f"{GNMI_USER}:{GNMI_PASSWORD}"
KEY = SecretsKey(bytes(range(32)))  # the planner's key for stored secrets


async def test_gnmi_reads_the_ports_state_counters_and_lldp_like_snmp(lab: FabricLab) -> None:
    """The gNMI driver over real gRPC: the port's state, counters that agree with the kernel's and with SNMP's
    names, pause frames, the LLDP neighbour the switch sees, and the boot time as the counters' epoch."""
    lab.set_gnmi_counters(
        {"gnmi:swp1:in-mac-pause-frames": 21, "gnmi:swp1:out-mac-pause-frames": 3, "gnmi:swp1:fec-mode": "FEC_RS528"}
    )
    poll = await poll_gnmi(_gnmi_config(lab), GNMI_SECRET)
    assert _port(poll, "if.speed") == 10_000
    assert _port(poll, "if.mtu") == 9000
    assert _port(poll, "if.oper_status") == 1
    assert _port(poll, "pause.in_frames") == 21
    assert _port(poll, "pause.out_frames") == 3
    assert _port(poll, "if.fec_mode") == FEC_CODES["rs"]
    before_queue = lab.switch_queue_bytes()
    queued = await poll_gnmi(_gnmi_config(lab), GNMI_SECRET)
    (sent,) = [s for s in queued.samples if s.counter == "queue.transmit_octets" and s.port == "swp1"]
    assert sent.qualifier == {"queue": "0"}
    assert before_queue <= sent.value <= lab.switch_queue_bytes()  # the kernel's own qdisc counter, read live
    assert sent.source.startswith("gnmi:/qos/interfaces/interface[interface-id=swp1]/output/queues/queue[name=0]")
    octets = next(s for s in poll.samples if s.port == "swp1" and s.counter == "if.in_octets")
    assert octets.source == "gnmi:/interfaces/interface[name=swp1]/state/counters/in-octets"
    assert octets.ts_device_ns is not None
    assert octets.epoch.startswith("leaf1:")
    before_host = lab.host_counter("tx_bytes")
    before_switch = octets.value
    lab.burst(1000, 4000)
    host_delta = lab.host_counter("tx_bytes") - before_host
    switch_delta = _port(await poll_gnmi(_gnmi_config(lab), GNMI_SECRET), "if.in_octets") - before_switch
    assert host_delta >= 1000 * 4000
    assert abs(switch_delta - host_delta) <= max(0.001 * host_delta, 8192)  # live counters: no agent cache lag
    deadline = time.monotonic() + 20
    while not (neighbors := (await poll_gnmi(_gnmi_config(lab), GNMI_SECRET)).lldp_remote):
        assert time.monotonic() < deadline, "the switch's lldpd saw no neighbour"
        time.sleep(1)
    assert [(n.local_port, n.system_name, n.port_descr) for n in neighbors] == [("swp1", "gpu-node-1", "eth1")]
    with pytest.raises(GnmiError, match="leaf1") as refused:
        await poll_gnmi(_gnmi_config(lab), f"{GNMI_USER}:wrong-password")
    assert "wrong-password" not in str(refused.value)


async def test_the_poller_reads_each_switch_with_its_protocols_driver(lab: FabricLab) -> None:
    published: list[Envelope] = []

    async def publish(event: Envelope) -> None:
        published.append(event)

    gnmi = _gnmi_config(lab).model_copy(update={"name": "leaf1-gnmi", "secret": "gnmi-creds"})
    snmp = _config(lab).model_copy(update={"secret": "snmp-creds"})
    switches = {c.name: c.model_dump_json().encode() for c in (gnmi, snmp)}
    stored = {
        "gnmi-creds": KEY.encrypt(GNMI_SECRET),
        "snmp-creds": KEY.encrypt(V3_SECRET),
    }  # as the planner stores them
    poller = Poller(lambda: switches, lambda: stored, publish, open_secret=KEY.decrypt)
    await poller.poll_once()
    sampled = {e.switch: e for e in published if isinstance(e, SwitchSampled)}
    assert sorted(sampled) == ["leaf1", "leaf1-gnmi"]
    assert {s.source.split(":")[0] for s in sampled["leaf1-gnmi"].samples} == {"gnmi"}
    assert {s.source.split(":")[0] for s in sampled["leaf1"].samples} == {"snmp"}
    lab.stop_gnmi()
    try:
        published.clear()
        await poller.poll_once()
        unread = [e for e in published if isinstance(e, SwitchUnread)]
        assert [e.switch for e in unread] == ["leaf1-gnmi"]
        assert GNMI_PASSWORD not in unread[0].model_dump_json()
    finally:
        lab.start_gnmi()


# last: it restarts the agent, and lldpd's AgentX link takes a while to come back
async def test_a_stopped_agent_makes_the_switch_unread_with_the_reason(lab: FabricLab) -> None:
    published: list[Envelope] = []

    async def publish(event: Envelope) -> None:
        published.append(event)

    config = _config(lab).model_copy(update={"secret": "leaf1-creds"})
    switches = {"leaf1": config.model_dump_json().encode()}
    stored = {"leaf1-creds": KEY.encrypt(V3_SECRET)}

    async def quick(c: SwitchConfig, s: str) -> SnmpPoll:
        return await poll_snmp(c, s, timeout_s=1.0)

    poller = Poller(lambda: switches, lambda: stored, publish, quick, open_secret=KEY.decrypt)
    await poller.poll_once()
    assert isinstance(published[-1], SwitchSampled)
    assert poller.status["leaf1"].ok
    lab.stop_snmpd()
    try:
        await poller.poll_once()
        assert isinstance(published[-1], SwitchUnread)
        assert "timeout" in published[-1].reason
        assert V3_AUTH not in published[-1].reason
        assert V3_PRIV not in published[-1].model_dump_json()
        assert not poller.status["leaf1"].ok
    finally:
        lab.start_snmpd()
