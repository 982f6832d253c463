"""The ledger protocol: the only way the engine reads or writes durable state.

The docstrings of :class:`Ledger` are the contract. Two implementations honour it and pass
the same contract suite (``tests/ledger/test_contract.py``): :class:`~engine.ledger.memory.
MemoryLedger` (deterministic, for unit tests and simulations) and :class:`~engine.ledger.
postgres.PostgresLedger` (the product), laid out alike: one module per protocol area (the
sections below), under the same name in ``engine/ledger/memory/`` and
``engine/ledger/postgres/``. A semantic change lands in the contract suite first.

This module is the protocol only. The records and parameter objects it names are in
:mod:`engine.ledger.params` (each checks itself, for both backends: ``checked()``), the
checks' rules in :mod:`engine.ledger.checks`, what both backends build alike (cursors, audit
details, shared errors) in :mod:`engine.ledger.common`, and when an execution may start in
:func:`engine.model.startable_at`.

Design
------
* **Time.** Every expiry (leases, attempt leases, heartbeats) is judged by the ledger's own
  clock -- ``now()`` in Postgres, the injected clock in memory -- never by a node's clock.
* **Fencing.** Every write that depends on owning a partition takes :class:`Fence` objects
  (partition, owner, token). It is applied only if, *for every fence*, the lease row has that
  owner and token and has not expired; otherwise nothing changes and :class:`~engine.errors.
  LeaseLost` is raised naming the lost partitions. The caller must stop acting on them.
* **Idempotency.** Execution ids are deterministic (``scheduleId:plannedAt``); planning the
  same fire twice inserts one row; completing with a stale attempt number changes nothing.
  So any write whose reply was lost (commit-unknown) may simply be retried.
* **Atomicity.** Each method is one transaction: all of its rows change, or none do.
* **Availability.** An unreachable, restarting or timed-out database raises
  :class:`~engine.errors.LedgerUnavailable`; callers retry with bounded backoff.
* **Audit.** Operator actions (dead-letter replay, trigger, backfill, API tokens) name their
  actor and append to an append-only audit trail in the same transaction (:meth:`Ledger.
  audit_list`). They are not fenced: any node may serve them.
* **Bounds.** Every batch has a limit (:data:`BATCH_ROWS_MAX`, page sizes); asking for more
  raises :class:`~engine.errors.InvalidField`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from engine.ledger.manifests import ManifestDone, ManifestsApply
from engine.ledger.params import (
    AuditQuery,
    Backfilled,
    ClusterSettings,
    CompleteResult,
    DeadLettersPurge,
    DeadLettersReplay,
    ExecutionDetail,
    ExecutionsBackfill,
    ExecutionsBucket,
    ExecutionsClaim,
    ExecutionsComplete,
    ExecutionsDue,
    ExecutionsExtend,
    ExecutionsFinish,
    ExecutionsPlan,
    ExecutionsPurge,
    ExecutionsQuery,
    ExecutionsRequeueExpired,
    ExecutionsSkip,
    ExecutionsStats,
    ExecutionsTrigger,
    LeasesAcquire,
    LeasesRelease,
    LeasesRenew,
    NodeInfo,
    NodesHeartbeat,
    Page,
    PlannableSchedule,
    PlanResult,
    RegionChange,
    RegionFailover,
    ScheduleChange,
    ScheduleChangesPrune,
    ScheduleChangesSince,
    ScheduleGroup,
    SchedulesCensus,
    SchedulesCreate,
    SchedulesDelete,
    SchedulesList,
    SchedulesPlannable,
    SchedulesUpdate,
    SessionsCreate,
    TaskTypesPut,
    TenantsPut,
    TokensCreate,
    TokensRevoke,
)
from engine.model import (
    ApiToken,
    AuditEvent,
    ConsoleSession,
    Execution,
    Lease,
    PlannerCheckpoint,
    Schedule,
    TaskType,
    Tenant,
)

__all__ = ["Ledger"]


# --- the protocol -----------------------------------------------------------------------


class Ledger(Protocol):
    """Durable schedules, leases and executions. Every method is one transaction."""

    # cluster (cluster.py): the clock, settings, leases and membership -------------------------

    async def database_now(self) -> datetime:
        """The ledger's clock (aware UTC): the only clock expiries are judged by."""
        ...

    async def cluster_get(self) -> ClusterSettings:
        """Partition count, active region and region epoch."""
        ...

    async def region_failover(self, params: RegionFailover) -> RegionChange:
        """Make ``to_region`` the active region, in one transaction.

        Unless it already is, at an epoch of at least ``epoch_at_least`` (then nothing
        changes: running it twice is safe): the region epoch becomes ``max(epoch + 1,
        epoch_at_least)``, every lease's owner is cleared (tokens kept), so every fence of
        the old epoch stops holding at once, and an audit event ``region.failover`` is
        appended (target the region; details ``from_region``, ``from_epoch``, ``to_epoch``,
        ``revoked``, ``reason``). ``InvalidField`` for a malformed region, actor or reason.
        """
        ...

    async def leases_acquire(self, params: LeasesAcquire) -> list[Lease]:
        """Take the listed partitions that are free or expired, if ``region`` is the
        cluster's active region (otherwise nothing: a standby region acquires nothing).

        Each acquisition draws a fencing token above the partition's last one and at least
        :func:`token_floor` of the region epoch (tokens are never reused, and a later epoch's
        are above an earlier one's) and sets ``expires_at`` = now + ``ttl_s``. Partitions
        held by a live owner -- including the caller -- are left alone and not returned.
        """
        ...

    async def leases_renew(self, params: LeasesRenew) -> list[Lease]:
        """Extend the leases whose fence still holds (owner, token, not expired) to
        now + ``ttl_s``; returns those. A fence missing from the result is lost."""
        ...

    async def leases_release(self, params: LeasesRelease) -> int:
        """Give up the leases whose fence still holds (owner cleared, token kept); returns
        how many were released. Others take them over at once, without waiting for expiry."""
        ...

    async def leases_list(self) -> list[Lease]:
        """Every partition's lease row, by partition id."""
        ...

    async def nodes_heartbeat(self, params: NodesHeartbeat) -> NodeInfo:
        """Record that a node is alive until now + ``ttl_s``, with the clock offset it
        reports (``None`` replaces an earlier one: not measured this time). ``InvalidField``
        for an offset that is not a finite number."""
        ...

    async def nodes_live(self) -> list[NodeInfo]:
        """Nodes whose heartbeat has not expired, by node id, with their clock offsets."""
        ...

    async def nodes_leave(self, node_id: str) -> None:
        """Remove a node's membership row (graceful shutdown)."""
        ...

    # schedules (schedules.py): schedules, quotas, census, the change feed ---------------------

    async def schedules_create(self, params: SchedulesCreate) -> list[Schedule]:
        """Insert schedules, all or none.

        Each gets ``version`` 1 -- or, for a deleted id created again, one more than its last
        version, so that a planner still holding the old incarnation cannot advance the new
        one --, ``partition_id = partition_of(id, partition_count)`` and
        ``updated_at`` = ledger now; ``next_run_at`` is stored as given. A change of kind
        ``created`` is appended to the feed for each. Errors: ``InvalidField`` naming every
        ``task_type`` that does not exist (:meth:`task_types_put` first), for a payload over
        ``PAYLOAD_BYTES_MAX`` or for more than :data:`BATCH_ROWS_MAX` schedules;
        ``AlreadyExists`` naming the ids that exist (not deleted). A deleted schedule's id
        may be created again (its old executions keep their ids); if it is created enabled,
        the fires it still has from now on that the delete (or an earlier pause) skipped
        are queued again in the same transaction, exactly as resuming does
        (:meth:`schedules_update`): each only if the new schedule fires at that instant and
        is of the execution's tenant.

        **Quota.** ``QuotaExceeded`` -- and nothing is created -- if for some tenant its live
        schedules plus the call's schedules of that tenant would exceed its
        ``schedules_max`` (the first such tenant by id is named, with its quota, its count
        and how many were asked for). A tenant without a stored row or without a quota is
        unlimited; a deleted id created again counts like a new one. Checked after
        ``InvalidField`` and ``AlreadyExists``. Concurrent creates never take a tenant past
        its quota together; a quota binds the creates that begin after it is stored.
        :meth:`schedules_update` never counts (moving a schedule to another tenant may leave
        that tenant above its quota, which then refuses only further creates).
        """
        ...

    async def schedules_update(self, params: SchedulesUpdate) -> Schedule:
        """Replace the user fields of a schedule and increment ``version``.

        Applied only if the stored version equals ``expected_version``: otherwise
        ``VersionConflict`` (someone else updated first) and nothing changes. ``NotFound``
        if absent or deleted; ``InvalidField`` if its ``task_type`` does not exist (checked
        first). ``next_run_at`` is stored as given (the caller recomputes it when the
        expression changes). Appends an ``updated`` change.

        **Pausing.** An update that turns an enabled schedule into a disabled one also, in
        the same transaction, makes every execution of it that has not started (``queued``,
        or ``failed`` awaiting a retry: what :meth:`schedules_delete` skips) ``skipped`` with
        ``error_code`` = :data:`SCHEDULE_PAUSED`; running attempts finish normally.

        **Resuming.** An update that turns a disabled schedule into an enabled one also, in
        the same transaction, queues again the fires that a pause or delete skipped and
        that have not come yet: each execution of it that is ``skipped`` with an
        ``error_code`` of :data:`LIFECYCLE_SKIPS`, ``attempt`` 0 (it never started), of the
        schedule's tenant, with ``planned_at`` >= ledger now, at an instant the schedule as
        updated fires at (expression, zone and DST policy: a fire of an older timetable
        stays skipped), becomes ``queued`` under its id: ``attempt`` 0, the schedule's task
        type, ``enqueued_at`` = now, ``finished_at``, ``error_code``, ``error_message``,
        ``not_before`` and the fencing token cleared (as :meth:`executions_backfill` writes
        one). Nothing else is revived: skips for other reasons (overlap, catch-up), fires
        that ran, and fires before now stay as they are (an operator may
        :meth:`executions_backfill` a past one). A planner that plans a revived fire again
        inserts nothing (its id is taken).
        """
        ...

    async def schedules_delete(self, params: SchedulesDelete) -> Schedule:
        """Delete a schedule; returns it as it was.

        In the same transaction every execution of it that has not started (``queued``, or
        ``failed`` awaiting a retry) becomes ``skipped`` with ``error_code`` =
        :data:`SCHEDULE_DELETED`; running attempts finish normally; history stays. Planning
        never inserts executions for a deleted (or disabled) schedule. ``NotFound`` if absent;
        ``VersionConflict`` if ``expected_version`` is given and differs. Appends a
        ``deleted`` change.
        """
        ...

    async def schedules_get(self, schedule_id: str) -> Schedule:
        """The schedule; ``NotFound`` if absent or deleted."""
        ...

    async def schedules_get_many(self, schedule_ids: list[str]) -> dict[str, Schedule]:
        """The live schedules among ``schedule_ids`` (at most :data:`PAGE_SIZE_MAX` ids), by
        id; absent or deleted ones are simply missing. One round trip: what the dispatcher
        uses to read a claim batch's schedules."""
        ...

    async def schedules_list(self, params: SchedulesList) -> Page[Schedule]:
        """Schedules matching every given filter, ordered by id, at most ``limit``
        (<= :data:`PAGE_SIZE_MAX`); deleted ones are never listed. ``id_prefix`` keeps the ids
        that start with it (a range of the ids: exact when the database orders text by code
        point, as the ``C`` collations do); ``InvalidField`` if it is over 128 characters."""
        ...

    async def schedules_plannable(self, params: SchedulesPlannable) -> list[PlannableSchedule]:
        """What planning needs of the enabled live schedules of a partition, in id order after
        ``params.after``, at most ``params.limit`` (<= :data:`PLAN_PAGE_MAX`): a planner's
        load. Fewer than ``limit`` means there are no more."""
        ...

    async def schedules_count(self, tenant_id: str) -> int:
        """How many live schedules (enabled or not) ``tenant_id`` owns: what its
        ``schedules_max`` is compared with. 0 for a tenant that owns none."""
        ...

    async def schedules_census(self, params: SchedulesCensus) -> list[ScheduleGroup]:
        """The enabled live schedules (of ``tenant_id`` when given) grouped by
        ``cron_expr``, ``timezone``, ``dst_gap``, ``dst_overlap``, ``tenant_id`` and
        ``task_type``, each :class:`ScheduleGroup` with its ``count`` and its smallest
        schedule id (by code point) as ``sample_schedule_id``; ordered by ``count``
        descending, then by those six fields (by code point); at most ``limit`` groups
        (1..:data:`CENSUS_GROUPS_MAX`, else ``InvalidField``). What a load forecast expands:
        one timetable per group instead of one per schedule (``H`` expressions hash on the
        id, so their groups are approximated by the sample)."""
        ...

    async def schedule_changes(self, params: ScheduleChangesSince) -> list[ScheduleChange]:
        """Changes with ``seq > after_seq`` in ``seq`` order, at most ``limit``.

        ``seq`` follows commit order: once a change with ``seq`` s is returned, no change
        with a smaller ``seq`` can appear later, so a reader may keep the last ``seq`` as its
        watermark.

        **Pruning.** ``ChangesPruned`` (carrying ``pruned_through``) -- instead of a silent
        hole -- when ``after_seq`` is below the newest pruned ``seq``
        (:meth:`schedule_changes_prune`): changes the reader never saw may be gone. The
        check and the read see one state of the feed, so a reader that gets changes missed
        none.
        """
        ...

    async def schedule_changes_head(self) -> int:
        """The ``seq`` of the newest change, or the newest pruned ``seq`` if that is larger
        (0 if neither): a reader starting now begins there."""
        ...

    async def schedule_changes_prune(self, params: ScheduleChangesPrune) -> int:
        """Remove the oldest changes appended before ``before``, at most ``limit``
        (1..:data:`BATCH_ROWS_MAX`, else ``InvalidField``); returns how many.

        Only a prefix of the feed goes: it stops at the first change appended at or after
        ``before``, so every ``seq`` up to the newest pruned one (kept, and never lowered) is
        gone and every later one is kept. ``InvalidField`` for a naive ``before``. Not
        fenced: the feed is the cluster's, and pruning twice removes nothing more.
        """
        ...

    async def schedule_changes_wait(self, after_seq: int, timeout_s: float) -> bool:
        """Wait until a change newer than ``after_seq`` may exist, or ``timeout_s`` passes.

        Returns ``True`` when woken by a change (LISTEN/NOTIFY on Postgres), ``False`` on
        timeout. Spurious wake-ups are allowed; callers re-read :meth:`schedule_changes`.
        """
        ...

    # catalog (catalog.py): task types and tenants ---------------------------------------------
    #
    #
    # Configuration every node reads: task types say how executions run and within which
    # limits; tenant rows say how the dispatcher shares out work. Both are few (operator-
    # managed), so they are listed whole. Their changes are not in the schedule change feed:
    # readers re-list them periodically.

    async def task_types_put(self, params: TaskTypesPut) -> TaskType:
        """Create a task type (``version`` 1) or replace every field of an existing one
        (``version`` + 1); ``updated_at`` = ledger now; returns it as stored.

        ``InvalidField`` for a malformed task type (:func:`~engine.model.validate_task_type`:
        name, kind, ranges, settings that are not a JSON object of at most
        ``SETTINGS_BYTES_MAX`` bytes -- their content is not checked here);
        ``VersionConflict`` if ``expected_version`` is given and the stored version (0 when
        absent) differs, and then nothing changes. Schedules and executions naming it see
        the new settings from their next dispatch on.
        """
        ...

    async def task_types_get(self, name: str) -> TaskType:
        """The task type; ``NotFound`` if absent."""
        ...

    async def task_types_list(self) -> list[TaskType]:
        """Every task type, by name."""
        ...

    async def task_types_delete(self, name: str) -> TaskType:
        """Delete a task type; returns it as it was.

        ``NotFound`` if absent; ``InvalidField`` -- and nothing changes -- while any live
        schedule names it (saying how many, and which first): delete those schedules or
        move them to another task type first. Deleted schedules do not count. Executions
        keep the name they were planned with, so one may outlive its task type (e.g. still
        running when its schedule and then the task type are deleted).
        Refusal and deletion are atomic with respect to :meth:`schedules_create` and
        :meth:`schedules_update`: no live schedule can ever name a deleted task type.
        """
        ...

    async def tenants_put(self, params: TenantsPut) -> Tenant:
        """Create or replace a tenant's dispatch settings and schedule quota
        (``schedules_max``), versioned like :meth:`task_types_put`; ``InvalidField`` for
        malformed ones (:func:`~engine.model.validate_tenant`). Tenants need no row to own
        schedules. A lower quota than the tenant's count deletes nothing: it refuses
        further creates."""
        ...

    async def tenants_get(self, tenant_id: str) -> Tenant:
        """The tenant's stored settings; ``NotFound`` if none were ever put -- the
        tenant then has the defaults, ``Tenant(tenant_id=tenant_id)``."""
        ...

    async def tenants_list(self) -> list[Tenant]:
        """Every stored tenant, by id; tenants absent from it have the defaults."""
        ...

    # executions (executions.py): planning, dispatch, history, retention -----------------------

    async def checkpoints_get(self, partition_ids: list[int]) -> list[PlannerCheckpoint]:
        """The checkpoints of the listed partitions that have one."""
        ...

    async def executions_plan(self, params: ExecutionsPlan) -> PlanResult:
        """One fenced transaction for a planner batch.

        Inserts the executions (``ON CONFLICT DO NOTHING`` on the id; skipped for schedules
        that are deleted or disabled -- a planner that has not yet heard of a pause plans
        nothing more), moves each schedule's ``next_run_at`` if it is still at the
        expected version, and moves the partition checkpoint forward to ``checkpoint``
        (never backward). Every schedule named must belong to the fenced partition
        (``InvalidField`` otherwise). ``LeaseLost`` if the fence does not hold.
        """
        ...

    async def executions_due(self, params: ExecutionsDue) -> list[Execution]:
        """Executions of the partitions that may start by ``before``
        (:func:`~engine.model.startable_at` at or before it: ``queued`` with ``planned_at
        <= before``, or ``failed`` with ``not_before <= before``, at once without one);
        ordered by that instant, then id (:func:`~engine.ledger.params.due_cursor`),
        beginning after ``after`` when given; only ``tenant_id``'s when given; at most
        ``limit``."""
        ...

    async def executions_claim(self, params: ExecutionsClaim) -> list[Execution]:
        """Start the listed executions that are startable now (as in :meth:`executions_due`
        with ``before`` = ledger now): status ``running``, ``attempt`` + 1, ``started_at``
        = now, attempt lease until now + ``attempt_lease_s``. Others are left alone and not
        returned. Fenced: ``LeaseLost`` if any fence fails, and every id must belong to a
        fenced partition (``InvalidField`` otherwise).

        **Cluster caps.** An execution whose task type has ``max_concurrency_cluster`` C
        starts only while fewer than C executions of that type are ``running`` in the whole
        cluster (every partition, every node; an attempt whose lease ran out counts until it
        is re-queued). Of several in one call, at most C minus those running start, in the
        order the ids are given; the rest stay queued and are not returned, like any other
        id that cannot start. Concurrent claims from other nodes never take a type past its
        cap together: the count and the claim are atomic per task type. A cap (or a change
        of it) binds the claims that begin after it is stored; executions of a task type
        without a cap, or of one that no longer exists, are claimed without counting.
        """
        ...

    async def executions_extend(self, params: ExecutionsExtend) -> list[str]:
        """Renew attempt leases: each listed execution that is ``running`` under exactly the
        given ``attempt`` gets ``attempt_expires_at`` = now + ``attempt_lease_s`` (which may
        also shorten it) and the fence's token. Returns the ids extended, in the order given,
        without repeats; others -- finished, re-queued, running under another attempt,
        unknown -- are left alone, so a worker whose attempt was taken from it learns so
        here. Workers call it every few seconds while a long handler runs, so that
        :meth:`executions_requeue_expired` never re-queues a live attempt. Fenced like claim;
        ``InvalidField`` for more than :data:`BATCH_ROWS_MAX` attempts or an
        ``attempt_lease_s`` that is not a positive number of seconds."""
        ...

    async def executions_complete(self, params: ExecutionsComplete) -> CompleteResult:
        """Finish attempts, guarded by attempt number.

        A completion applies only if the execution is ``running`` with that ``attempt``:
        ``succeeded``/``dead-letter``/``skipped`` are terminal (``finished_at`` = now);
        ``failed`` waits for ``not_before``. Each applied completion is added to the attempt
        history. Others are returned as ``stale``. Fenced like claim.
        """
        ...

    async def executions_finish(self, params: ExecutionsFinish) -> CompleteResult:
        """Finish *folded* attempts -- started by the partition's owner without a claim --
        in one step, guarded by attempt number (docs/ledger.md, "Folded claims").

        A completion applies only if the execution is startable now (as in
        :meth:`executions_claim`: ``queued``, or ``failed`` with its retry due) with
        ``attempt`` one less than the completion's: it then moves to the outcome as
        :meth:`executions_complete` would move a running one, with ``attempt`` = the
        completion's, ``started_at`` = the completion's (never after now), the node
        ``node_id`` as its claimer and the fence's token. Its attempt is recorded in the
        history like a completed one's. Others -- claimed or finished meanwhile (a second
        finish of the same attempt), skipped, not yet startable, unknown -- are returned as
        ``stale``. Cluster caps are not counted: the node folds no capped task type. Fenced
        like claim; ``InvalidField`` for a completion without ``started_at``.
        """
        ...

    async def executions_skip(self, params: ExecutionsSkip) -> list[str]:
        """Make the listed executions that have not started -- ``queued``, or ``failed``
        awaiting a retry, whatever their instant -- ``skipped`` with ``error_code`` and
        ``error_message``: terminal, ``finished_at`` = now, ``not_before`` cleared, written
        under the fence's token. No attempt is recorded (none ran). Returns the ids skipped,
        in the order given, without repeats; others (running, terminal, unknown) are left
        alone, so a repeated call skips nothing more. Fenced like claim; ``InvalidField``
        for an empty ``error_code`` or more than :data:`BATCH_ROWS_MAX` ids."""
        ...

    async def executions_requeue_expired(self, params: ExecutionsRequeueExpired) -> list[str]:
        """Put ``running`` executions whose attempt lease has expired back to ``queued``
        (the attempt is recorded as ``expired``); returns their ids. Fenced."""
        ...

    async def executions_get(self, execution_id: str) -> ExecutionDetail:
        """An execution with its attempt history; ``NotFound`` if absent."""
        ...

    async def executions_query(self, params: ExecutionsQuery) -> Page[Execution]:
        """Executions matching every given filter, ordered by (planned_at, id)."""
        ...

    async def executions_stats(self, params: ExecutionsStats) -> list[ExecutionsBucket]:
        """``buckets`` :class:`ExecutionsBucket` in time order, counting the executions (of
        ``tenant_id`` when given) planned in the range, as that class says. An execution's
        first start is its ``started_at`` while ``attempt`` is 1, attempt 1's in its history
        after; its plan lag is ``min(enqueued_at, first start) - planned_at`` (a replay moves
        ``enqueued_at``; a backfill is late by design). A start or skip outside the range is
        not counted. ``InvalidField`` for a naive ``planned_from``, ``buckets`` outside
        1..:data:`STATS_BUCKETS_MAX`, ``bucket_s`` outside 1..:data:`STATS_BUCKET_S_MAX`, or
        an ``on_time_s`` that is not a finite number >= 0. Reads each execution of the range
        once (Postgres: one range of executions_tenant_idx per tenant)."""
        ...

    async def executions_purge(self, params: ExecutionsPurge) -> int:
        """Delete up to ``limit`` succeeded or skipped executions of the fenced partition
        that finished before ``finished_before`` (with their history), oldest first;
        returns how many. With ``dead_letters``, dead letters instead (and nothing else).
        Each removed execution moves its schedule's purge horizon on to its ``planned_at``
        (never back; see :meth:`executions_backfill`). Fenced."""
        ...

    # audit (audit.py): operators' audited actions and the trail -------------------------------

    async def executions_trigger(self, params: ExecutionsTrigger) -> Execution:
        """Run a schedule now: insert a ``queued`` execution of it with ``planned_at`` =
        ledger now (microseconds) and the id ``execution_id(schedule_id, planned_at)``.
        While that id is taken, ``planned_at`` moves on by a microsecond, so two triggers in
        one microsecond get two executions; it also moves past a whole second -- the instant
        of every cron fire --, so a trigger never takes the id of a fire still to be planned
        (:func:`~engine.ledger.common.trigger_instants`). Tenant, task type and partition are
        the schedule's; ``enqueued_at`` = now. It is startable from ``planned_at``, that is
        at once, or as many microseconds later as it moved on (:meth:`executions_due` of its
        partition returns it from then on). Returns it as stored.

        Works on a disabled (paused) schedule too: a manual run is explicit. ``NotFound`` if
        the schedule is absent or deleted; ``InvalidField`` for a malformed ``actor`` or
        ``reason``; ``AlreadyExists`` if :data:`TRIGGER_ID_TRIES_MAX` microseconds in a row
        are taken (triggers in a tight loop; try again). Appends an ``executions_added``
        change (the owning node hears of it as of any schedule change) and, audited, an
        event: action ``schedule.trigger``, target the execution id, details
        ``schedule_id`` and ``reason``. Not fenced.
        """
        ...

    async def executions_backfill(self, params: ExecutionsBackfill) -> Backfilled:
        """Insert a ``queued`` execution of the schedule at each past instant of
        ``planned_at``, under its deterministic id (``execution_id(schedule_id, instant)``),
        like a planned fire (startable at once, since its instant has passed). An id that
        exists already, in any status, is left alone: backfilling over fires that were
        planned, ran or were skipped adds nothing -- except an execution that a pause or
        delete skipped before it ever started (``skipped`` with an ``error_code`` of
        :data:`LIFECYCLE_SKIPS`, ``attempt`` 0, of the schedule's tenant): it never ran, so
        it is queued again under its id, as resuming does (:meth:`schedules_update`), and
        counts as inserted. Returns the ids inserted, in the order given, without repeats.

        **Purged history.** An instant at or before the schedule id's purge horizon
        (``purged_through``: the latest ``planned_at`` of its executions that
        :meth:`executions_purge` or :meth:`dead_letters_purge` ever removed, kept after the
        rows are gone, across a delete and re-create of the id) is not inserted either: it
        may have run, and a backfill never runs a fire twice. The result says how many
        distinct instants were skipped so (``skipped_purged``) and the horizon (also for an
        empty list). A purge that races the backfill is either seen by it (its instants
        skipped) or finds the rows it would remove still there (nothing inserted over them).

        ``InvalidField`` -- and nothing changes -- for more than :data:`BATCH_ROWS_MAX`
        instants, a naive one, one later than ledger now, or a malformed ``actor`` or
        ``reason``; ``NotFound`` if the schedule is absent or deleted (disabled ones may be
        backfilled). A call with instants is audited once, whatever it inserted: action
        ``schedule.backfill``, target the schedule id, details ``inserted``, ``requested``
        (distinct instants), ``first`` and ``last`` (the earliest and latest asked for, RFC
        3339 UTC), ``reason`` and ``skipped_purged``; and, if it inserted any, appends one
        ``executions_added`` change. An empty list does nothing. Not fenced.
        """
        ...

    async def dead_letters_replay(self, params: DeadLettersReplay) -> list[str]:
        """Put dead letters back to ``queued`` under the same id (history kept; the next
        claim starts the next attempt number); returns the ids replayed, in the order
        given, without repeats. Others are ignored -- and so are dead letters whose schedule
        is deleted (or is live again under another tenant): such a replay could not run,
        since what an execution runs with (its payload) is its schedule's.

        Audited: in the same transaction, one :class:`~engine.model.AuditEvent` per replayed
        execution is appended (action ``dead_letter.replay``, target its id, ``actor``, and
        details ``reason``, ``attempt`` and the ``error_code`` it was dead-lettered with), in
        the order the ids are given. ``InvalidField`` -- and nothing changes -- for a
        malformed ``actor`` or ``reason`` or more than :data:`BATCH_ROWS_MAX` ids. Not
        fenced: an operator's action that any node may serve.
        """
        ...

    async def dead_letters_purge(self, params: DeadLettersPurge) -> list[str]:
        """Delete dead letters for good (with their attempt history); returns the ids
        deleted, in the order given, without repeats. Others (not dead letters, unknown)
        are ignored. Each moves its schedule's purge horizon on, like
        :meth:`executions_purge`.

        Audited: in the same transaction one event per deleted execution (action
        ``dead_letter.purge``, target its id, ``actor``, details ``reason``, ``attempt``,
        ``error_code`` and ``schedule_id``), in the order given. ``InvalidField`` -- and
        nothing changes -- for a malformed ``actor`` or ``reason`` or more than
        :data:`BATCH_ROWS_MAX` ids. Not fenced.
        """
        ...

    async def audit_list(self, params: AuditQuery) -> list[AuditEvent]:
        """Audit events with ``event_id > after_event_id`` matching every given filter, by
        ``event_id``, at most ``limit`` (1..:data:`PAGE_SIZE_MAX`, else ``InvalidField``).

        The trail is append-only, and ``event_id`` follows commit order: once an event is
        returned, no event with a smaller id can appear later, so a reader may keep the
        last id it saw as a watermark and pass it back as ``after_event_id``.
        """
        ...

    # tokens (tokens.py): API tokens and console sessions --------------------------------------
    #
    #
    # The HTTP API's bearer tokens. The ledger never sees a secret: the caller stores the
    # SHA-256 of it (check_token_hash) and looks a presented one up by its hash.
    #
    #
    # The operator console's sign-ins. Like a token's secret, a session id never reaches the
    # ledger: the caller stores its SHA-256 and presents that. Validity is judged by the
    # ledger's clock, so every node agrees on it.

    async def tokens_create(self, params: TokensCreate) -> ApiToken:
        """Store a token (``created_at`` = ledger now, not revoked); returns it as stored.

        ``InvalidField`` for a malformed token (:func:`~engine.model.validate_api_token`:
        id, scope ``admin`` or ``tenant:<id>``, description), a hash that is not
        :data:`TOKEN_HASH_BYTES` bytes, or a malformed ``actor``; ``AlreadyExists`` if the
        token id, or a token with the same hash, exists (revoked ones too: ids are never
        reused). Audited: action ``token.create``, target the token id, details ``scope``
        and ``description``.
        """
        ...

    async def tokens_get_by_hash(self, token_hash: bytes) -> ApiToken:
        """The token whose secret hashes to ``token_hash``; ``NotFound`` if none does,
        ``InvalidField`` for a hash that is not :data:`TOKEN_HASH_BYTES` bytes. A revoked
        token *is* returned, with ``revoked_at`` set: the caller refuses it (and can say
        why). One indexed read: the API calls it for every request it has not cached."""
        ...

    async def tokens_list(self) -> list[ApiToken]:
        """Every token, revoked ones included, by token id."""
        ...

    async def tokens_revoke(self, params: TokensRevoke) -> ApiToken:
        """Revoke a token: ``revoked_at`` = ledger now; returns it as stored.

        Revoking a revoked token returns it unchanged and appends no second event.
        ``NotFound`` if absent; ``InvalidField`` for a malformed ``actor``. Audited: action
        ``token.revoke``, target the token id, details ``scope``. Every console session
        opened with the token is revoked in the same transaction (:meth:`sessions_touch`
        then refuses them), and no new one can be opened with it.
        """
        ...

    async def sessions_create(self, params: SessionsCreate) -> ConsoleSession:
        """Open a session for a valid token (``created_at`` = ``last_seen_at`` = ledger now,
        ``expires_at`` = now + ``lifetime_s``); returns it as stored.

        ``InvalidField`` for a hash that is not :data:`TOKEN_HASH_BYTES` bytes, or durations
        that are not ``0 < idle_timeout_s <= lifetime_s <=`` :data:`SESSION_LIFETIME_S_MAX`;
        ``NotFound`` if the token does not exist or is revoked; ``AlreadyExists`` if a session
        with this hash is stored. Also deletes up to :data:`SESSIONS_PURGED_MAX` sessions
        past ``expires_at`` (revoked or not), so the table holds no session for longer than
        its lifetime. Not audited (the node logs sign-ins).
        """
        ...

    async def sessions_touch(self, session_hash: bytes) -> ConsoleSession:
        """The session with this hash, if it is valid now, with ``last_seen_at`` set to the
        ledger's now. Valid: not revoked, its token not revoked, now before ``expires_at``
        and before ``last_seen_at + idle_timeout_s``. ``NotFound`` otherwise (unknown,
        revoked, expired, idle too long: the caller only needs to know it is no session);
        ``InvalidField`` for a malformed hash. One indexed read and write."""
        ...

    async def sessions_revoke(self, session_hash: bytes) -> None:
        """End the session with this hash (``revoked_at`` = ledger now) if it is not ended;
        nothing for an unknown, expired or revoked one (signing out twice is no error).
        ``InvalidField`` for a malformed hash."""
        ...

    # manifests (manifests.py): manifest sets, applied all or nothing ------------------------

    async def manifests_apply(self, params: ManifestsApply) -> list[ManifestDone]:
        """Apply a manifest set (:mod:`engine.ledger.manifests`) in one transaction.

        Serialized per set name (Postgres: a transaction advisory lock keyed by it; memory:
        one synchronous stretch): under it the ledger reads the state -- the live schedules
        among ``schedule_ids`` and those labelled with the set (locked for update), every
        task type and tenant, the labels of the listed objects and of the set's own --,
        calls ``plan`` once with it, and makes the changes it returns in their order, each
        with the rules of its single-object method (:meth:`schedules_create`, ``_update``,
        ``_delete``, :meth:`task_types_put`, ``_delete``, :meth:`tenants_put`) and refused
        with ``VersionConflict`` if the object is no longer at ``expected_version``. Each
        change writes (or, deleted or released, removes) the object's label and appends
        an audit event ``manifest.apply`` (target its name; details ``manifest_set``,
        ``kind``, ``change``, ``fields``, ``version``, ``source``), in the same transaction.
        Any refusal -- the planner's own exceptions included, which propagate unchanged --
        changes nothing. ``dry_run`` returns the plan and writes nothing (no label, no
        audit); so does a plan without changes. ``InvalidField`` for a malformed set name
        or actor, or more than :data:`~engine.ledger.manifests.MANIFEST_CHANGES_MAX` changes.
        """
        ...
