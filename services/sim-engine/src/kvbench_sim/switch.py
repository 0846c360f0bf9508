"""A simulated leaf switch for the simulated cluster: its port counters move with the simulated KV transfers, and
it answers real SNMP v2c (GET, GETNEXT, GETBULK) so the switch-poller reads it over the protocol it uses for a
real switch.

Each simulated machine ``sim-<i>`` is cabled to port ``swp<i+1>``. A machine's engines publish their KV bytes
(``EngineSampled``: stores to and loads from a shared store, P/D transfers); bytes a machine sends count as the
port's ``ifHCInOctets``, bytes it receives as ``ifHCOutOctets``, plus a trickle of background (LLDP-like)
frames. The LLDP-MIB remote table names each machine, so the fabric checks see the cable from both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyasn1.codec.ber import decoder, encoder
from pysnmp.proto import api
from pysnmp.proto.rfc1902 import Counter32, Counter64, Gauge32, Integer32, OctetString, TimeTicks

from kvbench_contracts.engine import SIM_KV_BYTES_SENT
from kvbench_core.bus import NatsAuth, nats_servers
from kvbench_core.settings import read_secret_file

__all__ = ["SimSwitch", "SnmpV2cResponder", "main"]

log = logging.getLogger("kvbench_sim.switch")

SENT = ("kv_bytes_stored_remote", SIM_KV_BYTES_SENT)  # the machine puts these on the wire (P/D: its prefill engines)
RECEIVED = ("kv_bytes_loaded_remote", "kv_bytes_transferred")  # and takes these off it
BACKGROUND_BYTES_PER_S = 64  # LLDP and ARP on an idle port


@dataclass
class Port:
    name: str
    if_index: int
    node: str
    in_octets: int = 0
    out_octets: int = 0
    last: dict[str, dict[str, float]] = field(default_factory=dict)  # engine -> counter -> last value


class SimSwitch:
    def __init__(self, name: str, machines: int, nic_gbps: float, mtu: int = 9216) -> None:
        self.name = name
        self.started = time.monotonic()
        self.speed_mbps = int(nic_gbps * 1000)
        self.mtu = mtu
        self.ports = [Port(f"swp{i + 1}", i + 1, f"sim-{i}") for i in range(machines)]
        self._by_node = {p.node: p for p in self.ports}
        self._template: tuple[list[tuple[tuple[int, ...], Any]], list[tuple[int, Port | None, int]]] | None = None

    def port_of(self, node: str) -> Port | None:
        return self._by_node.get(node)

    def observe(self, node: str, engine: str, normalized: dict[str, float]) -> None:
        """Counters of one engine of one machine; only increases count (an engine restart starts from 0)."""
        port = self._by_node.get(node)
        if port is None:
            return
        last = port.last.setdefault(engine, {})
        for key in (*SENT, *RECEIVED):
            value = normalized.get(key)
            if value is None:
                continue
            step = value - last.get(key, 0.0) if value >= last.get(key, 0.0) else value
            last[key] = value
            if key in SENT:
                port.in_octets += int(step)
            else:
                port.out_octets += int(step)

    def table(self) -> list[tuple[tuple[int, ...], Any]]:
        """Every (OID, value) this agent serves, sorted. A walk of fifty ports is dozens of requests, each asking
        for the table: the OIDs, their order and the values that never change are built once (``_template``); a
        request builds only the uptime and the octet counters."""
        if self._template is None:
            self._template = self._build_template()
        rows, moving = self._template
        elapsed = time.monotonic() - self.started
        uptime, background = int(elapsed * 100), int(elapsed * BACKGROUND_BYTES_PER_S)
        out = rows.copy()
        for at, port, column in moving:
            oid = out[at][0]
            if port is None:  # sysUpTime
                out[at] = (oid, TimeTicks(uptime))
            else:
                octets = port.in_octets if column == _IN_OCTETS else port.out_octets
                out[at] = (oid, Counter64(octets + background))
        return out

    def _build_template(self) -> tuple[list[tuple[tuple[int, ...], Any]], list[tuple[int, Port | None, int]]]:
        """The sorted rows, and where each moving value goes: (row, its port, which value)."""
        rows: list[tuple[tuple[int, ...], Any, Port | None, int]] = [
            ((1, 3, 6, 1, 2, 1, 1, 1, 0), OctetString(f"kvbench simulated leaf {self.name}"), None, _FIXED),
            ((1, 3, 6, 1, 2, 1, 1, 3, 0), None, None, _UPTIME),
            ((1, 3, 6, 1, 2, 1, 1, 5, 0), OctetString(self.name), None, _FIXED),
        ]
        for p in self.ports:
            i = p.if_index
            rows += [
                ((1, 3, 6, 1, 2, 1, 2, 2, 1, 4, i), Integer32(self.mtu), p, _FIXED),
                ((1, 3, 6, 1, 2, 1, 2, 2, 1, 8, i), Integer32(1), p, _FIXED),
                ((1, 3, 6, 1, 2, 1, 2, 2, 1, 13, i), Counter32(0), p, _FIXED),
                ((1, 3, 6, 1, 2, 1, 2, 2, 1, 14, i), Counter32(0), p, _FIXED),
                ((1, 3, 6, 1, 2, 1, 2, 2, 1, 19, i), Counter32(0), p, _FIXED),
                ((1, 3, 6, 1, 2, 1, 2, 2, 1, 20, i), Counter32(0), p, _FIXED),
                ((1, 3, 6, 1, 2, 1, 31, 1, 1, 1, 1, i), OctetString(p.name), p, _FIXED),
                ((1, 3, 6, 1, 2, 1, 31, 1, 1, 1, 6, i), None, p, _IN_OCTETS),
                ((1, 3, 6, 1, 2, 1, 31, 1, 1, 1, 10, i), None, p, _OUT_OCTETS),
                ((1, 3, 6, 1, 2, 1, 31, 1, 1, 1, 15, i), Gauge32(self.speed_mbps), p, _FIXED),
                # LLDP-MIB lldpRemTable (timeMark 0, localPortNum = ifIndex, remIndex 1)
                ((1, 0, 8802, 1, 1, 2, 1, 4, 1, 1, 4, 0, i, 1), Integer32(7), p, _FIXED),
                ((1, 0, 8802, 1, 1, 2, 1, 4, 1, 1, 5, 0, i, 1), OctetString(p.node), p, _FIXED),
                ((1, 0, 8802, 1, 1, 2, 1, 4, 1, 1, 6, 0, i, 1), Integer32(5), p, _FIXED),
                ((1, 0, 8802, 1, 1, 2, 1, 4, 1, 1, 7, 0, i, 1), OctetString("eth0"), p, _FIXED),
                ((1, 0, 8802, 1, 1, 2, 1, 4, 1, 1, 8, 0, i, 1), OctetString("eth0"), p, _FIXED),
                ((1, 0, 8802, 1, 1, 2, 1, 4, 1, 1, 9, 0, i, 1), OctetString(p.node), p, _FIXED),
            ]
        rows.sort(key=lambda r: r[0])
        moving = [(at, port, column) for at, (_, _, port, column) in enumerate(rows) if column != _FIXED]
        return [(oid, value) for oid, value, _, _ in rows], moving


_FIXED, _UPTIME, _IN_OCTETS, _OUT_OCTETS = range(4)  # what a table row's value is: set once, or read per request


class SnmpV2cResponder(asyncio.DatagramProtocol):
    """A read-only SNMP v2c agent over a table function; wrong communities get no answer, like a real agent."""

    def __init__(self, community: str, table: Callable[[], list[tuple[tuple[int, ...], Any]]]) -> None:
        self.community = community.encode()
        self.table = table
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a datagram endpoint's transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            reply = self.answer(data)
        except Exception:
            log.debug("undecodable SNMP datagram dropped", exc_info=True)
            return
        if reply is not None and self.transport is not None:
            self.transport.sendto(reply, addr)

    def answer(self, data: bytes) -> bytes | None:
        version = int(api.decodeMessageVersion(data))
        if version != api.SNMP_VERSION_2C:
            return None
        p = api.PROTOCOL_MODULES[version]
        message, _ = decoder.decode(data, asn1Spec=p.Message())
        if bytes(p.apiMessage.get_community(message)) != self.community:
            return None
        request = p.apiMessage.get_pdu(message)
        response = p.apiMessage.get_response(message)
        pdu = p.apiMessage.get_pdu(response)
        rows = self.table()
        oids = [r[0] for r in rows]
        asked = [tuple(oid) for oid, _ in p.apiPDU.get_varbinds(request)]

        def exact(oid: tuple[int, ...]) -> tuple[tuple[int, ...], Any]:
            at = bisect.bisect_left(oids, oid)
            return (oid, rows[at][1]) if at < len(oids) and oids[at] == oid else (oid, p.NoSuchInstance(""))

        def after(oid: tuple[int, ...]) -> tuple[tuple[int, ...], Any]:
            at = bisect.bisect_right(oids, oid)
            return rows[at] if at < len(rows) else (oid, p.EndOfMibView(""))

        if request.isSameTypeWith(p.GetRequestPDU()):
            binds = [exact(o) for o in asked]
        elif request.isSameTypeWith(p.GetNextRequestPDU()):
            binds = [after(o) for o in asked]
        elif request.isSameTypeWith(p.GetBulkRequestPDU()):
            non_repeaters = int(p.apiBulkPDU.get_non_repeaters(request))
            repetitions = int(p.apiBulkPDU.get_max_repetitions(request))
            binds = [after(o) for o in asked[:non_repeaters]]
            cursors = asked[non_repeaters:]
            for _ in range(max(0, repetitions)):
                step = [after(o) for o in cursors]
                binds += step
                cursors = [oid for oid, _ in step]
                if all(isinstance(v, p.EndOfMibView) for _, v in step):
                    break
        else:
            return None
        p.apiPDU.set_varbinds(pdu, binds)
        encoded: bytes = encoder.encode(response)
        return encoded


def _bus_auth() -> NatsAuth:
    """The bus's credentials as every service takes them (KVBENCH_NATS_USER and KVBENCH_NATS_PASSWORD_FILE, or
    KVBENCH_NATS_TOKEN_FILE): file paths in the environment, never the secrets themselves."""
    token_file = os.environ.get("KVBENCH_NATS_TOKEN_FILE")
    password_file = os.environ.get("KVBENCH_NATS_PASSWORD_FILE")
    return NatsAuth(
        token=read_secret_file(Path(token_file)) if token_file else None,
        user=os.environ.get("KVBENCH_NATS_USER"),
        password=read_secret_file(Path(password_file)) if password_file else None,
        ca_file=os.environ.get("KVBENCH_NATS_CA_FILE"),
    )


async def _run(args: argparse.Namespace, stop: asyncio.Event) -> None:
    import nats  # noqa: PLC0415

    from kvbench_contracts.events import EngineSampled  # noqa: PLC0415

    switch = SimSwitch(args.name, args.machines, args.nic_gbps)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: SnmpV2cResponder(args.community, switch.table), local_addr=(args.host, args.port)
    )
    servers = nats_servers(args.nats_url)  # a cluster's URLs, comma-separated
    nc = await nats.connect(servers=servers, name=f"sim-switch-{args.name}", **_bus_auth().connect_options())

    async def on_sample(msg: Any) -> None:
        try:
            sample = EngineSampled.model_validate_json(msg.data)
        except ValueError:
            return
        switch.observe(sample.node_id, sample.engine_id, sample.normalized)

    await nc.subscribe("kvbench.engine.*.sampled", cb=on_sample)
    log.info(
        "simulated switch %s serving SNMP v2c on %s:%d for %d ports", args.name, args.host, args.port, args.machines
    )
    try:
        await stop.wait()
    finally:
        await nc.drain()
        transport.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kvbench-sim-switch", description="A simulated leaf switch (SNMP v2c)")
    parser.add_argument("--name", default="sim-leaf")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--community-env", default="KVBENCH_SIM_SWITCH_COMMUNITY", help="variable holding the community"
    )
    parser.add_argument("--machines", type=int, default=2)
    parser.add_argument("--nic-gbps", type=float, default=200.0)
    parser.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    args = parser.parse_args(argv)
    import os  # noqa: PLC0415

    args.community = os.environ.get(args.community_env, "")
    if not re.fullmatch(r"\S{8,}", args.community):
        sys.stderr.write(f"kvbench-sim-switch: set {args.community_env} to a community of 8 or more characters\n")
        raise SystemExit(2)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s kvbench-sim-switch %(message)s")

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await _run(args, stop)

    asyncio.run(runner())


if __name__ == "__main__":
    main()
