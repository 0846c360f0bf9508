"""Host side of the fabric (reference/fabric.md sections 1 and 3): LLDP neighbours from ``lldpctl -f json0``,
NIC and RDMA port counters from sysfs, and the RDMA-port detail the preflight needs.

``json0`` is parsed because its shape does not change with the number of interfaces or neighbours. InfiniBand
``port_rcv_data``/``port_xmit_data`` count 4-byte words: they are converted to octets, and the raw value is
named in the sample's source.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from typing import Any

from kvbench_contracts.fabric import CounterSample, LldpNeighbor

__all__ = [
    "FEC_CLASSES",
    "lldp_neighbors",
    "nic_counter_samples",
    "nic_fec",
    "parse_ethtool_stats",
    "parse_fec",
    "parse_lldpctl_json0",
    "rdma_port_details",
    "read_text",
]

_NETDEV_STATS = {
    "rx_bytes": ("if.in_octets", "octets"),
    "tx_bytes": ("if.out_octets", "octets"),
    "rx_packets": ("if.in_pkts", "packets"),
    "tx_packets": ("if.out_pkts", "packets"),
    "rx_dropped": ("if.in_discards", "packets"),
    "tx_dropped": ("if.out_discards", "packets"),
    "rx_errors": ("if.in_errors", "packets"),
    "tx_errors": ("if.out_errors", "packets"),
}
# IB port counters: file -> (canonical name, unit, multiplier to the unit)
_IB_COUNTERS = {
    "port_rcv_data": ("ib.in_octets", "octets", 4),
    "port_xmit_data": ("ib.out_octets", "octets", 4),
    "port_rcv_packets": ("ib.in_pkts", "packets", 1),
    "port_xmit_packets": ("ib.out_pkts", "packets", 1),
    "port_xmit_wait": ("ib.xmit_wait", "ticks", 1),
    "port_xmit_discards": ("ib.xmit_discards", "packets", 1),
    "symbol_error": ("ib.symbol_errors", "packets", 1),
    "link_downed": ("ib.link_downed", "packets", 1),
}


def _first(items: Any, key: str = "value") -> str:
    if isinstance(items, list) and items and isinstance(items[0], dict):
        return str(items[0].get(key, ""))
    return ""


def parse_lldpctl_json0(text: str) -> list[LldpNeighbor]:
    """Every (local NIC, neighbour) pair ``lldpctl -f json0`` reports."""
    data = json.loads(text or "{}")
    out: list[LldpNeighbor] = []
    for block in data.get("lldp", []):
        for interface in block.get("interface", []) or []:
            chassis = (interface.get("chassis") or [{}])[0]
            port = (interface.get("port") or [{}])[0]
            out.append(
                LldpNeighbor(
                    local_port=str(interface.get("name", "")),
                    chassis_id=_first(chassis.get("id")),
                    chassis_id_subtype=_first(chassis.get("id"), "type"),
                    system_name=_first(chassis.get("name")),
                    port_id=_first(port.get("id")),
                    port_id_subtype=_first(port.get("id"), "type"),
                    port_descr=_first(port.get("descr")),
                    mgmt_addresses=[str(m.get("value")) for m in chassis.get("mgmt-ip", []) or [] if m.get("value")],
                )
            )
    return out


def lldp_neighbors(socket: str | None = None, timeout_s: float = 5.0) -> list[LldpNeighbor]:
    """The neighbours lldpd sees now; empty when lldpd is not installed or not running."""
    binary = shutil.which("lldpctl")
    if binary is None:
        return []
    argv = [binary, *(["-u", socket] if socket else []), "-f", "json0"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    return parse_lldpctl_json0(done.stdout)


def read_text(path: str) -> str:
    """A sysfs or procfs file's text, stripped; empty when it cannot be read."""
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


# `ethtool -S` names (mlx5 documents these; other drivers name theirs differently and are read where they match)
_ETHTOOL_GLOBAL = {
    "rx_pause_ctrl_phy": ("pause.rx_frames", "frames"),  # the switch paused us
    "tx_pause_ctrl_phy": ("pause.tx_frames", "frames"),  # we paused the switch
    "rx_bytes_phy": ("if.in_octets_phy", "octets"),  # wire bytes with header and FCS: what the switch port counts
    "tx_bytes_phy": ("if.out_octets_phy", "octets"),
    "rx_discards_phy": ("if.in_discards_phy", "packets"),  # no NIC buffer: the adapter is congested
    "rx_out_of_buffer": ("if.rx_out_of_buffer", "packets"),
}
_ETHTOOL_PRIORITY = re.compile(r"^(rx|tx)_prio(\d)_(pause|marked)$")
_ETHTOOL_LINE = re.compile(r"^\s*([A-Za-z0-9_.\[\]-]+):\s+(\d+)\s*$")
# RDMA hw_counters (mlx5): congestion signals of RoCE
_HW_COUNTERS = {
    "np_ecn_marked_roce_packets": ("ecn.marked_packets", "packets"),
    "np_cnp_sent": ("cnp.sent", "packets"),
    "rp_cnp_handled": ("cnp.handled", "packets"),
    "out_of_buffer": ("rdma.out_of_buffer", "packets"),
}
FEC_CLASSES = {"off": "off", "none": "off", "baser": "baser", "fc": "baser", "rs": "rs", "llrs": "rs"}


def parse_ethtool_stats(text: str) -> list[tuple[str, str, int, dict[str, int], str]]:
    """``ethtool -S`` text -> (counter, unit, value, qualifier, ethtool name) for the pause, PFC, ECN and wire-byte
    counters kvbench compares with the switch (Debian's ethtool 6.1 has no JSON for -S)."""
    out: list[tuple[str, str, int, dict[str, int], str]] = []
    for line in text.splitlines():
        match = _ETHTOOL_LINE.match(line)
        if not match:
            continue
        name, value = match.group(1), int(match.group(2))
        if name in _ETHTOOL_GLOBAL:
            counter, unit = _ETHTOOL_GLOBAL[name]
            out.append((counter, unit, value, {}, name))
            continue
        prio = _ETHTOOL_PRIORITY.match(name)
        if prio:
            direction, priority, kind = prio.groups()
            counter = f"pfc.{direction}_frames" if kind == "pause" else "ecn.marked_packets"
            out.append((counter, "frames" if kind == "pause" else "packets", value, {"priority": int(priority)}, name))
    return out


def parse_fec(text: str) -> tuple[str | None, int | None]:
    """``ethtool -I --show-fec`` text -> (active FEC class: off, baser or rs; uncorrectable blocks, when shown)."""
    active = re.search(r"Active FEC encoding:\s*(\S+)", text)
    mode = FEC_CLASSES.get(active.group(1).lower()) if active else None
    blocks = re.search(r"Uncorrectable blocks:\s*(\d+)", text)
    return mode, int(blocks.group(1)) if blocks else None


def _ethtool(*args: str) -> str:
    if shutil.which("ethtool") is None:
        return ""
    try:
        done = subprocess.run(["ethtool", *args], capture_output=True, text=True, timeout=2, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def nic_fec(netdev: str) -> str | None:
    """The NIC's active FEC class, when its driver reports one."""
    return parse_fec(_ethtool("--show-fec", netdev))[0]


def _boot_id() -> str:
    return read_text("/proc/sys/kernel/random/boot_id")


def _sample(
    host: str,
    port: str,
    counter: str,
    value: int,
    unit: str,
    t_request: int,
    source: str,
    epoch: str,
    qualifier: dict[str, int] | None = None,
) -> CounterSample:
    return CounterSample.model_validate(
        {
            "device": host,
            "device_kind": "host",
            "port": port,
            "counter": counter,
            "qualifier": qualifier or {},
            "value": value,
            "unit": unit,
            "ts_request_ns": t_request,
            "ts_response_ns": time.time_ns(),
            "source": source,
            "epoch": epoch,
        }
    )


def nic_counter_samples(
    host: str,
    net_root: str = "/sys/class/net",
    ib_root: str = "/sys/class/infiniband",
    nics: list[str] | None = None,
    ethtool: bool = True,
) -> list[CounterSample]:
    """One reading of every NIC's kernel counters (and its driver's pause, PFC, ECN and FEC counters through
    ``ethtool``, where it has them) and every RDMA port's counters and congestion signals."""
    samples: list[CounterSample] = []
    epoch = _boot_id()
    names = nics if nics is not None else (sorted(os.listdir(net_root)) if os.path.isdir(net_root) else [])
    for name in names:
        if name == "lo":
            continue
        t_request = time.time_ns()
        for stat, (counter, unit) in _NETDEV_STATS.items():
            path = os.path.join(net_root, name, "statistics", stat)
            raw = read_text(path)
            if raw.isdigit():
                samples.append(_sample(host, name, counter, int(raw), unit, t_request, f"sysfs:{path}", epoch))
        if ethtool:
            for counter, unit, value, qualifier, stat in parse_ethtool_stats(_ethtool("-S", name)):
                samples.append(
                    _sample(host, name, counter, value, unit, t_request, f"ethtool:{stat}", epoch, qualifier)
                )
            _, uncorrectable = parse_fec(_ethtool("-I", "--show-fec", name))
            if uncorrectable is not None:
                source = "ethtool:--show-fec uncorrectable blocks"
                samples.append(_sample(host, name, "fec.uncorrectable_blocks", uncorrectable, "packets", t_request,
                                       source, epoch))  # fmt: skip
    for device in sorted(os.listdir(ib_root)) if os.path.isdir(ib_root) else []:
        ports = os.path.join(ib_root, device, "ports")
        for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else []:
            t_request = time.time_ns()
            for name, (counter, unit, factor) in _IB_COUNTERS.items():
                path = os.path.join(ports, port, "counters", name)
                raw = read_text(path)
                if raw.isdigit():
                    source = f"sysfs:{path}" + (" (4-byte words, x4)" if factor == 4 else "")
                    value = int(raw) * factor
                    samples.append(_sample(host, f"{device}/{port}", counter, value, unit, t_request, source, epoch))
            for name, (counter, unit) in _HW_COUNTERS.items():
                path = os.path.join(ports, port, "hw_counters", name)
                raw = read_text(path)
                if raw.isdigit():
                    samples.append(
                        _sample(host, f"{device}/{port}", counter, int(raw), unit, t_request, f"sysfs:{path}", epoch)
                    )
    return samples


def rdma_port_details(ib_root: str = "/sys/class/infiniband") -> list[dict[str, str]]:
    """Per RDMA port: state, physical state, rate, link layer and its netdev (what the preflight checks)."""
    out: list[dict[str, str]] = []
    if not os.path.isdir(ib_root):
        return out
    for device in sorted(os.listdir(ib_root)):
        ports = os.path.join(ib_root, device, "ports")
        net_dir = os.path.join(ib_root, device, "device", "net")
        netdevs = sorted(os.listdir(net_dir)) if os.path.isdir(net_dir) else []
        for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else []:
            base = os.path.join(ports, port)
            out.append(
                {
                    "device": f"{device}/{port}",
                    "state": read_text(os.path.join(base, "state")).split(":")[-1].strip() or "UNKNOWN",
                    "phys_state": read_text(os.path.join(base, "phys_state")).split(":")[-1].strip(),
                    "rate": read_text(os.path.join(base, "rate")),
                    "link_layer": read_text(os.path.join(base, "link_layer")),
                    "netdev": netdevs[0] if netdevs else "",
                }
            )
    return out
