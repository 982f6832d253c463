-- Carillon schema, version 4: what the HTTP API needs -- API tokens, a per-tenant schedule
-- quota, executions added by operators (trigger, backfill) in the change feed, and each
-- node's clock offset in the membership.

-- API tokens (engine/model.py ApiToken). Only the SHA-256 of a token's secret is stored,
-- computed by the API; the secret itself never reaches the database. Tokens are never
-- deleted -- revocation sets revoked_at -- so neither an id nor a hash is ever reused.
CREATE TABLE api_tokens (
    token_id    text        PRIMARY KEY,
    -- the primary key serves tokens_list (by token_id) and tokens_revoke
    token_hash  bytea       NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    -- its unique index serves tokens_get_by_hash: the API's authentication of a request
    scope       text        NOT NULL CHECK (scope = 'admin' OR scope LIKE 'tenant:%'),
    description text        NOT NULL DEFAULT '' CHECK (length(description) <= 200),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- A tenant's schedule quota: schedules_create refuses to take the tenant past it (NULL: no
-- quota). The create locks the tenant row and counts the tenant's live schedules with
-- schedules_tenant_live_idx (0001), an index-only count; so does schedules_count.
ALTER TABLE tenants
    ADD COLUMN schedules_max integer CHECK (schedules_max BETWEEN 1 AND 10000000);

-- The change feed learns a fourth kind: executions an operator added to a schedule
-- (executions_trigger, executions_backfill), so that the owning node's dispatcher hears of
-- them within a second. The new check is wider than the old one, so every stored row
-- satisfies it: NOT VALID skips re-reading the whole feed (it is not trimmed) under the
-- migration's exclusive lock; new rows are checked all the same.
ALTER TABLE schedule_changes DROP CONSTRAINT schedule_changes_kind_check;
ALTER TABLE schedule_changes ADD CONSTRAINT schedule_changes_kind_check
    CHECK (kind IN ('created', 'updated', 'deleted', 'executions_added')) NOT VALID;

-- Each node's clock minus the database's, as the node last measured it (NULL: not
-- reported), shown by nodes_live.
ALTER TABLE nodes ADD COLUMN clock_offset_s double precision;
-- Each node's planner lag per partition it plans, as it last reported it ({"7": 0.0, ...}):
-- what GET /v1/cluster shows per partition, whichever node answers.
ALTER TABLE nodes ADD COLUMN planner_lag jsonb NOT NULL DEFAULT '{}'::jsonb;

-- No new index for the other API reads:
-- * executions_trigger and executions_backfill insert by execution_id (executions_pkey,
--   ON CONFLICT DO NOTHING) after share-locking the schedule row (schedules_pkey);
-- * schedules_update pausing a schedule skips its pending executions like a delete does
--   (executions_schedule_idx);
-- * schedules_census groups every enabled live schedule: a rare full scan for the load
--   forecast (with a tenant, schedules_tenant_live_idx), not worth slowing every
--   schedule write with an index on its six grouping columns.
