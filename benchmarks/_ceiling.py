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

from benchmarks._burst import WAL_POSITION, schedule_ids, tenant_of
from engine.actors.completions import BATCH_MAX_DEFAULT as COMPLETE_BATCH_MAX
from engine.actors.dispatcher import CLAIM_BATCH_DEFAULT
from engine.config import ATTEMPT_LEASE_S_DEFAULT
from engine.core.hashing import partition_of
from engine.ledger.postgres import PARTITIONS_DEFAULT
from engine.ledger.postgres.rows import int_array, text_array, timestamptz_array
from engine.ledger.postgres.sql_executions import EXECUTIONS_CLAIM, EXECUTIONS_COMPLETE
from engine.model import execution_id, parse_execution_id

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
    """The ceiling's rows/s and WAL bytes per row for the whole cycle and for claim +
    complete alone (the WAL of the timed loops only, not of the ANALYZE between them)."""
    batches = _ceiling_batches(n, burst_at)
    connection = await asyncpg.connect(url)
    try:
        # The engine started on an empty executions table; so does the ceiling.
        await connection.execute("TRUNCATE executions, execution_attempts")
        await connection.execute("VACUUM ANALYZE executions, execution_attempts")
        seconds: dict[str, float] = {}
        wal: dict[str, int] = {}
        for phase in ("insert", "claim", "complete"):
            if phase != "insert":
                # Untimed: the planner's view of the table as it now is (module docstring).
                await connection.execute("ANALYZE executions")
            done = 0
            wal_before = await connection.fetchval(WAL_POSITION)
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
            wal[phase] = await connection.fetchval(WAL_POSITION) - wal_before
            if done != n:
                raise RuntimeError(f"ceiling {phase}: {done} rows of {n}")
    finally:
        await connection.close()
    cycle = seconds["insert"] + seconds["claim"] + seconds["complete"]
    return {
        "ceiling_cycle_per_s": n / cycle,
        "ceiling_claim_complete_per_s": n / (seconds["claim"] + seconds["complete"]),
        "ceiling_cycle_wal_b": sum(wal.values()) / n,
        "ceiling_claim_complete_wal_b": (wal["claim"] + wal["complete"]) / n,
    }


# --- the same-design ceiling and the physical reference ----------------------------------------
#
# The raw ceiling above is the minimal statements for the writes; the engine's own claim and
# complete do more (the fence in the statement, the cluster-cap anti-join, the attempt
# history, the columns returned). Two more figures bound the engine from both sides, in the
# same run: the same-design ceiling -- the engine's own claim and complete statements in a bare
# loop, at the engine's largest batches -- and the physical reference -- the same rows written
# once by binary COPY into a table with no index, which is what the machine's PostgreSQL can
# store per second with nothing of our design in the way.

SAME_DESIGN_CLAIM_BATCH: Final = CLAIM_BATCH_DEFAULT
SAME_DESIGN_COMPLETE_BATCH: Final = COMPLETE_BATCH_MAX
SAME_DESIGN_NODE: Final = "ceiling"

LEASES_TAKE: Final = """
INSERT INTO partition_leases (partition_id, owner_id, fencing_token, expires_at)
SELECT p, $2, 1, now() + interval '1 hour' FROM generate_series(0, $1 - 1) AS p
ON CONFLICT (partition_id) DO UPDATE
SET owner_id = $2, fencing_token = partition_leases.fencing_token + 1,
    expires_at = now() + interval '1 hour'
RETURNING partition_id, fencing_token
"""

REFERENCE_TABLE: Final = "copy_reference"
REFERENCE_COLUMNS: Final = (
    "execution_id",
    "schedule_id",
    "tenant_id",
    "task_type",
    "partition_id",
    "planned_at",
    "status",
    "attempt",
    "enqueued_at",
    "fencing_token",
)


async def _refill(connection: asyncpg.Connection, n: int, burst_at: datetime) -> None:
    """The executions table emptied, vacuumed and holding the burst's N queued rows (untimed)."""
    await connection.execute("TRUNCATE executions, execution_attempts")
    await connection.execute("VACUUM ANALYZE executions, execution_attempts")
    for exec_ids, sids, tenants, parts in _ceiling_batches(n, burst_at):
        await connection.execute(CEILING_INSERT, exec_ids, sids, tenants, parts, burst_at)
    await connection.execute("ANALYZE executions")


def _fences(exec_ids: list[str], tokens: dict[int, int]) -> tuple[list[int], list[str], list[int]]:
    """The fence arrays a node passes for a batch: each partition of the batch once."""
    partitions = sorted({_partition_of_execution(value) for value in exec_ids})
    return partitions, [SAME_DESIGN_NODE] * len(partitions), [tokens[p] for p in partitions]


def _partition_of_execution(value: str) -> int:
    return partition_of(parse_execution_id(value)[0], PARTITIONS_DEFAULT)


async def same_design_ceiling(url: str, n: int, burst_at: datetime) -> dict[str, float]:
    """Claim + complete rows/s of the engine's own statements (``EXECUTIONS_CLAIM`` and
    ``EXECUTIONS_COMPLETE``, parameters encoded as the ledger encodes them) in a bare loop:
    claims of the dispatcher's largest batch, completions of the completion writer's, one
    connection, no trio, no bridge, no node; and the WAL it wrote per row. Every row is
    claimed and completed exactly once, or this raises."""
    ids = [execution_id(sid, burst_at) for sid in schedule_ids(n)]
    ids.sort()  # the engine claims in due order: (planned_at, execution_id), one instant here
    connection = await asyncpg.connect(url)
    try:
        await _refill(connection, n, burst_at)
        rows = await connection.fetch(LEASES_TAKE, PARTITIONS_DEFAULT, SAME_DESIGN_NODE)
        tokens = {row["partition_id"]: row["fencing_token"] for row in rows}
        lease_s = ATTEMPT_LEASE_S_DEFAULT
        claimed = completed = 0
        wal_before = await connection.fetchval(WAL_POSITION)
        started = time.perf_counter()
        for i in range(0, n, SAME_DESIGN_COMPLETE_BATCH):
            chunk = ids[i : i + SAME_DESIGN_COMPLETE_BATCH]
            running: list[tuple[str, int]] = []
            for j in range(0, len(chunk), SAME_DESIGN_CLAIM_BATCH):
                batch = chunk[j : j + SAME_DESIGN_CLAIM_BATCH]
                got = await connection.fetch(
                    EXECUTIONS_CLAIM, batch, lease_s, SAME_DESIGN_NODE, *_fences(batch, tokens)
                )
                running += [(row["execution_id"], row["attempt"]) for row in got if row[2]]
            claimed += len(running)
            done = [value for value, _ in running]
            got = await connection.fetch(
                EXECUTIONS_COMPLETE,
                text_array(done),
                int_array([attempt for _, attempt in running]),
                text_array(["succeeded"] * len(done)),
                timestamptz_array([None] * len(done)),
                text_array([None] * len(done)),
                text_array([None] * len(done)),
                *_fences(done, tokens),
            )
            completed += sum(1 for row in got if row[2] is not None)
        seconds = time.perf_counter() - started
        wal_bytes = await connection.fetchval(WAL_POSITION) - wal_before
    finally:
        await connection.close()
    if claimed != n or completed != n:
        raise RuntimeError(f"same-design ceiling: {claimed} claimed, {completed} completed of {n}")
    return {"same_design_per_s": n / seconds, "same_design_wal_b": wal_bytes / n}


async def physical_reference(url: str, n: int, burst_at: datetime) -> dict[str, float]:
    """Rows/s of the burst's execution rows written once by binary COPY (asyncpg's
    ``copy_records_to_table``) into a table shaped like ``executions`` with no index and no
    key, in batches of ``CEILING_BATCH``, each its own transaction, ``synchronous_commit`` as
    the server has it; and the WAL it wrote per row."""
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(
            f"CREATE TABLE {REFERENCE_TABLE} "
            "(LIKE executions INCLUDING DEFAULTS INCLUDING GENERATED)"
        )
        batches = _ceiling_batches(n, burst_at)
        now = datetime.now(burst_at.tzinfo)
        records = [
            [
                (exec_id, sid, tenant, "noop", part, burst_at, "queued", 0, now, 1)
                for exec_id, sid, tenant, part in zip(*batch, strict=True)
            ]
            for batch in batches
        ]
        wal_before = await connection.fetchval(WAL_POSITION)
        started = time.perf_counter()
        for rows in records:
            await connection.copy_records_to_table(
                REFERENCE_TABLE, records=rows, columns=REFERENCE_COLUMNS
            )
        seconds = time.perf_counter() - started
        wal_bytes = await connection.fetchval(WAL_POSITION) - wal_before
        written = await connection.fetchval(f"SELECT count(*) FROM {REFERENCE_TABLE}")
        await connection.execute(f"DROP TABLE {REFERENCE_TABLE}")
    finally:
        await connection.close()
    if written != n:
        raise RuntimeError(f"physical reference: {written} rows of {n}")
    return {"physical_per_s": n / seconds, "physical_wal_b": wal_bytes / n}
