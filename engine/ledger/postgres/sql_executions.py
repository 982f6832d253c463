"""The execution statements of the Postgres ledger: due, claim (with its in-statement fence
and the cluster-wide caps), extend, complete, finish (a folded claim), skip, requeue, get,
replay and purge. Part of :mod:`engine.ledger.postgres.sql`, which re-exports every name;
the conventions stated there hold here.
"""

from __future__ import annotations

from typing import Final

from engine.ledger.postgres.sql_columns import (
    CAP_LOCK_SPACE,
    EXECUTION_COLUMNS,
    PURGE_MARKS_UPSERT,
    prefixed,
)

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

EXECUTIONS_DUE_TENANT: Final = f"""
SELECT {EXECUTION_COLUMNS} FROM executions
WHERE tenant_id = $6
  AND partition_id = ANY($1::integer[])
  AND status IN ('queued', 'failed')
  AND startable_at <= $2
  AND (startable_at, execution_id) > ($4::timestamptz, $5::text)
ORDER BY startable_at, execution_id
LIMIT $3
"""
"""``EXECUTIONS_DUE`` for one tenant: a range scan of executions_tenant_startable_idx
(migrations/0005_due_by_tenant.sql) instead of reading past every other tenant's backlog."""

# Statements that read or write executions named by id find them by primary key, whatever
# the statistics say. Two habits keep the planner there:
#
# - The status is tested as ``e.status || ''``. No partial index's predicate (status =
#   'running', status IN ('queued', 'failed')) can be proven from that expression, so those
#   indexes are out of the running. Statistics taken mid-burst once made a completion
#   hash-join its batch against every running execution, read through
#   executions_running_task_type_idx and the dead entries a burst leaves in it: each batch
#   cost O(running) instead of O(batch), and the first whole minute after a 200,000 burst
#   crawled (docs/ledger.md, "Dead row versions after a burst").
# - The fencing token comes from the arrays by position, not from a join with their unnest:
#   the planner, expecting one row, re-ran that 64-row unnest for every execution (measured:
#   9 us a row, most of a claim's or completion's join).


def status_test(statuses: str) -> str:
    """``e``'s status among ``statuses`` (an SQL list, ``'running'`` or ``'queued', 'failed'``),
    in a form no partial index applies to (see above)."""
    return f"e.status || '' IN ({statuses})"


def fenced_partition(partitions: int) -> str:
    """``e`` is in one of the fenced partitions, parameter ``$partitions``."""
    return f"e.partition_id = ANY(${partitions}::integer[])"


def fenced_token(partitions: int, tokens: int) -> str:
    """The caller's fencing token for ``e``'s partition, from the parallel arrays."""
    return f"(${tokens}::bigint[])[array_position(${partitions}::integer[], e.partition_id)]"


def claim_update(partitions: int, tokens: int) -> str:
    """The claim's effect; every claim statement passes the ids in ``$1``, the attempt lease
    in ``$2`` and the node in ``$3``, and the fences' partitions and tokens as given."""
    return f"""
UPDATE executions AS e
SET status = 'running', attempt = e.attempt + 1, started_at = now(), finished_at = NULL,
    attempt_expires_at = now() + make_interval(secs => $2), not_before = NULL,
    error_code = NULL, error_message = NULL, fencing_token = {fenced_token(partitions, tokens)},
    claimed_by = $3
"""


def held_columns(partitions: int) -> str:
    """``held``'s two columns as a claim or a completion returns them with every row:
    ``holding`` only when a fence did not hold (NULL otherwise). Decoding the partition
    array on each returned row cost the node 1.5 us a row with 64 partitions (measured,
    asyncpg 0.30), a tenth of its whole CPU per execution, to say what ``fences_held``
    already says."""
    return (
        f"held.fences_held, CASE WHEN held.fences_held = cardinality(${partitions}::integer[]) "
        "THEN NULL ELSE held.holding END AS holding"
    )


def fence_cte(partitions: int, owners: int, tokens: int) -> str:
    """The in-statement fence check of claim and complete, as CTEs ``fence`` (the fences that
    hold: partition and token) and ``held`` (one row: ``fences_held``, their count, and
    ``holding``, their partitions), given the parameter numbers of the partition, owner and
    token arrays. A statement built on it writes only if ``held.fences_held`` equals the
    number of fences passed, and returns ``held`` with its rows so the caller can tell
    (:func:`engine.ledger.postgres.fencing.check_held`). The write itself takes its tokens
    from the arrays (:func:`fenced_token`), not from ``fence``: the planner takes a CTE for
    one row, and with ``fence`` as the outer side it re-scanned the batch's ids once per
    partition (measured: 4x slower)."""
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
WITH {fence_cte(4, 5, 6)}, claimed AS ({claim_update(4, 6)}
    WHERE e.execution_id = ANY($1::text[])
      AND {fenced_partition(4)}
      AND (SELECT fences_held FROM held) = cardinality($4::integer[])
      AND {status_test("'queued', 'failed'")}
      AND e.startable_at <= now()
      AND NOT EXISTS (
          SELECT 1 FROM task_types AS t
          WHERE t.name = e.task_type AND t.max_concurrency_cluster IS NOT NULL)
    RETURNING {prefixed(EXECUTION_COLUMNS, "e")}
)
SELECT {held_columns(4)}, claimed.* FROM held LEFT JOIN claimed ON true
"""
"""Claim the listed startable executions whose task type has no cluster cap, fenced in the
statement (the fast path: a batch of those needs nothing else; the few task types make the
anti-join one small hash). One row per claimed execution, each with ``held``; a single row
of ``held`` and NULLs when none was claimed. ``$1`` ids, ``$2`` attempt lease, ``$3`` node,
``$4``-``$6`` fences. The ids stay a binary ``text[]`` parameter, not an array literal as in
:data:`EXECUTIONS_COMPLETE`: with ``= ANY($1::text::text[])`` the prepared statement's
generic plan scans the table (measured: 724 rows/s against 44,000 over 100,000 rows)."""

# Cluster-wide concurrency caps (engine/ledger/postgres/caps.py). Only when EXECUTIONS_CLAIM
# left some ids unclaimed does a claim look for startable ones of capped task types among
# them (TASK_TYPES_CAPPED_AMONG); if there are, it locks those types (CAP_LOCKS, in key
# order) and claims them with EXECUTIONS_CLAIM_CAPPED: a later statement, so its snapshot
# sees every claim committed by the locks' previous holders, and it counts and claims at once.

TASK_TYPES_CAPPED_AMONG: Final = f"""
SELECT DISTINCT e.task_type FROM executions AS e
JOIN task_types AS t ON t.name = e.task_type AND t.max_concurrency_cluster IS NOT NULL
WHERE e.execution_id = ANY($1::text[])
  AND {status_test("'queued', 'failed'")}
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
    WHERE {status_test("'queued', 'failed'")}
      AND e.startable_at <= now()
      AND e.partition_id = ANY($4::integer[])
){claim_update(4, 5)}
FROM ranked
WHERE e.execution_id = ranked.execution_id
  AND ranked.rank <= ranked.room
  AND {fenced_partition(4)}
  AND {status_test("'queued', 'failed'")}
  AND e.startable_at <= now()
RETURNING {prefixed(EXECUTION_COLUMNS, "e")}
"""
"""Claim the startable executions of the capped task types ``$6`` (whose locks the caller
holds): per type, the first ``cap - running`` of them in the order of ``$1``. Caps are
re-read here, under the lock; the running count uses executions_running_task_type_idx."""

EXECUTIONS_EXTEND: Final = f"""
UPDATE executions AS e
SET attempt_expires_at = now() + make_interval(secs => $3), fencing_token = {fenced_token(4, 5)}
FROM unnest($1::text[], $2::integer[]) AS a (execution_id, attempt)
WHERE e.execution_id = a.execution_id
  AND e.attempt = a.attempt
  AND {status_test("'running'")}
  AND {fenced_partition(4)}
RETURNING e.execution_id
"""
"""Renew the attempt leases of the listed attempts that are still running."""


def outcome_set() -> str:
    """What a completion and a folded finish both set: the outcome, ``finished_at`` exactly
    while terminal, a failed attempt's retry instant, its error, no attempt lease."""
    return """status = c.outcome,
        finished_at = CASE WHEN c.outcome = 'failed' THEN NULL ELSE now() END,
        not_before = CASE WHEN c.outcome = 'failed' THEN coalesce(c.not_before, now()) END,
        attempt_expires_at = NULL,
        error_code = c.error_code, error_message = c.error_message"""


def recorded_and_held(partitions: int) -> str:
    """The end of a completion and a folded finish, after their ``finished`` update's
    ``WHERE``: what it returns, the history rows of the attempts that did not succeed, and
    the answer (``held`` with each finished attempt, or alone)."""
    return f"""RETURNING e.execution_id, e.attempt, c.outcome, e.started_at, e.error_code,
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
SELECT {held_columns(partitions)}, finished.execution_id, finished.attempt
FROM held LEFT JOIN finished ON true
"""


EXECUTIONS_COMPLETE: Final = f"""
WITH {fence_cte(7, 8, 9)}, c AS (
    SELECT * FROM unnest($1::text::text[], $2::text::integer[], $3::text::text[],
                         $4::text::timestamptz[], $5::text::text[], $6::text::text[])
         AS c (execution_id, attempt, outcome, not_before, error_code, error_message)
), finished AS (
    UPDATE executions AS e
    SET {outcome_set()},
        fencing_token = {fenced_token(7, 9)}
    FROM c
    WHERE e.execution_id = c.execution_id
      AND e.attempt = c.attempt
      AND {status_test("'running'")}
      AND {fenced_partition(7)}
      AND (SELECT fences_held FROM held) = cardinality($7::integer[])
    {recorded_and_held(7)}"""
"""Finish the current attempts and record them in the history, fenced, in one statement.
A succeeded attempt is not copied to the history: a succeeded execution never changes again,
so its row is that attempt's record (``executions_get`` shows it from there; measured: the
complete costs a fifth less).
``finished_at`` is set exactly while an execution is terminal, so a failed attempt leaves it
empty and waits for ``not_before`` (now, when the worker gave no retry time). Rows as
:data:`EXECUTIONS_CLAIM`: ``held`` with each recorded attempt, or alone. ``$1``-``$6`` are
array literals (:mod:`~engine.ledger.postgres.rows`)."""

EXECUTIONS_FINISH: Final = f"""
WITH {fence_cte(8, 9, 10)}, c AS (
    SELECT * FROM unnest($1::text::text[], $2::text::integer[], $3::text::text[],
                         $4::text::timestamptz[], $5::text::text[], $6::text::text[],
                         $7::text::timestamptz[])
         AS c (execution_id, attempt, outcome, not_before, error_code, error_message,
               started_at)
), finished AS (
    UPDATE executions AS e
    SET {outcome_set()},
        attempt = c.attempt, started_at = least(c.started_at, now()),
        fencing_token = {fenced_token(8, 10)}, claimed_by = $11
    FROM c
    WHERE e.execution_id = c.execution_id
      AND e.attempt = c.attempt - 1
      AND {status_test("'queued', 'failed'")}
      AND e.startable_at <= now()
      AND {fenced_partition(8)}
      AND (SELECT fences_held FROM held) = cardinality($8::integer[])
    {recorded_and_held(8)}"""
"""Finish folded attempts (docs/ledger.md, "Folded claims"): the claim and the completion
of :data:`EXECUTIONS_CLAIM` and :data:`EXECUTIONS_COMPLETE` in one row version. The row
must still be startable under the attempt before the completion's (``attempt =
c.attempt - 1``, startable now, by primary key as the claim reads it); it moves to the
outcome under the new attempt number, with the handler's start from the node and the node
as its claimer, and a non-succeeded attempt is recorded as a completion records it.
``$1``-``$7`` array literals (the six of a completion and ``started_at``), ``$8``-``$10``
the fences, ``$11`` the node. Rows as :data:`EXECUTIONS_COMPLETE`."""

EXECUTIONS_SKIP: Final = f"""
UPDATE executions AS e
SET status = 'skipped', error_code = $2, error_message = $3, finished_at = now(),
    not_before = NULL, fencing_token = {fenced_token(4, 5)}
WHERE e.execution_id = ANY($1::text[])
  AND {fenced_partition(4)}
  AND {status_test("'queued', 'failed'")}
RETURNING e.execution_id
"""
"""Skip not-yet-started executions on purpose (the overlap policy); no attempt is recorded."""

EXECUTIONS_REQUEUE_EXPIRED: Final = f"""
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
    SET status = 'queued', attempt_expires_at = NULL, fencing_token = {fenced_token(1, 3)}
    FROM expired
    WHERE e.execution_id = expired.execution_id AND {fenced_partition(1)}
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
    SELECT x.execution_id, x.attempt, x.error_code FROM executions AS x
    WHERE x.execution_id = ANY($1::text[]) AND x.status = 'dead-letter'
      AND EXISTS (
          SELECT 1 FROM schedules AS s
          WHERE s.schedule_id = x.schedule_id AND s.deleted_at IS NULL
            AND s.tenant_id = x.tenant_id)
    ORDER BY x.execution_id
    FOR UPDATE OF x
)
UPDATE executions AS e
SET status = 'queued', enqueued_at = now(), not_before = NULL, finished_at = NULL,
    error_code = NULL, error_message = NULL
FROM letters
WHERE e.execution_id = letters.execution_id
RETURNING e.execution_id, letters.attempt, letters.error_code
"""
"""Replay dead letters, returning what the audit trail records of each: its attempt count
and the error code it was dead-lettered with (read, locked, before the update clears it).
Only those whose schedule is live and still of their tenant: one of a deleted schedule could
not run (its payload went with the schedule). A delete that commits after a replay skips
what it replayed (its later statement waits for the row and sees it queued)."""

DEAD_LETTERS_PURGE_SELECT: Final = f"""
WITH doomed AS (
    SELECT execution_id, schedule_id, planned_at, attempt, error_code FROM executions
    WHERE execution_id = ANY($1::text[]) AND status = 'dead-letter'
    ORDER BY execution_id
    FOR UPDATE
), marked AS ({PURGE_MARKS_UPSERT})
SELECT execution_id, schedule_id, attempt, error_code FROM doomed
"""
"""Lock the dead letters among ``$1`` and move their schedules' purge horizon on, returning
what the audit trail records of each; :data:`~engine.ledger.postgres.sql.EXECUTIONS_DELETE`
then removes them (an operator's purge)."""
