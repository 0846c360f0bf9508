"""The router of simulated stacks: one OpenAI endpoint in front of several simulated engines.

Policies (PLAN.md ``measurement.routing``), the same choices as batch mode's ``Cluster.pick``:
- ``round_robin``: engines in turn;
- ``session_affinity``: a conversation stays on one engine (the body's OpenAI ``user`` field, else the
  ``X-Session-Id`` header, else the prompt's start);
- ``prefix_aware``: equal prompt starts (first 256 words) go to the same engine;
- ``pd_aware``: the decode engine with the fewest requests in flight through this router.

With prefill engines (P/D split, like vllm-router with NIXL): the request first goes to a prefill engine (in turn)
with ``max_tokens`` 1 and ``kv_transfer_params.do_remote_decode``; its answer's ``kv_transfer_params`` go with the
original request to the chosen decode engine, whose stream is passed through unchanged.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import itertools
import json
import logging
import sys
from collections import Counter as Tally
from pathlib import Path
from typing import Any, get_args

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from kvbench_contracts.sim import SimRoutingPolicy
from kvbench_sim.text import chat_to_prompt, tokenize

__all__ = ["POLICIES", "Backends", "build_router", "main"]

log = logging.getLogger("kvbench_sim.router")

# the contract names the policies, so the node agent can check a plan's routing without importing the router
POLICIES: tuple[str, ...] = get_args(SimRoutingPolicy)
_PREFIX_WORDS = 256


def _stable(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class Backends:
    """Which engine serves a request: pure choice, no I/O (tested without servers)."""

    def __init__(self, engines: list[str], prefill: list[str], policy: str) -> None:
        if policy not in POLICIES:
            raise ValueError(f"routing policy {policy!r}: choose one of {', '.join(POLICIES)}")
        if not engines:
            raise ValueError("the router needs at least one (decode) engine")
        self.engines = engines
        self.prefill = prefill
        self.policy = policy
        self.in_flight: Tally[str] = Tally()
        self._turn = itertools.cycle(range(len(engines)))
        self._prefill_turn = itertools.cycle(range(len(prefill) or 1))

    def pick(self, session_key: str | None, prompt_head: str) -> str:
        n = len(self.engines)
        if n == 1:
            return self.engines[0]
        if self.policy == "session_affinity":
            return self.engines[_stable(session_key or prompt_head) % n]
        if self.policy == "prefix_aware":
            return self.engines[_stable(prompt_head) % n]
        if self.policy == "pd_aware":
            return min(self.engines, key=lambda url: self.in_flight[url])
        return self.engines[next(self._turn)]

    def pick_prefill(self) -> str:
        return self.prefill[next(self._prefill_turn)]


def _prompt_head(body: dict[str, Any], chat: bool) -> str:
    if chat:
        messages = body.get("messages")
        text = chat_to_prompt(messages) if isinstance(messages, list) else ""
    else:
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return " ".join(tokenize(text)[:_PREFIX_WORDS])


def build_router(backends: Backends) -> web.Application:
    registry = CollectorRegistry(auto_describe=True)
    routed = Counter(
        "kvbench_sim_router_requests", "Requests sent to each engine", ["engine", "role"], registry=registry
    )
    failed = Counter(
        "kvbench_sim_router_upstream_errors", "Requests an engine failed", ["engine", "role"], registry=registry
    )
    in_flight = Gauge("kvbench_sim_router_in_flight_requests", "Requests in flight", ["engine"], registry=registry)
    state: dict[str, aiohttp.ClientSession] = {}

    async def on_startup(_: web.Application) -> None:
        state["http"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
        )

    async def on_cleanup(_: web.Application) -> None:
        await state["http"].close()

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(_: web.Request) -> web.Response:
        async with state["http"].get(backends.engines[0] + "/v1/models") as upstream:
            return web.Response(body=await upstream.read(), status=upstream.status, content_type="application/json")

    async def metrics(_: web.Request) -> web.Response:
        for url in backends.engines:
            in_flight.labels(url).set(backends.in_flight[url])
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def prefill(http: aiohttp.ClientSession, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        """The prompt on a prefill engine; returns its kv_transfer_params, or an error response."""
        url = backends.pick_prefill()
        ask = copy.copy(body)
        ask.update(stream=False, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        ask.pop("max_completion_tokens", None)
        ask.pop("stream_options", None)
        routed.labels(url, "prefill").inc()
        async with http.post(url + path, json=ask, headers=headers) as upstream:
            payload = await upstream.read()
            if upstream.status != 200:
                failed.labels(url, "prefill").inc()
                return web.Response(body=payload, status=upstream.status, content_type="application/json")
            params = json.loads(payload).get("kv_transfer_params")
        if not isinstance(params, dict):
            failed.labels(url, "prefill").inc()
            return web.json_response({"error": f"prefill engine {url} returned no kv_transfer_params"}, status=502)
        return params

    async def forward(request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": "body: invalid JSON"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": "body: a JSON object is required"}, status=400)
        path = request.path
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("x-request-id", "authorization")}
        session = body.get("user") if isinstance(body.get("user"), str) else request.headers.get("X-Session-Id")
        head = _prompt_head(body, chat)
        http = state["http"]
        if backends.prefill:
            try:
                params = await prefill(http, path, body, headers)
            except aiohttp.ClientError as exc:
                return web.json_response({"error": f"prefill engine: {exc}"}, status=502)
            if isinstance(params, web.Response):
                return params
            body = {**body, "kv_transfer_params": params}
        url = backends.pick(session, head)
        role = "decode" if backends.prefill else "engine"
        routed.labels(url, role).inc()
        backends.in_flight[url] += 1
        response: web.StreamResponse | None = None
        try:
            async with http.post(url + path, json=body, headers=headers) as upstream:
                if upstream.status != 200:
                    failed.labels(url, role).inc()
                response = web.StreamResponse(
                    status=upstream.status,
                    headers={"Content-Type": upstream.headers.get("Content-Type", "application/json")},
                )
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientError as exc:
            failed.labels(url, role).inc()
            if response is not None:
                return response  # cut mid-stream: the client sees the stream end early, as from the engine
            return web.json_response({"error": f"engine {url}: {exc}"}, status=502)
        finally:
            backends.in_flight[url] -= 1

    async def completions(request: web.Request) -> web.StreamResponse:
        return await forward(request, chat=False)

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        return await forward(request, chat=True)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes(
        [
            web.get("/health", health),
            web.get("/v1/models", models),
            web.get("/metrics", metrics),
            web.post("/v1/completions", completions),
            web.post("/v1/chat/completions", chat_completions),
        ]
    )
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def add_parser(sub: Any) -> None:
    route = sub.add_parser("route", help="serve a router in front of simulated engines")
    route.add_argument("--host", default="127.0.0.1")
    route.add_argument("--port", type=int, default=None, help="required unless --spec gives it")
    route.add_argument("--policy", choices=POLICIES, default="round_robin")
    route.add_argument("--engine", action="append", default=[], help="base URL of a (decode) engine; repeat")
    route.add_argument("--prefill", action="append", default=[], help="base URL of a prefill engine; repeat")
    route.add_argument("--spec", type=Path, default=None, help="a SimRouterSpec JSON file (what the node agent writes)")


def main(args: argparse.Namespace) -> None:
    try:
        backends = Backends([u.rstrip("/") for u in args.engine], [u.rstrip("/") for u in args.prefill], args.policy)
    except ValueError as exc:
        sys.stderr.write(f"kvbench-sim route: {exc}\n")
        raise SystemExit(2) from None
    log.info(
        "routing %s over %d engine(s)%s",
        args.policy,
        len(backends.engines),
        f" after {len(backends.prefill)} prefill engine(s)" if backends.prefill else "",
    )
    web.run_app(
        build_router(backends), host=args.host, port=args.port, print=None, access_log=None, shutdown_timeout=1.0
    )
