"""File-backed tiers keep their records across processes (server mode): an engine restart, or a stack restarted
between jobs, finds the chunks a disk tier or a shared filesystem stored before, as LMCache finds its disk records.

The index (chunk hashes, least recently used first) is written to ``DIR/records-<key>.bin`` at most once per
interval while it changes, and when the process stops; a rename makes each write whole, so a killed process
leaves the last complete one. ``<key>`` digests what makes records usable: the tier, the model, the chunk size
and bytes, and the process's string hashing (chunk hashes are Python hashes of the prompt's words, so a process
started without the same ``PYTHONHASHSEED`` could not match them). Records of another configuration sit in
their own file and are never loaded, as the LMCache study asks (model, block size: never share records).
"""

from __future__ import annotations

import array
import asyncio
import hashlib
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from kvbench_sim.background import run_while_serving

if TYPE_CHECKING:
    from kvbench_sim.tiers import Tier

__all__ = ["Indexed", "TierRecords", "file_backed", "keep_while_serving", "tier_signature"]

log = logging.getLogger("kvbench_sim.records")

_FORMAT = 1


class Indexed(Protocol):
    """What a records file follows: an engine's ``Tier`` or the shared store's index."""

    changes: int

    def index(self) -> list[int]: ...

    def restore(self, chunk_hashes: Sequence[int]) -> int: ...


class TierRecords:
    def __init__(self, directory: Path, indexed: Indexed, signature: Mapping[str, object]) -> None:
        self.indexed = indexed
        self.signature = {
            "format": _FORMAT,
            **signature,
            "string_hashing": hash("kvbench-sim-records"),  # differs unless PYTHONHASHSEED is the same
        }
        key = hashlib.blake2b(json.dumps(self.signature, sort_keys=True).encode(), digest_size=6).hexdigest()
        self.path = directory / f"records-{key}.bin"
        self._saved_changes: int | None = None

    def restore(self) -> int:
        """Load the records a previous process left (none when there are none); returns how many are held."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return 0
        header, _, body = raw.partition(b"\n")
        try:
            meta = json.loads(header)
            hashes = array.array("q")
            hashes.frombytes(body[: len(body) // hashes.itemsize * hashes.itemsize])
        except (ValueError, TypeError) as exc:
            log.warning("records %s unreadable (%s): starting empty", self.path, exc)
            return 0
        if meta.get("signature") != self.signature or meta.get("count") != len(hashes):
            log.warning("records %s belong to another configuration or are cut short: starting empty", self.path)
            return 0
        if sys.byteorder != meta.get("byteorder"):
            hashes.byteswap()
        held = self.indexed.restore(hashes.tolist())
        self._saved_changes = self.indexed.changes
        log.info("restored %d records from %s", held, self.path)
        return held

    def save(self) -> bool:
        """Write the index if it changed since the last write; True when it wrote."""
        snapshot = self._snapshot()
        if snapshot is None:
            return False
        self._write(*snapshot)
        return True

    def _snapshot(self) -> tuple[array.array[int], int] | None:
        if self._saved_changes == self.indexed.changes:
            return None
        return array.array("q", self.indexed.index()), self.indexed.changes

    def _write(self, hashes: array.array[int], changes: int) -> None:
        header = {"signature": self.signature, "count": len(hashes), "byteorder": sys.byteorder}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        with partial.open("wb") as out:
            out.write(json.dumps(header).encode() + b"\n")
            hashes.tofile(out)
        os.replace(partial, self.path)
        self._saved_changes = changes

    async def keep(self, interval_s: float = 1.0) -> None:
        """Save every ``interval_s`` while the index changes, the file written from a thread so a paced engine's
        loop is not held up; until cancelled, then once more."""
        try:
            while True:
                await asyncio.sleep(interval_s)
                snapshot = self._snapshot()
                if snapshot is not None:
                    await asyncio.to_thread(self._write, *snapshot)
        finally:
            self.save()


def file_backed(tier: Tier) -> bool:
    """Tiers whose records are files (they outlive the process): a local disk tier, a shared filesystem."""
    return tier.name == "disk" or tier.config.store_id == "shared-fs"


def tier_signature(tier: Tier, model: str) -> dict[str, object]:
    """What must agree for records to be usable: the tier, the model, the chunk's tokens and bytes."""
    return {
        "tier": tier.name,
        "store": tier.config.store_id,
        "model": model,
        "chunk_tokens": tier.chunk_tokens,
        "bytes_per_chunk": round(tier.bytes_per_chunk),
    }


def keep_while_serving(app: web.Application, kept: Sequence[TierRecords]) -> None:
    """Write ``kept`` records while ``app`` serves, and once more when it stops."""
    run_while_serving(app, "sim-records", *(records.keep for records in kept))
