"""The state of a :class:`~engine.ledger.memory.MemoryLedger`: its tables and its clock.

Every per-area module of this package (``cluster.py``, ``schedules.py``, ...) is a mixin of
:class:`MemoryState`, so each reads and writes the same tables and judges time by the one
:meth:`MemoryState._now`. The few helpers more than one area needs -- the live schedule by
id, appending to the change feed -- are here too, once.
"""

from __future__ import annotations

from datetime import UTC, datetime

from engine.clock import Clock
from engine.core.hashing import partition_of
from engine.errors import ConfigError
from engine.ledger.common import TENANT_DEFAULTS, not_found
from engine.ledger.manifests import Label
from engine.ledger.memory.tables import (
    AuditLog,
    ChangeFeed,
    ExecutionTable,
    LeaseTable,
    TokenTable,
    VersionedTable,
)
from engine.ledger.params import (
    PARTITIONS_DEFAULT,
    REGION_DEFAULT,
    ChangeKind,
    ClusterSettings,
    NodeInfo,
)
from engine.model import ConsoleSession, Schedule, TaskType, Tenant

REGION_EPOCH_INITIAL = 1
"""The region epoch of a fresh cluster (no failover has happened yet)."""


class MemoryState:
    """The ledger's tables, on an injected clock.

    ``partition_count`` and ``active_region`` are the cluster settings a ``migrate`` would
    fix; every partition starts with a free lease row (no owner, token 0).
    """

    def __init__(
        self,
        *,
        clock: Clock,
        partition_count: int = PARTITIONS_DEFAULT,
        active_region: str = REGION_DEFAULT,
    ) -> None:
        if partition_count < 1:
            raise ConfigError(f"partition_count must be at least 1, got {partition_count}")
        self._clock = clock
        self._settings = ClusterSettings(
            partition_count=partition_count,
            active_region=active_region,
            region_epoch=REGION_EPOCH_INITIAL,
        )
        self._schedules: dict[str, Schedule] = {}
        # Deleted schedules, as they were: the soft delete of the Postgres schema. Nothing
        # reads them back (a deleted schedule is absent to every method), but a simulation or
        # a debugger can inspect what was deleted.
        self._tombstones: dict[str, Schedule] = {}
        self._feed = ChangeFeed()
        self._leases = LeaseTable(partition_count)
        self._nodes: dict[str, NodeInfo] = {}
        self._checkpoints: dict[int, datetime] = {}
        self._executions = ExecutionTable()
        self._task_types = VersionedTable[TaskType]("task type")
        self._tenants = VersionedTable[Tenant]("tenant", absent=TENANT_DEFAULTS)
        self._audit = AuditLog()
        self._tokens = TokenTable()
        self._sessions: dict[bytes, ConsoleSession] = {}
        self._manifest_labels: dict[Label, str] = {}
        """Ownership labels of manifest sets: (kind, name) -> set name."""
        """Console sessions by the hash of their id."""

    def _now(self) -> datetime:
        """The ledger's clock: every expiry is judged by it, every timestamp written is it."""
        now = self._clock.now()
        if now.tzinfo is None:
            raise ConfigError("the ledger's clock must return aware datetimes")
        return now.astimezone(UTC)

    def _partition(self, schedule_id: str) -> int:
        return partition_of(schedule_id, self._settings.partition_count)

    def _live_schedule(self, schedule_id: str) -> Schedule:
        schedule = self._schedules.get(schedule_id)
        if schedule is None:
            raise not_found("schedule", schedule_id)
        return schedule

    def _record_change(self, schedule: Schedule, kind: ChangeKind) -> None:
        partition = self._partition(schedule.schedule_id)
        self._feed.append(schedule.schedule_id, partition, kind, schedule.version, self._now())
