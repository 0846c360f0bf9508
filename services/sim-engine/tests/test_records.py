"""File-backed tiers keep records across processes: written whole, read back in LRU order, per configuration."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

from kvbench_sim.profiles import TierConfig
from kvbench_sim.records import TierRecords, file_backed, tier_signature
from kvbench_sim.store import SharedIndex
from kvbench_sim.tiers import Tier


def _disk(capacity_chunks: int = 100) -> Tier:
    # 1,000 bytes a token, 256-token chunks: 256 kB a chunk
    config = TierConfig(name="disk", capacity_gb=capacity_chunks * 256_000 / 1e9, bw_gbps=1, lat_ms=1)
    return Tier(config, 256, 1000.0, 0.0)


def test_a_new_process_finds_the_records_in_their_order(tmp_path: Path) -> None:
    tier = _disk()
    tier.commit([11, -22, 2**62, 44])
    tier.touch([11])  # now the most recently used
    records = TierRecords(tmp_path, tier, tier_signature(tier, "m"))
    assert records.save()
    assert not records.save()  # unchanged: nothing written

    fresh = _disk()
    assert TierRecords(tmp_path, fresh, tier_signature(fresh, "m")).restore() == 4
    assert fresh.index() == [-22, 2**62, 44, 11]
    assert fresh.longest_prefix([-22, 2**62, 5]) == 2


def test_records_beyond_a_smaller_capacity_keep_the_most_recent(tmp_path: Path) -> None:
    big = _disk(100)
    big.commit(list(range(50)))
    TierRecords(tmp_path, big, tier_signature(big, "m")).save()
    small = _disk(10)
    assert TierRecords(tmp_path, small, tier_signature(small, "m")).restore() == 10
    assert small.index() == list(range(40, 50))


def test_records_of_another_configuration_or_cut_short_are_not_used(tmp_path: Path) -> None:
    tier = _disk()
    tier.commit([1, 2, 3])
    records = TierRecords(tmp_path, tier, tier_signature(tier, "model-a"))
    records.save()
    other_model = _disk()
    assert TierRecords(tmp_path, other_model, tier_signature(other_model, "model-b")).restore() == 0
    assert other_model.index() == []
    records.path.write_bytes(records.path.read_bytes()[:-3])  # a write cut short
    same = _disk()
    assert TierRecords(tmp_path, same, tier_signature(same, "model-a")).restore() == 0
    records.path.write_bytes(b"not json\n")
    assert TierRecords(tmp_path, same, tier_signature(same, "model-a")).restore() == 0


def test_the_shared_store_index_keeps_records_too(tmp_path: Path) -> None:
    index = SharedIndex(3)
    index.add([7, 8, 9])
    index.touch([7])
    TierRecords(tmp_path, index, {"tier": "shared"}).save()
    again = SharedIndex(2)
    assert TierRecords(tmp_path, again, {"tier": "shared"}).restore() == 2
    assert list(again.chunks) == [9, 7]


async def test_kept_records_are_written_while_serving_and_on_stop(tmp_path: Path) -> None:
    tier = _disk()
    records = TierRecords(tmp_path, tier, tier_signature(tier, "m"))
    keeper = asyncio.create_task(records.keep(interval_s=0.05))
    tier.commit([1, 2])
    for _ in range(100):
        await asyncio.sleep(0.02)
        if records.path.exists():
            break
    fresh = _disk()
    assert TierRecords(tmp_path, fresh, tier_signature(fresh, "m")).restore() == 2  # a killed process leaves these
    tier.commit([3])
    keeper.cancel()
    await asyncio.gather(keeper, return_exceptions=True)
    assert TierRecords(tmp_path, fresh, tier_signature(fresh, "m")).restore() == 3  # the last change, on stop


def test_only_file_tiers_keep_records() -> None:
    def tier(name: Literal["host", "disk", "shared"], store_id: str | None) -> Tier:
        return Tier(TierConfig(name=name, capacity_gb=1, bw_gbps=1, lat_ms=1, store_id=store_id), 256, 1e3, 0.0)

    assert file_backed(tier("disk", None))
    assert file_backed(tier("shared", "shared-fs"))
    assert not file_backed(tier("shared", "mooncake"))  # a memory store loses its chunks when it stops
    assert not file_backed(tier("host", None))
