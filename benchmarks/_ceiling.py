"""The raw PostgreSQL ceiling for a burst's ledger writes: no engine, no trio, no bridge.

Plain asyncpg on a uvloop loop, on the executions table of a burst's database emptied
(TRUNCATE) and vacuumed, N rows in sequential batches of ``CEILING_BATCH``: an ``unnest``
insert of the executions, then an ``unnest`` update claiming them (queued -> running), then one
completing them (running -> succeeded) -- the minimal statements for what the engine writes.

A ceiling is the best the database can do, so before the claim phase and again before the
complete phase an untimed ``ANALYZE executions`` gives the planner the table as it is
(autovacuum may be off, as on the reference server). Without it the planner works from the
statistics of the empty table; ANALYZE before the claim alone is worse: the complete phase
then plans for no running rows, and once chose a nested loop that rescanned the batch's
5,000 ids for every running row -- minutes for one batch. Even with fresh statistics, the
first five executions of each prepared statement (custom plans, the array's length known)
hash-join the batch against all N rows, as PostgreSQL's cost model prefers on this server;
from the sixth on, the generic plan probes the primary key (a nested loop). Measured with
EXPLAIN (ANALYZE): 200-300 ms a batch for the hash join, 100-130 ms for the primary-key
probe, at N = 200,000 on a loaded 2-core machine.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Final

import asyncpg

from benchmarks._burst import schedule_ids, tenant_of
from engine.core.hashing import partition_of
from engine.ledger.postgres import PARTITIONS_DEFAULT
from engine.model import execution_id

CEILING_BATCH: Final = 5_000


CEILING_INSERT: Final = """
INSERT INTO executions (execution_id, schedule_id, tenant_id, task_type, partition_id,
                        planned_at, status, attempt, enqueued_at, fencing_token)
SELECT u.execution_id, u.schedule_id, u.tenant_id, 'noop', u.partition_id, $5, 'queued', 0,
       now(), 1
FROM unnest($1::text[], $2::text[], $3::text[], $4::integer[])
     AS u (execution_id, schedule_id, tenant_id, partition_id)
ON CONFLICT DO NOTHING
"""

CEILING_CLAIM: Final = """
UPDATE executions AS e
SET status = 'running', attempt = e.attempt + 1, started_at = now(), finished_at = NULL,
    attempt_expires_at = now() + interval '60 seconds', not_before = NULL,
    error_code = NULL, error_message = NULL, fencing_token = 1, claimed_by = 'ceiling'
FROM unnest($1::text[]) AS u (execution_id)
WHERE e.execution_id = u.execution_id
  AND e.status IN ('queued', 'failed')
  AND e.startable_at <= now()
"""

CEILING_COMPLETE: Final = """
UPDATE executions AS e
SET status = 'succeeded', finished_at = now(), not_before = NULL, attempt_expires_at = NULL,
    error_code = NULL, error_message = NULL
FROM unnest($1::text[], $2::integer[]) AS u (execution_id, attempt)
WHERE e.execution_id = u.execution_id AND e.attempt = u.attempt AND e.status = 'running'
"""


def _ceiling_batches(
    n: int, burst_at: datetime
) -> list[tuple[list[str], list[str], list[str], list[int]]]:
    ids = schedule_ids(n)
    return [
        (
            [execution_id(sid, burst_at) for sid in ids[i : i + CEILING_BATCH]],
            ids[i : i + CEILING_BATCH],
            [tenant_of(sid) for sid in ids[i : i + CEILING_BATCH]],
            [partition_of(sid, PARTITIONS_DEFAULT) for sid in ids[i : i + CEILING_BATCH]],
        )
        for i in range(0, n, CEILING_BATCH)
    ]


async def ceiling(url: str, n: int, burst_at: datetime) -> dict[str, float]:
    """The ceiling's rows/s for the whole cycle and for claim + complete alone."""
    batches = _ceiling_batches(n, burst_at)
    connection = await asyncpg.connect(url)
    try:
        # The engine started on an empty executions table; so does the ceiling.
        await connection.execute("TRUNCATE executions, execution_attempts")
        await connection.execute("VACUUM ANALYZE executions, execution_attempts")
        seconds: dict[str, float] = {}
        for phase in ("insert", "claim", "complete"):
            if phase != "insert":
                # Untimed: the planner's view of the table as it now is (module docstring).
                await connection.execute("ANALYZE executions")
            done = 0
            started = time.perf_counter()
            for exec_ids, sids, tenants, parts in batches:
                if phase == "insert":
                    tag = await connection.execute(
                        CEILING_INSERT, exec_ids, sids, tenants, parts, burst_at
                    )
                elif phase == "claim":
                    tag = await connection.execute(CEILING_CLAIM, exec_ids)
                else:
                    tag = await connection.execute(CEILING_COMPLETE, exec_ids, [1] * len(exec_ids))
                done += int(tag.rsplit(" ", 1)[1])
            seconds[phase] = time.perf_counter() - started
            if done != n:
                raise RuntimeError(f"ceiling {phase}: {done} rows of {n}")
    finally:
        await connection.close()
    cycle = seconds["insert"] + seconds["claim"] + seconds["complete"]
    return {
        "ceiling_cycle_per_s": n / cycle,
        "ceiling_claim_complete_per_s": n / (seconds["claim"] + seconds["complete"]),
    }
