"""The SNMP driver (pysnmp 7.1, asyncio): IF-MIB 64-bit counters, speeds, MTU, oper status, errors and
discards, EtherLike pause frames, per-priority PFC from CISCO-PFC-EXT-MIB (also SONiC's agent), and the
LLDP-MIB remote table. Numeric OIDs only: no MIB files are loaded, nothing is fetched from the network.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from pysnmp.hlapi.v3arch.asyncio import (
    CommunityData,
    ContextData,
    ObjectIdentity,
    ObjectType,
    SnmpEngine,
    UdpTransportTarget,
    UsmUserData,
    bulk_walk_cmd,
    get_cmd,
    usmAesCfb128Protocol,
    usmAesCfb256Protocol,
    usmDESPrivProtocol,
    usmHMAC192SHA256AuthProtocol,
    usmHMACMD5AuthProtocol,
    usmHMACSHAAuthProtocol,
)

from kvbench_contracts.fabric import CounterSample, LldpNeighbor, SwitchConfig
from kvbench_switch_poller.reading import SwitchPoll, SwitchReadError

__all__ = ["IF_COLUMNS", "SnmpError", "SnmpPoll", "poll_snmp"]

SYS_UPTIME = "1.3.6.1.2.1.1.3.0"
SYS_NAME = "1.3.6.1.2.1.1.5.0"
IF_NAME = "1.3.6.1.2.1.31.1.1.1.1"
# column OID -> (canonical counter, unit, kind)
IF_COLUMNS: dict[str, tuple[str, str, str]] = {
    "1.3.6.1.2.1.31.1.1.1.6": ("if.in_octets", "octets", "counter"),
    "1.3.6.1.2.1.31.1.1.1.10": ("if.out_octets", "octets", "counter"),
    "1.3.6.1.2.1.31.1.1.1.7": ("if.in_ucast_pkts", "packets", "counter"),
    "1.3.6.1.2.1.31.1.1.1.11": ("if.out_ucast_pkts", "packets", "counter"),
    "1.3.6.1.2.1.31.1.1.1.15": ("if.speed", "mbps", "gauge"),
    "1.3.6.1.2.1.2.2.1.4": ("if.mtu", "bytes", "gauge"),
    "1.3.6.1.2.1.2.2.1.8": ("if.oper_status", "state", "state"),
    "1.3.6.1.2.1.2.2.1.13": ("if.in_discards", "packets", "counter"),
    "1.3.6.1.2.1.2.2.1.14": ("if.in_errors", "packets", "counter"),
    "1.3.6.1.2.1.2.2.1.19": ("if.out_discards", "packets", "counter"),
    "1.3.6.1.2.1.2.2.1.20": ("if.out_errors", "packets", "counter"),
    "1.3.6.1.2.1.10.7.10.1.3": ("pause.in_frames", "frames", "counter"),  # EtherLike dot3InPauseFrames
    "1.3.6.1.2.1.10.7.10.1.4": ("pause.out_frames", "frames", "counter"),
}
# CISCO-PFC-EXT-MIB cpfcIfPriorityTable, indexed (ifIndex, priority)
PFC_COLUMNS: dict[str, tuple[str, str]] = {
    "1.3.6.1.4.1.9.9.813.1.2.1.2": ("pfc.requests", "frames"),  # sent: we paused the peer
    "1.3.6.1.4.1.9.9.813.1.2.1.3": ("pfc.indications", "frames"),  # received: the peer paused us
}
LLDP_REM = "1.0.8802.1.1.2.1.4.1.1"
_AUTH = {"SHA": usmHMACSHAAuthProtocol, "SHA256": usmHMAC192SHA256AuthProtocol, "MD5": usmHMACMD5AuthProtocol}
_PRIV = {"AES": usmAesCfb128Protocol, "AES256": usmAesCfb256Protocol, "DES": usmDESPrivProtocol}
_CHASSIS_SUBTYPES = {4: "mac", 5: "ip", 7: "local", 6: "ifname"}
_PORT_SUBTYPES = {3: "mac", 5: "ifname", 7: "local", 1: "ifalias", 4: "ip"}


class SnmpError(SwitchReadError):
    """An SNMP read failed (timeout, authentication, agent error)."""


SnmpPoll = SwitchPoll


def _auth(config: SwitchConfig, secret: str) -> CommunityData | UsmUserData:
    if config.snmp_version == "2c":
        return CommunityData(secret, mpModel=1)  # noqa: S508 (v2c is what many switches offer; v3 is the default)
    user, _, rest = secret.partition(":")
    auth_key, _, priv_key = rest.partition(":")
    if not user or not auth_key:
        raise SnmpError(f"switch {config.name}: secret {config.secret!r} must be 'user:authkey[:privkey]' for SNMPv3")
    return UsmUserData(
        user,
        auth_key,
        priv_key or None,
        authProtocol=_AUTH[config.auth_protocol],
        privProtocol=_PRIV[config.priv_protocol] if priv_key else None,
    )


def _hex(value: object) -> str:
    raw = bytes(value.asOctets()) if hasattr(value, "asOctets") else str(value).encode()
    if raw and all(32 <= b < 127 for b in raw):
        return raw.decode()
    return ":".join(f"{b:02x}" for b in raw)


async def _walk(engine: SnmpEngine, auth: object, target: UdpTransportTarget, root: str) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    async for error, status, _, binds in bulk_walk_cmd(
        engine, auth, target, ContextData(), 0, 32, ObjectType(ObjectIdentity(root)), lexicographicMode=False
    ):
        if error:
            raise SnmpError(str(error))
        if status:
            break  # noSuchName and the like: the table is absent on this agent
        for oid, value in binds:
            if value.__class__.__name__ in ("NoSuchObject", "NoSuchInstance", "EndOfMibView"):
                continue
            out.append((str(oid), value))
    return out


def _suffix(oid: str, column: str) -> str:
    return oid[len(column) + 1 :]


async def poll_snmp(config: SwitchConfig, secret: str, timeout_s: float = 2.0) -> SnmpPoll:
    """One read of every column; raises ``SnmpError`` (timeout, auth) with a reason fit to show a user."""
    engine = SnmpEngine()
    try:
        auth = _auth(config, secret)
        target = await UdpTransportTarget.create((config.address, config.port), timeout=timeout_s, retries=1)
        t_request = time.time_ns()
        error, status, _, binds = await get_cmd(
            engine,
            auth,
            target,
            ContextData(),
            ObjectType(ObjectIdentity(SYS_UPTIME)),
            ObjectType(ObjectIdentity(SYS_NAME)),
        )
        t_uptime = time.time_ns()  # sysUpTime was read inside this one round trip, not the walk after it
        if error or status:
            raise SnmpError(f"switch {config.name} at {config.address}:{config.port}: {error or status.prettyPrint()}")
        uptime, sys_name = int(binds[0][1]), str(binds[1][1])
        names = {_suffix(oid, IF_NAME): str(value) for oid, value in await _walk(engine, auth, target, IF_NAME)}
        rows: list[tuple[str, str, object]] = []
        for column in IF_COLUMNS:
            rows.extend(
                (column, _suffix(oid, column), value) for oid, value in await _walk(engine, auth, target, column)
            )
        pfc: list[tuple[str, str, object]] = []
        for column in PFC_COLUMNS:
            pfc.extend(
                (column, _suffix(oid, column), value) for oid, value in await _walk(engine, auth, target, column)
            )
        lldp = await _walk(engine, auth, target, LLDP_REM)
        t_response = time.time_ns()
    except TimeoutError as exc:
        raise SnmpError(f"switch {config.name} at {config.address}:{config.port}: timed out") from exc
    finally:
        engine.close_dispatcher()
    # boot time, to the second: the middle of the round trip that read sysUpTime, less it. Not the walk's end: walking
    # fifty ports' tables took 1 to 19 s on a busy poller, and a boot second that moved that much read as a reboot
    # (every port's counters "reset", their deltas unknown)
    epoch = f"{config.name}:{((t_request + t_uptime) // 2 - uptime * 10_000_000) // 1_000_000_000}"
    poll = SnmpPoll(config.name, sys_name, uptime)
    ignored = set(config.ignore_ports)

    def sample(port: str, counter: str, value: Any, unit: str, kind: str, source: str, **qualifier: int) -> None:
        poll.samples.append(
            CounterSample.model_validate(
                {
                    "device": config.name,
                    "device_kind": "switch",
                    "port": port,
                    "counter": counter,
                    "qualifier": qualifier,
                    "value": int(value),
                    "unit": unit,
                    "kind": kind,
                    "ts_request_ns": t_request,
                    "ts_response_ns": t_response,
                    "source": f"snmp:{source}",
                    "epoch": epoch,
                }
            )
        )

    for column, index, value in rows:
        port = names.get(index, f"ifIndex{index}")
        if port in ignored:
            continue
        counter, unit, kind = IF_COLUMNS[column]
        sample(port, counter, value, unit, kind, f"{column}.{index}")
    for column, index, value in pfc:
        if_index, _, priority = index.partition(".")
        port = names.get(if_index, f"ifIndex{if_index}")
        if port not in ignored and priority.isdigit():
            counter, unit = PFC_COLUMNS[column]
            sample(port, counter, value, unit, "counter", f"{column}.{index}", priority=int(priority))
    poll.lldp_remote = _lldp_remote(lldp, names)
    return poll


def _lldp_remote(binds: Iterable[tuple[str, object]], names: dict[str, str]) -> list[LldpNeighbor]:
    """lldpRemTable, indexed (timeMark, localPortNum, remIndex): columns 4-9 per remote."""
    by_row: dict[tuple[str, str], dict[int, object]] = {}
    for oid, value in binds:
        parts = _suffix(oid, LLDP_REM).split(".")
        if len(parts) < 4:
            continue
        column, local_port, rem_index = int(parts[0]), parts[2], parts[3]
        by_row.setdefault((local_port, rem_index), {})[column] = value
    out = []
    for (local_port, _), cols in sorted(by_row.items()):
        if 5 not in cols or 7 not in cols:
            continue
        out.append(
            LldpNeighbor(
                local_port=names.get(local_port, local_port),
                chassis_id=_hex(cols[5]),
                chassis_id_subtype=_CHASSIS_SUBTYPES.get(int(cols.get(4, 0)), str(cols.get(4, ""))),  # type: ignore[call-overload]
                system_name=str(cols.get(9, "")),
                port_id=_hex(cols[7]),
                port_id_subtype=_PORT_SUBTYPES.get(int(cols.get(6, 0)), str(cols.get(6, ""))),  # type: ignore[call-overload]
                port_descr=str(cols.get(8, "")),
            )
        )
    return out
