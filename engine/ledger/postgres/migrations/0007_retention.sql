-- Carillon schema, version 7: pruning the schedule change feed, and what survives the
-- retention of executions (a backfill must not run again a fire whose row was purged).
--
-- Both are new small tables, so this migrates a live ledger without rewriting or scanning
-- a big one: no index is built on executions (dead-letter retention reads the existing
-- executions_dead_letter_idx of 0001 by planned_at).

-- The newest seq pruned from schedule_changes (0: none). One row. Pruning deletes a prefix
-- of the feed and moves this on in the same statement, so a reader compares its watermark
-- with it in the statement that reads the changes: a watermark below it may have missed
-- changes (engine/ledger/postgres/sql.py CHANGES_SINCE, CHANGES_PRUNE).
CREATE TABLE schedule_changes_pruned (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    through   bigint  NOT NULL DEFAULT 0 CHECK (through >= 0)
);
INSERT INTO schedule_changes_pruned DEFAULT VALUES;

-- Per schedule id: the latest planned_at of its executions ever purged (by retention or a
-- dead-letter purge). A backfill skips every instant at or before it. Kept when the
-- schedule is deleted (its id, created again, has the same execution ids); one row per
-- schedule that ever lost history, upserted once per schedule per purge batch. A purge
-- upserts these rows before it deletes, and a backfill upserts (locks) its row before it
-- inserts, so one of them always sees the other.
CREATE TABLE execution_purge_marks (
    schedule_id    text        PRIMARY KEY,
    purged_through timestamptz
);
