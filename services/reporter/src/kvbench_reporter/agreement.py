"""NIC-to-switch-port agreement checks (reference/fabric.md section 7), one cable at a time.

Each check is PASS, WARN or FAIL with what each side said, so a report can name the cable and the fix.
Byte agreement compares like with like: the host's netdev bytes exclude the FCS (4 bytes a frame) while a
switch port counts it, so the switch side is corrected by 4 x packets when packet counts are known.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Check", "HostSide", "SwitchSide", "agreement_checks"]

Verdict = Literal["PASS", "WARN", "FAIL"]
# L2 header allowances between a NOS's port MTU and the host's IP MTU (e.g. 9216 vs 9000 is common)
MTU_OFFSETS = (0, 14, 18, 22, 216)
# the switch-poller's FEC state codes -> the classes a host's ethtool reports
FEC_NAMES = {0: "off", 1: "baser", 2: "rs"}


@dataclass(frozen=True)
class Check:
    check: str
    verdict: Verdict
    detail: str


@dataclass
class HostSide:
    host: str
    nic: str
    mac: str = ""
    state: str = ""  # operstate
    speed_mbps: int | None = None
    mtu: int | None = None
    lldp_switch: str | None = None  # the switch and port the host's LLDP names
    lldp_port: str | None = None
    deltas: dict[str, int] = field(default_factory=dict)  # if.in_octets, if.out_octets, if.in_pkts, ... over the window
    fec: str | None = None  # active FEC class: off, baser, rs


@dataclass
class SwitchSide:
    switch: str
    port: str
    oper_status: int | None = None  # IF-MIB: 1 = up
    speed_mbps: int | None = None
    mtu: int | None = None
    lldp_remote: list[dict[str, Any]] = field(default_factory=list)  # the switch's LLDP-MIB entries on this port
    deltas: dict[str, int] = field(default_factory=dict)
    fec: str | None = None


def _cable(host: HostSide, switch: SwitchSide) -> Check:
    if (host.lldp_switch, host.lldp_port) != (switch.switch, switch.port):
        return Check(
            "cable",
            "FAIL",
            f"{host.host} {host.nic} is cabled to {host.lldp_switch} {host.lldp_port} by its LLDP, "
            f"not to {switch.switch} {switch.port}",
        )
    if not switch.lldp_remote:
        return Check("cable", "WARN", f"only {host.host} confirms the cable: {switch.switch} exports no LLDP-MIB entry")
    seen = any(
        r.get("system_name") == host.host
        or r.get("port_descr") == host.nic
        or (host.mac and str(r.get("port_id", "")).lower() == host.mac.lower())
        for r in switch.lldp_remote
    )
    if seen:
        return Check("cable", "PASS", f"{host.host} {host.nic} <-> {switch.switch} {switch.port}, seen from both sides")
    names = ", ".join(str(r.get("system_name") or r.get("port_id")) for r in switch.lldp_remote)
    return Check("cable", "FAIL", f"{switch.switch} {switch.port} sees {names}, not {host.host} {host.nic}")


def _state(host: HostSide, switch: SwitchSide) -> Check:
    up = host.state == "up" and switch.oper_status == 1
    detail = f"host {host.state or '?'}, switch ifOperStatus {switch.oper_status}"
    return Check("link_state", "PASS" if up else "FAIL", detail)


def _speed(host: HostSide, switch: SwitchSide) -> Check:
    if host.speed_mbps is None or switch.speed_mbps is None:
        return Check("speed", "WARN", "a side does not report its speed")
    same = host.speed_mbps == switch.speed_mbps
    return Check("speed", "PASS" if same else "FAIL", f"host {host.speed_mbps} Mb/s, switch {switch.speed_mbps} Mb/s")


def _mtu(host: HostSide, switch: SwitchSide) -> Check:
    if host.mtu is None or switch.mtu is None:
        return Check("mtu", "WARN", "a side does not report its MTU")
    ok = (switch.mtu - host.mtu) in MTU_OFFSETS
    return Check("mtu", "PASS" if ok else "FAIL", f"host {host.mtu}, switch {switch.mtu}")


def _bytes(host: HostSide, switch: SwitchSide, tolerance: float, floor_bytes: int) -> list[Check]:
    out = []
    for host_key, switch_key, pkts_key, label in (
        ("if.out_octets", "if.in_octets", "if.out_pkts", "host tx vs switch rx"),
        ("if.in_octets", "if.out_octets", "if.in_pkts", "switch tx vs host rx"),
    ):
        h, s = host.deltas.get(host_key), switch.deltas.get(switch_key)
        if h is None or s is None:
            continue
        # a switch port usually counts each frame's 4-byte FCS and the host's netdev does not; some agents (and
        # virtual ports) do not either: agreement with either reading passes
        fcs = 4 * host.deltas.get(pkts_key, 0)
        allowed = max(tolerance * max(h, s), floor_bytes)
        ok = min(abs(s - h), abs(s - fcs - h)) <= allowed
        detail = f"host {h:,} B, switch {s:,} B, allowed +-{allowed:,.0f}"
        out.append(Check(f"bytes ({label})", "PASS" if ok else "FAIL", detail))
    return out


def _fec(host: HostSide, switch: SwitchSide) -> Check:
    """fabric.md section 7, check 5: both ends use the same FEC; uncorrectable blocks on the host are a warning."""
    bad = host.deltas.get("fec.uncorrectable_blocks", 0)
    if host.fec is None or switch.fec is None:
        return Check("fec", "WARN", "a side does not report its FEC mode")
    if host.fec != switch.fec:
        return Check("fec", "FAIL", f"host {host.fec}, switch {switch.fec}: the link runs without error correction")
    if bad > 0:
        return Check("fec", "WARN", f"both {host.fec}, but {bad:,} uncorrectable blocks on {host.host} {host.nic}")
    return Check("fec", "PASS", f"both {host.fec}")


# (host counter, switch counter, what it means): frames one side sent are frames the other received
_PAUSE_PAIRS = (
    ("pause.rx_frames", "pause.out_frames", "switch paused the host"),
    ("pause.tx_frames", "pause.in_frames", "host paused the switch"),
    ("pfc.rx_frames", "pfc.requests", "switch paused the host"),
    ("pfc.tx_frames", "pfc.indications", "host paused the switch"),
)


def _pause(host: HostSide, switch: SwitchSide, tolerance: float = 0.01) -> Check:
    """Pause symmetry: the pause frames (802.3x, and PFC per priority) one end sent are the ones the other end
    received over the same window, within 1% (or 2 frames: reads are not simultaneous)."""
    compared: list[str] = []
    mismatched: list[str] = []
    one_sided: list[str] = []
    for host_counter, switch_counter, meaning in _PAUSE_PAIRS:
        keys = {k.removeprefix(host_counter) for k in host.deltas if k.startswith(host_counter)}
        keys |= {k.removeprefix(switch_counter) for k in switch.deltas if k.startswith(switch_counter)}
        for suffix in sorted(keys):
            h, s = host.deltas.get(host_counter + suffix), switch.deltas.get(switch_counter + suffix)
            label = f"{meaning}{' ' + suffix if suffix else ''}"
            if h is None or s is None:
                one_sided.append(label)
                continue
            compared.append(f"{label}: host {h:,}, switch {s:,}")
            if abs(h - s) > max(2, tolerance * max(h, s)):
                mismatched.append(f"{label}: host {h:,}, switch {s:,}")
    if mismatched:
        return Check("pause_symmetry", "FAIL", "; ".join(mismatched))
    if compared:
        return Check("pause_symmetry", "PASS", "; ".join(compared))
    if one_sided:
        return Check("pause_symmetry", "WARN", f"only one side counts pause frames ({', '.join(one_sided)})")
    return Check("pause_symmetry", "WARN", "neither side reports pause frames")


def _errors(host: HostSide, switch: SwitchSide) -> Check:
    grew = {
        k: v
        for side in (host.deltas, switch.deltas)
        for k, v in side.items()
        if k in ("if.in_errors", "if.out_errors") and v > 0
    }
    if grew:
        where = f"{host.host} {host.nic} / {switch.switch} {switch.port}"
        return Check("errors", "WARN", f"error counters grew: {grew} on {where}")
    return Check("errors", "PASS", "no error counter grew")


def agreement_checks(
    host: HostSide, switch: SwitchSide, tolerance: float = 0.001, floor_bytes: int = 8192
) -> list[Check]:
    """Cable, link state, speed, MTU, FEC, bytes both ways, pause symmetry and errors for one cable.
    ``floor_bytes``: the background traffic (LLDP, ARP) two reads a moment apart may differ by."""
    return [
        _cable(host, switch),
        _state(host, switch),
        _speed(host, switch),
        _mtu(host, switch),
        _fec(host, switch),
        *_bytes(host, switch, tolerance, floor_bytes),
        _pause(host, switch),
        _errors(host, switch),
    ]
