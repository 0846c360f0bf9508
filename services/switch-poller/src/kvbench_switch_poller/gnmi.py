"""The gNMI driver (pygnmi, OpenConfig paths; reference/fabric.md section 2): interface counters, speed, MTU,
oper status, FEC mode and 802.3x pause frames, output-queue packets, octets and drops (QoS), the LLDP neighbours the
switch sees, and the boot time as the counters' epoch. One Get per subtree, JSON_IETF; pygnmi is synchronous, so a
read runs in a worker thread.

Targets answer a Get for a subtree either with one update holding the whole tree or with one update per list
entry; both are folded into the same nested form (list entries keyed by their ``name``/``id``, module prefixes
dropped) before anything is read from it.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Any

from pygnmi.client import gNMIclient

from kvbench_contracts.fabric import CounterSample, LldpNeighbor, SwitchConfig
from kvbench_switch_poller.reading import SwitchPoll, SwitchReadError

__all__ = [
    "FEC_CODES",
    "QUEUE_COUNTERS",
    "GnmiError",
    "Read",
    "fold_updates",
    "poll_gnmi",
    "samples_from_interfaces",
    "samples_from_queues",
]

# OpenConfig interface state leaf -> (canonical counter, unit, kind), as the SNMP driver names them
STATE_COUNTERS: dict[str, tuple[str, str, str]] = {
    "in-octets": ("if.in_octets", "octets", "counter"),
    "out-octets": ("if.out_octets", "octets", "counter"),
    "in-unicast-pkts": ("if.in_ucast_pkts", "packets", "counter"),
    "out-unicast-pkts": ("if.out_ucast_pkts", "packets", "counter"),
    "in-discards": ("if.in_discards", "packets", "counter"),
    "out-discards": ("if.out_discards", "packets", "counter"),
    "in-errors": ("if.in_errors", "packets", "counter"),
    "out-errors": ("if.out_errors", "packets", "counter"),
    "in-fcs-errors": ("if.in_fcs_errors", "packets", "counter"),
}
ETHERNET_COUNTERS: dict[str, tuple[str, str, str]] = {
    "in-mac-pause-frames": ("pause.in_frames", "frames", "counter"),
    "out-mac-pause-frames": ("pause.out_frames", "frames", "counter"),
}
# OpenConfig FEC modes -> the classes a host's ethtool reports (off, BASE-R, Reed-Solomon), as state codes
FEC_CODES = {"off": 0, "baser": 1, "rs": 2}
_FEC = {"FEC_DISABLED": "off", "FEC_FC": "baser", "FEC_RS528": "rs", "FEC_RS544": "rs",
        "FEC_RS544_2X_INTERLEAVE": "rs", "FEC_RS108": "rs"}  # fmt: skip
_OPER = {"UP": 1, "DOWN": 2, "TESTING": 3, "UNKNOWN": 4, "DORMANT": 5, "NOT_PRESENT": 6, "LOWER_LAYER_DOWN": 7}
_SPEED = re.compile(r"SPEED_(\d+)(MB|GB)")
_KEY = re.compile(r"([^\[/]+)((?:\[[^\]]*\])*)")


class GnmiError(SwitchReadError):
    """A gNMI read failed (unreachable, TLS, authentication, a path the target refused)."""


def _plain(key: str) -> str:
    return key.rsplit(":", 1)[-1]


def _normalize(value: Any) -> Any:
    """Module prefixes off the keys; lists of entries keyed by their name (or id)."""
    if isinstance(value, dict):
        return {_plain(k): _normalize(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        keyed: dict[str, Any] = {}
        for raw in value:
            entry = _normalize(raw)
            key = entry.get("name", entry.get("id", entry.get("interface-id")))
            keyed[str(key)] = entry
        return keyed
    return value


def _elements(path: str) -> list[tuple[str, str | None]]:
    """'interfaces/interface[name=swp1]/state' -> [('interfaces', None), ('interface', 'swp1'), ('state', None)]."""
    out: list[tuple[str, str | None]] = []
    for match in _KEY.finditer(path.strip("/")):
        name, keys = match.group(1).strip("/"), match.group(2)
        if not name:
            continue
        key = re.search(r"=([^\]]*)\]", keys).group(1) if keys else None  # type: ignore[union-attr]
        out.append((_plain(name), key))
    return out


def fold_updates(response: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """A pygnmi Get response -> (one nested tree, the newest notification timestamp in ns)."""
    tree: dict[str, Any] = {}
    newest: int | None = None
    for notification in response.get("notification") or []:
        stamp = notification.get("timestamp")
        if isinstance(stamp, int) and stamp > 0:
            newest = stamp if newest is None else max(newest, stamp)
        prefix = notification.get("prefix") or ""
        for update in notification.get("update") or []:
            path = "/".join(p for p in (prefix, str(update.get("path") or "")) if p)
            node = tree
            for name, key in _elements(path):
                node = node.setdefault(name, {})
                if key is not None:
                    node = node.setdefault(key, {})
            value = _normalize(update.get("val"))
            if isinstance(value, dict):
                _merge(node, value)
            elif path:
                *_, (last, _) = _elements(path)
                parent = tree
                for name, key in _elements(path)[:-1]:
                    parent = parent[name] if key is None else parent[name][key]
                parent[last] = value
    return tree, newest


def _merge(into: dict[str, Any], value: dict[str, Any]) -> None:
    for k, v in value.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _speed_mbps(value: object) -> int | None:
    match = _SPEED.search(str(value or ""))
    if not match:
        return None
    return int(match.group(1)) * (1000 if match.group(2) == "GB" else 1)


@dataclass(frozen=True)
class Read:
    """When one read happened, for every sample it gives."""

    config: SwitchConfig
    t_request: int
    t_response: int
    t_device: int | None
    epoch: str

    def sample(self, port: str, counter: str, value: object, unit: str, kind: str, path: str,
               **qualifier: object) -> CounterSample:  # fmt: skip
        return CounterSample.model_validate(
            {
                "device": self.config.name,
                "device_kind": "switch",
                "port": port,
                "counter": counter,
                "qualifier": qualifier,
                "value": int(value),  # type: ignore[call-overload]
                "unit": unit,
                "kind": kind,
                "ts_request_ns": self.t_request,
                "ts_response_ns": self.t_response,
                "ts_device_ns": self.t_device,
                "source": f"gnmi:{path}",
                "epoch": self.epoch,
            }
        )


def samples_from_interfaces(interfaces: dict[str, Any], read: Read) -> list[CounterSample]:
    """The ``interfaces/interface`` tree as counter samples named like the SNMP driver's."""
    out: list[CounterSample] = []
    ignored = set(read.config.ignore_ports)

    def sample(port: str, counter: str, value: object, unit: str, kind: str, leaf: str) -> None:
        out.append(read.sample(port, counter, value, unit, kind, f"/interfaces/interface[name={port}]/{leaf}"))

    for port, entry in sorted((interfaces.get("interface") or {}).items()):
        if port in ignored or not isinstance(entry, dict):
            continue
        state = entry.get("state") or {}
        for leaf, value in (state.get("counters") or {}).items():
            if leaf in STATE_COUNTERS and value is not None:
                sample(port, *STATE_COUNTERS[leaf][:1], value, *STATE_COUNTERS[leaf][1:], f"state/counters/{leaf}")
        if state.get("mtu") is not None:
            sample(port, "if.mtu", state["mtu"], "bytes", "gauge", "state/mtu")
        if state.get("oper-status") is not None:
            status = _OPER.get(_plain(str(state["oper-status"])), 4)
            sample(port, "if.oper_status", status, "state", "state", "state/oper-status")
        ethernet = (entry.get("ethernet") or {}).get("state") or {}
        speed = _speed_mbps(ethernet.get("negotiated-port-speed")) or _speed_mbps(ethernet.get("port-speed"))
        if speed is not None:
            sample(port, "if.speed", speed, "mbps", "gauge", "ethernet/state/port-speed")
        fec = _FEC.get(_plain(str(ethernet.get("fec-mode") or "")))
        if fec is not None:
            sample(port, "if.fec_mode", FEC_CODES[fec], "state", "state", "ethernet/state/fec-mode")
        for leaf, value in (ethernet.get("counters") or {}).items():
            if leaf in ETHERNET_COUNTERS and value is not None:
                counter, unit, kind = ETHERNET_COUNTERS[leaf]
                sample(port, counter, value, unit, kind, f"ethernet/state/counters/{leaf}")
    return out


# OpenConfig QoS output-queue leaves -> canonical counters; ECN marks are a vendor augment where they exist
QUEUE_COUNTERS: dict[str, tuple[str, str]] = {
    "transmit-pkts": ("queue.transmit_pkts", "packets"),
    "transmit-octets": ("queue.transmit_octets", "octets"),
    "dropped-pkts": ("queue.dropped_pkts", "packets"),
    "ecn-marked-pkts": ("queue.ecn_marked_pkts", "packets"),
}


def samples_from_queues(qos: dict[str, Any], read: Read) -> list[CounterSample]:
    """``qos/interfaces/interface/output/queues/queue`` state: per port and queue, packets, octets, drops (and ECN
    marks where the target augments the model with them)."""
    out: list[CounterSample] = []
    ignored = set(read.config.ignore_ports)
    for port, entry in sorted(((qos.get("interfaces") or {}).get("interface") or {}).items()):
        if port in ignored or not isinstance(entry, dict):
            continue
        queues = ((entry.get("output") or {}).get("queues") or {}).get("queue") or {}
        for queue, body in sorted(queues.items()):
            state = (body or {}).get("state") or {}
            for leaf, value in state.items():
                if leaf in QUEUE_COUNTERS and value is not None:
                    counter, unit = QUEUE_COUNTERS[leaf]
                    path = (
                        f"/qos/interfaces/interface[interface-id={port}]/output/queues/queue[name={queue}]/state/{leaf}"
                    )
                    out.append(read.sample(port, counter, value, unit, "counter", path, queue=str(queue)))
    return out


def _neighbors(lldp: dict[str, Any]) -> list[LldpNeighbor]:
    out = []
    for port, entry in sorted((lldp.get("interfaces", {}).get("interface") or {}).items()):
        for neighbor in ((entry or {}).get("neighbors", {}).get("neighbor") or {}).values():
            state = (neighbor or {}).get("state") or {}
            if not state.get("chassis-id") or not state.get("port-id"):
                continue
            out.append(
                LldpNeighbor(
                    local_port=port,
                    chassis_id=str(state["chassis-id"]),
                    chassis_id_subtype=_subtype(state.get("chassis-id-type")),
                    system_name=str(state.get("system-name") or ""),
                    port_id=str(state["port-id"]),
                    port_id_subtype=_subtype(state.get("port-id-type")),
                    port_descr=str(state.get("port-description") or ""),
                )
            )
    return out


def _subtype(value: object) -> str:
    """OpenConfig's LLDP id types -> the subtypes the SNMP driver and lldpctl use."""
    plain = _plain(str(value or "")).upper()
    return {
        "MAC_ADDRESS": "mac",
        "INTERFACE_NAME": "ifname",
        "LOCAL": "local",
        "NETWORK_ADDRESS": "ip",
        "INTERFACE_ALIAS": "ifalias",
    }.get(plain, plain.lower())


def _read(config: SwitchConfig, secret: str, timeout_s: float) -> SwitchPoll:
    user, _, password = secret.partition(":")
    where = f"switch {config.name} at {config.address}:{config.port} (gNMI)"
    try:
        with gNMIclient(
            target=(config.address, config.port),
            username=user,
            password=password,
            insecure=config.gnmi_tls == "plaintext",
            skip_verify=config.gnmi_tls == "tls_skip_verify",
            gnmi_timeout=max(1, round(timeout_s)),
        ) as client:
            t_request = time.time_ns()
            interfaces, t_device = fold_updates(client.get(path=["interfaces"], encoding="json_ietf", datatype="state"))
            qos = _optional(client, "qos")
            t_response = time.time_ns()
            lldp = _optional(client, "lldp")
            boot = ((_optional(client, "system/state").get("system") or {}).get("state") or {}).get("boot-time")
    except GnmiError:
        raise
    except Exception as exc:  # pygnmi and grpc raise many kinds; the reason is what matters
        reason = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise GnmiError(f"{where}: {reason}") from None
    epoch = f"{config.name}:{int(boot) // 1_000_000_000}" if boot is not None else ""
    read = Read(config, t_request, t_response, t_device, epoch)
    poll = SwitchPoll(config.name, config.name, 0)
    poll.samples = samples_from_interfaces(interfaces.get("interfaces") or {}, read)
    if not poll.samples:
        raise GnmiError(f"{where}: the target returned no OpenConfig interface state")
    poll.samples += samples_from_queues(qos.get("qos") or {}, read)
    poll.lldp_remote = _neighbors(lldp.get("lldp") or {})
    return poll


def _optional(client: Any, path: str) -> dict[str, Any]:
    """A subtree the target may not serve (then empty): the read goes on without it."""
    try:
        tree, _ = fold_updates(client.get(path=[path], encoding="json_ietf", datatype="state"))
    except Exception:  # pygnmi raises plain Exception for a refused path
        return {}
    return tree


async def poll_gnmi(config: SwitchConfig, secret: str, timeout_s: float = 3.0) -> SwitchPoll:
    """One read of the interfaces, LLDP and system subtrees; raises ``GnmiError`` with a reason fit to show."""
    return await asyncio.to_thread(_read, config, secret, timeout_s)
