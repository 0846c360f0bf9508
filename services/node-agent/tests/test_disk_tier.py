"""The agent's count of a disk tier's directory: what the report's disk-tier table shows for real engines."""

from __future__ import annotations

from pathlib import Path

from kvbench_node_agent.disk_tier import census, fill_warning


def test_a_disk_tier_is_counted_every_level_down(tmp_path: Path) -> None:
    (tmp_path / "model-a").mkdir()
    (tmp_path / "model-a" / "chunk-1.kv").write_bytes(b"x" * 1000)
    (tmp_path / "model-a" / "chunk-2.kv").write_bytes(b"x" * 3000)
    (tmp_path / "chunk-3.kv").write_bytes(b"x" * 24)
    (tmp_path / "outside").mkdir()
    (tmp_path / "elsewhere.kv").symlink_to(tmp_path / "model-a" / "chunk-1.kv")  # a link is not a record
    assert census(tmp_path) == (3, 4024)
    (tmp_path / "model-a" / "chunk-2.kv").unlink()  # evicted
    assert census(tmp_path) == (2, 1024)


def test_a_missing_or_oversized_tier_gives_no_figure(tmp_path: Path) -> None:
    assert census(tmp_path / "absent") is None
    for i in range(5):
        (tmp_path / f"c{i}").write_bytes(b"x")
    assert census(tmp_path, max_files=4) is None  # a floor is not given as a count
    assert census(tmp_path, max_files=5) == (5, 5)


def test_a_tier_that_could_fill_its_filesystem_is_warned_of() -> None:
    assert fill_warning(None, 10**12, None) is None  # no size limit given: nothing to compare
    assert fill_warning(50, 100 * 10**9, None) is None  # half the free space
    warning = fill_warning(95, 100 * 10**9, (377, 32 * 10**9))
    assert warning is not None
    assert "may write 95 GB before it evicts" in warning
    assert "100.0 GB free, besides 377 files (32.0 GB) from earlier runs" in warning
    assert "Lower sizing.disk_tier_gb" in warning
