"""The acceptance test's reset phase: each engine asked to empty its local prefix cache, its answer kept."""

from __future__ import annotations

from aiohttp import web

from kvbench_contracts.events import EngineEndpoint
from kvbench_core.procs import free_port
from kvbench_loadgen.reset import reset_note, reset_prefix_caches


async def test_each_engine_is_asked_and_a_router_is_skipped() -> None:
    asked: list[str] = []

    async def reset(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/reset_prefix_cache", reset)  # the second "engine" has no such route: 404
    runner = web.AppRunner(app)
    await runner.setup()
    port, dead = free_port(), free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    base = f"http://127.0.0.1:{port}"
    endpoints = [
        EngineEndpoint(node_id="n", engine_id="e0", base_url=base, metrics_url=base + "/metrics"),
        EngineEndpoint(node_id="n", engine_id="e1", base_url=base + "/other", metrics_url=base + "/metrics"),
        EngineEndpoint(node_id="n", engine_id="gone", base_url=f"http://127.0.0.1:{dead}", metrics_url=""),
        EngineEndpoint(node_id="n", engine_id="r", role="router", base_url=base, metrics_url=base + "/metrics"),
    ]
    try:
        statuses = await reset_prefix_caches(endpoints, timeout_s=5)
    finally:
        await runner.cleanup()
    assert statuses == {"e0": 200, "e1": 404, "gone": 0}
    assert asked == ["/reset_prefix_cache"]  # the router passed nothing on: not asked
    note = reset_note(statuses)
    assert note.startswith("emptied the local prefix cache of 1 of 3 engines before the load (e1: HTTP 404, gone: no")
    assert "VLLM_SERVER_DEV_MODE=1" in note
