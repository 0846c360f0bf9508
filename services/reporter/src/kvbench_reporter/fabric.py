"""The report's fabric section and the publish gate (reference/fabric.md sections 6 and 7).

Which switches count: those the run's machines are cabled to, by their LLDP neighbours. A result is
publishable only when each of them has a good read at or before the start of the run and one at or after its
end, with no failed read between; otherwise the gate names the switches, with the reason of their last failed
read. Port counters are differenced between the reads that bracket the run with a guard band where there are
such reads (agents serve cached counters), else between the nearest bracketing reads.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from kvbench_reporter.store import Store

__all__ = ["SWITCH_UNREAD", "fabric_section"]

SWITCH_UNREAD = {
    "code": "switch_unread",
    "message": "These switches carried the pool's traffic but were not read during it",
    "fix": "Connect each switch named on the Network tab, or ignore a switch that carries no benchmark traffic, "
    "and then run the workload again.",
}


async def fabric_section(
    store: Store, run_id: str, start: datetime | None, end: datetime | None, guard_s: float = 5.0, reach_s: float = 60.0
) -> dict[str, Any]:
    """``reach_s``: how far outside the guarded window a bracketing read may lie (a poll interval or two)."""
    nodes = [
        r["node_id"]
        for r in await store.pool.fetch(
            "SELECT DISTINCT node_id FROM events WHERE run_id = $1 AND node_id IS NOT NULL ORDER BY node_id", run_id
        )
    ]
    cabled: dict[str, list[dict[str, Any]]] = {}
    for row in await store.pool.fetch("SELECT node_id, inventory FROM node_inventory WHERE node_id = ANY($1)", nodes):
        inventory = json.loads(row["inventory"]) if isinstance(row["inventory"], str) else row["inventory"]
        for neighbour in inventory.get("lldp", []):
            switch = neighbour.get("system_name") or neighbour.get("chassis_id")
            cabled.setdefault(str(switch), []).append(
                {"node": row["node_id"], "nic": neighbour.get("local_port"), "port": neighbour.get("port_id")}
            )
    out: dict[str, Any] = {
        "definition": "switches the run's machines are cabled to (LLDP); a switch is read when a good read lies at or "
        f"before the run's start + {guard_s:g} s (stacks take longer to stand up) and one at or after its end; port "
        f"deltas span [start - {guard_s:g} s, end + {guard_s:g} s] where reads allow",
        "switches": [],
        "publish_gate": {"publishable": True},
    }
    if not cabled or start is None or end is None:
        out["note"] = "no machine of this run reported an LLDP neighbour" if not cabled else "the run has no window"
        return out
    before, after = start - timedelta(seconds=guard_s), end + timedelta(seconds=guard_s)
    unread: list[dict[str, Any]] = []
    for switch, cables in sorted(cabled.items()):
        reads = await store.pool.fetch(
            "SELECT ok, reason, read_at FROM switch_reads WHERE switch = $1 AND read_at BETWEEN $2 AND $3 "
            "ORDER BY read_at",
            switch,
            before - timedelta(seconds=reach_s),
            after + timedelta(seconds=reach_s),
        )
        # up to a guard after the run's start: standing the first stack up takes longer, so no load is missed
        good_before = [r for r in reads if r["ok"] and r["read_at"] <= start + timedelta(seconds=guard_s)]
        good_after = [r for r in reads if r["ok"] and r["read_at"] >= end]
        failed = [r for r in reads if not r["ok"] and start <= r["read_at"] <= end]
        entry: dict[str, Any] = {
            "switch": switch,
            "cabled": cables,
            "read": bool(good_before and good_after and not failed),
            "reads": len(reads),
            "failed_reads": len(failed),
        }
        if failed:
            entry["reason"] = failed[-1]["reason"]
        elif not reads:
            entry["reason"] = "never read: connect it (POST /v1/switches)"
        elif not (good_before and good_after):
            entry["reason"] = "no good read bracketing the window"
        if entry["read"]:
            guarded_before = [r for r in good_before if r["read_at"] <= before] or good_before
            guarded_after = [r for r in good_after if r["read_at"] >= after] or good_after
            t0, t1 = guarded_before[-1]["read_at"], guarded_after[0]["read_at"]
            entry["window"] = {"from": t0.isoformat(), "to": t1.isoformat()}
            entry["ports"] = await _port_deltas(store, switch, t0, t1)
        else:
            unread.append(entry)
        out["switches"].append(entry)
    if unread:
        out["publish_gate"] = {
            "publishable": False,
            **SWITCH_UNREAD,
            "switches": [{"switch": u["switch"], "reason": u.get("reason")} for u in unread],
        }
    return out


async def _port_deltas(store: Store, switch: str, t0: datetime, t1: datetime) -> list[dict[str, Any]]:
    rows = await store.pool.fetch(
        """
        SELECT port, counter, poll_ts, value, epoch FROM fabric_samples
        WHERE device = $1 AND poll_ts BETWEEN $2 AND $3
          AND counter IN ('if.in_octets', 'if.out_octets', 'if.speed', 'if.in_discards', 'if.out_discards',
                          'if.in_errors', 'if.out_errors', 'pause.in_frames', 'pause.out_frames')
        ORDER BY port, counter, poll_ts
        """,
        switch,
        t0 - timedelta(seconds=5),
        t1 + timedelta(seconds=5),
    )
    series: dict[tuple[str, str], list[Any]] = {}
    for r in rows:
        series.setdefault((r["port"], r["counter"]), []).append(r)
    ports: dict[str, dict[str, Any]] = {}
    seconds = max((t1 - t0).total_seconds(), 1e-9)
    for (port, counter), points in series.items():
        first, last = points[0], points[-1]
        entry = ports.setdefault(port, {"port": port, "window_s": seconds})
        if counter == "if.speed":
            entry["speed_mbps"] = int(last["value"])
        elif first["epoch"] != last["epoch"] or last["value"] < first["value"]:
            entry[f"{counter}_delta"] = None  # the counter was reset inside the window: no honest delta
            entry["reset"] = True
        else:
            entry[f"{counter}_delta"] = int(last["value"] - first["value"])
    for entry in ports.values():
        speed = entry.get("speed_mbps")
        for direction in ("in", "out"):
            delta = entry.get(f"if.{direction}_octets_delta")
            if speed and delta is not None:
                entry[f"{direction}_utilization"] = 8 * delta / (entry["window_s"] * speed * 1e6)
    return sorted(ports.values(), key=lambda p: p["port"])
