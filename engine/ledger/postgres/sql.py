"""Every SQL statement the Postgres ledger runs, in one place (the schema is in ``migrations/``).

Conventions kept by every statement here:

* **Expiry is judged by the server**: leases, attempt leases and heartbeats compare with
  ``now()`` (the transaction's start on the server's clock), never with a node's clock.
* **Batches travel as arrays**: a write of n rows is one statement over ``unnest($k::type[],
  ...)``, not n statements (ARCHITECTURE.md §7: 55-75k rows/s instead of a few thousand).
* **Partition ids come from Python** (:func:`engine.core.hashing.partition_of`); no statement
  recomputes the hash.
* **Row locks are taken in ascending key order** (``ORDER BY ... FOR SHARE|UPDATE`` puts the
  lock step above the sort), so lease renewals and fenced writes of the same node never
  deadlock each other.
* Listing queries are composed from fixed fragments by the small builders at the end, so
  that each filter combination gets its own prepared statement and its own index.
"""

from __future__ import annotations

import functools
from typing import Final

# --- constants shared with the schema ---------------------------------------------------

CHANGES_CHANNEL: Final = "carillon_schedule_changes"
"""The LISTEN/NOTIFY channel; the payload is the newest ``seq`` of the notifying commit."""

CHANGES_LOCK_KEY: Final = 0x6361726C_63686773  # "carlchgs"
"""Transaction advisory lock serializing schedule-change writers (commit order = seq order)."""

MIGRATION_LOCK_KEY: Final = 0x6361726C_6D696772  # "carlmigr"
"""Session advisory lock held by ``carillon migrate`` while it inspects and changes the schema."""

AUDIT_LOCK_KEY: Final = 0x6361726C_61756474  # "carlaudt"
"""Transaction advisory lock serializing audit writers (commit order = event_id order)."""

CAP_LOCK_SPACE: Final = 0x63617073  # "caps"
"""First key of the two-key transaction advisory locks that serialize the claims of one
capped task type (the second key: :func:`engine.ledger.postgres.caps.cap_lock_key`). Two-key
locks live apart from the one-key locks above."""

SCHEDULE_COLUMNS: Final = (
    "schedule_id, tenant_id, cron_expr, timezone, task_type, payload, enabled, next_run_at, "
    "updated_at, version, partition_id, catch_up, catch_up_window_s, dst_gap, dst_overlap, "
    "overlap"
)
EXECUTION_COLUMNS: Final = (
    "execution_id, schedule_id, tenant_id, task_type, planned_at, status, attempt, "
    "enqueued_at, not_before, started_at, finished_at, error_code, error_message, "
    "fencing_token, partition_id, attempt_expires_at"
)
LEASE_COLUMNS: Final = "partition_id, owner_id, fencing_token, expires_at"
TASK_TYPE_COLUMNS: Final = (
    "name, kind, settings, timeout_s, max_concurrency, max_concurrency_cluster, max_attempts, "
    "backoff_base_s, backoff_max_s, overlap, updated_at, version"
)
TENANT_COLUMNS: Final = (
    "tenant_id, weight, concurrency_quota, rate_per_s, burst, updated_at, version"
)
NODE_COLUMNS: Final = "node_id, region, started_at, last_seen_at, expires_at"
AUDIT_COLUMNS: Final = "event_id, at, actor, action, target, details"


def _prefixed(columns: str, alias: str) -> str:
    return ", ".join(f"{alias}.{column.strip()}" for column in columns.split(","))


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
FOR SHARE OF l
"""
"""The fences that hold, each lease row share-locked until commit: a concurrent takeover
(an UPDATE of the row) waits for this transaction, so the fence holds for all of it."""

# --- task types and tenants -------------------------------------------------------------
#
# A live schedule's task type must exist: schedules.live_task_type references task_types
# (migrations/0001_initial.sql). Schedule writers first key-share-lock the task types they
# name (TASK_TYPES_LOCK, the lock the foreign key itself takes), so that a missing one is
# reported by name; a delete locks its row for update and only then counts the schedules
# using it (TASK_TYPE_USERS), so a create either commits first and is counted, or waits and
# finds the task type gone. Replacing a task type's fields takes a no-key lock, which does
# not conflict with schedule writers.

TASK_TYPES_LOCK: Final = """
SELECT name FROM task_types WHERE name = ANY($1::text[]) ORDER BY name FOR KEY SHARE
"""

TASK_TYPE_PUT: Final = f"""
WITH current AS (SELECT version FROM task_types WHERE name = $1 FOR NO KEY UPDATE)
INSERT INTO task_types AS t (
    name, kind, settings, timeout_s, max_concurrency, max_concurrency_cluster, max_attempts,
    backoff_base_s, backoff_max_s, overlap, updated_at, version)
SELECT $1::text, $2::text, $3::jsonb, $4::double precision, $5::integer, $6::integer,
       $7::integer, $8::double precision, $9::double precision, $10::text, now(), 1
WHERE $11::bigint IS NULL OR $11::bigint = coalesce((SELECT version FROM current), 0)
ON CONFLICT (name) DO UPDATE SET
    kind = EXCLUDED.kind, settings = EXCLUDED.settings, timeout_s = EXCLUDED.timeout_s,
    max_concurrency = EXCLUDED.max_concurrency,
    max_concurrency_cluster = EXCLUDED.max_concurrency_cluster,
    max_attempts = EXCLUDED.max_attempts, backoff_base_s = EXCLUDED.backoff_base_s,
    backoff_max_s = EXCLUDED.backoff_max_s, overlap = EXCLUDED.overlap,
    updated_at = now(), version = t.version + 1
WHERE $11::bigint IS NULL OR t.version = $11::bigint
RETURNING {_prefixed(TASK_TYPE_COLUMNS, "t")}
"""
"""Create or replace, optimistically. Without an expected version (``$11`` NULL) the row is
inserted or replaced. With one, a row is proposed only if it matches the locked current
version (0 when absent), and replaced only if it still does; otherwise nothing is returned.
The no-key lock leaves schedule writers' key-share locks alone; concurrent creates of one
name meet on the key, and the second then replaces (or, expecting 0, returns nothing)."""

TASK_TYPE_VERSION: Final = "SELECT version FROM task_types WHERE name = $1"

TASK_TYPE_GET: Final = f"SELECT {TASK_TYPE_COLUMNS} FROM task_types WHERE name = $1"

TASK_TYPES_LIST: Final = f"SELECT {TASK_TYPE_COLUMNS} FROM task_types ORDER BY name"

TASK_TYPE_LOCK_FOR_DELETE: Final = "SELECT name FROM task_types WHERE name = $1 FOR UPDATE"

TASK_TYPE_USERS: Final = """
SELECT schedule_id, count(*) OVER () AS total FROM schedules
WHERE task_type = $1 AND deleted_at IS NULL ORDER BY schedule_id LIMIT $2
"""
"""The first live schedules naming a task type, each row with how many there are in all (a
scan: deleting a task type is rare, and an index would slow every planner advance)."""

TASK_TYPE_DELETE: Final = f"DELETE FROM task_types WHERE name = $1 RETURNING {TASK_TYPE_COLUMNS}"

TENANT_PUT: Final = f"""
WITH current AS (SELECT version FROM tenants WHERE tenant_id = $1 FOR NO KEY UPDATE)
INSERT INTO tenants AS t (
    tenant_id, weight, concurrency_quota, rate_per_s, burst, updated_at, version)
SELECT $1::text, $2::integer, $3::integer, $4::double precision, $5::integer, now(), 1
WHERE $6::bigint IS NULL OR $6::bigint = coalesce((SELECT version FROM current), 0)
ON CONFLICT (tenant_id) DO UPDATE SET
    weight = EXCLUDED.weight, concurrency_quota = EXCLUDED.concurrency_quota,
    rate_per_s = EXCLUDED.rate_per_s, burst = EXCLUDED.burst,
    updated_at = now(), version = t.version + 1
WHERE $6::bigint IS NULL OR t.version = $6::bigint
RETURNING {_prefixed(TENANT_COLUMNS, "t")}
"""
"""As :data:`TASK_TYPE_PUT`, with the expected version in ``$6``."""

TENANT_VERSION: Final = "SELECT version FROM tenants WHERE tenant_id = $1"

TENANT_GET: Final = f"SELECT {TENANT_COLUMNS} FROM tenants WHERE tenant_id = $1"

TENANTS_LIST: Final = f"SELECT {TENANT_COLUMNS} FROM tenants ORDER BY tenant_id"

# --- schedules --------------------------------------------------------------------------

SCHEDULES_LIVE_IDS: Final = """
SELECT schedule_id FROM schedules
WHERE schedule_id = ANY($1::text[]) AND deleted_at IS NULL
ORDER BY schedule_id
"""

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
WHERE s.deleted_at IS NOT NULL
RETURNING {_prefixed(SCHEDULE_COLUMNS, "s")}
"""
"""Insert new schedules and revive deleted ones; a live row is left alone and not returned
(a concurrent create of the same id committed first)."""

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
SET status = 'skipped', error_code = 'schedule_deleted',
    error_message = 'the schedule was deleted before this execution started',
    finished_at = now(), not_before = NULL
WHERE schedule_id = $1 AND status IN ('queued', 'failed')
"""
"""Run as a *later statement* than :data:`SCHEDULE_SOFT_DELETE` of the same transaction:
under READ COMMITTED it sees every execution a planner committed while holding the
schedule row, and a planner that comes later no longer finds the schedule live."""

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
SELECT seq, schedule_id, partition_id, kind, version FROM schedule_changes
WHERE seq > $1 ORDER BY seq LIMIT $2
"""

CHANGES_NEWEST: Final = "SELECT coalesce(max(seq), 0) FROM schedule_changes"

# --- leases, membership, checkpoints ----------------------------------------------------

LEASES_ACQUIRE: Final = f"""
WITH free AS (
    SELECT partition_id FROM partition_leases
    WHERE partition_id = ANY($1::integer[])
      AND (owner_id IS NULL OR expires_at IS NULL OR expires_at <= now())
    ORDER BY partition_id
    FOR UPDATE SKIP LOCKED
)
UPDATE partition_leases AS l
SET owner_id = $2, fencing_token = l.fencing_token + 1,
    expires_at = now() + make_interval(secs => $3)
FROM free WHERE l.partition_id = free.partition_id
RETURNING {_prefixed(LEASE_COLUMNS, "l")}
"""
"""Take free or expired partitions. A row locked by someone else's transaction (a rival
acquiring it, or the previous owner's last fenced write) is skipped, never waited for."""

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
    FOR UPDATE OF l
)
"""

LEASES_RENEW: Final = f"""{_LEASES_HELD_LOCKED}
UPDATE partition_leases AS l SET expires_at = now() + make_interval(secs => $4)
FROM held WHERE l.partition_id = held.partition_id
RETURNING {_prefixed(LEASE_COLUMNS, "l")}
"""

LEASES_RELEASE: Final = f"""{_LEASES_HELD_LOCKED}
UPDATE partition_leases AS l SET owner_id = NULL, expires_at = NULL
FROM held WHERE l.partition_id = held.partition_id
RETURNING l.partition_id
"""
"""Owner cleared, token kept (the next acquisition increments it)."""

LEASES_LIST: Final = f"SELECT {LEASE_COLUMNS} FROM partition_leases ORDER BY partition_id"

NODES_HEARTBEAT: Final = f"""
INSERT INTO nodes AS n (node_id, region, started_at, last_seen_at, expires_at)
VALUES ($1, $2, now(), now(), now() + make_interval(secs => $3))
ON CONFLICT (node_id) DO UPDATE SET
    region = EXCLUDED.region,
    started_at = CASE WHEN n.expires_at > now() THEN n.started_at ELSE now() END,
    last_seen_at = EXCLUDED.last_seen_at,
    expires_at = EXCLUDED.expires_at
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
WHERE schedule_id = ANY($1::text[]) AND deleted_at IS NULL
ORDER BY schedule_id
FOR SHARE
"""
"""Share-lock the live schedules a plan names, until commit. A concurrent delete waits for
the plan (and then skips what it inserted); a plan that waited for a delete re-checks the
row, finds it deleted, and inserts nothing for it."""

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

# --- execution --------------------------------------------------------------------------

# "Startable by t": queued and planned by t, or failed with its retry due by t. startable_at
# is a generated column holding exactly that instant (migrations/0001_initial.sql), so the
# test is one indexed range per partition.

EXECUTIONS_DUE: Final = f"""
SELECT {EXECUTION_COLUMNS} FROM executions
WHERE partition_id = ANY($1::integer[])
  AND status IN ('queued', 'failed')
  AND startable_at <= $2
  AND (startable_at, execution_id) > ($4::timestamptz, $5::text)
ORDER BY startable_at, execution_id
LIMIT $3
"""

_CLAIM_UPDATE: Final = """
UPDATE executions AS e
SET status = 'running', attempt = e.attempt + 1, started_at = now(), finished_at = NULL,
    attempt_expires_at = now() + make_interval(secs => $2), not_before = NULL,
    error_code = NULL, error_message = NULL, fencing_token = f.fencing_token, claimed_by = $3
"""
"""The claim's effect, for an UPDATE joined to the fences as ``f``; every claim statement
passes the ids in ``$1``, the attempt lease in ``$2`` and the node in ``$3``."""


def fence_cte(partitions: int, owners: int, tokens: int) -> str:
    """The in-statement fence check of claim and complete, as CTEs ``fence`` (the fences that
    hold: partition and token) and ``held`` (one row: ``fences_held``, their count, and
    ``holding``, their partitions), given the parameter numbers of the partition, owner and
    token arrays. A statement built on it writes only if ``held.fences_held`` equals the
    number of fences passed, and returns ``held`` with its rows so the caller can tell
    (:func:`engine.ledger.postgres.fencing.check_held`). The write itself joins the token
    array, not ``fence``: the planner takes a CTE for one row, and with ``fence`` as the
    outer side it re-scanned the batch's ids once per partition (measured: 4x slower)."""
    return f"""fence AS (
    SELECT l.partition_id, l.fencing_token
    FROM partition_leases AS l
    JOIN unnest(${partitions}::integer[], ${owners}::text[], ${tokens}::bigint[])
         AS f (partition_id, owner_id, fencing_token)
      ON l.partition_id = f.partition_id
     AND l.owner_id = f.owner_id
     AND l.fencing_token = f.fencing_token
    WHERE l.expires_at > now()
), held AS (
    SELECT count(*) AS fences_held, array_agg(partition_id) AS holding FROM fence
)"""


EXECUTIONS_CLAIM: Final = f"""
WITH {fence_cte(4, 5, 6)}, claimed AS ({_CLAIM_UPDATE}
    FROM unnest($4::integer[], $6::bigint[]) AS f (partition_id, fencing_token)
    WHERE e.execution_id = ANY($1::text[])
      AND e.partition_id = f.partition_id
      AND (SELECT fences_held FROM held) = cardinality($4::integer[])
      AND e.status IN ('queued', 'failed')
      AND e.startable_at <= now()
      AND NOT EXISTS (
          SELECT 1 FROM task_types AS t
          WHERE t.name = e.task_type AND t.max_concurrency_cluster IS NOT NULL)
    RETURNING {_prefixed(EXECUTION_COLUMNS, "e")}
)
SELECT held.fences_held, held.holding, claimed.* FROM held LEFT JOIN claimed ON true
"""
"""Claim the listed startable executions whose task type has no cluster cap, fenced in the
statement (the fast path: a batch of those needs nothing else; the few task types make the
anti-join one small hash). One row per claimed execution, each with ``held``; a single row
of ``held`` and NULLs when none was claimed. ``$1`` ids, ``$2`` attempt lease, ``$3`` node,
``$4``-``$6`` fences."""

# Cluster-wide concurrency caps (engine/ledger/postgres/caps.py). Only when EXECUTIONS_CLAIM
# left some ids unclaimed does a claim look for startable ones of capped task types among
# them (TASK_TYPES_CAPPED_AMONG); if there are, it locks those types (CAP_LOCKS, in key
# order) and claims them with EXECUTIONS_CLAIM_CAPPED: a later statement, so its snapshot
# sees every claim committed by the locks' previous holders, and it counts and claims at once.

TASK_TYPES_CAPPED_AMONG: Final = """
SELECT DISTINCT e.task_type FROM executions AS e
JOIN task_types AS t ON t.name = e.task_type AND t.max_concurrency_cluster IS NOT NULL
WHERE e.execution_id = ANY($1::text[])
  AND e.status IN ('queued', 'failed')
  AND e.startable_at <= now()
ORDER BY e.task_type
"""
"""The capped task types of the startable executions among ``$1``."""

CAP_LOCKS: Final = f"""
SELECT pg_advisory_xact_lock({CAP_LOCK_SPACE}, key) FROM unnest($1::integer[]) AS key
"""
"""Lock the capped task types' keys until commit, in the order given (the caller sorts them,
so two claims locking several types never deadlock)."""

EXECUTIONS_CLAIM_CAPPED: Final = f"""
WITH caps AS (
    SELECT name AS task_type, max_concurrency_cluster AS cap FROM task_types
    WHERE name = ANY($6::text[]) AND max_concurrency_cluster IS NOT NULL
), running AS (
    SELECT task_type, count(*) AS n FROM executions
    WHERE status = 'running' AND task_type = ANY($6::text[])
    GROUP BY task_type
), ranked AS (
    SELECT e.execution_id,
           caps.cap - coalesce(running.n, 0) AS room,
           row_number() OVER (PARTITION BY e.task_type ORDER BY u.position) AS rank
    FROM unnest($1::text[]) WITH ORDINALITY AS u (execution_id, position)
    JOIN executions AS e ON e.execution_id = u.execution_id
    JOIN caps ON caps.task_type = e.task_type
    LEFT JOIN running ON running.task_type = e.task_type
    WHERE e.status IN ('queued', 'failed')
      AND e.startable_at <= now()
      AND e.partition_id = ANY($4::integer[])
){_CLAIM_UPDATE}
FROM ranked, unnest($4::integer[], $5::bigint[]) AS f (partition_id, fencing_token)
WHERE e.execution_id = ranked.execution_id
  AND ranked.rank <= ranked.room
  AND e.partition_id = f.partition_id
  AND e.status IN ('queued', 'failed')
  AND e.startable_at <= now()
RETURNING {_prefixed(EXECUTION_COLUMNS, "e")}
"""
"""Claim the startable executions of the capped task types ``$6`` (whose locks the caller
holds): per type, the first ``cap - running`` of them in the order of ``$1``. Caps are
re-read here, under the lock; the running count uses executions_running_task_type_idx."""

EXECUTIONS_EXTEND: Final = """
UPDATE executions AS e
SET attempt_expires_at = now() + make_interval(secs => $3), fencing_token = f.fencing_token
FROM unnest($1::text[], $2::integer[]) AS a (execution_id, attempt),
     unnest($4::integer[], $5::bigint[]) AS f (partition_id, fencing_token)
WHERE e.execution_id = a.execution_id
  AND e.attempt = a.attempt
  AND e.status = 'running'
  AND e.partition_id = f.partition_id
RETURNING e.execution_id
"""
"""Renew the attempt leases of the listed attempts that are still running."""

EXECUTIONS_COMPLETE: Final = f"""
WITH {fence_cte(7, 8, 9)}, c AS (
    SELECT * FROM unnest($1::text[], $2::integer[], $3::text[], $4::timestamptz[],
                         $5::text[], $6::text[])
         AS c (execution_id, attempt, outcome, not_before, error_code, error_message)
), finished AS (
    UPDATE executions AS e
    SET status = c.outcome,
        finished_at = CASE WHEN c.outcome = 'failed' THEN NULL ELSE now() END,
        not_before = CASE WHEN c.outcome = 'failed' THEN coalesce(c.not_before, now()) END,
        attempt_expires_at = NULL,
        error_code = c.error_code, error_message = c.error_message,
        fencing_token = f.fencing_token
    FROM c, unnest($7::integer[], $9::bigint[]) AS f (partition_id, fencing_token)
    WHERE e.execution_id = c.execution_id
      AND e.attempt = c.attempt
      AND e.status = 'running'
      AND e.partition_id = f.partition_id
      AND (SELECT fences_held FROM held) = cardinality($7::integer[])
    RETURNING e.execution_id, e.attempt, c.outcome, e.started_at, e.error_code,
              e.error_message, e.claimed_by
), recorded AS (
    INSERT INTO execution_attempts (
        execution_id, attempt, outcome, started_at, finished_at, error_code, error_message,
        claimed_by)
    SELECT execution_id, attempt, outcome, started_at, now(), error_code, error_message,
           claimed_by
    FROM finished
    WHERE outcome <> 'succeeded'
)
SELECT held.fences_held, held.holding, finished.execution_id, finished.attempt
FROM held LEFT JOIN finished ON true
"""
"""Finish the current attempts and record them in the history, fenced, in one statement.
A succeeded attempt is not copied to the history: a succeeded execution never changes again,
so its row is that attempt's record (``executions_get`` shows it from there; measured: the
complete costs a fifth less).
``finished_at`` is set exactly while an execution is terminal, so a failed attempt leaves it
empty and waits for ``not_before`` (now, when the worker gave no retry time). Rows as
:data:`EXECUTIONS_CLAIM`: ``held`` with each recorded attempt, or alone."""

EXECUTIONS_SKIP: Final = """
UPDATE executions AS e
SET status = 'skipped', error_code = $2, error_message = $3, finished_at = now(),
    not_before = NULL, fencing_token = f.fencing_token
FROM unnest($4::integer[], $5::bigint[]) AS f (partition_id, fencing_token)
WHERE e.execution_id = ANY($1::text[])
  AND e.partition_id = f.partition_id
  AND e.status IN ('queued', 'failed')
RETURNING e.execution_id
"""
"""Skip not-yet-started executions on purpose (the overlap policy); no attempt is recorded."""

EXECUTIONS_REQUEUE_EXPIRED: Final = """
WITH expired AS (
    SELECT execution_id FROM executions
    WHERE partition_id = ANY($1::integer[])
      AND status = 'running'
      AND attempt_expires_at <= now()
    ORDER BY planned_at, execution_id
    LIMIT $2
    FOR UPDATE
), requeued AS (
    UPDATE executions AS e
    SET status = 'queued', attempt_expires_at = NULL, fencing_token = f.fencing_token
    FROM expired, unnest($1::integer[], $3::bigint[]) AS f (partition_id, fencing_token)
    WHERE e.execution_id = expired.execution_id AND e.partition_id = f.partition_id
    RETURNING e.execution_id, e.attempt, e.started_at, e.claimed_by, e.planned_at
), recorded AS (
    INSERT INTO execution_attempts (
        execution_id, attempt, outcome, started_at, finished_at, claimed_by)
    SELECT execution_id, attempt, 'expired', started_at, now(), claimed_by FROM requeued
)
SELECT execution_id FROM requeued ORDER BY planned_at, execution_id
"""

EXECUTION_GET: Final = f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE execution_id = $1"

ATTEMPTS_GET: Final = """
SELECT attempt, outcome, started_at, finished_at, error_code, error_message
FROM execution_attempts WHERE execution_id = $1 ORDER BY attempt
"""

DEAD_LETTERS_REPLAY: Final = """
WITH letters AS (
    SELECT execution_id, attempt, error_code FROM executions
    WHERE execution_id = ANY($1::text[]) AND status = 'dead-letter'
    ORDER BY execution_id
    FOR UPDATE
)
UPDATE executions AS e
SET status = 'queued', enqueued_at = now(), not_before = NULL, finished_at = NULL,
    error_code = NULL, error_message = NULL
FROM letters
WHERE e.execution_id = letters.execution_id
RETURNING e.execution_id, letters.attempt, letters.error_code
"""
"""Replay dead letters, returning what the audit trail records of each: its attempt count
and the error code it was dead-lettered with (read, locked, before the update clears it)."""

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

EXECUTIONS_PURGE: Final = """
WITH doomed AS (
    SELECT execution_id FROM executions
    WHERE partition_id = $1
      AND status IN ('succeeded', 'skipped')
      AND finished_at < $2
    ORDER BY finished_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
), history AS (
    DELETE FROM execution_attempts AS a USING doomed
    WHERE a.execution_id = doomed.execution_id
), purged AS (
    DELETE FROM executions AS e USING doomed
    WHERE e.execution_id = doomed.execution_id
    RETURNING 1
)
SELECT count(*) FROM purged
"""
"""Delete old terminal executions and their attempt history, in one statement (the history
table has no foreign key: checking one on every completion cost a fifth of its time)."""

# --- listings: fixed fragments, composed per filter combination --------------------------


@functools.cache
def schedules_list(
    *, tenant: bool, task_type: bool, enabled: bool, partition: bool, after: bool
) -> str:
    """Live schedules by id; parameters in order: the filters given, the cursor id, limit."""
    fragments = [
        ("tenant_id = ${}", tenant),
        ("task_type = ${}", task_type),
        ("enabled = ${}", enabled),
        ("partition_id = ${}", partition),
        ("schedule_id > ${}", after),
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
    status: bool,
    planned_from: bool,
    planned_to: bool,
    after: bool,
    task_type: bool = False,
    finished_from: bool = False,
) -> str:
    """Executions by (planned_at, id); parameters in order: the filters given, the cursor
    (two parameters: planned_at, id), limit."""
    fragments = [
        ("schedule_id = ${}", schedule),
        ("tenant_id = ${}", tenant),
        ("status = ${}", status),
        ("planned_at >= ${}", planned_from),
        ("planned_at < ${}", planned_to),
        ("task_type = ${}", task_type),
        ("finished_at >= ${}", finished_from),
        ("(planned_at, execution_id) > (${}, ${})", after),
    ]
    where, count = _where([], fragments)
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

MIGRATION_LOCK: Final = f"SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})"
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
