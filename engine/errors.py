"""Every exception Carillon raises on purpose.

Operating errors (bad input, an unreachable database, a lost lease) are subclasses of
:class:`CarillonError`; anything else escaping the engine is a bug.

::

    CarillonError
    ├── ValidationError            bad input from a user; callers answer 4xx / exit code 2
    │   ├── InvalidCronExpression  unparsable or out-of-range cron fields
    │   ├── UnknownTimeZone        not an IANA zone name
    │   ├── ScheduleNeverFires     valid fields that never produce an instant (``0 0 30 2 *``)
    │   └── InvalidField           any other malformed value (ids, timestamps, policies, counts)
    ├── ConfigError                the node or a command was configured wrongly
    ├── ActorCrashLoop             an actor kept crashing; the node stops rather than limp
    ├── LedgerError                the durable store refused or could not do an operation
    │   ├── LedgerUnavailable      unreachable, timed out, or restarted; retry with backoff
    │   ├── LeaseLost              a fenced write matched no current lease: stop acting at once
    │   ├── VersionConflict        optimistic concurrency: someone else updated first
    │   ├── AlreadyExists          a record with that id exists already
    │   ├── NotFound               the addressed record does not exist
    │   ├── ChangesPruned          a change-feed reader fell behind the pruned changes
    │   └── QuotaExceeded          a tenant would own more schedules than its quota allows
    ├── TransientError             raised by a user's Python handler: worth retrying with backoff
    └── PermanentError             raised by a user's Python handler: retrying cannot help
"""

from __future__ import annotations


class CarillonError(Exception):
    """Base of every deliberate Carillon error."""


class ValidationError(CarillonError, ValueError):
    """The input cannot be accepted; the message tells a person how to fix it."""


class InvalidCronExpression(ValidationError):
    """A cron expression that cannot be parsed or has an out-of-range field."""


class UnknownTimeZone(ValidationError):
    """A time-zone name that is not in the IANA database."""


class ScheduleNeverFires(ValidationError):
    """An expression whose fields are valid but which never produces an instant."""


class InvalidField(ValidationError):
    """A malformed value other than a cron expression or a zone."""


class ConfigError(CarillonError):
    """A node or command configuration that cannot work."""


class ActorCrashLoop(CarillonError):
    """An actor crashed more often than its supervisor allows; the node shuts down."""


class LedgerError(CarillonError):
    """The ledger could not perform an operation."""


class LedgerUnavailable(LedgerError):
    """The database is unreachable, timed out, or restarted mid-operation.

    Nothing is known to have been committed, or a commit may have happened with its reply
    lost; every ledger write is idempotent so callers retry with bounded backoff.
    """


class LeaseLost(LedgerError):
    """A fenced write matched no lease held by the caller with its fencing token.

    The caller no longer owns the partitions in ``partitions`` and must stop acting on them
    immediately. Nothing was written.
    """

    def __init__(self, message: str, *, partitions: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.partitions = partitions


class VersionConflict(LedgerError):
    """An optimistic update carried a version that is no longer current."""


class AlreadyExists(LedgerError):
    """A create named ids that exist already; ``ids`` lists them. Nothing was written."""

    def __init__(self, message: str, *, ids: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.ids = ids


class NotFound(LedgerError):
    """The addressed record does not exist."""


class InUse(LedgerError):
    """The record cannot be deleted or narrowed while others still refer to it (a task type
    named by live schedules or unfinished runs). Nothing was written."""


class ChangesPruned(LedgerError):
    """A change-feed read started below the pruned part of the feed: changes the reader has
    not seen may be gone. ``pruned_through`` is the newest ``seq`` pruned; the reader must
    reload what it derives from the feed (planners reload their partitions) and carry on
    from a watermark of at least that."""

    def __init__(self, message: str, *, pruned_through: int = 0) -> None:
        super().__init__(message)
        self.pruned_through = pruned_through


class QuotaExceeded(LedgerError):
    """A create would give ``tenant_id`` more live schedules than its ``quota``.

    ``count`` is how many it owns, ``requested`` how many more the call asked for. Nothing
    was written: delete schedules, or raise the tenant's ``schedules_max``, and try again.
    """

    def __init__(
        self,
        message: str,
        *,
        tenant_id: str = "",
        quota: int = 0,
        count: int = 0,
        requested: int = 0,
    ) -> None:
        super().__init__(message)
        self.tenant_id = tenant_id
        self.quota = quota
        self.count = count
        self.requested = requested


class TransientError(CarillonError):
    """Raised by a ``python`` handler for a failure that a later attempt may not meet.

    The execution is retried with exponential backoff (after at least ``retry_after_s``
    when given) until its task type's ``max_attempts`` are used up. Any exception that is
    neither this nor :class:`PermanentError` is classified *unknown*: retried a bounded
    number of times, then dead-lettered.
    """

    def __init__(self, message: str = "", *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PermanentError(CarillonError):
    """Raised by a ``python`` handler for a failure no retry can fix (bad payload, gone resource).

    The execution is dead-lettered at once; an operator may replay it after fixing the cause.
    """
