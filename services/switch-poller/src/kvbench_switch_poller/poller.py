"""Polls every connected switch on an interval and publishes what it read, or that it could not read it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pydantic import ValidationError

from kvbench_contracts.envelope import Envelope
from kvbench_contracts.fabric import SwitchConfig, SwitchSampled, SwitchUnread
from kvbench_core.sealing import SealingError
from kvbench_switch_poller.gnmi import poll_gnmi
from kvbench_switch_poller.reading import SwitchPoll, SwitchReadError
from kvbench_switch_poller.snmp import poll_snmp

__all__ = ["Poller", "SwitchStatus"]

log = logging.getLogger(__name__)

Publish = Callable[[Envelope], Awaitable[object]]
PollFn = Callable[[SwitchConfig, str], Awaitable[SwitchPoll]]
DRIVERS: dict[str, PollFn] = {"snmp": poll_snmp, "gnmi": poll_gnmi}


@dataclass
class SwitchStatus:
    ok: bool = False
    last_ok_ns: int | None = None
    error: str | None = None
    polls: int = 0


class Poller:
    def __init__(
        self,
        switches: Callable[[], dict[str, bytes]],
        secrets: Callable[[], dict[str, bytes]],
        publish: Publish,
        poll: PollFn | None = None,
        open_secret: Callable[[bytes], str] | None = None,
    ) -> None:
        """``poll``: one reader for every switch (tests); by default each switch's protocol picks its driver.
        ``open_secret``: a stored secret in clear (kvbench_core.sealing.SecretsKey.decrypt); raises SealingError."""
        self._switches, self._secrets, self._publish, self._poll = switches, secrets, publish, poll
        self._open = open_secret or _no_key
        self.status: dict[str, SwitchStatus] = {}
        self.failing_rounds = 0  # consecutive polling rounds that failed (health says so)

    def configs(self) -> list[SwitchConfig]:
        out = []
        for name, raw in sorted(self._switches().items()):
            try:
                out.append(SwitchConfig.model_validate_json(raw))
            except ValidationError as exc:
                log.error("switch entry is not valid; skipped", extra={"switch": name, "error": str(exc)[:300]})
        return out

    async def poll_once(self) -> None:
        """Every switch read once; one whose reading or publishing fails is logged and marked unread, and never stops
        the others. The round fails (and backs off) only when every switch failed."""
        configs = self.configs()
        results = await asyncio.gather(*(self._poll_switch(config) for config in configs), return_exceptions=True)
        failed = [(c, r) for c, r in zip(configs, results, strict=True) if isinstance(r, BaseException)]
        for config, error in failed:
            status = self.status.setdefault(config.name, SwitchStatus())
            status.ok, status.error = False, f"switch {config.name}: {type(error).__name__}: {error}"[:500]
            log.error("switch poll failed", extra={"switch": config.name, "error": status.error})
        if configs and len(failed) == len(configs):
            raise failed[0][1]

    async def _poll_switch(self, config: SwitchConfig) -> None:
        status = self.status.setdefault(config.name, SwitchStatus())
        status.polls += 1
        secret = self._secrets().get(config.secret)
        if secret is None:
            await self._unread(config, status, f"switch {config.name}: its secret {config.secret!r} is not stored")
            return
        try:
            credential = self._open(secret)
        except SealingError as exc:
            await self._unread(
                config, status, f"switch {config.name}: its secret {config.secret!r} cannot be read: {exc}"
            )
            return
        read = self._poll or DRIVERS[config.protocol]
        try:
            result = await read(config, credential)
        except SwitchReadError as exc:
            await self._unread(config, status, str(exc))
            return
        status.ok, status.error, status.last_ok_ns = True, None, time.time_ns()
        await self._publish(SwitchSampled(switch=config.name, samples=result.samples, lldp_remote=result.lldp_remote))

    async def _unread(self, config: SwitchConfig, status: SwitchStatus, reason: str) -> None:
        status.ok, status.error = False, reason
        log.warning("switch unread", extra={"switch": config.name, "reason": reason})
        await self._publish(SwitchUnread(switch=config.name, reason=reason))

    async def run(self, interval_s: float, stop: asyncio.Event) -> None:
        """Poll every ``interval_s`` until ``stop``. A round that fails (the bus down, a publish timing out) never
        ends the loop: it is logged, and the next round waits longer (doubling up to a minute) until one succeeds."""
        failures = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self.poll_once()
                failures = 0
            except Exception:
                failures += 1
                log.exception("a polling round failed; retrying", extra={"failures": failures})
            self.failing_rounds = failures
            wait = interval_s if not failures else min(60.0, interval_s * 2**failures)
            remaining = wait - (time.monotonic() - started)
            if remaining > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), remaining)


def _no_key(_: bytes) -> str:
    raise SealingError("the switch poller holds no secrets key (KVBENCH_SECRETS_KEY_FILE, the planner's)")
