-- Carillon schema, version 3: the audit trail, and what cluster-wide concurrency caps count.

-- The audit trail: one row per audited operator action (today: each dead letter replayed,
-- written in the replay's transaction). Append-only: nothing in Carillon updates or deletes
-- a row, and the trigger below refuses it to anyone else too (pruning the trail is a
-- deliberate act: drop the trigger first). event_id follows commit order, because writers
-- take the audit advisory lock before drawing it (engine/ledger/postgres/sql.py).
CREATE TABLE audit_events (
    event_id bigserial   PRIMARY KEY,
    -- the primary key serves audit_list without a target: "event_id > $after ORDER BY
    -- event_id LIMIT n"
    at       timestamptz NOT NULL DEFAULT now(),
    actor    text        NOT NULL CHECK (length(actor) BETWEEN 1 AND 200),
    action   text        NOT NULL,
    target   text        NOT NULL,
    details  jsonb       NOT NULL DEFAULT '{}'::jsonb
);

-- audit_list by target ("what happened to execution x"), in event order.
CREATE INDEX audit_events_target_idx ON audit_events (target, event_id);

CREATE FUNCTION carillon_audit_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only: % is refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER audit_events_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION carillon_audit_events_append_only();

-- executions_claim of a task type with max_concurrency_cluster: "how many executions of
-- type t are running, in every partition" -- counted under the type's advisory lock, so the
-- index holds only the running executions (bounded by the caps and the worker pools).
CREATE INDEX executions_running_task_type_idx
    ON executions (task_type) WHERE status = 'running';
