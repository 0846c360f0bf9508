"""An embedded NATS server whose port another process took first: chosen again, or the reason at once."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvbench_core import embedded, procs
from kvbench_core.embedded import EmbeddedNats, EmbeddedNatsCluster, PortTakenError


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process listens on (what a racing process did between free_port and the server's bind)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", procs.free_port()))
        sock.listen()
        yield int(sock.getsockname()[1])


def _first(port: int) -> Callable[[str], int]:
    """free_port as it answers in a race: ``port`` first, then free ones."""
    picks = iter([port])

    def free_port(host: str = "127.0.0.1") -> int:
        return next(picks, None) or procs.free_port(host)

    return free_port


def test_a_server_whose_chosen_port_was_taken_meanwhile_listens_on_another(
    tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "free_port", _first(taken_port))
    server = EmbeddedNats(tmp_path / "nats").start()
    try:
        assert server.port != taken_port
        with socket.create_connection(("127.0.0.1", server.port), timeout=2):
            pass
        assert "address already in use" in (tmp_path / "nats" / "nats.log").read_text()  # the first try's
    finally:
        server.stop()


def test_a_server_given_a_taken_port_says_so(tmp_path: Path, taken_port: int) -> None:
    """A port the caller chose (a restart on the port clients know) is not changed: the server's own reason, raised
    as soon as it exits rather than after the wait for it to listen."""
    server = EmbeddedNats(tmp_path / "nats", port=taken_port)
    try:
        with pytest.raises(PortTakenError, match=f"127.0.0.1:{taken_port}.*address already in use"):
            server.start()
        assert server.pid is None
    finally:
        server.stop()  # nothing to stop, unless it started after all


def test_a_cluster_whose_chosen_port_was_taken_meanwhile_forms_on_others(
    tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "free_port", _first(taken_port))
    cluster = EmbeddedNatsCluster(tmp_path / "cluster", size=3).start()
    try:
        assert taken_port not in [server.port for server in cluster.servers]
        assert sorted(server.role() for server in cluster.servers) == ["follower", "follower", "leader"]
    finally:
        cluster.stop()
