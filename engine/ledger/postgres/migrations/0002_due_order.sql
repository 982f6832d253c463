-- executions_due pages through a backlog in (startable_at, execution_id) order with a keyset
-- cursor. Ordered by partition first, the old index made every page sort the whole startable
-- backlog (200,000 rows in a top-of-minute burst); ordered by the start instant, a page is a
-- range scan of `limit` entries (a node owning a share of the partitions skips the others'
-- entries). Still partial: only the startable backlog is indexed, never the history.
DROP INDEX executions_startable_idx;
CREATE INDEX executions_startable_idx
    ON executions (startable_at, execution_id) WHERE status IN ('queued', 'failed');
