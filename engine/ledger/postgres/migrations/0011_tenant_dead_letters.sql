-- carillon: online
-- Carillon schema, version 11: a tenant's dead letters by planned time.
--
-- GET /v1/dead-letters?tenant_id=T (and /v1/executions?tenant_id=T&status=dead-letter) had no
-- index of its own: it walked the tenant's whole history through executions_tenant_idx, or
-- every tenant's dead letters through executions_dead_letter_idx, filtering each row (on a
-- 5M-execution ledger, p95 48-124 ms; benchmarks/bench_listing.py). This index holds dead
-- letters only, so no claim, completion or plan of a run that ends well writes to it.
--
-- The first online migration (engine/ledger/postgres/migrate.py): built CONCURRENTLY, so a
-- live ledger keeps planning, claiming and completing while it is built (about a minute per
-- 5M executions here); a run cut short leaves an invalid index, which the next run drops and
-- builds again.
-- step
CREATE INDEX CONCURRENTLY IF NOT EXISTS executions_tenant_dead_letter_idx
    ON executions (tenant_id, planned_at, execution_id) WHERE status = 'dead-letter'
