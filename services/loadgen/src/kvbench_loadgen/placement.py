"""Which load generator runs which shard of a job.

The planner publishes each shard of a job as one message of a shared work queue, so that a shard whose load
generator died is taken by another. The queue alone lets one load generator take every shard (it acks a shard at
once and asks for the next before a slower peer does): the shards would then share one process's CPU, which is
what sharding was meant to avoid, and their records would carry one load generator's id. So a load generator that
already runs a shard of the job leaves the next one to a peer whose heartbeat shows it free of this job, for a
bounded time; when no peer is free, or none took it within that time, it runs the shard itself and says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from pydantic import ValidationError

from kvbench_contracts.commands import RunLoad
from kvbench_contracts.node import LoadgenHeartbeat, shard_key, shards_of_job
from kvbench_core.bus import Bus, LeaveForOthers

__all__ = ["REDELIVER_S", "ShardPlacement"]

log = logging.getLogger(__name__)

# how soon a shard left for a peer comes back (a free peer's pull is usually waiting: it takes it at once)
REDELIVER_S = 0.5


class ShardPlacement:
    def __init__(self, bus: Bus, loadgen_id: str, wait_s: float) -> None:
        self._bus = bus
        self._me = loadgen_id
        self._wait_s = wait_s  # how long a shard waits for a free peer before this load generator runs it anyway
        self._first_offered: dict[str, float] = {}

    async def claim(self, command: RunLoad, running: Iterable[str]) -> None:
        """Return to run ``command`` here; raise ``LeaveForOthers`` to leave it for a free peer. ``running``: the
        shard keys this load generator runs now."""
        key = shard_key(command.job_id, command.shard_index)
        now = time.monotonic()
        self._forget_older_than(now - 600.0)
        if not any(index != command.shard_index for index in shards_of_job(running, command.job_id)):
            self._first_offered.pop(key, None)
            return
        first = self._first_offered.setdefault(key, now)
        if now - first >= self._wait_s:
            self._first_offered.pop(key, None)
            log.warning("no other load generator took the shard: it runs here beside another of its job",
                        extra={"job_id": command.job_id, "shard_index": command.shard_index})  # fmt: skip
            return
        free = await self.free_peers(command.job_id)
        if not free:
            self._first_offered.pop(key, None)
            return
        raise LeaveForOthers(
            REDELIVER_S,
            f"shard {command.shard_index + 1} of {command.shards} of job {command.job_id} left for a free load "
            f"generator ({', '.join(free)}): {self._me} already runs another shard of the job",
        )

    async def free_peers(self, job_id: str) -> list[str]:
        """Other load generators alive now (a heartbeat within the bucket's TTL) that run no shard of ``job_id``."""
        free = []
        for name, value in (await self._bus.kv_values("kvbench_loadgens")).items():
            if name == self._me:
                continue
            try:
                beat = LoadgenHeartbeat.model_validate_json(value)
            except ValidationError:
                continue
            if not shards_of_job(beat.shards, job_id):
                free.append(name)
        return sorted(free)

    def _forget_older_than(self, cutoff: float) -> None:
        """Shards a peer took are never offered here again: their first-offer times go after a while."""
        for key in [k for k, at in self._first_offered.items() if at < cutoff]:
            del self._first_offered[key]
