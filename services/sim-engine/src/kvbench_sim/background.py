"""Tasks that live as long as an aiohttp app serves: started on startup, cancelled and awaited on cleanup."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

__all__ = ["run_while_serving"]


def run_while_serving(app: web.Application, name: str, *work: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run each of ``work`` as a task named ``name`` from the app's startup until its cleanup."""
    tasks: list[asyncio.Task[None]] = []

    async def start(_: web.Application) -> None:
        tasks.extend(asyncio.create_task(make(), name=name) for make in work)

    async def stop(_: web.Application) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
