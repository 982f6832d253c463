"""Carillon: a distributed cron engine.

The names below are the supported public API; everything else may change between releases.
"""

from engine.clock import Clock, SystemClock
from engine.core.dst import Adjustment, DstGap, DstOverlap
from engine.core.hashing import partition_of, stable_hash
from engine.core.timetable import Fire, Timetable, TimetableCache
from engine.errors import (
    AlreadyExists,
    CarillonError,
    ConfigError,
    InvalidCronExpression,
    InvalidField,
    LeaseLost,
    LedgerError,
    LedgerUnavailable,
    NotFound,
    PermanentError,
    QuotaExceeded,
    ScheduleNeverFires,
    TransientError,
    UnknownTimeZone,
    ValidationError,
    VersionConflict,
)
from engine.model import (
    CatchUpPolicy,
    Execution,
    ExecutionStatus,
    HandlerKind,
    Lease,
    OverlapPolicy,
    PlannerCheckpoint,
    Schedule,
    TaskType,
    Tenant,
    execution_id,
)

__version__ = "0.1.0"
"""The one place the version is written: the distribution's metadata is read from this literal
at build time (pyproject.toml, ``[tool.setuptools.dynamic]``), so keep it a plain string."""

__all__ = [
    "Adjustment",
    "AlreadyExists",
    "CarillonError",
    "CatchUpPolicy",
    "Clock",
    "ConfigError",
    "DstGap",
    "DstOverlap",
    "Execution",
    "ExecutionStatus",
    "Fire",
    "HandlerKind",
    "InvalidCronExpression",
    "InvalidField",
    "Lease",
    "LeaseLost",
    "LedgerError",
    "LedgerUnavailable",
    "NotFound",
    "OverlapPolicy",
    "PermanentError",
    "PlannerCheckpoint",
    "QuotaExceeded",
    "Schedule",
    "ScheduleNeverFires",
    "SystemClock",
    "TaskType",
    "Tenant",
    "Timetable",
    "TimetableCache",
    "TransientError",
    "UnknownTimeZone",
    "ValidationError",
    "VersionConflict",
    "__version__",
    "execution_id",
    "partition_of",
    "stable_hash",
]
