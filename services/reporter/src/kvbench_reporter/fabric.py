"""The report's fabric section and the publish gate (reference/fabric.md sections 6 and 7).

Which switches count: those the run's machines are cabled to, by their LLDP neighbours. A result is
publishable only when each of them has a good read at or before the start of the run and one at or after its
end (a poll that failed in between is reported, not fatal: the counters are continuous unless they reset);
otherwise the gate names the switches, with the reason of their last failed read. Port counters are
differenced between the reads that bracket the run with a guard band where there are such reads (agents serve
cached counters), else between the nearest bracketing reads.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from kvbench_contracts.fabric import SwitchConfig
from kvbench_core.naming import natural_key
from kvbench_reporter.agreement import FEC_NAMES, HostSide, SwitchSide, agreement_checks
from kvbench_reporter.store import Store

__all__ = ["EPOCH_TOLERANCE_S", "SWITCH_UNREAD", "fabric_section", "same_boot"]

EPOCH_TOLERANCE_S = 2  # SNMP's derived boot second moves by one between polls of one boot

GAUGES = {"if.speed": "speed_mbps", "if.mtu": "mtu", "if.oper_status": "oper_status", "if.fec_mode": "fec_code"}


def counter_key(counter: str, qualifier: object) -> str:
    """A counter's name in deltas: per-priority ones carry their priority (``pfc.requests[p3]``)."""
    if isinstance(qualifier, str):
        qualifier = json.loads(qualifier) if qualifier else {}
    if not isinstance(qualifier, dict):
        return counter
    if qualifier.get("priority") is not None:
        return f"{counter}[p{qualifier['priority']}]"
    if qualifier.get("queue") is not None:
        return f"{counter}[q{qualifier['queue']}]"
    return counter


SWITCH_UNREAD = {
    "code": "switch_unread",
    "message": "These switches carried the pool's traffic but were not read during it",
    "fix": "Connect each switch named on the Network tab, or ignore a switch that carries no benchmark traffic, "
    "and then run the workload again.",
}


async def fabric_section(
    store: Store,
    run_id: str,
    start: datetime | None,
    end: datetime | None,
    guard_s: float = 5.0,
    reach_s: float = 60.0,
    configs: dict[str, SwitchConfig] | None = None,
    jobs: list[dict[str, Any]] | None = None,
    load_began: datetime | None = None,
) -> dict[str, Any]:
    """``reach_s``: how far outside the guarded window a bracketing read may lie (a poll interval or two).
    ``jobs``: each job's measured window (``job_id``, ``workload``, ``start``, ``end``) and the KV bytes its engines
    said they moved (``kv_bytes``), for the per-job port deltas. ``load_began``: when the run's first load began; a
    read before it counts as one before the run's traffic, however long the stacks took to stand up."""
    nodes = [
        r["node_id"]
        for r in await store.pool.fetch(
            "SELECT DISTINCT node_id FROM events WHERE run_id = $1 AND node_id IS NOT NULL ORDER BY node_id", run_id
        )
    ]
    cabled: dict[str, list[dict[str, Any]]] = {}
    inventories: dict[str, dict[str, Any]] = {}
    for row in await store.pool.fetch("SELECT node_id, inventory FROM node_inventory WHERE node_id = ANY($1)", nodes):
        inventory = json.loads(row["inventory"]) if isinstance(row["inventory"], str) else row["inventory"]
        inventories[row["node_id"]] = inventory
        for neighbour in inventory.get("lldp", []):
            switch = neighbour.get("system_name") or neighbour.get("chassis_id")
            cabled.setdefault(str(switch), []).append(
                {"node": row["node_id"], "nic": neighbour.get("local_port"), "port": neighbour.get("port_id")}
            )
    configs = configs or {}
    out: dict[str, Any] = {
        "definition": "switches the run's machines are cabled to (LLDP); a switch is read when a good read lies at or "
        f"before the run's start + {guard_s:g} s or its first load's start, whichever is later (stacks take longer to "
        "stand up), and one at or after its end; port "
        f"deltas span [start - {guard_s:g} s, end + {guard_s:g} s] where reads allow; per job (``jobs``), the "
        "cabled ports' deltas between the reads bracketing its measured window with the same guard but never inside "
        "another job's measured window, and the KV bytes "
        "its engines said they moved (transferred, loaded from and stored to remote tiers: each byte crosses a "
        "sender's port and a receiver's, and ports carry other traffic too)",
        "switches": [],
        "publish_gate": {"publishable": True},
    }
    if not cabled or start is None or end is None:
        out["note"] = "no machine of this run reported an LLDP neighbour" if not cabled else "the run has no window"
        return out
    before, after = start - timedelta(seconds=guard_s), end + timedelta(seconds=guard_s)
    unread: list[dict[str, Any]] = []
    for switch, cables in sorted(cabled.items(), key=lambda item: natural_key(item[0])):
        config = configs.get(switch)
        if config is not None and config.no_benchmark_traffic:
            out["switches"].append({"switch": switch, "cabled": cables, "read": None, "ignored": True,
                                    "reason": "marked as carrying no benchmark traffic"})  # fmt: skip
            continue
        reads = await store.pool.fetch(
            "SELECT event_id, ok, reason, read_at, lldp_remote FROM switch_reads WHERE switch = $1 "
            "AND read_at BETWEEN $2 AND $3 ORDER BY read_at",
            switch,
            before - timedelta(seconds=reach_s),
            after + timedelta(seconds=reach_s),
        )
        # up to a guard after the run's start, or up to its first load: standing the stacks up takes longer (fifty
        # machines' stacks took 29 s on one host, while the poller had not read a switch connected just before)
        opened = max(start + timedelta(seconds=guard_s), load_began or start)
        good_before = [r for r in reads if r["ok"] and r["read_at"] <= opened]
        good_after = [r for r in reads if r["ok"] and r["read_at"] >= end]
        failed = [r for r in reads if not r["ok"] and start <= r["read_at"] <= end]
        entry: dict[str, Any] = {
            "switch": switch,
            "cabled": cables,
            "read": bool(good_before and good_after),
            "reads": len(reads),
            "failed_reads": len(failed),
        }
        if failed and not entry["read"]:
            entry["reason"] = failed[-1]["reason"]
        elif failed:
            entry["note"] = f"{len(failed)} poll(s) failed during the run, last: {failed[-1]['reason']}"
        elif not reads:
            entry["reason"] = "never read: connect it (POST /v1/switches)"
        elif not (good_before and good_after):
            entry["reason"] = _unbracketed(reads, start, opened, end)
        if entry["read"]:
            guarded_before = [r for r in good_before if r["read_at"] <= before] or good_before
            guarded_after = [r for r in good_after if r["read_at"] >= after] or good_after
            first, last = guarded_before[-1], guarded_after[0]
            t0, t1 = first["read_at"], last["read_at"]
            entry["window"] = {"from": t0.isoformat(), "to": t1.isoformat()}
            entry["ports"] = await _port_deltas(store, switch, first["event_id"], last["event_id"], t0, t1)
            remote = good_after[0]["lldp_remote"]
            remote = json.loads(remote) if isinstance(remote, str) else remote
            entry["agreement"] = await _agreement(store, switch, cables, inventories, entry["ports"], remote, t0, t1)
            cabled_ports = {c["port"] for c in cables}
            windows = sorted(jobs or [], key=lambda j: j["start"])
            entry["jobs"] = [
                await _job_window(store, switch, job, cabled_ports, guard_s, reach_s, _neighbours(windows, job))
                for job in jobs or []
            ]
        else:
            unread.append(entry)
        out["switches"].append(entry)
    out["bottleneck"] = _bottleneck(out["switches"])
    if unread:
        out["publish_gate"] = {
            "publishable": False,
            **SWITCH_UNREAD,
            "switches": [{"switch": u["switch"], "reason": u.get("reason")} for u in unread],
        }
    return out


def _unbracketed(reads: list[Any], start: datetime, opened: datetime, end: datetime) -> str:
    """Why reads exist but none brackets the run: when the first good one came after the run opened, or the last
    good one before it ended, so a person knows whether the switch was connected late or the poller stopped."""
    good = [r["read_at"] for r in reads if r["ok"]]
    if not good:
        return "no good read around the run"
    if good[0] > opened:
        return (
            f"its first good read came {(good[0] - start).total_seconds():.0f} s after the run started, after its "
            "first load began: connect the switch, and let the switch-poller read it, before the run"
        )
    return (
        f"its last good read came {(end - good[-1]).total_seconds():.0f} s before the run ended: the switch-poller "
        "stopped reading it (is it running, and can it reach the switch?)"
    )


def _neighbours(windows: list[dict[str, Any]], job: dict[str, Any]) -> tuple[datetime | None, datetime | None]:
    """The end of the last other job's measured window before this one's start, and the moment the first job after
    its end began its load (its warm-up included: that traffic is the next job's, not this one's): a job's port
    deltas never reach into another job's load."""
    before = [w["end"] for w in windows if w is not job and w["end"] <= job["start"]]
    after = [w.get("began") or w["start"] for w in windows if w is not job and w["start"] >= job["end"]]
    after = [max(t, job["end"]) for t in after]  # a neighbour that began before this one ended starts at its end
    return (max(before) if before else None), (min(after) if after else None)


async def _job_window(
    store: Store,
    switch: str,
    job: dict[str, Any],
    cabled: set[str],
    guard_s: float,
    reach_s: float,
    neighbours: tuple[datetime | None, datetime | None],
) -> dict[str, Any]:
    """One job's port deltas: between the last good read at least a guard before its measured window and the first
    at least a guard after it (the nearest reads on either side when the polls are sparser than that), never past
    the neighbouring jobs' windows."""
    start, end = job["start"], job["end"]
    floor, ceiling = neighbours
    low, high = start - timedelta(seconds=guard_s + reach_s), end + timedelta(seconds=guard_s + reach_s)
    low = max(low, floor) if floor else low
    high = min(high, ceiling) if ceiling else high
    reads = await store.pool.fetch(
        "SELECT event_id, read_at FROM switch_reads WHERE switch = $1 AND ok AND read_at BETWEEN $2 AND $3 "
        "ORDER BY read_at",
        switch,
        low,
        high,
    )
    before = [r for r in reads if r["read_at"] <= start - timedelta(seconds=guard_s)] or [
        r for r in reads if r["read_at"] <= start
    ]
    after = [r for r in reads if r["read_at"] >= end + timedelta(seconds=guard_s)] or [
        r for r in reads if r["read_at"] >= end
    ]
    out: dict[str, Any] = {"job_id": job["job_id"], "workload": job["workload"]}
    if not before or not after:
        out["note"] = "no good reads bracket the job's measured window without reaching into another job's"
        return out
    first, last = before[-1], after[0]
    t0, t1 = first["read_at"], last["read_at"]
    deltas = await _port_deltas(store, switch, first["event_id"], last["event_id"], t0, t1)
    ports = [p for p in deltas if p["port"] in cabled]
    out["window"] = {"from": t0.isoformat(), "to": t1.isoformat(), "measured_s": (end - start).total_seconds()}
    out["ports"] = ports
    carried = [
        (p.get("if.in_octets_delta") or 0) + (p.get("if.out_octets_delta") or 0)
        for p in ports
        if p.get("if.in_octets_delta") is not None
    ]
    out["port_bytes"] = sum(carried) if carried else None
    out["engine_kv_bytes"] = job.get("kv_bytes")
    if out["port_bytes"] and job.get("kv_bytes"):
        out["ports_over_engines"] = out["port_bytes"] / job["kv_bytes"]
    out["bottleneck"] = _bottleneck([{"switch": switch, "ports": ports}])
    return out


def same_boot(first: str, last: str) -> bool:
    """Whether two reads' counter epochs are one boot of the device. An epoch is ``name:boot-seconds``; SNMP derives
    the boot second from the response time less sysUpTime, which moves by a second between polls of one boot, so
    epochs within EPOCH_TOLERANCE_S are the same boot (a reboot moves it by the whole uptime)."""
    if first == last:
        return True
    name_a, _, boot_a = first.rpartition(":")
    name_b, _, boot_b = last.rpartition(":")
    if name_a != name_b or not boot_a.lstrip("-").isdigit() or not boot_b.lstrip("-").isdigit():
        return False
    return abs(int(boot_a) - int(boot_b)) <= EPOCH_TOLERANCE_S


async def _port_deltas(
    store: Store, switch: str, first_read: str, last_read: str, t0: datetime, t1: datetime
) -> list[dict[str, Any]]:
    """Every port's counters differenced between two reads (exactly those two: never a sample of a read outside)."""
    rows = await store.pool.fetch(
        """
        SELECT port, counter, qualifier, poll_ts, value, epoch FROM fabric_samples
        WHERE device = $1 AND event_id = ANY($2::text[])
          AND counter IN ('if.in_octets', 'if.out_octets', 'if.speed', 'if.mtu', 'if.oper_status', 'if.in_discards',
                          'if.out_discards', 'if.in_errors', 'if.out_errors', 'if.fec_mode', 'pause.in_frames',
                          'pause.out_frames', 'pfc.requests', 'pfc.indications', 'queue.dropped_pkts',
                          'queue.ecn_marked_pkts')
        ORDER BY port, counter, qualifier, poll_ts
        """,
        switch,
        [first_read, last_read],
    )
    series: dict[tuple[str, str], list[Any]] = {}
    for r in rows:
        series.setdefault((r["port"], counter_key(r["counter"], r["qualifier"])), []).append(r)
    ports: dict[str, dict[str, Any]] = {}
    seconds = max((t1 - t0).total_seconds(), 1e-9)
    for (port, counter), points in series.items():
        first, last = points[0], points[-1]
        entry = ports.setdefault(port, {"port": port, "window_s": seconds})
        if counter in GAUGES:
            entry[GAUGES[counter]] = int(last["value"])
        elif len(points) < 2:
            entry[f"{counter}_delta"] = None  # one read lacks this counter: unknown, never 0
        elif not same_boot(first["epoch"], last["epoch"]) or last["value"] < first["value"]:
            entry[f"{counter}_delta"] = None  # the counter was reset inside the window: no honest delta
            entry["reset"] = True
        else:
            entry[f"{counter}_delta"] = int(last["value"] - first["value"])
    for entry in ports.values():
        for total, prefix in (("queue_drops", "queue.dropped_pkts["), ("ecn_marked", "queue.ecn_marked_pkts[")):
            values = [v for k, v in entry.items() if k.startswith(prefix) and v is not None]
            if values:
                entry[f"{total}_delta"] = sum(values)  # over the port's output queues
        speed = entry.get("speed_mbps")
        for direction in ("in", "out"):
            delta = entry.get(f"if.{direction}_octets_delta")
            if speed and delta is not None:
                entry[f"{direction}_utilization"] = 8 * delta / (entry["window_s"] * speed * 1e6)
    return sorted(ports.values(), key=lambda p: natural_key(p["port"]))


async def _agreement(
    store: Store,
    switch: str,
    cables: list[dict[str, Any]],
    inventories: dict[str, dict[str, Any]],
    ports: list[dict[str, Any]],
    remote: list[dict[str, Any]],
    t0: datetime,
    t1: datetime,
) -> list[dict[str, Any]]:
    """Every cable's checks, where the machine sent its own NIC counters (simulated machines have none)."""
    by_port = {p["port"]: p for p in ports}
    out = []
    for cable in cables:
        inventory = inventories.get(cable["node"], {})
        host_name = str(inventory.get("hostname", cable["node"]))
        rows = await store.pool.fetch(
            "SELECT counter, qualifier, poll_ts, value FROM fabric_samples WHERE device = $1 AND port = $2 "
            "AND poll_ts BETWEEN $3 AND $4 ORDER BY poll_ts",
            host_name,
            cable["nic"],
            t0,
            t1,
        )
        if not rows:
            out.append({**cable, "checks": [], "note": "the machine sent no NIC counters (simulated, or none read)"})
            continue
        nic: dict[str, Any] = next((n for n in inventory.get("nics", []) if n.get("name") == cable["nic"]), {})
        port = by_port.get(cable["port"], {})
        host = HostSide(
            host=host_name, nic=cable["nic"], mac=str(nic.get("mac", "")), state=str(nic.get("state", "")),
            speed_mbps=nic.get("speed_mbps"), mtu=nic.get("mtu"), lldp_switch=switch, lldp_port=cable["port"],
            deltas=_deltas(rows), fec=nic.get("fec"),
        )  # fmt: skip
        side = SwitchSide(
            switch=switch, port=cable["port"], oper_status=port.get("oper_status"), speed_mbps=port.get("speed_mbps"),
            mtu=port.get("mtu"), lldp_remote=[r for r in remote if r.get("local_port") == cable["port"]],
            deltas={k[: -len("_delta")]: v for k, v in port.items() if k.endswith("_delta") and v is not None},
            fec=FEC_NAMES.get(port["fec_code"]) if port.get("fec_code") is not None else None,
        )  # fmt: skip
        checks = agreement_checks(host, side)
        congestion = await _congestion(store, host_name, cable["nic"], inventory, host.deltas, t0, t1)
        out.append({**cable, "checks": [c.__dict__ for c in checks], "congestion": congestion})
    return out


def _deltas(rows: list[Any]) -> dict[str, int]:
    """Last minus first value of each counter (per priority) in time-ordered sample rows."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for r in rows:
        key = counter_key(r["counter"], r["qualifier"])
        first.setdefault(key, int(r["value"]))
        last[key] = int(r["value"])
    return {key: value - first[key] for key, value in last.items()}


# host-side congestion signals: the NIC's (ethtool) and those of the RDMA ports riding on it (hw_counters)
_CONGESTION = {
    "pause.rx_frames": "pause_frames_received",
    "pause.tx_frames": "pause_frames_sent",
    "pfc.rx_frames": "pfc_frames_received",
    "pfc.tx_frames": "pfc_frames_sent",
    "ecn.marked_packets": "ecn_marked_packets",
    "cnp.sent": "cnp_sent",
    "cnp.handled": "cnp_handled",
    "rdma.out_of_buffer": "rdma_out_of_buffer",
    "ib.xmit_wait": "xmit_wait_ticks",
}


async def _congestion(
    store: Store,
    host: str,
    netdev: str,
    inventory: dict[str, Any],
    nic_deltas: dict[str, int],
    t0: datetime,
    t1: datetime,
) -> dict[str, int]:
    """ECN marks, CNPs, pause/PFC frames (summed over priorities) and queueing the host counted over the window."""
    deltas = dict(nic_deltas)
    rdma = [p["device"] for p in inventory.get("rdma", []) if p.get("netdev") == netdev]
    for device in rdma:
        port = device if "/" in device else f"{device}/1"
        rows = await store.pool.fetch(
            "SELECT counter, qualifier, value FROM fabric_samples WHERE device = $1 AND port = $2 "
            "AND poll_ts BETWEEN $3 AND $4 ORDER BY poll_ts",
            host,
            port,
            t0,
            t1,
        )
        for key, value in _deltas(rows).items():
            deltas[key] = deltas.get(key, 0) + value
    out: dict[str, int] = {}
    for key, value in deltas.items():
        name = _CONGESTION.get(key.split("[", 1)[0])
        if name is not None:
            out[name] = out.get(name, 0) + value
    return out


def _bottleneck(switches: list[dict[str, Any]], busy: float = 0.9) -> dict[str, Any]:
    """fabric.md section 6: network-bound when a port ran at >= 90% of line rate or dropped frames."""
    hot, drops = [], []
    for switch in switches:
        for port in switch.get("ports", []) or []:
            name = f"{switch['switch']} {port['port']}"
            if max(port.get("in_utilization") or 0.0, port.get("out_utilization") or 0.0) >= busy:
                hot.append(name)
            discards = (port.get("if.in_discards_delta") or 0) + (port.get("if.out_discards_delta") or 0)
            if discards + (port.get("queue_drops_delta") or 0) > 0:
                drops.append(name)
    if hot or drops:
        reasons = [f"{', '.join(hot)} at >= {busy:.0%} of line rate"] if hot else []
        reasons += [f"{', '.join(drops)} dropped frames"] if drops else []
        return {"verdict": "network-bound", "reasons": reasons}
    return {"verdict": "not network-limited", "reasons": [f"no port at >= {busy:.0%} of line rate, no drops"]}
