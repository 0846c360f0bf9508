"""Emptying the engines' local prefix caches before a job (the acceptance test's reset phase), through the engine's own
route (``RunLoad.reset_route``): vLLM's ``POST /reset_prefix_cache`` (external, connector-kept records stay: vLLM
resets them only when asked with ``reset_external=true``; served only with ``VLLM_SERVER_DEV_MODE=1``), SGLang's
``POST /flush_cache``. An engine with no such route is restarted alone by its agent instead."""

from __future__ import annotations

import aiohttp

from kvbench_contracts.events import EngineEndpoint

__all__ = ["reset_note", "reset_prefix_caches"]


async def reset_prefix_caches(
    endpoints: list[EngineEndpoint], route: str = "/reset_prefix_cache", timeout_s: float = 30.0
) -> dict[str, int]:
    """Each engine's answer (a router passes nothing on, so it is skipped): engine id -> HTTP status, 0 when it did
    not answer."""
    statuses: dict[str, int] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        for endpoint in endpoints:
            if endpoint.role == "router":
                continue
            try:
                async with session.post(endpoint.base_url.rstrip("/") + route) as response:
                    statuses[endpoint.engine_id] = response.status
            except (aiohttp.ClientError, TimeoutError):
                statuses[endpoint.engine_id] = 0
    return statuses


def reset_note(statuses: dict[str, int], route: str = "/reset_prefix_cache") -> str:
    """What the report says of it, in words."""
    done = sorted(e for e, status in statuses.items() if 200 <= status < 300)
    failed = {e: s for e, s in sorted(statuses.items()) if not 200 <= s < 300}
    note = f"emptied the local prefix cache of {len(done)} of {len(statuses)} engines before the load"
    if failed:
        answers = ", ".join(f"{e}: {'no answer' if s == 0 else f'HTTP {s}'}" for e, s in failed.items())
        note += (
            f" ({answers} to POST {route}; vLLM serves /reset_prefix_cache only when started with "
            "VLLM_SERVER_DEV_MODE=1)"
        )
    return note
