"""The constants the SQL shares with the schema: advisory-lock keys, the NOTIFY channel, and
the column lists every record is read from (``rows.py`` reads executions by position in the
order of :data:`EXECUTION_COLUMNS`). Part of :mod:`engine.ledger.postgres.sql`, which
re-exports every name.
"""

from __future__ import annotations

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
    "backoff_base_s, backoff_max_s, overlap, updated_at, version, tenant_id, allowed_tenants"
)
TENANT_COLUMNS: Final = (
    "tenant_id, weight, concurrency_quota, rate_per_s, burst, schedules_max, updated_at, version"
)
NODE_COLUMNS: Final = (
    "node_id, region, started_at, last_seen_at, expires_at, clock_offset_s, planner_lag"
)
AUDIT_COLUMNS: Final = "event_id, at, actor, action, target, details"
TOKEN_COLUMNS: Final = "token_id, scope, description, created_at, revoked_at"


def prefixed(columns: str, alias: str) -> str:
    return ", ".join(f"{alias}.{column.strip()}" for column in columns.split(","))


PURGE_MARKS_UPSERT: Final = """
INSERT INTO execution_purge_marks AS m (schedule_id, purged_through)
SELECT schedule_id, max(planned_at) FROM doomed GROUP BY schedule_id ORDER BY schedule_id
ON CONFLICT (schedule_id) DO UPDATE
SET purged_through = greatest(m.purged_through, excluded.purged_through)
"""
"""Move the purge horizon of the schedules of the ``doomed`` executions on (never back), in
schedule order (so concurrent purges lock the rows in one order)."""
