"""What a disk tier holds: its files and their bytes, counted on the machine (the LMCache study found 377 records
and 32 GB left on disk after a week, by looking). Engine-neutral: LMCache's disk backend and vLLM's tiering both
keep a file per chunk under the tier's directory, and no engine version exports the count."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["MAX_FILES", "census", "fill_warning"]

MAX_FILES = 2_000_000  # past this a directory walk each scrape costs more than the figure is worth


def census(path: str | Path, max_files: int = MAX_FILES) -> tuple[int, int] | None:
    """(files, bytes) under ``path``, every level down; None when the directory is missing or holds more than
    ``max_files`` files (counted no further: the figure would be a floor, and is not given as one)."""
    files = size = 0
    pending = [str(path)]
    try:
        os.stat(pending[0])
    except OSError:
        return None
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            files += 1
                            size += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue  # removed while counted (an eviction): not held any more
                    if files > max_files:
                        return None
        except OSError:
            continue
    return files, size


def fill_warning(cap_gb: float | None, free_bytes: int, found: tuple[int, int] | None) -> str | None:
    """What to say when the run could fill the tier's filesystem: the tier writes up to its size limit before it
    evicts, and records it finds from earlier runs do not count against that limit (a process counts only what it
    wrote). None when the limit leaves a tenth of the free space."""
    if not cap_gb:
        return None
    cap = cap_gb * 1e9
    if cap < 0.9 * free_bytes:
        return None
    left = f", besides {found[0]} files ({found[1] / 1e9:.1f} GB) from earlier runs" if found and found[0] else ""
    return (
        f"the disk tier may write {cap_gb:g} GB before it evicts and its filesystem has {free_bytes / 1e9:.1f} GB "
        f"free{left}: the run could fill the disk. Lower sizing.disk_tier_gb, or free space (remove old records)"
    )
