"""The public API is what ``engine.__all__`` says; changing it is a deliberate act."""

import engine

PINNED = {
    "AlreadyExists", "Adjustment", "CarillonError", "CatchUpPolicy", "Clock", "ConfigError",
    "DstGap", "DstOverlap", "Execution", "ExecutionStatus", "Fire", "InvalidCronExpression",
    "InvalidField", "Lease", "LeaseLost", "LedgerError", "LedgerUnavailable", "NotFound",
    "OverlapPolicy", "PlannerCheckpoint", "Schedule", "ScheduleNeverFires", "SystemClock",
    "Timetable", "TimetableCache", "UnknownTimeZone", "ValidationError", "VersionConflict",
    "__version__", "execution_id", "partition_of", "stable_hash",
    "TransientError", "PermanentError", "TaskType", "Tenant", "HandlerKind", "QuotaExceeded",
}  # fmt: skip


def test_public_names_are_pinned() -> None:
    assert set(engine.__all__) == PINNED


def test_every_public_name_resolves() -> None:
    for name in engine.__all__:
        assert getattr(engine, name) is not None
