"""A small gNMI target for the fabric lab (reference/fabric.md section 5, item 4): run inside the switch's network
namespace, it serves that namespace's real kernel counters under OpenConfig paths (root qdiscs as output queues),
the switch's real lldpd neighbours, and the boot time, over gRPC with pygnmi's bundled gNMI stubs. Test-only: it
stands where a switch's gNMI server would; the data are live.

    python gnmi_target.py --address A --port P --user U --password W --lldp-socket S --extra counters.json

Interfaces come back one update per interface (``interfaces/interface[name=X]``); LLDP as one update holding the
whole tree: the two shapes real targets use. 64-bit counters are JSON strings, as RFC 7951 (JSON_IETF) says.
``--extra`` is a JSON file the test writes: ``{"gnmi:<port>:<leaf>": value}`` for what a veth cannot have
(pause frames, an FEC mode).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from pygnmi.spec.v080 import gnmi_pb2, gnmi_pb2_grpc

SKIP = {"lo", "mgmt0"}


def _read(path: Path) -> str:
    return path.read_text().strip()


def _interfaces(extra: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for netdev in sorted(Path("/sys/class/net").iterdir()):
        name = netdev.name
        if name in SKIP:
            continue
        stats = netdev / "statistics"
        counters = {
            "in-octets": _read(stats / "rx_bytes"),
            "out-octets": _read(stats / "tx_bytes"),
            "in-unicast-pkts": _read(stats / "rx_packets"),
            "out-unicast-pkts": _read(stats / "tx_packets"),
            "in-discards": _read(stats / "rx_dropped"),
            "out-discards": _read(stats / "tx_dropped"),
            "in-errors": _read(stats / "rx_errors"),
            "out-errors": _read(stats / "tx_errors"),
        }
        speed = int(_read(netdev / "speed")) if _read(netdev / "operstate") == "up" else 0
        value = {
            "openconfig-interfaces:state": {
                "name": name,
                "mtu": int(_read(netdev / "mtu")),
                "oper-status": "UP" if _read(netdev / "operstate") == "up" else "DOWN",
                "counters": counters,
            },
            "openconfig-if-ethernet:ethernet": {
                "state": {
                    "port-speed": f"openconfig-if-ethernet:SPEED_{speed // 1000}GB",
                    "fec-mode": f"openconfig-platform-types:{extra.get(f'gnmi:{name}:fec-mode', 'FEC_DISABLED')}",
                    "counters": {
                        leaf: str(extra.get(f"gnmi:{name}:{leaf}", 0))
                        for leaf in ("in-mac-pause-frames", "out-mac-pause-frames")
                    },
                }
            },
        }
        out.append((name, value))
    return out


def _qos() -> dict[str, Any]:
    """Each port's root qdisc as its one output queue "0" (the kernel's own packets, bytes and drops)."""
    interfaces = []
    for netdev in sorted(Path("/sys/class/net").iterdir()):
        if netdev.name in SKIP:
            continue
        raw = subprocess.run(["tc", "-s", "-j", "qdisc", "show", "dev", netdev.name], capture_output=True, text=True,
                             check=False).stdout  # fmt: skip
        root = next((q for q in json.loads(raw or "[]") if q.get("root")), None)
        if root is None:
            continue
        state = {"transmit-pkts": str(root["packets"]), "transmit-octets": str(root["bytes"]),
                 "dropped-pkts": str(root["drops"])}  # fmt: skip
        queue = {"name": "0", "state": state}
        interfaces.append({"interface-id": netdev.name, "output": {"queues": {"queue": [queue]}}})
    return {"openconfig-qos:interfaces": {"interface": interfaces}}


def _lldp(socket: str) -> dict[str, Any]:
    raw = subprocess.run(["lldpctl", "-u", socket, "-f", "json0"], capture_output=True, text=True, check=False).stdout
    interfaces = []
    for entry in (json.loads(raw or "{}").get("lldp") or [{}])[0].get("interface") or []:
        chassis, port = (entry.get("chassis") or [{}])[0], (entry.get("port") or [{}])[0]
        chassis_id, port_id = (chassis.get("id") or [{}])[0], (port.get("id") or [{}])[0]
        types = {"mac": "MAC_ADDRESS", "ifname": "INTERFACE_NAME", "local": "LOCAL"}
        state = {
            "chassis-id": chassis_id.get("value", ""),
            "chassis-id-type": f"openconfig-lldp-types:{types.get(chassis_id.get('type', ''), 'LOCAL')}",
            "port-id": port_id.get("value", ""),
            "port-id-type": f"openconfig-lldp-types:{types.get(port_id.get('type', ''), 'LOCAL')}",
            "system-name": ((chassis.get("name") or [{}])[0]).get("value", ""),
            "port-description": ((port.get("descr") or [{}])[0]).get("value", ""),
        }
        interfaces.append({"name": entry.get("name"), "neighbors": {"neighbor": [{"id": "1", "state": state}]}})
    return {"openconfig-lldp:interfaces": {"interface": interfaces}}


def _path(elements: list[tuple[str, dict[str, str]]]) -> gnmi_pb2.Path:
    return gnmi_pb2.Path(elem=[gnmi_pb2.PathElem(name=n, key=k) for n, k in elements])


def _json(value: Any) -> gnmi_pb2.TypedValue:
    return gnmi_pb2.TypedValue(json_ietf_val=json.dumps(value).encode())


class Target(gnmi_pb2_grpc.gNMIServicer):  # type: ignore[misc]
    def __init__(self, user: str, password: str, lldp_socket: str, extra: Path) -> None:
        self.user, self.password, self.lldp_socket, self.extra = user, password, lldp_socket, extra

    def _check(self, context: grpc.ServicerContext) -> None:
        metadata = dict(context.invocation_metadata())
        if metadata.get("username") != self.user or metadata.get("password") != self.password:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad username or password")

    def Capabilities(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC's name)
        self._check(context)
        return gnmi_pb2.CapabilityResponse(supported_encodings=[gnmi_pb2.JSON_IETF], gNMI_version="0.8.0")

    def Get(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC's name)
        self._check(context)
        extra = json.loads(self.extra.read_text()) if self.extra.exists() else {}
        now = time.time_ns()
        notifications = []
        for path in request.path:
            names = [e.name.rsplit(":", 1)[-1] for e in path.elem]
            if names[:1] == ["interfaces"]:
                updates = [
                    gnmi_pb2.Update(path=_path([("interfaces", {}), ("interface", {"name": name})]), val=_json(value))
                    for name, value in _interfaces(extra)
                ]
            elif names[:1] == ["qos"]:
                updates = [gnmi_pb2.Update(path=_path([("qos", {})]), val=_json(_qos()))]
            elif names[:1] == ["lldp"]:
                updates = [gnmi_pb2.Update(path=_path([("lldp", {})]), val=_json(_lldp(self.lldp_socket)))]
            elif names[:2] == ["system", "state"]:
                stat = Path("/proc/stat").read_text().splitlines()
                btime = next(int(line.split()[1]) for line in stat if line.startswith("btime"))
                value = {"openconfig-system:boot-time": str(btime * 1_000_000_000)}
                updates = [gnmi_pb2.Update(path=_path([("system", {}), ("state", {})]), val=_json(value))]
            else:
                context.abort(grpc.StatusCode.NOT_FOUND, f"path {'/'.join(names)} is not served")
            notifications.append(gnmi_pb2.Notification(timestamp=now, update=updates))
        return gnmi_pb2.GetResponse(notification=notifications)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--password", required=True)
    parser.add_argument("--lldp-socket", required=True)
    parser.add_argument("--extra", type=Path, required=True)
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    gnmi_pb2_grpc.add_gNMIServicer_to_server(Target(args.user, args.password, args.lldp_socket, args.extra), server)
    server.add_insecure_port(f"{args.address}:{args.port}")
    server.start()
    server.wait_for_termination()


if __name__ == "__main__":
    main()
