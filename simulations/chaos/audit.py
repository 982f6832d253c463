"""An independent record of every lease change and every execution write, kept by triggers.

The chaos run installs these triggers in its private database right after ``carillon
migrate`` (schema ``chaos``, apart from the engine's tables). They record, in the writing
transaction itself:

* ``chaos.lease_history``: every change of a ``partition_leases`` row -- acquisition (a new
  token), renewal, release -- with the transaction's ``now()``;
* ``chaos.execution_writes``: every insert of an execution and every update that changes its
  status, attempt, fencing token or attempt lease, with the token and attempt lease the row
  carries after the write and the transaction's ``now()``.

Every ownership-dependent write of the engine stamps the row with the writer's fencing token
(plan, claim, extend, complete, skip, re-queue), so each recorded write names the lease it
claims to act under. The checker (:mod:`simulations.chaos.checks`) then asks of each: was
that lease valid, by the database's clock, when the write's transaction began? That is the
engine's own fencing rule, verified from outside the engine's code.

Data is read with asyncpg through ``asyncio.run`` (this script is synchronous).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import asyncpg

INSTALL_SQL: Final = """
CREATE SCHEMA chaos;
CREATE TABLE chaos.lease_history (
    seq           bigserial PRIMARY KEY,
    partition_id  integer NOT NULL,
    owner_id      text,
    fencing_token bigint NOT NULL,
    expires_at    timestamptz,
    at            timestamptz NOT NULL,
    wall          timestamptz NOT NULL
);
CREATE FUNCTION chaos.lease_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos.lease_history (partition_id, owner_id, fencing_token, expires_at, at, wall)
    VALUES (NEW.partition_id, NEW.owner_id, NEW.fencing_token, NEW.expires_at, now(),
            clock_timestamp());
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_lease_changed AFTER INSERT OR UPDATE ON partition_leases
    FOR EACH ROW EXECUTE FUNCTION chaos.lease_changed();

CREATE TABLE chaos.execution_writes (
    execution_id  text NOT NULL,
    partition_id  integer NOT NULL,
    old_status    text,
    new_status    text NOT NULL,
    attempt       integer NOT NULL,
    fencing_token bigint,
    claimed_by    text,
    attempt_expires_at timestamptz,
    at            timestamptz NOT NULL,
    wall          timestamptz NOT NULL
);
CREATE FUNCTION chaos.executions_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos.execution_writes
    SELECT n.execution_id, n.partition_id, NULL, n.status, n.attempt, n.fencing_token,
           n.claimed_by, n.attempt_expires_at, now(), clock_timestamp()
    FROM new_rows AS n;
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_executions_inserted AFTER INSERT ON executions
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION chaos.executions_inserted();
CREATE FUNCTION chaos.executions_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos.execution_writes
    SELECT n.execution_id, n.partition_id, o.status, n.status, n.attempt, n.fencing_token,
           n.claimed_by, n.attempt_expires_at, now(), clock_timestamp()
    FROM new_rows AS n JOIN old_rows AS o USING (execution_id)
    WHERE n.status IS DISTINCT FROM o.status
       OR n.attempt IS DISTINCT FROM o.attempt
       OR n.fencing_token IS DISTINCT FROM o.fencing_token
       OR n.attempt_expires_at IS DISTINCT FROM o.attempt_expires_at;
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_executions_updated AFTER UPDATE ON executions
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION chaos.executions_updated();
"""


@dataclass(frozen=True)
class LeaseChange:
    partition_id: int
    owner_id: str | None
    fencing_token: int
    expires_at: float | None
    at: float
    wall: float


@dataclass(frozen=True)
class ExecutionWrite:
    execution_id: str
    partition_id: int
    old_status: str | None
    new_status: str
    attempt: int
    fencing_token: int | None
    claimed_by: str | None
    at: float
    wall: float
    attempt_expires_at: float | None = None
    """The attempt lease after the write (set by claims and renewals)."""


@dataclass(frozen=True)
class LedgerExecution:
    execution_id: str
    schedule_id: str
    planned_at: float
    status: str
    attempt: int
    claimed_by: str | None
    started_at: float | None
    error_code: str | None = None


@dataclass(frozen=True)
class AuditData:
    leases: list[LeaseChange]
    writes: list[ExecutionWrite]
    executions: list[LedgerExecution]
    partition_of: dict[str, int]
    """The partition of every execution in the ledger, by id."""


def _s(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


async def _fetch(url: str, statement: str, *args: Any) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(url, timeout=10)
    try:
        rows: list[asyncpg.Record] = await connection.fetch(statement, *args)
        return rows
    finally:
        await connection.close()


def fetch(url: str, statement: str, *args: Any) -> list[asyncpg.Record]:
    """Run one query on a fresh connection (blocking)."""
    return asyncio.run(_fetch(url, statement, *args))


def lease_owners(url: str) -> dict[int, tuple[str | None, int]]:
    """``{partition: (owner or None when free or expired, token)}`` now."""
    rows = fetch(
        url,
        "SELECT partition_id, CASE WHEN expires_at > now() THEN owner_id END AS owner_id, "
        "fencing_token FROM partition_leases",
    )
    return {row["partition_id"]: (row["owner_id"], row["fencing_token"]) for row in rows}


def count_succeeded(url: str, start_s: float, end_s: float) -> int:
    rows = fetch(
        url,
        "SELECT count(*) AS n FROM executions WHERE status = 'succeeded' "
        "AND planned_at >= to_timestamp($1) AND planned_at < to_timestamp($2)",
        start_s,
        end_s,
    )
    return int(rows[0]["n"])


def read_all(url: str, start_s: float, end_s: float) -> AuditData:
    """The lease history, every recorded write, and the executions planned in the window."""
    leases = [
        LeaseChange(
            r["partition_id"], r["owner_id"], r["fencing_token"], _s(r["expires_at"]),
            r["at"].timestamp(), r["wall"].timestamp(),
        )
        for r in fetch(url, "SELECT * FROM chaos.lease_history ORDER BY seq")
    ]  # fmt: skip
    writes = [
        ExecutionWrite(
            r["execution_id"], r["partition_id"], r["old_status"], r["new_status"],
            r["attempt"], r["fencing_token"], r["claimed_by"], r["at"].timestamp(),
            r["wall"].timestamp(), _s(r["attempt_expires_at"]),
        )
        for r in fetch(url, "SELECT * FROM chaos.execution_writes ORDER BY wall")
    ]  # fmt: skip
    executions = [
        LedgerExecution(
            r["execution_id"], r["schedule_id"], r["planned_at"].timestamp(), r["status"],
            r["attempt"], r["claimed_by"], _s(r["started_at"]), r["error_code"],
        )
        for r in fetch(
            url,
            "SELECT execution_id, schedule_id, planned_at, status, attempt, claimed_by, "
            "started_at, error_code FROM executions "
            "WHERE planned_at >= to_timestamp($1) AND planned_at < to_timestamp($2)",
            start_s,
            end_s,
        )
    ]  # fmt: skip
    partition_of = {
        r["execution_id"]: r["partition_id"]
        for r in fetch(url, "SELECT execution_id, partition_id FROM executions")
    }
    return AuditData(leases, writes, executions, partition_of)
