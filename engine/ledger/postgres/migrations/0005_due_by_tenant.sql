-- Carillon schema, version 5: executions_due by tenant.
--
-- executions_due for one tenant: a dispatcher whose queue holds less than the startable
-- backlog reads each backlogged tenant's work on its own, so that its queue holds the tenants
-- by weight rather than by backlog (engine/core/queue_shares.py). Ordered by tenant, then the
-- start instant, a tenant's page is a range scan of `limit` entries instead of a walk past
-- every other tenant's backlog in executions_startable_idx (0002). Partial like that one:
-- only the startable backlog is indexed, so a claim (queued -> running) adds no entry here.
CREATE INDEX executions_tenant_startable_idx
    ON executions (tenant_id, startable_at, execution_id) WHERE status IN ('queued', 'failed');
