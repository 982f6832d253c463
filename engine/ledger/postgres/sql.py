"""Every SQL statement the Postgres ledger runs, in one place (the schema is in ``migrations/``).

Conventions kept by every statement here:

* **Expiry is judged by the server**: leases, attempt leases and heartbeats compare with
  ``now()`` (the transaction's start on the server's clock), never with a node's clock.
* **Batches travel as arrays**: a write of n rows is one statement over ``unnest($k::type[],
  ...)``, not n statements (``docs/ledger.md``: 55-75k rows/s instead of a few thousand).
* **Partition ids come from Python** (:func:`engine.core.hashing.partition_of`); no statement
  recomputes the hash.
* **Row locks are taken in ascending key order** (``ORDER BY ... FOR <mode>`` puts the
  lock step above the sort), so lease renewals and fenced writes of the same node never
  deadlock each other.
* Listing queries are composed from fixed fragments by the small builders at the end, so
  that each filter combination gets its own prepared statement and its own index.
"""

from __future__ import annotations

import functools
from typing import Final

from engine.ledger.params import REGION_EPOCH_TOKEN_SHIFT
from engine.ledger.postgres.sql_columns import (
    AUDIT_COLUMNS,
    AUDIT_LOCK_KEY,
    CAP_LOCK_SPACE,
    CHANGES_CHANNEL,
    CHANGES_LOCK_KEY,
    EXECUTION_COLUMNS,
    LEASE_COLUMNS,
    MIGRATION_LOCK_KEY,
    NODE_COLUMNS,
    PURGE_MARKS_UPSERT,
    SCHEDULE_COLUMNS,
    TASK_TYPE_COLUMNS,
    TENANT_COLUMNS,
    TOKEN_COLUMNS,
    prefixed,
)
from engine.model import ExecutionStatus

# --- cluster ----------------------------------------------------------------------------

DATABASE_NOW: Final = "SELECT now()"
CLUSTER_GET: Final = "SELECT partition_count, active_region, region_epoch FROM cluster_settings"
SCHEMA_VERSION: Final = "SELECT max(version) FROM carillon_schema_migrations"

# --- fencing ----------------------------------------------------------------------------

FENCES_HOLDING: Final = """
SELECT l.partition_id
FROM partition_leases AS l
JOIN unnest($1::integer[], $2::text[], $3::bigint[]) AS f (partition_id, owner_id, fencing_token)
  ON l.partition_id = f.partition_id
 AND l.owner_id = f.owner_id
 AND l.fencing_token = f.fencing_token
WHERE l.expires_at > now()
ORDER BY l.partition_id
FOR KEY SHARE OF l
"""
"""The fences that hold, each lease row key-share-locked until commit. A takeover locks the row
``FOR UPDATE`` first (``LEASES_ACQUIRE``, ``LEASES_REVOKE_ALL``), which conflicts: it skips or
waits for this transaction, so the fence holds for all of it. A renewal or release only takes
the weaker ``FOR NO KEY UPDATE``, which does not conflict: the owner's own renewals never queue
behind its fenced writes. (With ``FOR SHARE`` they did: a renewal of n rows waited on each
row's writer in turn, and under a burst it came back more than a trust window late.)"""

# --- task types and tenants -------------------------------------------------------------
#
# A live schedule's task type must exist: schedules.live_task_type references task_types
# (migrations/0001_initial.sql). Schedule writers first key-share-lock the task types they
# name (TASK_TYPES_LOCK, the lock the foreign key itself takes), so that a missing one is
# reported by name; a delete locks its row for update and only then counts the schedules
# using it (TASK_TYPE_USERS), so a create either commits first and is counted, or waits and
# finds the task type gone. The same holds for who may use a task type: a schedule writer
# checks its tenant against the grants it read under the key-share lock, and a replacement
# locks the row for update first (TASK_TYPE_LOCK_FOR_CHANGE), so a change that takes the task
# type away from a tenant counts that tenant's schedules only after every writer that read
# the old grants has committed.

TASK_TYPES_LOCK: Final = """
SELECT name, tenant_id, allowed_tenants FROM task_types WHERE name = ANY($1::text[])
ORDER BY name FOR KEY SHARE
"""
"""The task types schedules name, key-share locked, with who may use them."""

TASK_TYPE_LOCK_FOR_CHANGE: Final = f"""
SELECT {TASK_TYPE_COLUMNS} FROM task_types WHERE name = $1 FOR UPDATE
"""
"""A task type about to be replaced, locked against schedule writers: a change that takes it
away from some tenants counts their live schedules in a later statement, which sees every
schedule committed while this lock waited (as :data:`TASK_TYPE_LOCK_FOR_DELETE`)."""

TASK_TYPE_TENANT_USERS: Final = """
SELECT tenant_id, count(*) AS live FROM schedules
WHERE task_type = $1 AND deleted_at IS NULL AND NOT (tenant_id = ANY($2::text[]))
GROUP BY tenant_id ORDER BY tenant_id
"""
"""Per tenant not in ``$2``, how many live schedules name the task type ``$1`` (a scan, like
:data:`TASK_TYPE_USERS`; run only when a change takes the task type away from someone)."""

TASK_TYPE_PUT: Final = f"""
WITH current AS (SELECT version FROM task_types WHERE name = $1 FOR NO KEY UPDATE)
INSERT INTO task_types AS t (
    name, kind, settings, timeout_s, max_concurrency, max_concurrency_cluster, max_attempts,
    backoff_base_s, backoff_max_s, overlap, updated_at, version, tenant_id, allowed_tenants)
SELECT $1::text, $2::text, $3::jsonb, $4::double precision, $5::integer, $6::integer,
       $7::integer, $8::double precision, $9::double precision, $10::text, now(), 1,
       $12::text, $13::text[]
WHERE $11::bigint IS NULL OR $11::bigint = coalesce((SELECT version FROM current), 0)
ON CONFLICT (name) DO UPDATE SET
    kind = EXCLUDED.kind, settings = EXCLUDED.settings, timeout_s = EXCLUDED.timeout_s,
    max_concurrency = EXCLUDED.max_concurrency,
    max_concurrency_cluster = EXCLUDED.max_concurrency_cluster,
    max_attempts = EXCLUDED.max_attempts, backoff_base_s = EXCLUDED.backoff_base_s,
    backoff_max_s = EXCLUDED.backoff_max_s, overlap = EXCLUDED.overlap,
    tenant_id = EXCLUDED.tenant_id, allowed_tenants = EXCLUDED.allowed_tenants,
    updated_at = now(), version = t.version + 1
WHERE $11::bigint IS NULL OR t.version = $11::bigint
RETURNING {prefixed(TASK_TYPE_COLUMNS, "t")}
"""
"""Create or replace, optimistically. Without an expected version (``$11`` NULL) the row is
inserted or replaced. With one, a row is proposed only if it matches the locked current
version (0 when absent), and replaced only if it still does; otherwise nothing is returned.
Concurrent creates of one name meet on the key, and the second then replaces (or, expecting
0, returns nothing). ``$12`` is the owning tenant, ``$13`` the tenants granted."""

TASK_TYPE_GET: Final = f"SELECT {TASK_TYPE_COLUMNS} FROM task_types WHERE name = $1"

TASK_TYPES_LIST: Final = f"SELECT {TASK_TYPE_COLUMNS} FROM task_types ORDER BY name"

TASK_TYPE_LOCK_FOR_DELETE: Final = "SELECT name FROM task_types WHERE name = $1 FOR UPDATE"

TASK_TYPE_USERS: Final = """
SELECT schedule_id, count(*) OVER () AS total FROM schedules
WHERE task_type = $1 AND deleted_at IS NULL ORDER BY schedule_id LIMIT $2
"""
"""The first live schedules naming a task type, each row with how many there are in all (a
scan: deleting a task type is rare, and an index would slow every planner advance)."""

TASK_TYPE_UNFINISHED_RUNS: Final = """
SELECT status, count(*) AS runs FROM (
    SELECT status FROM executions WHERE status IN ('queued', 'failed') AND task_type = $1
    UNION ALL
    SELECT status FROM executions WHERE status = 'running' AND task_type = $1
    UNION ALL
    SELECT status FROM executions WHERE status = 'dead-letter' AND task_type = $1
) AS unfinished
GROUP BY status
"""
"""How many runs naming a task type are not finished, by status. Each branch's status test
is the predicate of a partial index (the startable, running and dead-letter ones), so the
unfinished rows are read through those, not by a scan of the whole history."""

TASK_TYPE_DELETE: Final = f"DELETE FROM task_types WHERE name = $1 RETURNING {TASK_TYPE_COLUMNS}"

TENANT_PUT: Final = f"""
WITH current AS (SELECT version FROM tenants WHERE tenant_id = $1 FOR NO KEY UPDATE)
INSERT INTO tenants AS t (
    tenant_id, weight, concurrency_quota, rate_per_s, burst, schedules_max, updated_at,
    version)
SELECT $1::text, $2::integer, $3::integer, $4::double precision, $5::integer, $7::integer,
       now(), 1
WHERE $6::bigint IS NULL OR $6::bigint = coalesce((SELECT version FROM current), 0)
ON CONFLICT (tenant_id) DO UPDATE SET
    weight = EXCLUDED.weight, concurrency_quota = EXCLUDED.concurrency_quota,
    rate_per_s = EXCLUDED.rate_per_s, burst = EXCLUDED.burst,
    schedules_max = EXCLUDED.schedules_max, updated_at = now(), version = t.version + 1
WHERE $6::bigint IS NULL OR t.version = $6::bigint
RETURNING {prefixed(TENANT_COLUMNS, "t")}
"""
"""As :data:`TASK_TYPE_PUT`, with the expected version in ``$6`` and the schedule quota in
``$7``."""

TENANT_VERSION: Final = "SELECT version FROM tenants WHERE tenant_id = $1"

TENANT_GET: Final = f"SELECT {TENANT_COLUMNS} FROM tenants WHERE tenant_id = $1"

TENANTS_LIST: Final = f"SELECT {TENANT_COLUMNS} FROM tenants ORDER BY tenant_id"

# --- schedules --------------------------------------------------------------------------

SCHEDULES_PLANNABLE: Final = """
SELECT schedule_id, tenant_id, task_type, version, next_run_at, cron_expr, timezone, dst_gap,
       dst_overlap, catch_up, catch_up_window_s
FROM schedules
WHERE partition_id = $1 AND deleted_at IS NULL AND enabled AND schedule_id > $2
ORDER BY schedule_id
LIMIT $3
"""
"""A planner's load, one page: the columns planning reads, by position (see
``schedules.schedules_plannable``), along schedules_partition_live_idx. ``$2`` is ``''``
for the first page (every id sorts above it)."""

SCHEDULES_TAKEN_IDS: Final = """
SELECT s.schedule_id FROM schedules AS s
JOIN unnest($1::text[], $2::text[]) AS u (schedule_id, tenant_id) USING (schedule_id)
WHERE s.deleted_at IS NULL OR s.tenant_id <> u.tenant_id
ORDER BY s.schedule_id
"""
"""Of the ids ``$1`` to be created for the tenants ``$2``, those taken: live, or deleted by
another tenant (a deleted id is only ever revived for the tenant that had it)."""

SCHEDULES_INSERT: Final = f"""
INSERT INTO schedules AS s (
    schedule_id, tenant_id, cron_expr, timezone, task_type, payload, enabled, next_run_at,
    created_at, updated_at, version, partition_id, catch_up, catch_up_window_s, dst_gap,
    dst_overlap, overlap, deleted_at)
SELECT u.schedule_id, u.tenant_id, u.cron_expr, u.timezone, u.task_type, u.payload, u.enabled,
       u.next_run_at, now(), now(), 1, u.partition_id, u.catch_up, u.catch_up_window_s,
       u.dst_gap, u.dst_overlap, u.overlap, NULL
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[],
            $7::boolean[], $8::timestamptz[], $9::integer[], $10::text[],
            $11::double precision[], $12::text[], $13::text[], $14::text[])
     AS u (schedule_id, tenant_id, cron_expr, timezone, task_type, payload, enabled,
           next_run_at, partition_id, catch_up, catch_up_window_s, dst_gap, dst_overlap,
           overlap)
ON CONFLICT (schedule_id) DO UPDATE SET
    tenant_id = EXCLUDED.tenant_id, cron_expr = EXCLUDED.cron_expr,
    timezone = EXCLUDED.timezone, task_type = EXCLUDED.task_type, payload = EXCLUDED.payload,
    enabled = EXCLUDED.enabled, next_run_at = EXCLUDED.next_run_at,
    created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at, version = s.version + 1,
    partition_id = EXCLUDED.partition_id, catch_up = EXCLUDED.catch_up,
    catch_up_window_s = EXCLUDED.catch_up_window_s, dst_gap = EXCLUDED.dst_gap,
    dst_overlap = EXCLUDED.dst_overlap, overlap = EXCLUDED.overlap, deleted_at = NULL
WHERE s.deleted_at IS NOT NULL AND s.tenant_id = EXCLUDED.tenant_id
RETURNING {prefixed(SCHEDULE_COLUMNS, "s")}
"""
"""Insert new schedules and revive the deleted ones of the same tenant; a live row, or
another tenant's deleted one, is left alone and not returned (a concurrent create of the
same id committed first)."""

SCHEDULE_UPDATE: Final = f"""
UPDATE schedules SET
    tenant_id = $2, cron_expr = $3, timezone = $4, task_type = $5, payload = $6,
    enabled = $7, next_run_at = $8, catch_up = $9, catch_up_window_s = $10, dst_gap = $11,
    dst_overlap = $12, overlap = $13, version = version + 1, updated_at = now()
WHERE schedule_id = $1 AND deleted_at IS NULL AND version = $14
RETURNING {SCHEDULE_COLUMNS}
"""

SCHEDULE_GET: Final = f"""
SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE schedule_id = $1 AND deleted_at IS NULL
"""

SCHEDULE_GET_FOR_UPDATE: Final = SCHEDULE_GET + "FOR UPDATE"

SCHEDULES_GET_MANY: Final = f"""
SELECT {SCHEDULE_COLUMNS} FROM schedules
WHERE schedule_id = ANY($1::text[]) AND deleted_at IS NULL
"""

SCHEDULE_SOFT_DELETE: Final = "UPDATE schedules SET deleted_at = now() WHERE schedule_id = $1"

EXECUTIONS_SKIP_PENDING: Final = """
UPDATE executions
SET status = 'skipped', error_code = $2, error_message = $3, finished_at = now(),
    not_before = NULL
WHERE schedule_id = $1 AND status IN ('queued', 'failed')
"""
"""Skip the executions of schedule ``$1`` that have not started, with the reason ``$2``
(``schedule_deleted`` or ``schedule_paused``) and message ``$3``. Run as a *later
statement* than the delete (:data:`SCHEDULE_SOFT_DELETE`) or the pausing update of the
same transaction, which holds the schedule row: under READ COMMITTED it sees every
execution a planner committed while holding the row, and a planner that comes later finds
the schedule deleted or disabled."""

EXECUTIONS_LIFECYCLE_SKIPPED: Final = """
SELECT execution_id, schedule_id, tenant_id, planned_at FROM executions
WHERE schedule_id = ANY($1::text[]) AND planned_at >= now() AND status = 'skipped'
  AND attempt = 0 AND error_code = ANY($2::text[])
ORDER BY schedule_id, planned_at
"""
"""The fires of schedules ``$1`` from now on that a pause or delete (the reasons ``$2``)
skipped before they started: what resuming or re-creating a schedule revives (those of its
tenant that its timetable still has; filtered by the caller). A range of
executions_schedule_idx per schedule."""

EXECUTIONS_REVIVE: Final = """
UPDATE executions AS e
SET status = 'queued', task_type = u.task_type, enqueued_at = now(), finished_at = NULL,
    not_before = NULL, error_code = NULL, error_message = NULL, fencing_token = NULL
FROM unnest($1::text[], $2::text[], $3::text[]) AS u (execution_id, tenant_id, task_type)
WHERE e.execution_id = u.execution_id AND e.tenant_id = u.tenant_id
  AND e.status = 'skipped' AND e.attempt = 0 AND e.error_code = ANY($4::text[])
RETURNING e.execution_id
"""
"""Queue again executions ``$1`` of tenants ``$2`` that a pause or delete (the reasons
``$4``) skipped before they ever started, as their schedule would plan them now (task type
``$3``, enqueued now, written under no lease); any other row is left alone and not
returned. Run under the schedule's row lock (resume, re-create) or share lock (backfill)."""

CHANGES_LOCK: Final = f"SELECT pg_advisory_xact_lock({CHANGES_LOCK_KEY})"
"""Taken right before :data:`CHANGES_APPEND`, held until commit: the next writer draws its
``seq`` only after this transaction is visible, so ``seq`` order is commit order."""

CHANGES_APPEND: Final = f"""
WITH appended AS (
    INSERT INTO schedule_changes (schedule_id, partition_id, kind, version)
    SELECT * FROM unnest($1::text[], $2::integer[], $3::text[], $4::bigint[])
    RETURNING seq
), newest AS (
    SELECT max(seq) AS seq FROM appended
)
SELECT newest.seq, pg_notify('{CHANGES_CHANNEL}', newest.seq::text) FROM newest
"""
"""Append changes and NOTIFY listeners (delivered at commit, with the newest seq)."""

CHANGES_SINCE: Final = """
SELECT p.through, c.seq, c.schedule_id, c.partition_id, c.kind, c.version
FROM schedule_changes_pruned AS p
LEFT JOIN LATERAL (
    SELECT seq, schedule_id, partition_id, kind, version FROM schedule_changes
    WHERE seq > $1 ORDER BY seq LIMIT $2
) AS c ON true
ORDER BY c.seq
"""
"""The changes after ``$1`` and the newest pruned ``seq`` (``through``, on every row; one
row with a NULL ``seq`` when there are no changes), in one statement: one snapshot, so a
prune cannot fall between the check and the read."""

CHANGES_NEWEST: Final = """
SELECT greatest(coalesce(max(seq), 0), (SELECT through FROM schedule_changes_pruned))
FROM schedule_changes
"""

CHANGES_PRUNE: Final = """
WITH oldest AS (
    SELECT seq, at FROM schedule_changes ORDER BY seq LIMIT $2
), young AS (
    SELECT min(seq) AS seq FROM oldest WHERE at >= $1
), doomed AS (
    DELETE FROM schedule_changes AS c USING oldest
    WHERE c.seq = oldest.seq AND oldest.seq < coalesce((SELECT seq FROM young), oldest.seq + 1)
    RETURNING c.seq
), moved AS (
    UPDATE schedule_changes_pruned SET through = greatest(through, (SELECT max(seq) FROM doomed))
    WHERE EXISTS (SELECT 1 FROM doomed)
)
SELECT count(*) FROM doomed
"""
"""Delete the oldest changes (at most ``$2``) up to the first one appended at or after
``$1``, and move the pruned watermark on to the newest deleted, in one statement. Served by
the primary key; a concurrent prune of the same rows waits for this one, then deletes (and
counts) nothing."""

# --- leases, membership, checkpoints ----------------------------------------------------

LEASES_ACQUIRE: Final = f"""
WITH active AS (
    SELECT region_epoch FROM cluster_settings WHERE active_region = $4 FOR SHARE
), free AS (
    SELECT partition_id FROM partition_leases
    WHERE partition_id = ANY($1::integer[])
      AND (owner_id IS NULL OR expires_at IS NULL OR expires_at <= now())
      AND EXISTS (SELECT 1 FROM active)
    ORDER BY partition_id
    FOR UPDATE SKIP LOCKED
)
UPDATE partition_leases AS l
SET owner_id = $2,
    fencing_token = greatest(
        l.fencing_token + 1, ((active.region_epoch - 1) << {REGION_EPOCH_TOKEN_SHIFT}) + 1
    ),
    expires_at = now() + make_interval(secs => $3)
FROM free, active WHERE l.partition_id = free.partition_id
RETURNING {prefixed(LEASE_COLUMNS, "l")}
"""
"""Take free or expired partitions, only for a node of the active region ($4). A row locked
by someone else's transaction (a rival acquiring it, or the previous owner's last fenced
write) is skipped, never waited for. The settings row is share-locked first, so a region
failover (which locks it for update, then revokes every lease) waits for this to commit, or
this waits for the failover and then finds the region inactive."""

REGION_LOCK: Final = """
SELECT partition_count, active_region, region_epoch FROM cluster_settings FOR UPDATE
"""

REGION_SET: Final = """
UPDATE cluster_settings SET active_region = $1, region_epoch = $2
RETURNING partition_count, active_region, region_epoch
"""

LEASES_REVOKE_ALL: Final = """
WITH owned AS (
    SELECT partition_id FROM partition_leases
    WHERE owner_id IS NOT NULL ORDER BY partition_id FOR UPDATE
)
UPDATE partition_leases AS l SET owner_id = NULL, expires_at = NULL
FROM owned WHERE l.partition_id = owned.partition_id
"""
"""Clear every owner, tokens kept (a failover); rows locked in partition order, as always."""

_LEASES_HELD_LOCKED: Final = """
WITH held AS (
    SELECT l.partition_id
    FROM partition_leases AS l
    JOIN unnest($1::integer[], $2::text[], $3::bigint[])
         AS f (partition_id, owner_id, fencing_token)
      ON l.partition_id = f.partition_id
     AND l.owner_id = f.owner_id
     AND l.fencing_token = f.fencing_token
    WHERE l.expires_at > now()
    ORDER BY l.partition_id
    FOR NO KEY UPDATE OF l
)
"""
"""The caller's held leases, locked against each other's renewals and releases, and against a
takeover; not against the caller's own fenced writes (see ``FENCES_HOLDING``)."""

LEASES_RENEW: Final = f"""{_LEASES_HELD_LOCKED}
UPDATE partition_leases AS l SET expires_at = now() + make_interval(secs => $4)
FROM held WHERE l.partition_id = held.partition_id
RETURNING {prefixed(LEASE_COLUMNS, "l")}
"""

LEASES_RELEASE: Final = f"""{_LEASES_HELD_LOCKED}
UPDATE partition_leases AS l SET owner_id = NULL, expires_at = NULL
FROM held WHERE l.partition_id = held.partition_id
RETURNING l.partition_id
"""
"""Owner cleared, token kept (the next acquisition increments it)."""

LEASES_LIST: Final = f"SELECT {LEASE_COLUMNS} FROM partition_leases ORDER BY partition_id"

NODES_HEARTBEAT: Final = f"""
INSERT INTO nodes AS n (
    node_id, region, started_at, last_seen_at, expires_at, clock_offset_s, planner_lag
)
VALUES ($1, $2, now(), now(), now() + make_interval(secs => $3), $4, $5)
ON CONFLICT (node_id) DO UPDATE SET
    region = EXCLUDED.region,
    started_at = CASE WHEN n.expires_at > now() THEN n.started_at ELSE now() END,
    last_seen_at = EXCLUDED.last_seen_at,
    expires_at = EXCLUDED.expires_at,
    clock_offset_s = EXCLUDED.clock_offset_s,
    planner_lag = EXCLUDED.planner_lag
RETURNING {NODE_COLUMNS}
"""
"""A node whose row had expired was judged dead: its next heartbeat is a rejoin."""

NODES_LIVE: Final = f"SELECT {NODE_COLUMNS} FROM nodes WHERE expires_at > now() ORDER BY node_id"

NODES_LEAVE: Final = "DELETE FROM nodes WHERE node_id = $1"

CHECKPOINTS_GET: Final = """
SELECT partition_id, last_evaluated_at FROM planner_checkpoints
WHERE partition_id = ANY($1::integer[]) ORDER BY partition_id
"""

CHECKPOINT_ADVANCE: Final = """
INSERT INTO planner_checkpoints AS c (partition_id, last_evaluated_at) VALUES ($1, $2)
ON CONFLICT (partition_id) DO UPDATE
SET last_evaluated_at = greatest(c.last_evaluated_at, EXCLUDED.last_evaluated_at)
"""
"""Move a checkpoint forward, never backward."""

# --- planning ---------------------------------------------------------------------------

SCHEDULES_LOCK_LIVE: Final = """
SELECT schedule_id FROM schedules
WHERE schedule_id = ANY($1::text[]) AND deleted_at IS NULL AND enabled
ORDER BY schedule_id
FOR SHARE
"""
"""Share-lock the live, enabled schedules a plan names, until commit. A concurrent delete or
pause waits for the plan (and then skips what it inserted); a plan that waited for one
re-checks the row, finds it deleted or disabled, and inserts nothing for it."""

EXECUTIONS_INSERT_PLANNED: Final = """
INSERT INTO executions (
    execution_id, schedule_id, tenant_id, task_type, partition_id, planned_at, status,
    attempt, enqueued_at, finished_at, error_code, error_message, fencing_token)
SELECT u.execution_id, u.schedule_id, u.tenant_id, u.task_type, $9, u.planned_at, u.status,
       0, now(), CASE WHEN u.status = 'skipped' THEN now() END, u.error_code,
       u.error_message, $10
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::text[],
            $7::text[], $8::text[])
     AS u (execution_id, schedule_id, tenant_id, task_type, planned_at, status, error_code,
           error_message)
ON CONFLICT (execution_id) DO NOTHING
RETURNING execution_id
"""
"""Record planned fires (the caller passes only fires of schedules it locked live with
:data:`SCHEDULES_LOCK_LIVE`); fires already recorded are left alone and not returned.

The live filter is applied in Python, not as ``WHERE schedule_id = ANY($n)``: after five
executions asyncpg's prepared statement gets a generic plan, where ``= ANY($param)`` is a
linear search per row -- quadratic in the batch (measured: 70 ms to 300 ms per 5,000)."""

SCHEDULES_ADVANCE: Final = """
UPDATE schedules AS s SET next_run_at = u.next_run_at
FROM unnest($1::text[], $2::timestamptz[], $3::bigint[])
     AS u (schedule_id, next_run_at, expected_version)
WHERE s.schedule_id = u.schedule_id
  AND s.version = u.expected_version
  AND s.deleted_at IS NULL
RETURNING s.schedule_id
"""

SCHEDULE_ADVANCE_ONE: Final = """
UPDATE schedules SET next_run_at = $2
WHERE schedule_id = $1 AND version = $3 AND deleted_at IS NULL
RETURNING schedule_id
"""
"""One advance at a time, in order: only for a plan that names a schedule twice."""

# --- audit trail ------------------------------------------------------------------------

AUDIT_LOCK: Final = f"SELECT pg_advisory_xact_lock({AUDIT_LOCK_KEY})"
"""Taken right before :data:`AUDIT_APPEND`, held until commit: the next writer draws its
``event_id`` only after this transaction is visible, so ``event_id`` order is commit order."""

AUDIT_APPEND: Final = """
INSERT INTO audit_events (actor, action, target, details)
SELECT $1::text, $2::text, u.target, u.details
FROM unnest($3::text[], $4::jsonb[]) WITH ORDINALITY AS u (target, details, position)
ORDER BY u.position
"""
"""Append events of one actor and action, numbered in the order of the targets given."""


def _executions_purge_select(condition: str) -> str:
    return f"""
WITH doomed AS (
    SELECT execution_id, schedule_id, planned_at FROM executions
    WHERE partition_id = $1 AND {condition}
    ORDER BY finished_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), marked AS ({PURGE_MARKS_UPSERT})
SELECT execution_id FROM doomed
"""


EXECUTIONS_PURGE_SELECT: Final = _executions_purge_select(
    "status IN ('succeeded', 'skipped') AND finished_at < $2"
)
"""Lock the oldest succeeded or skipped executions of partition ``$1`` finished before
``$2`` (at most ``$3``; executions_retention_idx) and record their schedules' purge horizon,
*before* :data:`EXECUTIONS_DELETE` removes them (a backfill locks its mark first)."""

DEAD_LETTERS_EXPIRED_SELECT: Final = _executions_purge_select(
    "status = 'dead-letter' AND planned_at < $2 AND finished_at < $2"
)
"""As :data:`EXECUTIONS_PURGE_SELECT`, for the dead letters of partition ``$1`` finished
before ``$2``. Such a letter was also planned before ``$2``, which bounds the range read of
executions_dead_letter_idx (planned_at) to the old dead letters of every partition."""

EXECUTIONS_DELETE: Final = """
WITH history AS (
    DELETE FROM execution_attempts WHERE execution_id = ANY($1::text[])
), purged AS (
    DELETE FROM executions WHERE execution_id = ANY($1::text[])
    RETURNING 1
)
SELECT count(*) FROM purged
"""
"""Delete executions (locked by the statement before) and their attempt history, in one
statement (the history table has no foreign key: checking one on every completion cost a
fifth of its time)."""

# --- listings: fixed fragments, composed per filter combination --------------------------


@functools.cache
def schedules_list(
    *,
    tenant: bool,
    task_type: bool,
    enabled: bool,
    partition: bool,
    after: bool,
    prefix: bool = False,
) -> str:
    """Live schedules by id; parameters in order: the filters given, the cursor id, the id
    prefix (three parameters: the prefix, its upper bound, the prefix), limit. The prefix
    is a range of the primary key, ``starts_with`` keeping it exact within the range."""
    fragments = [
        ("tenant_id = ${}", tenant),
        ("task_type = ${}", task_type),
        ("enabled = ${}", enabled),
        ("partition_id = ${}", partition),
        ("schedule_id > ${}", after),
        ("schedule_id >= ${} AND schedule_id < ${} AND starts_with(schedule_id, ${})", prefix),
    ]
    where, count = _where(["deleted_at IS NULL"], fragments)
    return (
        f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE {where} "
        f"ORDER BY schedule_id LIMIT ${count + 1}"
    )


@functools.cache
def executions_query(
    *,
    schedule: bool,
    tenant: bool,
    status: ExecutionStatus | None,
    planned_from: bool,
    planned_to: bool,
    after: bool,
    task_type: bool = False,
    finished_from: bool = False,
) -> str:
    """Executions by (planned_at, id); parameters in order: the filters given, the cursor
    (two parameters: planned_at, id), limit.

    The status, one of six, is written into the text rather than passed: a statement per
    status, so that even its generic plan (a connection's sixth call on) knows which partial
    index applies. With the status as a parameter, the generic plan of a tenant's queued
    executions could use no partial index and walked the tenant's whole history through
    executions_tenant_idx, filtering each row: on a 5M-execution ledger, p95 136 ms against
    2.8 ms for the plan made for the value (``benchmarks/bench_listing.py``)."""
    fixed = [] if status is None else [f"status = '{ExecutionStatus(status).value}'"]
    fragments = [
        ("schedule_id = ${}", schedule),
        ("tenant_id = ${}", tenant),
        ("planned_at >= ${}", planned_from),
        ("planned_at < ${}", planned_to),
        ("task_type = ${}", task_type),
        ("finished_at >= ${}", finished_from),
        ("(planned_at, execution_id) > (${}, ${})", after),
    ]
    where, count = _where(fixed, fragments)
    return (
        f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE {where} "
        f"ORDER BY planned_at, execution_id LIMIT ${count + 1}"
    )


@functools.cache
def audit_list(*, target: bool, action: bool, after: bool) -> str:
    """Audit events by event_id; parameters in order: the filters given, the watermark,
    limit."""
    fragments = [
        ("target = ${}", target),
        ("action = ${}", action),
        ("event_id > ${}", after),
    ]
    where, count = _where([], fragments)
    return (
        f"SELECT {AUDIT_COLUMNS} FROM audit_events WHERE {where} "
        f"ORDER BY event_id LIMIT ${count + 1}"
    )


def _where(fixed: list[str], fragments: list[tuple[str, bool]]) -> tuple[str, int]:
    """AND together the fixed clauses and the chosen fragments, numbering ``$n`` in order."""
    clauses = list(fixed)
    count = 0
    for template, chosen in fragments:
        if chosen:
            holes = template.count("${}")
            clauses.append(template.format(*(f"{count + i + 1}" for i in range(holes))))
            count += holes
    return (" AND ".join(clauses) or "true"), count


# --- migrations (engine/ledger/postgres/migrate.py) ------------------------------------------

MIGRATION_TRY_LOCK: Final = f"SELECT pg_try_advisory_lock({MIGRATION_LOCK_KEY})"
"""Tried, not waited for: a session waiting inside ``pg_advisory_lock`` holds a snapshot, and
``CREATE INDEX CONCURRENTLY`` in the lock holder's online migration waits for every older
snapshot of the database -- a deadlock between two nodes migrating at once."""
MIGRATION_UNLOCK: Final = f"SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})"

MIGRATIONS_TABLE_EXISTS: Final = "SELECT to_regclass('carillon_schema_migrations') IS NOT NULL"

MIGRATIONS_TABLE_CREATE: Final = """
CREATE TABLE IF NOT EXISTS carillon_schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
"""The record of applied migration files (created before the first of them runs)."""

MIGRATIONS_APPLIED: Final = """
SELECT version, name, checksum, applied_at FROM carillon_schema_migrations ORDER BY version
"""

MIGRATION_RECORD: Final = """
INSERT INTO carillon_schema_migrations (version, name, checksum) VALUES ($1, $2, $3)
"""

INDEX_INVALID: Final = """
SELECT NOT i.indisvalid FROM pg_index AS i WHERE i.indexrelid = to_regclass($1)
"""
"""Whether index ``$1`` exists and is invalid (a ``CREATE INDEX CONCURRENTLY`` cut short);
NULL when it does not exist."""

CLUSTER_SETTINGS_EXISTS: Final = "SELECT to_regclass('cluster_settings') IS NOT NULL"

CLUSTER_PARTITION_COUNT: Final = "SELECT partition_count FROM cluster_settings"

CLUSTER_PARTITION_COUNT_FOR_UPDATE: Final = CLUSTER_PARTITION_COUNT + " FOR UPDATE"

CLUSTER_INITIALIZE: Final = "INSERT INTO cluster_settings (partition_count) VALUES ($1)"

LEASES_CREATE: Final = """
INSERT INTO partition_leases (partition_id, owner_id, fencing_token, expires_at)
SELECT partition_id, NULL, 0, NULL FROM generate_series(0, $1::integer - 1) AS partition_id
ON CONFLICT (partition_id) DO NOTHING
RETURNING partition_id
"""
"""One free lease row per partition (owner NULL, token 0); existing rows are kept."""

DATABASE_EXISTS: Final = "SELECT true FROM pg_database WHERE datname = $1"

__all__ = [  # re-exported: the shared column lists and keys
    "AUDIT_COLUMNS",
    "AUDIT_LOCK_KEY",
    "CAP_LOCK_SPACE",
    "CHANGES_CHANNEL",
    "CHANGES_LOCK_KEY",
    "EXECUTION_COLUMNS",
    "LEASE_COLUMNS",
    "MIGRATION_LOCK_KEY",
    "NODE_COLUMNS",
    "SCHEDULE_COLUMNS",
    "TASK_TYPE_COLUMNS",
    "TENANT_COLUMNS",
    "TOKEN_COLUMNS",
    "prefixed",
]
