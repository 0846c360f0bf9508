"""Which run holds which machine: two runs never start stacks on the same machines. A run takes all the machines
its workloads need at once (so two runs can never each hold what the other waits for), keeps them until it ends,
and waits its turn in the order runs were submitted (a run resumed by a restarted planner first: it held them)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MachineLeases", "QueuePlace"]


class QueuePlace(BaseModel):
    """Where a queued run stands: shown by the API (``queue`` of a run), ``kvbench runs`` and the progress line."""

    model_config = ConfigDict(frozen=True)

    position: int = Field(ge=1, description="1: the next run to get its machines")
    waiting_for: list[str] = Field(description='What it waits for, each "machine (run RUN_ID)"')


@dataclass
class _Waiter:
    run_id: str
    nodes: frozenset[str]
    order: tuple[int, float]  # (0 for a run that held its machines before a planner restart, 1 else; submitted at)


class MachineLeases:
    def __init__(self) -> None:
        self.held: dict[str, str] = {}  # machine -> the run holding it
        self._waiting: list[_Waiter] = []
        self._changed = asyncio.Condition()

    def blockers(self, run_id: str, nodes: Iterable[str], before: tuple[int, float] | None = None) -> list[str]:
        """What keeps ``run_id`` from ``nodes`` now: machines held by other runs, and machines an earlier waiting
        run wants (``before``: this run's own place; None: behind every waiting run)."""
        wanted = set(nodes)
        found = [f"{node} (run {owner})" for node in sorted(wanted) if (owner := self.held.get(node, run_id)) != run_id]
        for waiter in self._waiting:
            if waiter.run_id == run_id or (before is not None and waiter.order >= before):
                continue
            found += [f"{node} (run {waiter.run_id}, queued before it)" for node in sorted(wanted & waiter.nodes)]
        return found

    def queue_place(self, run_id: str) -> QueuePlace | None:
        waiter = next((w for w in self._waiting if w.run_id == run_id), None)
        if waiter is None:
            return None
        position = 1 + sum(1 for w in self._waiting if w.order < waiter.order)
        return QueuePlace(position=position, waiting_for=self.blockers(run_id, waiter.nodes, waiter.order))

    async def acquire(
        self,
        run_id: str,
        nodes: Iterable[str],
        order: tuple[int, float],
        on_wait: Callable[[QueuePlace], Awaitable[None]],
    ) -> None:
        """Hold ``nodes`` for ``run_id``, waiting for them in ``order``; ``on_wait`` hears each new place in the
        queue (not called when they are free at once). Cancelled while waiting: it leaves the queue."""
        waiter = _Waiter(run_id, frozenset(nodes), order)
        async with self._changed:
            self._waiting.append(waiter)
            self._waiting.sort(key=lambda w: w.order)
            try:
                said: QueuePlace | None = None
                while self.blockers(run_id, waiter.nodes, waiter.order):
                    place = self.queue_place(run_id)
                    if place is not None and place != said:
                        said = place
                        await on_wait(place)
                    await self._changed.wait()
                for node in waiter.nodes:
                    self.held[node] = run_id
            finally:
                with contextlib.suppress(ValueError):
                    self._waiting.remove(waiter)
                self._changed.notify_all()

    async def release(self, run_id: str) -> None:
        async with self._changed:
            for node in [n for n, owner in self.held.items() if owner == run_id]:
                del self.held[node]
            self._changed.notify_all()

    def holder(self, node: str) -> str | None:
        return self.held.get(node)
