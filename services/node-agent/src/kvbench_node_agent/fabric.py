"""Host side of the fabric (reference/fabric.md sections 1 and 3): LLDP neighbours from ``lldpctl -f json0``,
NIC and RDMA port counters from sysfs, and the RDMA-port detail the preflight needs.

``json0`` is parsed because its shape does not change with the number of interfaces or neighbours. InfiniBand
``port_rcv_data``/``port_xmit_data`` count 4-byte words: they are converted to octets, and the raw value is
named in the sample's source.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from typing import Any

from kvbench_contracts.fabric import CounterSample, LldpNeighbor

__all__ = ["lldp_neighbors", "nic_counter_samples", "parse_lldpctl_json0", "rdma_port_details", "read_text"]

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


def _boot_id() -> str:
    return read_text("/proc/sys/kernel/random/boot_id")


def _sample(
    host: str, port: str, counter: str, value: int, unit: str, t_request: int, source: str, epoch: str
) -> CounterSample:
    return CounterSample.model_validate(
        {
            "device": host,
            "device_kind": "host",
            "port": port,
            "counter": counter,
            "value": value,
            "unit": unit,
            "ts_request_ns": t_request,
            "ts_response_ns": time.time_ns(),
            "source": source,
            "epoch": epoch,
        }
    )


def nic_counter_samples(
    host: str, net_root: str = "/sys/class/net", ib_root: str = "/sys/class/infiniband", nics: list[str] | None = None
) -> list[CounterSample]:
    """One reading of every NIC's kernel counters and every RDMA port's counters."""
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
