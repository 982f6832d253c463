-- Carillon schema, version 6: task types belong to tenants.
--
-- Until version 5 any tenant's schedule could name any task type, so one tenant could send
-- its payloads to another's webhook, signed with the other's secret, or feed a shell or
-- python task type. A task type is now either owned by one tenant (tenant_id; usable by that
-- tenant's schedules only) or shared (tenant_id NULL) and granted by an admin to the tenants
-- in allowed_tenants, where '*' means every tenant (never for the python and shell kinds,
-- which run code on the nodes). engine/model.py TaskType.usable_by is the rule; the ledger
-- checks it whenever a schedule is created or changed, and the workers again before a run.
ALTER TABLE task_types
    ADD COLUMN tenant_id       text,
    ADD COLUMN allowed_tenants text[] NOT NULL DEFAULT '{default}';

ALTER TABLE task_types
    ADD CONSTRAINT task_types_owned_or_shared
        CHECK (tenant_id IS NULL OR allowed_tenants = '{}'),
    ADD CONSTRAINT task_types_code_kinds_granted_by_name
        CHECK (kind NOT IN ('python', 'shell') OR NOT ('*' = ANY (allowed_tenants)));

-- Every existing task type stays usable by each tenant that uses it today: the tenants of the
-- live schedules naming it and of the executions naming it that are not finished (queued,
-- running, failed and waiting for a retry) or are dead letters (a replay runs them again),
-- and by the default tenant, which is what a task type created without grants gets from now
-- on. One pass over schedules and executions; nothing else changes, so no schedule is
-- replanned and no execution is touched.
WITH users AS (
    SELECT task_type, tenant_id FROM schedules WHERE deleted_at IS NULL
    UNION
    SELECT task_type, tenant_id FROM executions
    WHERE status IN ('queued', 'running', 'failed', 'dead-letter')
    UNION
    SELECT name, 'default' FROM task_types
)
UPDATE task_types AS t
SET allowed_tenants = granted.tenants
FROM (
    SELECT task_type, array_agg(tenant_id ORDER BY tenant_id) AS tenants
    FROM users GROUP BY task_type
) AS granted
WHERE granted.task_type = t.name;
