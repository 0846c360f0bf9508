"""The shared store of served simulated engines: its index and what it tells connected engines."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from kvbench_sim.profiles import TierConfig
from kvbench_sim.store import PoolTier, SharedIndex, StoreClient, build_store
from kvbench_sim.tiers import Tier


def test_the_index_evicts_least_recently_used_and_reports_the_net_change() -> None:
    index = SharedIndex(3)
    assert index.add([1, 2, 3]) == ([1, 2, 3], [])
    index.touch([1])  # 2 is now the oldest
    assert index.add([4]) == ([4], [2])
    assert index.add([5, 6, 7, 8]) == ([6, 7, 8], [3, 1, 4])  # 5 came and went in the same call: neither
    assert list(index.chunks) == [6, 7, 8]
    with pytest.raises(ValueError, match="capacity_chunks"):
        SharedIndex(0)


def test_the_index_keeps_who_stored_each_chunk_until_it_is_evicted() -> None:
    index = SharedIndex(3)
    index.add([1, 2], "a")
    index.add([2, 3], "b")  # 2 was a's: the first engine to store a chunk computed it
    assert index.by_owner() == {"a": [1, 2], "b": [3]}
    index.add([4], "b")  # 1 goes, and with it who made it
    assert index.by_owner() == {"a": [2], "b": [3, 4]}


def _tier() -> Tier:
    return Tier(TierConfig(name="shared", capacity_gb=1, bw_gbps=10, lat_ms=1, store_id="s"), 256, 1000.0, 0.0)


async def _until(condition: object, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition() and loop.time() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.02)


async def test_what_one_engine_stores_reaches_the_others_and_evictions_too() -> None:
    server = TestServer(build_store({"shared": PoolTier(SharedIndex(4))}))
    await server.start_server()
    url = str(server.make_url("/ws"))
    a, b = _tier(), _tier()
    clients = [StoreClient(url, a), StoreClient(url, b)]
    for client in clients:
        client.start()
    try:
        await asyncio.gather(*(c.connected.wait() for c in clients))
        a.commit([11, 12, 13])  # engine A's stores landed
        await _until(lambda: b.longest_prefix([11, 12, 13]) == 3)
        assert b.longest_prefix([11, 12, 13]) == 3
        b.commit([14, 15])  # B stores two more: the store holds 4, so the oldest (11) goes everywhere
        await _until(lambda: a.longest_prefix([11]) == 0 and a.longest_prefix([14, 15]) == 2)
        assert a.longest_prefix([11, 12]) == 0
        assert a.longest_prefix([14, 15]) == 2
        assert b.longest_prefix([12, 13]) == 2
        late = _tier()  # an engine that connects later gets the whole index
        clients.append(StoreClient(url, late))
        clients[-1].start()
        await _until(lambda: late.chunks == 4)
        assert late.chunks == 4
    finally:
        for client in clients:
            await client.stop()
        await server.close()


async def test_an_engine_that_reconnects_forgets_what_was_evicted_while_it_was_away() -> None:
    server = TestServer(build_store({"shared": PoolTier(SharedIndex(2))}))
    await server.start_server()
    url = str(server.make_url("/ws"))
    a, b = _tier(), _tier()
    first, second = StoreClient(url, a), StoreClient(url, b)
    first.start()
    second.start()
    try:
        await asyncio.gather(first.connected.wait(), second.connected.wait())
        a.commit([1, 2])
        await _until(lambda: b.longest_prefix([1, 2]) == 2)
        await second.stop()  # B is away while the store evicts 1 and 2 for A's next chunks
        a.commit([3, 4])
        await _until(lambda: a.longest_prefix([1]) == 0 and a.chunks == 2)
        assert b.longest_prefix([1, 2]) == 2  # B's mirror is stale ...
        again = StoreClient(url, b)
        again.start()
        await _until(lambda: b.longest_prefix([1]) == 0 and b.longest_prefix([3, 4]) == 2)
        assert b.longest_prefix([1]) == 0  # ... until it reconnects and takes the store's index as it is
        assert b.longest_prefix([3, 4]) == 2
        await again.stop()
    finally:
        await first.stop()
        await server.close()


async def _through_after(link: object, started: float, timeout_s: float = 5.0) -> float:
    """Virtual seconds from ``started`` until the store said the link's flow was through."""
    from kvbench_sim.store import StoreLink  # noqa: PLC0415

    assert isinstance(link, StoreLink)
    await _until(lambda: bool(link._through), timeout_s)
    assert link._through, "the store never said the flow was through"
    finished = link._through[0].finished_at
    assert finished is not None
    return finished - started


async def test_the_store_shares_its_bandwidth_between_engines_flows() -> None:
    """1 GB/s for the pool: a 102.4 MB load alone takes 0.1 s; two engines loading at once take 0.2 s each, as
    batch mode's engines sharing one tier do."""
    import time  # noqa: PLC0415

    from kvbench_sim.store import FlowPacer  # noqa: PLC0415

    server = TestServer(build_store({"shared": PoolTier(SharedIndex(1000), FlowPacer(1e9))}))
    await server.start_server()
    url = str(server.make_url("/ws"))
    t0 = time.monotonic()
    tiers = [_tier(), _tier()]
    clients = [StoreClient(url, t, virtual_at=lambda at: at - t0) for t in tiers]
    for client in clients:
        client.start()
    try:
        await asyncio.gather(*(c.connected.wait() for c in clients))
        await _until(lambda: all(c.link is not None and c.link.remote for c in clients))
        alone = time.monotonic() - t0
        tiers[0].load(alone, range(400), "load", None)  # 400 chunks of 256 kB
        assert await _through_after(clients[0].link, alone) == pytest.approx(0.1024, abs=0.01)
        clients[0].link._through.clear()  # type: ignore[union-attr]
        together = time.monotonic() - t0
        for tier in tiers:
            tier.load(together, range(400), "load", None)
        for client in clients:
            assert await _through_after(client.link, together) == pytest.approx(0.2048, abs=0.015)
        async with aiohttp.ClientSession() as http, http.get(str(server.make_url("/metrics"))) as response:
            metrics = await response.text()
        assert 'kvbench_sim_store_bytes_total{tier="shared"} 3.072e+08' in metrics
    finally:
        for client in clients:
            await client.stop()
        await server.close()


async def test_flows_in_flight_when_the_store_goes_away_land_on_the_engines_own_link() -> None:
    import time  # noqa: PLC0415

    from kvbench_sim.store import FlowPacer  # noqa: PLC0415

    server = TestServer(
        build_store({"shared": PoolTier(SharedIndex(1000), FlowPacer(1e6))})
    )  # 1 MB/s: the flow outlasts the store
    await server.start_server()
    t0 = time.monotonic()
    tier = _tier()
    client = StoreClient(str(server.make_url("/ws")), tier, virtual_at=lambda at: at - t0)
    client.start()
    try:
        await client.connected.wait()
        await _until(lambda: client.link is not None and client.link.remote)
        (transfer,) = tier.load(time.monotonic() - t0, range(4), "load", None)  # 1 MB: a second through the store
        await server.close()
        await _until(lambda: client.link is not None and not client.link.remote)
        assert client.link is not None
        assert not client.link.remote
        now = time.monotonic() - t0
        assert transfer in client.link.flows  # timed here now, at the tier's own 10 GB/s
        assert client.link.landed(now + 0.01) == [transfer]
    finally:
        await client.stop()


async def test_a_store_of_several_tiers_keeps_them_apart_and_says_who_computed_what() -> None:
    """A simulated LMCache server shared by two engines: its L1 and its disk are two tiers, each at its own path; an
    engine that connects later learns who stored each chunk, and an engine loading another's chunks can say whose."""
    app = build_store({"host": PoolTier(SharedIndex(8)), "disk": PoolTier(SharedIndex(8))})
    server = TestServer(app)
    await server.start_server()
    a_host, a_disk, b_host = _tier(), _tier(), _tier()
    clients = [
        StoreClient(str(server.make_url("/ws/host")), a_host, owner="a"),
        StoreClient(str(server.make_url("/ws/disk")), a_disk, owner="a"),
        StoreClient(str(server.make_url("/ws/host")), b_host, owner="b"),
    ]
    for client in clients:
        client.start()
    try:
        await asyncio.gather(*(c.connected.wait() for c in clients))
        a_host.commit([1, 2, 3])
        a_disk.commit([9])
        await _until(lambda: b_host.longest_prefix([1, 2, 3]) == 3)
        assert b_host.longest_prefix([9]) == 0  # the disk tier is another index
        assert b_host.owners([1, 2, 3], "b") == {"a": 3}
        assert a_host.owners([1, 2, 3], "a") == {}  # its own chunks are no one else's
        late = _tier()
        clients.append(StoreClient(str(server.make_url("/ws/host")), late, owner="c"))
        clients[-1].start()
        await _until(lambda: late.chunks == 3)
        assert late.owners([1, 2, 3], "c") == {"a": 3}
        async with aiohttp.ClientSession() as http:
            async with http.get(str(server.make_url("/ws/nvme"))) as response:
                assert response.status == 404
                assert "host, disk" in await response.text()
            async with http.get(str(server.make_url("/metrics"))) as response:
                metrics = await response.text()
        assert 'kvbench_sim_store_chunks{tier="host"} 3.0' in metrics
        assert 'kvbench_sim_store_chunks{tier="disk"} 1.0' in metrics
    finally:
        for client in clients:
            await client.stop()
        await server.close()
