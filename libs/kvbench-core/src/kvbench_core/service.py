"""Service runner: signals only set an event; the service's ``main`` owns an ``AsyncExitStack``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable

__all__ = ["run_service"]

log = logging.getLogger(__name__)


def run_service(main: Callable[[asyncio.Event], Awaitable[None]], *, use_uvloop: bool = False) -> None:
    """Run ``main(stop)`` until it returns; SIGTERM and SIGINT set ``stop`` and nothing else."""

    async def _runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    if use_uvloop:
        with contextlib.suppress(ImportError):
            import uvloop  # noqa: PLC0415  (optional speed-up, only where installed)

            uvloop.run(_runner())
            return
    asyncio.run(_runner())
