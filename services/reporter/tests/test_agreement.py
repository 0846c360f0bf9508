"""NIC-to-switch-port agreement: FEC and pause symmetry (pure logic; the lab tests the other checks live)."""

from __future__ import annotations

from kvbench_reporter.agreement import HostSide, SwitchSide, agreement_checks


def _verdicts(host: HostSide, switch: SwitchSide) -> dict[str, tuple[str, str]]:
    return {c.check: (c.verdict, c.detail) for c in agreement_checks(host, switch)}


def _sides(host_deltas: dict[str, int], switch_deltas: dict[str, int], host_fec: str | None = "rs",
           switch_fec: str | None = "rs") -> tuple[HostSide, SwitchSide]:  # fmt: skip
    host = HostSide(host="gpu-a", nic="eth1", state="up", lldp_switch="leaf1", lldp_port="swp1",
                    deltas=host_deltas, fec=host_fec)  # fmt: skip
    return host, SwitchSide(switch="leaf1", port="swp1", oper_status=1, deltas=switch_deltas, fec=switch_fec)


def test_fec_must_match_on_both_ends_and_uncorrectable_blocks_warn() -> None:
    assert _verdicts(*_sides({}, {}))["fec"][0] == "PASS"
    verdict, detail = _verdicts(*_sides({}, {}, switch_fec="off"))["fec"]
    assert verdict == "FAIL"
    assert "host rs, switch off" in detail
    assert _verdicts(*_sides({"fec.uncorrectable_blocks": 12}, {}))["fec"][0] == "WARN"
    assert _verdicts(*_sides({}, {}, host_fec=None))["fec"][0] == "WARN"


def test_pause_frames_sent_by_one_end_are_received_by_the_other() -> None:
    host = {"pause.rx_frames": 1000, "pause.tx_frames": 0, "pfc.rx_frames[p3]": 5_000, "pfc.tx_frames[p3]": 40}
    switch = {"pause.out_frames": 1001, "pause.in_frames": 0, "pfc.requests[p3]": 5_010, "pfc.indications[p3]": 40}
    verdict, detail = _verdicts(*_sides(host, switch))["pause_symmetry"]
    assert verdict == "PASS"
    assert "switch paused the host [p3]: host 5,000, switch 5,010" in detail
    # the switch says it paused priority 3 far more often than the host saw: a mis-mapped priority or a bad cable
    verdict, detail = _verdicts(*_sides(host, {**switch, "pfc.requests[p3]": 9_000}))["pause_symmetry"]
    assert verdict == "FAIL"
    assert "[p3]" in detail
    # a priority only one end counts cannot be compared
    verdict, _ = _verdicts(*_sides({"pfc.rx_frames[p3]": 5}, {"pfc.requests[p4]": 5}))["pause_symmetry"]
    assert verdict == "WARN"
    assert _verdicts(*_sides({}, {}))["pause_symmetry"] == ("WARN", "neither side reports pause frames")


def test_queue_drops_make_a_port_a_bottleneck_and_qualifiers_name_their_counter() -> None:
    from kvbench_reporter.fabric import _bottleneck, counter_key  # noqa: PLC0415

    assert counter_key("pfc.requests", '{"priority": 3}') == "pfc.requests[p3]"
    assert counter_key("queue.dropped_pkts", {"queue": "0"}) == "queue.dropped_pkts[q0]"
    assert counter_key("if.in_octets", "") == "if.in_octets"
    quiet = {"switch": "leaf1", "ports": [{"port": "swp1", "in_utilization": 0.2}]}
    assert _bottleneck([quiet])["verdict"] == "not network-limited"
    dropping = {"switch": "leaf1", "ports": [{"port": "swp1", "in_utilization": 0.2, "queue_drops_delta": 40}]}
    verdict = _bottleneck([dropping])
    assert verdict["verdict"] == "network-bound"
    assert verdict["reasons"] == ["leaf1 swp1 dropped frames"]
