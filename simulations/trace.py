"""The ordered event log of a run and its hash: the determinism canary.

Every event the simulation sees -- each ledger call a node sends and what became of it,
each fault, each handler delivery and effect, each node start and stop -- is one line,
stamped with true time. The lines are hashed as they come (BLAKE2b), so two runs are the
same run exactly when their hashes match; the last few hundred lines are kept for a failure
report, and all of them can be written to a file (``--trace FILE``).
"""

from __future__ import annotations

import hashlib
from collections import deque
from typing import TextIO

import trio

TAIL_LINES = 400


class Trace:
    def __init__(self, sink: TextIO | None = None) -> None:
        self._hash = hashlib.blake2b(digest_size=16)
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._sink = sink
        self.events = 0

    def emit(self, kind: str, *fields: object) -> None:
        """Record one event at the current true time."""
        line = f"{trio.current_time():.6f} {kind} " + " ".join(str(f) for f in fields)
        self._hash.update(line.encode())
        self._hash.update(b"\n")
        self._tail.append(line)
        self.events += 1
        if self._sink is not None:
            self._sink.write(line + "\n")

    @property
    def digest(self) -> str:
        return self._hash.hexdigest()

    def tail(self, lines: int = 60) -> list[str]:
        return list(self._tail)[-lines:]
