"""The simulated leaf switch over real SNMP: the switch-poller's own driver reads it."""

from __future__ import annotations

import asyncio

import pytest

from kvbench_contracts.fabric import SwitchConfig
from kvbench_sim.switch import SimSwitch, SnmpV2cResponder
from kvbench_switch_poller.snmp import SnmpError, poll_snmp


async def test_ports_move_with_the_machines_kv_bytes_and_the_cables_show_in_lldp() -> None:
    switch = SimSwitch("sim-leaf", machines=2, nic_gbps=200)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: SnmpV2cResponder("community-123", switch.table), local_addr=("127.0.0.1", 0)
    )
    port = transport.get_extra_info("sockname")[1]
    config = SwitchConfig(name="sim-leaf", address="127.0.0.1", port=port, snmp_version="2c", secret="s")
    try:
        switch.observe("sim-0", "e0", {"kv_bytes_stored_remote": 5_000_000, "kv_bytes_loaded_remote": 1_000})
        switch.observe("sim-0", "e0", {"kv_bytes_stored_remote": 7_000_000, "kv_bytes_loaded_remote": 1_000})
        switch.observe("sim-0", "e1", {"kv_bytes_stored_remote": 100})  # a second engine on the machine adds up
        switch.observe("sim-9", "e0", {"kv_bytes_stored_remote": 1})  # not cabled: ignored
        poll = await poll_snmp(config, "community-123")
        by = {(s.port, s.counter): s.value for s in poll.samples}
        background = by[("swp2", "if.in_octets")]  # an idle port carries only LLDP-like frames
        assert background < 1_000
        assert by[("swp1", "if.in_octets")] - background == 7_000_100
        assert by[("swp1", "if.out_octets")] - by[("swp2", "if.out_octets")] == 1_000
        assert by[("swp1", "if.speed")] == 200_000
        assert by[("swp1", "if.oper_status")] == 1
        assert [(n.local_port, n.system_name) for n in poll.lldp_remote] == [("swp1", "sim-0"), ("swp2", "sim-1")]
        switch.observe("sim-0", "e0", {"kv_bytes_stored_remote": 10})  # the engine restarted: its counter fell
        again = await poll_snmp(config, "community-123")
        assert {(s.port, s.counter): s.value for s in again.samples}[("swp1", "if.in_octets")] >= 7_000_110
        with pytest.raises(SnmpError):
            await poll_snmp(config, "wrong-community", timeout_s=0.5)
    finally:
        transport.close()


async def test_a_slow_walk_does_not_move_the_boot_epoch() -> None:
    """A busy poller or switch stretches the walk of every port's columns over seconds; the counters' epoch (the
    boot second) comes from the sysUpTime read alone, so two reads of one boot agree however long each walk took."""
    import time  # noqa: PLC0415

    from kvbench_reporter.fabric import same_boot  # noqa: PLC0415

    switch = SimSwitch("sim-leaf", machines=50, nic_gbps=200)
    slow = {"s": 0.0}

    def table() -> list[tuple[tuple[int, ...], object]]:
        time.sleep(slow["s"])  # every request after the first waits: the walk, not the sysUpTime read, is slow
        slow["s"] = slow.get("next", 0.0)
        return switch.table()

    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: SnmpV2cResponder("community-123", table), local_addr=("127.0.0.1", 0)
    )
    port = transport.get_extra_info("sockname")[1]
    config = SwitchConfig(name="sim-leaf", address="127.0.0.1", port=port, snmp_version="2c", secret="s")
    try:
        quick = await poll_snmp(config, "community-123")
        slow.update(s=0.0, next=0.1)
        started = time.monotonic()
        stretched = await poll_snmp(config, "community-123", timeout_s=5.0)
        walked_s = time.monotonic() - started
        assert walked_s > 3.5, walked_s  # the walk took longer than the epoch tolerance (2 s) and then some
        assert same_boot(quick.samples[0].epoch, stretched.samples[0].epoch), (quick.samples[0].epoch, walked_s)
    finally:
        transport.close()


def test_the_table_built_once_serves_the_counters_as_they_move(monkeypatch: pytest.MonkeyPatch) -> None:
    """The OIDs and fixed values are built on the first request; every later one reads the uptime and octets anew:
    the same table as a switch that built everything after the bytes moved."""
    import time  # noqa: PLC0415

    clock = {"now": 1000.0}
    monkeypatch.setattr(time, "monotonic", lambda: clock["now"])  # uptime and background, fixed
    before = SimSwitch("sim-leaf", machines=12, nic_gbps=100)
    before.table()
    clock["now"] += 30.0
    for switch in (before, after := SimSwitch("sim-leaf", machines=12, nic_gbps=100)):
        switch.observe("sim-3", "e0", {"kv_bytes_stored_remote": 123_456, "kv_bytes_loaded_remote": 77})
    after.started = before.started
    served, fresh = before.table(), after.table()
    assert dict(served)[(1, 3, 6, 1, 2, 1, 1, 3, 0)] == 3000  # sysUpTime moved on: 30 s in hundredths
    assert [oid for oid, _ in served] == sorted(oid for oid, _ in fresh)
    assert [str(value) for _, value in served] == [str(value) for _, value in fresh]
    octets = dict(served)[(1, 3, 6, 1, 2, 1, 31, 1, 1, 1, 6, 4)]  # swp4 (sim-3): what it sent
    assert int(octets) >= 123_456
