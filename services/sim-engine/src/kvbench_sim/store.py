"""A shared KV store for simulated engines in server mode (the Mooncake/Valkey/shared-filesystem pools).

In batch mode engines of one cluster share one ``Tier`` object. Served engines are separate processes, so the
pool's index lives in a store process: it keeps the chunk hashes every engine has stored, evicts the least
recently used beyond its capacity, and tells every connected engine what was added and evicted. Each engine
keeps a mirror of that index for its lookups (as an engine asks the store's master before loading), and still
times its own loads and stores on its own link to the store; the store's aggregate bandwidth is not modelled.

Chunk hashes are Python hashes of the prompt's words: engines that share a store must hash alike, so the
launcher starts them with the same ``PYTHONHASHSEED``.

Protocol, JSON over one WebSocket per engine (``/ws``): engine -> store ``{"add": [h...]}`` (stores that
landed), ``{"touch": [h...]}`` (hits); store -> engine ``{"add": [...]}``, ``{"evict": [...]}`` (a new engine
first gets every stored hash).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kvbench_sim.records import TierRecords, keep_while_serving
from kvbench_sim.tiers import Tier

__all__ = ["SharedIndex", "StoreClient", "build_store", "main"]

log = logging.getLogger("kvbench_sim.store")


class SharedIndex:
    """The store's index: chunk hashes in least-recently-used order, bounded by a capacity in chunks."""

    def __init__(self, capacity_chunks: int) -> None:
        if capacity_chunks <= 0:
            raise ValueError("capacity_chunks: the store must hold at least one chunk")
        self.capacity = capacity_chunks
        self.chunks: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0
        self.changes = 0  # bumped on every change of the index or its order (what a records file follows)

    def add(self, hashes: Sequence[int]) -> tuple[list[int], list[int]]:
        """Store ``hashes``; returns (the new ones, the ones evicted to make room)."""
        added: list[int] = []
        evicted: list[int] = []
        for h in hashes:
            if h in self.chunks:
                self.chunks.move_to_end(h)
                continue
            while len(self.chunks) >= self.capacity:
                old, _ = self.chunks.popitem(last=False)
                evicted.append(old)
                self.evictions += 1
            self.chunks[h] = None
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
        self.changes += 1
        return len(self.chunks)


def build_store(index: SharedIndex) -> web.Application:
    registry = CollectorRegistry(auto_describe=True)
    stored = Gauge("kvbench_sim_store_chunks", "Chunks held", registry=registry)
    engines = Gauge("kvbench_sim_store_engines", "Engines connected", registry=registry)
    evictions = Counter("kvbench_sim_store_evictions", "Chunks evicted", registry=registry)
    peers: set[web.WebSocketResponse] = set()

    async def broadcast(message: dict[str, list[int]]) -> None:
        text = json.dumps(message)
        for peer in list(peers):
            with contextlib.suppress(ConnectionError, RuntimeError):
                await peer.send_str(text)

    async def ws(request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(heartbeat=10, max_msg_size=0)
        await socket.prepare(request)
        await socket.send_str(json.dumps({"add": list(index.chunks)}))
        peers.add(socket)
        try:
            async for message in socket:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue
                body: dict[str, Any] = json.loads(message.data)
                if body.get("touch"):
                    index.touch([int(h) for h in body["touch"]])
                if body.get("add"):
                    added, evicted = index.add([int(h) for h in body["add"]])
                    evictions.inc(len(evicted))
                    if evicted:
                        await broadcast({"evict": evicted})
                    if added:
                        await broadcast({"add": added})
        finally:
            peers.discard(socket)
        return socket

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(_: web.Request) -> web.Response:
        stored.set(len(index.chunks))
        engines.set(len(peers))
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.add_routes([web.get("/ws", ws), web.get("/health", health), web.get("/metrics", metrics)])
    return app


class StoreClient:
    """An engine's side: mirrors the store's index into its shared ``Tier`` and reports what it stores and hits.

    Until the store answers (it may start after the engine), the tier holds only what this engine stored."""

    def __init__(self, url: str, tier: Tier) -> None:
        self.url = url
        self.tier = tier
        self._outbox: asyncio.Queue[dict[str, list[int]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        tier.capacity_chunks = 1 << 62  # the store evicts, and says so
        tier.on_commit = lambda hashes: self._outbox.put_nowait({"add": list(hashes)})
        tier.on_touch = lambda hashes: self._outbox.put_nowait({"touch": list(hashes)})

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
                                    snapshot = False
                        finally:
                            sender.cancel()
                except (aiohttp.ClientError, OSError) as exc:
                    log.debug("shared store %s not reachable: %s", self.url, exc)
                self.connected.clear()
                await asyncio.sleep(0.5)

    async def _send(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        while True:
            message = await self._outbox.get()
            await socket.send_str(json.dumps(message))

    def _apply(self, body: dict[str, list[int]], snapshot: bool = False) -> None:
        if snapshot:
            self.tier.mirror(body.get("add") or [], exactly=True)
            return
        if body.get("evict"):
            self.tier.forget(body["evict"])
        if body.get("add"):
            self.tier.mirror(body["add"])


def add_parser(sub: Any) -> None:
    store = sub.add_parser("store", help="serve a shared KV store index for simulated engines")
    store.add_argument("--host", default="127.0.0.1")
    store.add_argument("--port", type=int, required=True)
    store.add_argument("--capacity-chunks", type=int, required=True)
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


def main(args: Any) -> None:
    index = SharedIndex(args.capacity_chunks)
    log.info("shared store: %d chunks", index.capacity)
    app = build_store(index)
    if args.records_dir:
        records = TierRecords(Path(args.records_dir), index, json.loads(args.records_signature))
        log.info("shared store: %d records found in %s", records.restore(), records.path)
        keep_while_serving(app, [records])
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None, shutdown_timeout=1.0)
