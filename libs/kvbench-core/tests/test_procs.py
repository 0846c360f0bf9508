"""Ports chosen for child processes: outside the range the kernel hands out for port 0, and never one in use."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

import pytest

from kvbench_core import procs


def _ephemeral_from() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


@pytest.mark.skipif(not Path("/proc/sys/net/ipv4/ip_local_port_range").exists(), reason="Linux only")
def test_a_chosen_port_is_below_the_kernels_ephemeral_range_and_free() -> None:
    start = _ephemeral_from()
    ports = [procs.free_port() for _ in range(30)]
    if start - 20000 >= 1000:
        assert all(20000 <= p < start for p in ports), ports
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free: it binds
    # what binds port 0 (an ops server) gets the kernel's pick, from its range: never one of ours
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        assert sock.getsockname()[1] >= start


@pytest.mark.skipif(not Path("/proc/sys/net/ipv4/ip_local_port_range").exists(), reason="Linux only")
def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        unused = probe.getsockname()[1]
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        picks = iter([taken, taken, unused])
        monkeypatch.setattr("kvbench_core.procs.random.randrange", lambda low, high: next(picks))
        assert procs.free_port() == unused


def test_with_no_room_below_the_range_the_kernel_picks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    narrow = tmp_path / "range"
    narrow.write_text("20100\t60999\n")
    monkeypatch.setattr(procs, "_EPHEMERAL_RANGE", narrow)
    monkeypatch.setattr("kvbench_core.procs.random.randrange", lambda low, high: pytest.fail("no room: not drawn"))
    port = procs.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    monkeypatch.setattr(procs, "_EPHEMERAL_RANGE", tmp_path / "missing")
    assert procs.free_port() > 0  # no /proc: the kernel's pick


def test_ports_a_simulated_pool_agrees_on_are_never_chosen_for_a_child() -> None:
    """A simulated pool's shared store and split engines listen on ports each agent works out from the run; a port
    chosen for another process (a test's planner, a NATS server) must never be one of them, or the store's health
    check is answered by that process (a launcher test once read another process's port as its store)."""
    last_agreed = procs.AGREED_PORTS_FROM + procs.AGREED_PORTS_SPAN + 1000  # the store, then its engines after it
    assert last_agreed <= procs.CHOSEN_PORTS_FROM


@pytest.mark.skipif(not Path("/proc/sys/net/ipv4/ip_local_port_range").exists(), reason="Linux only")
def test_a_port_handed_out_is_not_handed_out_again_before_its_process_binds_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Parallel tests chose ports a second or more before their processes bound them, and twice met on one: a port
    handed out stays claimed (by any process's free_port on the machine) until long after it was chosen."""
    monkeypatch.setattr(procs, "_CLAIMS", tmp_path / "claims")
    first = procs.free_port()
    picks = iter([first, first + 1])  # the same port again, as a racing process's random pick would be
    monkeypatch.setattr(random, "randrange", lambda *_: next(picks))
    second = procs.free_port()
    assert second == first + 1  # free (nothing bound it), but claimed: skipped
    # a claim older than CLAIM_S is given up: its process bound the port long ago, or never will
    claim = tmp_path / "claims" / str(second)
    old = claim.stat().st_mtime - procs.CLAIM_S - 1
    os.utime(claim, (old, old))
    monkeypatch.setattr(random, "randrange", lambda *_: second)
    assert procs.free_port() == second
