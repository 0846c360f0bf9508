"""Machine leases: a run takes all its machines at once, in submission order, and a cancelled wait leaves the queue."""

from __future__ import annotations

import asyncio

from kvbench_planner.leases import MachineLeases, QueuePlace


async def test_a_run_waits_for_a_machine_another_holds_and_gets_it_when_that_run_releases() -> None:
    leases = MachineLeases()
    places: list[QueuePlace] = []

    async def heard(place: QueuePlace) -> None:
        places.append(place)

    await leases.acquire("A", {"m1", "m2"}, (1, 1.0), heard)
    assert places == []  # free at once: nothing said
    second = asyncio.create_task(leases.acquire("B", {"m2", "m3"}, (1, 2.0), heard))
    await asyncio.sleep(0.05)
    assert not second.done()
    assert places == [QueuePlace(position=1, waiting_for=["m2 (run A)"])]
    assert "m3" not in leases.held  # all or nothing: it holds no machine while it waits
    await leases.release("A")
    await asyncio.wait_for(second, 1)
    assert leases.held == {"m2": "B", "m3": "B"}


async def test_runs_queue_in_submission_order_and_a_later_run_does_not_jump_a_waiting_one() -> None:
    leases = MachineLeases()
    order: list[str] = []

    async def quiet(_: QueuePlace) -> None:
        return None

    async def take(run: str, nodes: set[str], at: float) -> None:
        await leases.acquire(run, nodes, (1, at), quiet)
        order.append(run)

    await take("A", {"m1"}, 1.0)
    waiting_b = asyncio.create_task(take("B", {"m1", "m2"}, 2.0))
    await asyncio.sleep(0.02)
    # C needs only m2, which is free, but B (earlier) waits for it: C waits behind B
    waiting_c = asyncio.create_task(take("C", {"m2"}, 3.0))
    await asyncio.sleep(0.02)
    place = leases.queue_place("C")
    assert place is not None
    assert place.position == 2
    assert place.waiting_for == ["m2 (run B, queued before it)"]
    await leases.release("A")
    await asyncio.wait_for(waiting_b, 1)
    assert not waiting_c.done()
    await leases.release("B")
    await asyncio.wait_for(waiting_c, 1)
    assert order == ["A", "B", "C"]


async def test_a_cancelled_wait_leaves_the_queue_and_a_resumed_run_goes_first() -> None:
    leases = MachineLeases()

    async def quiet(_: QueuePlace) -> None:
        return None

    await leases.acquire("A", {"m1"}, (1, 1.0), quiet)
    cancelled = asyncio.create_task(leases.acquire("B", {"m1"}, (1, 2.0), quiet))
    resumed = asyncio.create_task(leases.acquire("R", {"m1"}, (0, 9.0), quiet))  # held m1 before a restart
    await asyncio.sleep(0.02)
    assert leases.queue_place("R") == QueuePlace(position=1, waiting_for=["m1 (run A)"])
    cancelled.cancel()
    await asyncio.sleep(0.02)
    assert leases.queue_place("B") is None
    await leases.release("A")
    await asyncio.wait_for(resumed, 1)
    assert leases.holder("m1") == "R"
    assert leases.blockers("new", {"m1"}) == ["m1 (run R)"]
