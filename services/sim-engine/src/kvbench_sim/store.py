"""A shared KV store for simulated engines in server mode (the Mooncake/Valkey/shared-filesystem pools).

In batch mode engines of one cluster share one ``Tier`` object. Served engines are separate processes, so the
pool's index lives in a store process: it keeps the chunk hashes every engine has stored, evicts the least
recently used beyond its capacity, and tells every connected engine what was added and evicted. Each engine
keeps a mirror of that index for its lookups (as an engine asks the store's master before loading).

The store also times every engine's loads and stores on the pool's one link (``--bandwidth-gbps``, processor
sharing, paced to the wall clock at ``--speed``), as batch mode's engines share one ``Tier``: two engines loading
at once each get half the store's bandwidth. An engine adds its own per-transfer latency once the store says a
flow is through; until a store that paces answers (or after it went away), an engine times flows itself.

Chunk hashes are Python hashes of the prompt's words: engines that share a store must hash alike, so the
launcher starts them with the same ``PYTHONHASHSEED``.

A store process may hold several tiers (a simulated LMCache server: its L1 in memory and its disk, shared by the
engines of its group); each has its own index and link, at ``/ws/TIER`` (the first also at ``/ws``). The index
remembers which engine stored each chunk, so an engine that loads it knows who computed what it reused.

Protocol, JSON over one WebSocket per engine and tier: engine -> store ``{"add": [h...], "owner": NAME}`` (stores
that landed, and the engine that made them), ``{"touch": [h...]}`` (hits), ``{"flow": [id, bytes]}`` (a transfer to
time); store -> engine ``{"add": [...], "owner": NAME}``, ``{"evict": [...]}``, ``{"through": [[id, monotonic
seconds], ...]}`` (flows that passed, and when: the processes share a host's monotonic clock). A new engine first
gets every stored hash with ``"owners": {NAME: [h...]}``, and ``"pacing": true`` when the store times flows.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kvbench_sim.background import run_while_serving
from kvbench_sim.records import TierRecords, keep_while_serving
from kvbench_sim.tiers import Link, Tier, Transfer

__all__ = ["FlowPacer", "PoolTier", "SharedIndex", "StoreClient", "StoreLink", "StoreTierPlan", "build_store", "main"]

log = logging.getLogger("kvbench_sim.store")


class SharedIndex:
    """The store's index: chunk hashes in least-recently-used order, bounded by a capacity in chunks."""

    def __init__(self, capacity_chunks: int) -> None:
        if capacity_chunks <= 0:
            raise ValueError("capacity_chunks: the store must hold at least one chunk")
        self.capacity = capacity_chunks
        self.chunks: OrderedDict[int, None] = OrderedDict()
        self.owners: dict[int, str] = {}  # the engine that stored each chunk (when it said)
        self.evictions = 0
        self.changes = 0  # bumped on every change of the index or its order (what a records file follows)

    def add(self, hashes: Sequence[int], owner: str = "") -> tuple[list[int], list[int]]:
        """Store ``hashes`` (made by ``owner``); returns (the new ones, the ones evicted to make room)."""
        added: list[int] = []
        evicted: list[int] = []
        for h in hashes:
            if h in self.chunks:
                self.chunks.move_to_end(h)
                continue
            while len(self.chunks) >= self.capacity:
                old, _ = self.chunks.popitem(last=False)
                self.owners.pop(old, None)
                evicted.append(old)
                self.evictions += 1
            self.chunks[h] = None
            if owner:
                self.owners[h] = owner
            added.append(h)
        self.changes += 1
        # a hash added and evicted within one call (more new chunks than the capacity) is neither
        added_here = set(added)
        return [h for h in added if h in self.chunks], [h for h in evicted if h not in added_here]

    def touch(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            if h in self.chunks:
                self.chunks.move_to_end(h)
        self.changes += 1

    def index(self) -> list[int]:
        return list(self.chunks)

    def restore(self, hashes: Sequence[int]) -> int:
        """Hold ``hashes`` (least recently used first; the most recent ones when they exceed the capacity)."""
        self.chunks = OrderedDict.fromkeys(list(hashes)[-self.capacity :])
        self.owners.clear()  # records files keep the hashes only
        self.changes += 1
        return len(self.chunks)

    def by_owner(self) -> dict[str, list[int]]:
        """The chunks held, by the engine that stored them (those of no known engine left out)."""
        out: dict[str, list[int]] = {}
        for h in self.chunks:
            owner = self.owners.get(h)
            if owner:
                out.setdefault(owner, []).append(h)
        return out


class FlowPacer:
    """The pool's one link: every engine's flows share its bandwidth, in virtual time paced to the wall clock."""

    def __init__(self, bytes_per_s: float, speed: float = 1.0) -> None:
        if bytes_per_s <= 0 or speed <= 0:
            raise ValueError("bandwidth and speed must be positive")
        self.link = Link("store", bytes_per_s)
        self.speed = speed
        self._t0 = time.monotonic()
        self._wake = asyncio.Event()

    def now_s(self) -> float:
        return (time.monotonic() - self._t0) * self.speed

    def start(self, owner: object, flow: int, size: float) -> None:
        self.link.start(self.now_s(), Transfer((owner, flow), size, 0.0))
        self._wake.set()

    def drop(self, owner: object) -> None:
        """An engine went away: its flows stop taking bandwidth."""
        self.link.flows = [f for f in self.link.flows if not (isinstance(f.key, tuple) and f.key[0] is owner)]
        self._wake.set()

    @property
    def in_flight(self) -> int:
        return len(self.link.flows)

    async def run(self, through: Callable[[object, list[list[float]]], object]) -> None:
        """Tell each flow's owner when it is through: ``through(owner, [[flow, monotonic time], ...])``."""
        while True:
            now = self.now_s()
            done: dict[int, tuple[object, list[list[float]]]] = {}
            for transfer in self.link.landed(now):
                assert isinstance(transfer.key, tuple)
                assert transfer.finished_at is not None
                owner, flow = transfer.key
                at = self._t0 + transfer.finished_at / self.speed
                done.setdefault(id(owner), (owner, []))[1].append([flow, at])
            for owner, flows in done.values():
                through(owner, flows)
            upcoming = self.link.next_done_s(now)
            self._wake.clear()
            timeout = None if upcoming is None else max(0.0, (upcoming - now) / self.speed)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)


@dataclass
class PoolTier:
    """One tier a store process holds: its index and, when the store times flows, its link."""

    index: SharedIndex
    pacer: FlowPacer | None = None  # None: each engine times its own flows


def build_store(tiers: Mapping[str, PoolTier]) -> web.Application:
    """A store of ``tiers`` (name -> tier), each at ``/ws/NAME``; the first also at ``/ws``."""
    if not tiers:
        raise ValueError("tiers: a store holds at least one tier")
    registry = CollectorRegistry(auto_describe=True)
    stored = Gauge("kvbench_sim_store_chunks", "Chunks held", ["tier"], registry=registry)
    engines = Gauge("kvbench_sim_store_engines", "Engines connected", ["tier"], registry=registry)
    evictions = Counter("kvbench_sim_store_evictions", "Chunks evicted", ["tier"], registry=registry)
    moved = Counter("kvbench_sim_store_bytes", "Bytes of engines' loads and stores timed on the store's link",
                    ["tier"], registry=registry)  # fmt: skip
    flows = Gauge("kvbench_sim_store_flows", "Engines' transfers in flight on the store's link", ["tier"],
                  registry=registry)  # fmt: skip
    peers: dict[str, set[web.WebSocketResponse]] = {name: set() for name in tiers}
    outboxes: dict[web.WebSocketResponse, asyncio.Queue[str]] = {}

    def through(owner: object, done: list[list[float]]) -> None:
        outbox = outboxes.get(owner) if isinstance(owner, web.WebSocketResponse) else None
        if outbox is not None:
            outbox.put_nowait(json.dumps({"through": done}))

    async def broadcast(name: str, message: dict[str, Any]) -> None:
        text = json.dumps(message)
        for peer in list(peers[name]):
            with contextlib.suppress(ConnectionError, RuntimeError):
                await peer.send_str(text)

    async def send_through(socket: web.WebSocketResponse, outbox: asyncio.Queue[str]) -> None:
        while True:
            text = await outbox.get()
            with contextlib.suppress(ConnectionError, RuntimeError):
                await socket.send_str(text)

    async def serve(name: str, request: web.Request) -> web.WebSocketResponse:
        tier = tiers[name]
        index, pacer = tier.index, tier.pacer
        socket = web.WebSocketResponse(heartbeat=10, max_msg_size=0)
        await socket.prepare(request)
        await socket.send_str(
            json.dumps({"add": list(index.chunks), "owners": index.by_owner(), "pacing": pacer is not None})
        )
        peers[name].add(socket)
        outboxes[socket] = asyncio.Queue()
        sender = asyncio.create_task(send_through(socket, outboxes[socket]))
        try:
            async for message in socket:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue
                body: dict[str, Any] = json.loads(message.data)
                if body.get("flow") and pacer is not None:
                    flow, size = body["flow"]
                    pacer.start(socket, int(flow), float(size))
                    moved.labels(name).inc(float(size))
                if body.get("touch"):
                    index.touch([int(h) for h in body["touch"]])
                if body.get("add"):
                    owner = str(body.get("owner") or "")
                    added, evicted = index.add([int(h) for h in body["add"]], owner)
                    evictions.labels(name).inc(len(evicted))
                    if evicted:
                        await broadcast(name, {"evict": evicted})
                    if added:
                        await broadcast(name, {"add": added, "owner": owner})
        finally:
            peers[name].discard(socket)
            outboxes.pop(socket, None)
            sender.cancel()
            if pacer is not None:
                pacer.drop(socket)
        return socket

    async def ws(request: web.Request) -> web.WebSocketResponse:
        name = request.match_info.get("tier") or next(iter(tiers))
        if name not in tiers:
            raise web.HTTPNotFound(text=f"no tier {name!r} here; this store holds {', '.join(tiers)}")
        return await serve(name, request)

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(_: web.Request) -> web.Response:
        for name, tier in tiers.items():
            stored.labels(name).set(len(tier.index.chunks))
            engines.labels(name).set(len(peers[name]))
            flows.labels(name).set(tier.pacer.in_flight if tier.pacer is not None else 0)
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def close_peers(_: web.Application) -> None:
        # engines hear the store is going at once (and time their flows themselves), not at the next heartbeat
        for peer in [p for group in peers.values() for p in group]:
            await peer.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"store stopping")

    app = web.Application()
    app.add_routes([web.get("/ws", ws), web.get("/ws/{tier}", ws), web.get("/health", health),
                    web.get("/metrics", metrics)])  # fmt: skip
    app.on_shutdown.append(close_peers)
    for name, tier in tiers.items():
        if tier.pacer is not None:
            run_while_serving(app, f"sim-store-pacer-{name}", functools.partial(tier.pacer.run, through))
    return app


class StoreLink(Link):
    """A shared tier's link in server mode: flows are timed by the store on the pool's one link while a pacing store
    is connected (``remote``), here at the same bandwidth otherwise; this engine adds each transfer's latency."""

    def __init__(self, name: str, bytes_per_s: float, virtual_at: Callable[[float], float],
                 send: Callable[[int, float], None], wake: Callable[[], None]) -> None:  # fmt: skip
        super().__init__(name, bytes_per_s)
        self._virtual_at = virtual_at  # a monotonic time -> this engine's virtual time
        self._send = send
        self._wake = wake
        self._ids = itertools.count()
        self._remote: dict[int, Transfer] = {}  # flows the store is timing
        self._through: list[Transfer] = []  # flows the store said are through, waiting out their latency
        self.remote = False

    def start(self, now_s: float, transfer: Transfer) -> None:
        if not self.remote or transfer.remaining_bytes <= 0:
            super().start(now_s, transfer)
            return
        flow = next(self._ids)
        self.bytes_moved += transfer.remaining_bytes
        self._remote[flow] = transfer
        self._send(flow, transfer.remaining_bytes)

    def through(self, flows: Sequence[Sequence[float]]) -> None:
        """The store says these flows passed, at these monotonic times."""
        for flow, at in flows:
            transfer = self._remote.pop(int(flow), None)
            if transfer is not None:
                transfer.remaining_bytes = 0.0
                transfer.finished_at = self._virtual_at(at)
                self._through.append(transfer)
        self._wake()

    def fall_back(self, now_s: float) -> None:
        """The store went away: the flows it was timing go on here, whole (how much had moved is not known)."""
        self.remote = False
        for transfer in self._remote.values():
            self.bytes_moved -= transfer.remaining_bytes  # counted when it started
            super().start(now_s, transfer)
        self._remote.clear()
        self._wake()

    def next_done_s(self, now_s: float) -> float | None:
        best = super().next_done_s(now_s)
        for transfer in self._through:
            assert transfer.finished_at is not None
            at = transfer.finished_at + transfer.latency_s
            best = at if best is None else min(best, at)
        return best

    def landed(self, now_s: float) -> list[Transfer]:
        done = super().landed(now_s)
        if self._through:
            ready = [t for t in self._through if (t.finished_at or 0.0) + t.latency_s <= now_s + 1e-12]
            if ready:
                self._through = [t for t in self._through if t not in ready]
                done = [*done, *ready]
        return done


class StoreClient:
    """An engine's side: mirrors the store's index into its shared ``Tier`` and reports what it stores and hits;
    with ``virtual_at`` (a monotonic time -> the engine's virtual time) and ``wake`` (rouse the engine's pacer),
    the tier's transfers are timed by a store that paces them.

    Until the store answers (it may start after the engine), the tier holds only what this engine stored."""

    def __init__(self, url: str, tier: Tier, virtual_at: Callable[[float], float] | None = None,
                 wake: Callable[[], None] | None = None, owner: str = "") -> None:  # fmt: skip
        self.url = url
        self.tier = tier
        self._outbox: asyncio.Queue[dict[str, list[int] | list[float] | str]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        # the store's index has arrived once: an engine serves only then (a restarted engine knows what the pool holds)
        self.synced = asyncio.Event()
        # the first attempt has ended, with the index or with no store there: a store that starts after its engines
        # (another machine's) does not hold them back; one that answers is waited for until its index is in
        self.settled = asyncio.Event()
        tier.capacity_chunks = 1 << 62  # the store evicts, and says so
        # ``owner``: this engine's name, kept with what it stores (who computed what another engine reuses)
        tier.on_commit = lambda hashes: self._outbox.put_nowait({"add": list(hashes), "owner": owner})
        tier.on_touch = lambda hashes: self._outbox.put_nowait({"touch": list(hashes)})
        self.link: StoreLink | None = None
        if virtual_at is not None:
            self._virtual_at = virtual_at
            self.link = StoreLink(
                tier.link.name,
                tier.link.bytes_per_s,
                virtual_at,
                lambda flow, size: self._outbox.put_nowait({"flow": [flow, size]}),
                wake or (lambda: None),
            )
            tier.link = self.link

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sim-store-client")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                try:
                    async with http.ws_connect(self.url, heartbeat=10, max_msg_size=0) as socket:
                        self.connected.set()
                        log.info("connected to the shared store %s", self.url)
                        sender = asyncio.create_task(self._send(socket))
                        snapshot = True  # the store's first message is its whole index
                        try:
                            async for message in socket:
                                if message.type == aiohttp.WSMsgType.TEXT:
                                    self._apply(json.loads(message.data), snapshot)
                                    if snapshot:
                                        self.synced.set()
                                        self.settled.set()
                                    snapshot = False
                        finally:
                            sender.cancel()
                except (aiohttp.ClientError, OSError) as exc:
                    log.debug("shared store %s not reachable: %s", self.url, exc)
                    self.settled.set()
                self.connected.clear()
                if self.link is not None and self.link.remote:
                    self.link.fall_back(self._virtual_at(time.monotonic()))
                await asyncio.sleep(0.5)

    async def _send(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        while True:
            message = await self._outbox.get()
            await socket.send_str(json.dumps(message))

    def _apply(self, body: dict[str, Any], snapshot: bool = False) -> None:
        if snapshot:
            self.tier.mirror(body.get("add") or [], exactly=True)
            for owner, hashes in (body.get("owners") or {}).items():
                self.tier.own(hashes, str(owner))
            if self.link is not None and body.get("pacing"):
                self.link.remote = True
            return
        if body.get("through") and self.link is not None:
            self.link.through(body["through"])
        if body.get("evict"):
            self.tier.forget(body["evict"])
        if body.get("add"):
            self.tier.mirror(body["add"])
            if body.get("owner"):
                self.tier.own(body["add"], str(body["owner"]))


def add_parser(sub: Any) -> None:
    store = sub.add_parser("store", help="serve a shared KV store index for simulated engines")
    store.add_argument("--host", default="127.0.0.1")
    store.add_argument("--port", type=int, default=None, help="required unless --spec gives it")
    store.add_argument("--capacity-chunks", type=int, default=None, help="required unless --spec gives it")
    store.add_argument(
        "--bandwidth-gbps",
        type=float,
        default=None,
        help="GB/s of the pool's link: time every engine's loads and stores on it (default: each engine times its own)",
    )
    store.add_argument(
        "--speed", type=float, default=1.0, help="virtual seconds per wall-clock second (as the engines)"
    )
    store.add_argument(
        "--records-dir",
        default=None,
        help="a file-backed pool (a shared filesystem): keep the index here, so a restarted store finds it",
    )
    store.add_argument(
        "--records-signature",
        default="{}",
        help="JSON: what must agree for kept records to be used (tier, model, chunk tokens and bytes)",
    )
    store.add_argument(
        "--spec",
        type=Path,
        default=None,
        help="a SimStoreSpec JSON file (what the node agent writes): the store derives its capacity, link and "
        "records from the stack's shared tier",
    )


@dataclass(frozen=True)
class StoreTierPlan:
    """What a store process holds for one tier: its capacity, its link (None: each engine times its own flows) and,
    for a file-backed tier, where its records are kept and what must agree for them to be used."""

    name: str
    capacity_chunks: int
    bandwidth_gbps: float | None = None
    records_dir: str | None = None
    records_signature: Mapping[str, object] | None = None


def main(args: Any) -> None:
    plans: list[StoreTierPlan] = getattr(args, "tier_plans", None) or []
    if not plans:  # one tier from the flags: a pool's shared store
        signature = json.loads(args.records_signature)
        plans = [StoreTierPlan("shared", args.capacity_chunks, args.bandwidth_gbps, args.records_dir, signature)]
    tiers: dict[str, PoolTier] = {}
    kept: list[TierRecords] = []
    for plan in plans:
        index = SharedIndex(plan.capacity_chunks)
        pacer = FlowPacer(plan.bandwidth_gbps * 1e9, args.speed) if plan.bandwidth_gbps else None
        label = "shared store" if plan.name == "shared" else f"shared store {plan.name}"
        link = f"{plan.bandwidth_gbps:g} GB/s shared by every engine" if pacer else "timed by each engine"
        log.info("%s: %d chunks; link %s", label, index.capacity, link)
        if plan.records_dir:
            records = TierRecords(Path(plan.records_dir), index, plan.records_signature or {})
            log.info("%s: %d records found in %s", label, records.restore(), records.path)
            kept.append(records)
        tiers[plan.name] = PoolTier(index, pacer)
    app = build_store(tiers)
    if kept:
        keep_while_serving(app, kept)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None, shutdown_timeout=1.0)
