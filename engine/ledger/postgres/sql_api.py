"""The statements of the HTTP API's ledger operations: API tokens and console sessions
(:mod:`engine.ledger.postgres.tokens`), executions added by an operator (trigger, backfill:
:mod:`engine.ledger.postgres.audit`), the per-tenant schedule quota and the schedule census
(:mod:`engine.ledger.postgres.schedules`; the quota check runs inside ``schedules_create``)
and the execution statistics (:mod:`engine.ledger.postgres.executions`). The conventions of
:mod:`engine.ledger.postgres.sql` hold here.

Lock order. Trigger and backfill share-lock the schedule row first (a concurrent delete or
pause then waits, and its later statement skips what they inserted; one of theirs that
waited finds the schedule gone and inserts nothing), insert, and end with the two advisory
locks held to commit: the audit trail's, then the change feed's. No other transaction takes
both, so the order cannot deadlock. A create locks the quota'd tenant rows in key order,
after the task types it names.
"""

from __future__ import annotations

from typing import Final

from engine.ledger.postgres.sql_columns import EXECUTION_COLUMNS, TOKEN_COLUMNS

# --- API tokens (migrations/0004_api.sql) ------------------------------------------------

TOKEN_INSERT: Final = f"""
INSERT INTO api_tokens (token_id, token_hash, scope, description, created_at)
VALUES ($1, $2, $3, $4, now())
ON CONFLICT DO NOTHING
RETURNING {TOKEN_COLUMNS}
"""
"""Store a token; nothing is returned if its id or its hash is taken (either unique key)."""

TOKEN_ID_TAKEN: Final = "SELECT true FROM api_tokens WHERE token_id = $1"

TOKEN_BY_HASH: Final = f"SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE token_hash = $1"
"""Authentication: one probe of the hash's unique index."""

TOKENS_LIST: Final = f"SELECT {TOKEN_COLUMNS} FROM api_tokens ORDER BY token_id"

TOKEN_GET: Final = f"SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE token_id = $1"

TOKEN_REVOKE: Final = f"""
UPDATE api_tokens SET revoked_at = now() WHERE token_id = $1 AND revoked_at IS NULL
RETURNING {TOKEN_COLUMNS}
"""
"""Revoke once: of two concurrent revocations the second waits for the row, finds it
revoked, and returns nothing (then it reads the token and appends no event)."""

# --- console sessions (migrations/0008_console_sessions.sql) --------------------------------

SESSION_COLUMNS: Final = (
    "s.token_id, t.scope, s.created_at, s.last_seen_at, "
    "extract(epoch FROM s.idle_timeout)::float8 AS idle_timeout_s, s.expires_at, s.revoked_at"
)

SESSIONS_PURGE: Final = """
DELETE FROM console_sessions WHERE session_hash IN (
    SELECT session_hash FROM console_sessions WHERE expires_at <= now()
    ORDER BY expires_at LIMIT $1
)
"""
"""Forget at most ``$1`` sessions past their absolute expiry, oldest first
(``console_sessions_expires_idx``)."""

SESSION_TOKEN_LOCK: Final = """
SELECT scope FROM api_tokens WHERE token_id = $1 AND revoked_at IS NULL FOR SHARE
"""
"""The token a session is opened with, if it is valid, share-locked to commit: a concurrent
revocation waits for the new session and then revokes it too, or the session's insert waits
for the revocation and then finds no valid token."""

SESSION_INSERT: Final = """
INSERT INTO console_sessions (
    session_hash, token_id, created_at, last_seen_at, idle_timeout, expires_at)
VALUES ($1, $2, now(), now(), make_interval(secs => $3), now() + make_interval(secs => $4))
ON CONFLICT DO NOTHING
RETURNING token_id, created_at, last_seen_at,
    extract(epoch FROM idle_timeout)::float8 AS idle_timeout_s, expires_at, revoked_at
"""
"""Open a session; nothing is returned if its hash is taken."""

SESSION_TOUCH: Final = f"""
UPDATE console_sessions AS s SET last_seen_at = now()
FROM api_tokens AS t
WHERE s.session_hash = $1 AND t.token_id = s.token_id
  AND s.revoked_at IS NULL AND t.revoked_at IS NULL
  AND now() < s.expires_at AND now() < s.last_seen_at + s.idle_timeout
RETURNING {SESSION_COLUMNS}
"""
"""Use a session: one probe of the primary key and of the token's; nothing is returned
unless it is valid now."""

SESSION_REVOKE: Final = """
UPDATE console_sessions SET revoked_at = now()
WHERE session_hash = $1 AND revoked_at IS NULL
  AND now() < expires_at AND now() < last_seen_at + idle_timeout
"""
"""Sign out: end the session if it has not ended."""

SESSIONS_REVOKE_FOR_TOKEN: Final = """
UPDATE console_sessions SET revoked_at = now() WHERE token_id = $1 AND revoked_at IS NULL
"""
"""End every open session of a token being revoked (``console_sessions_token_idx``)."""

# --- operator-added executions -----------------------------------------------------------

SCHEDULE_LOCK_FOR_ADD: Final = """
SELECT tenant_id, task_type, partition_id, version, clock_timestamp() AS now
FROM schedules WHERE schedule_id = $1 AND deleted_at IS NULL
FOR SHARE
"""
"""Share-lock a live schedule (enabled or not) that executions are added to, and read what
they copy from it with the server's clock at that moment (``now``: a trigger's instant, the
bound a backfill's instants must not pass)."""

PURGE_MARK_GET: Final = """
SELECT purged_through FROM execution_purge_marks WHERE schedule_id = $1
"""
"""The schedule's purge horizon (NULL: nothing of it was ever purged)."""

PURGE_MARK_LOCK: Final = """
INSERT INTO execution_purge_marks AS m (schedule_id, purged_through) VALUES ($1, NULL)
ON CONFLICT (schedule_id) DO UPDATE SET purged_through = m.purged_through
RETURNING purged_through
"""
"""Read the schedule's purge horizon with its row locked until commit (inserted, empty, if
absent), so that no purge of the schedule's executions can commit between this read and
the backfill's inserts; a purge that holds the row already is waited for and then seen."""

_INSERT_ADDED: Final = """
INSERT INTO executions (
    execution_id, schedule_id, tenant_id, task_type, partition_id, planned_at, status,
    attempt, enqueued_at)
SELECT u.execution_id, $3, $4, $5, $6, u.planned_at, 'queued', 0, now()
FROM unnest($1::text[], $2::timestamptz[]) AS u (execution_id, planned_at)
ON CONFLICT (execution_id) DO NOTHING
"""

EXECUTIONS_INSERT_ADDED: Final = _INSERT_ADDED + "RETURNING execution_id"
"""Insert queued executions of schedule ``$3`` (tenant ``$4``, task type ``$5``, partition
``$6``) at the instants ``$2`` under the ids ``$1``, written under no lease
(``fencing_token`` NULL); ids that exist, in any status, are left alone and not returned.
Their instants have passed, so ``startable_at`` (= ``planned_at``) puts them in the due
index at once."""

EXECUTION_INSERT_TRIGGERED: Final = _INSERT_ADDED + f"RETURNING {EXECUTION_COLUMNS}"
""":data:`EXECUTIONS_INSERT_ADDED` for one id, returning the whole row (a trigger's reply)."""

# --- schedule quota and census -----------------------------------------------------------

TENANT_QUOTAS_LOCK: Final = """
SELECT tenant_id, schedules_max FROM tenants
WHERE tenant_id = ANY($1::text[]) AND schedules_max IS NOT NULL
ORDER BY tenant_id
FOR UPDATE
"""
"""Lock the rows of the tenants named by a create that have a quota, in key order, until
commit: the creates of one such tenant run one at a time from here, and each counts in a
later statement (:data:`SCHEDULES_COUNT_BY_TENANT`) that sees every schedule committed by
the lock's previous holders -- so concurrent creates cannot pass the quota together.
Tenants without a quota are not locked; one whose quota is set meanwhile is held to it
from the next create on."""

SCHEDULES_COUNT_BY_TENANT: Final = """
SELECT tenant_id, count(*) AS count FROM schedules
WHERE tenant_id = ANY($1::text[]) AND deleted_at IS NULL
GROUP BY tenant_id
"""
"""Live schedules per tenant: an index-only range of schedules_tenant_live_idx each."""

SCHEDULES_COUNT: Final = """
SELECT count(*) FROM schedules WHERE tenant_id = $1 AND deleted_at IS NULL
"""

_CENSUS: Final = """
SELECT cron_expr, timezone, dst_gap, dst_overlap, tenant_id, task_type, count(*) AS count,
       min(schedule_id COLLATE "C") AS sample_schedule_id
FROM schedules
WHERE deleted_at IS NULL AND enabled {tenant}
GROUP BY cron_expr, timezone, dst_gap, dst_overlap, tenant_id, task_type
ORDER BY count DESC, cron_expr COLLATE "C", timezone COLLATE "C", dst_gap COLLATE "C",
         dst_overlap COLLATE "C", tenant_id COLLATE "C", task_type COLLATE "C"
LIMIT $1
"""

SCHEDULES_CENSUS: Final = _CENSUS.format(tenant="")
"""The enabled live schedules grouped by how they fire, biggest group first, at most ``$1``
groups. Ordered and sampled by code point (``COLLATE "C"``), whatever the database's
collation, as the memory ledger orders them. A full scan: the load forecast reads it
rarely, and an index on the six columns would cost every schedule write."""

SCHEDULES_CENSUS_OF_TENANT: Final = _CENSUS.format(tenant="AND tenant_id = $2")
""":data:`SCHEDULES_CENSUS` of tenant ``$2`` (a range of schedules_tenant_live_idx)."""

# --- execution statistics ----------------------------------------------------------------

_STATS: Final = """
WITH RECURSIVE tenants AS (
    {tenants}
), picked AS (
    SELECT e.planned_at, e.status, e.attempt, e.enqueued_at, e.finished_at,
           CASE WHEN e.attempt = 1 THEN e.started_at
                WHEN e.attempt > 1 THEN (
                    SELECT a.started_at FROM execution_attempts AS a
                    WHERE a.execution_id = e.execution_id AND a.attempt = 1)
           END AS first_started_at
    FROM tenants AS t
    CROSS JOIN LATERAL (
        SELECT execution_id, planned_at, status, attempt, enqueued_at, started_at, finished_at
        FROM executions
        WHERE tenant_id = t.tenant_id AND planned_at >= $1 AND planned_at < $2
        OFFSET 0  -- kept a per-tenant range: never flattened into a scan of the table
    ) AS e
    WHERE t.tenant_id IS NOT NULL
)
SELECT false AS happened,
       floor(extract(epoch FROM planned_at - $1) / $3)::int AS bucket,
       count(*) AS planned,
       count(first_started_at) AS started,
       count(*) FILTER (
           WHERE first_started_at - planned_at <= make_interval(secs => $4)) AS on_time,
       count(*) FILTER (WHERE status = 'dead-letter') AS dead_letters,
       max(greatest(0, extract(epoch FROM least(enqueued_at, first_started_at) - planned_at)))
           ::float8 AS plan_lag_s_max
FROM picked GROUP BY bucket
UNION ALL
SELECT true, floor(extract(epoch FROM coalesce(first_started_at, finished_at) - $1) / $3)::int,
       count(first_started_at), count(*) - count(first_started_at), 0, 0, 0
FROM picked
WHERE first_started_at IS NOT NULL OR (status = 'skipped' AND attempt = 0)
GROUP BY 2
"""

EXECUTIONS_STATS: Final = _STATS.format(
    tenants="""(SELECT tenant_id FROM executions ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT e.tenant_id FROM executions AS e WHERE e.tenant_id > t.tenant_id
            ORDER BY e.tenant_id LIMIT 1)
    FROM tenants AS t WHERE t.tenant_id IS NOT NULL"""
)
"""Histograms of the executions planned in ``[$1, $2)`` in buckets of ``$3`` seconds, ``$4``
the on-time bound: one row per bucket by planned time (``happened`` false: planned,
started, on time, dead letters, plan lag) and one per bucket by when first attempts started
(``happened`` true: starts in ``planned``, skips in ``started``); the caller drops buckets
outside the range. No index leads with planned_at, and one there would cost every
execution write; instead the tenants are walked with a loose index scan of
executions_tenant_idx (one probe per distinct tenant) and each tenant's range of it read:
the cost is a probe per tenant plus the executions of the range. Attempt 1's start is
read from execution_attempts' key only for executions past their first attempt."""

EXECUTIONS_STATS_OF_TENANT: Final = _STATS.format(tenants="SELECT $5::text AS tenant_id")
""":data:`EXECUTIONS_STATS` of tenant ``$5``: one range of executions_tenant_idx."""
