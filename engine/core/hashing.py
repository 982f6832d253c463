"""Stable hashing: the same input gives the same number on every node, process and version.

Python's built-in ``hash()`` is salted per process, so it must never decide anything two
nodes have to agree on (partition ownership, the ``H`` token of a cron expression).
"""

from __future__ import annotations

import hashlib
from typing import Final

_BLAKE2B_64: Final = hashlib.blake2b(digest_size=8)
"""An empty 8-byte BLAKE2b state: copying it is cheaper than building one with parameters,
which matters when a load hashes a million schedule ids."""


def stable_hash(text: str) -> int:
    """A 64-bit unsigned hash of ``text`` (BLAKE2b), identical everywhere."""
    state = _BLAKE2B_64.copy()
    state.update(text.encode("utf-8"))
    return int.from_bytes(state.digest(), "big")


def partition_of(schedule_id: str, partition_count: int) -> int:
    """The partition that owns ``schedule_id`` in a cluster of ``partition_count`` partitions."""
    if partition_count < 1:
        raise ValueError(f"partition_count must be >= 1, got {partition_count}")
    return stable_hash(schedule_id) % partition_count
