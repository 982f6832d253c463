-- Carillon schema, version 1: task types, tenants, schedules, the execution ledger, leases,
-- membership, settings.
--
-- Applied by engine/ledger/postgres/migrate.py inside one transaction, under the migration
-- advisory lock. Conventions: every instant is timestamptz (stored UTC, compared with the
-- server's now()); enumerations are text with CHECK constraints, spelled as in
-- engine/model.py; partition ids are computed by the engine (engine/core/hashing.py) and
-- passed in, never derived here.

-- Cluster-wide settings: exactly one row, written by `carillon migrate`.
CREATE TABLE cluster_settings (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    partition_count integer NOT NULL CHECK (partition_count BETWEEN 1 AND 4096),
    active_region   text    NOT NULL DEFAULT 'default',
    region_epoch    bigint  NOT NULL DEFAULT 1 CHECK (region_epoch >= 1)
);

-- Task types: how the executions of a schedule's task_type run, and within which limits
-- (engine/model.py TaskType; managed with `carillon task-type`, read by every node).
-- settings hold the handler's kind-specific options (url, secret, argv ...), checked by the
-- handler registry before they are stored.
CREATE TABLE task_types (
    name                    text        PRIMARY KEY,
    kind                    text        NOT NULL
                                        CHECK (kind IN ('webhook', 'python', 'shell', 'noop')),
    settings                jsonb       NOT NULL DEFAULT '{}'::jsonb,
    timeout_s               double precision NOT NULL DEFAULT 30 CHECK (timeout_s > 0),
    max_concurrency         integer     CHECK (max_concurrency >= 1),          -- per node
    max_concurrency_cluster integer     CHECK (max_concurrency_cluster >= 1),
    max_attempts            integer     NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    backoff_base_s          double precision NOT NULL DEFAULT 1 CHECK (backoff_base_s > 0),
    backoff_max_s           double precision NOT NULL DEFAULT 60
                                        CHECK (backoff_max_s >= backoff_base_s),
    -- the default overlap policy of this type's schedules; NULL: none (the schedule's own)
    overlap                 text        CHECK (overlap IN ('allow', 'skip', 'buffer_one')),
    updated_at              timestamptz NOT NULL,
    version                 bigint      NOT NULL CHECK (version >= 1)
);

-- Tenants' dispatch settings (engine/model.py Tenant; `carillon tenant`). A tenant without a
-- row has the defaults: weight 1, no quota, no rate of its own.
CREATE TABLE tenants (
    tenant_id         text        PRIMARY KEY,
    weight            integer     NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    concurrency_quota integer     CHECK (concurrency_quota >= 1),
    rate_per_s        double precision CHECK (rate_per_s > 0),
    burst             integer     CHECK (burst >= 1),
    updated_at        timestamptz NOT NULL,
    version           bigint      NOT NULL CHECK (version >= 1),
    CHECK (burst IS NULL OR rate_per_s IS NOT NULL)
);

-- Schedules. A delete is soft (deleted_at set) so that the row can be locked by a planning
-- transaction and history keeps its schedule; creating a deleted id again revives the row.
CREATE TABLE schedules (
    schedule_id       text        PRIMARY KEY,
    tenant_id         text        NOT NULL,
    cron_expr         text        NOT NULL,
    timezone          text        NOT NULL,
    task_type         text        NOT NULL,
    payload           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    enabled           boolean     NOT NULL,
    next_run_at       timestamptz,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    version           bigint      NOT NULL CHECK (version >= 1),
    partition_id      integer     NOT NULL CHECK (partition_id >= 0),
    catch_up          text        NOT NULL CHECK (catch_up IN ('none', 'latest', 'all')),
    catch_up_window_s double precision NOT NULL CHECK (catch_up_window_s >= 0),
    dst_gap           text        NOT NULL CHECK (dst_gap IN ('auto', 'shift', 'skip')),
    dst_overlap       text        NOT NULL
                                  CHECK (dst_overlap IN ('auto', 'first', 'last', 'both')),
    -- NULL: the task type's default overlap policy, else 'allow'
    overlap           text        CHECK (overlap IN ('allow', 'skip', 'buffer_one')),
    deleted_at        timestamptz,
    -- task_type while the schedule is live, NULL once it is deleted. Its foreign key makes
    -- "no live schedule names a missing task type" an invariant of the database, while a
    -- deleted schedule (kept for history and for version continuity when its id is created
    -- again) never holds up the deletion of its task type. Reviving a row sets it again,
    -- and so checks the key again. The check costs creates about 8%; an advance of
    -- next_run_at leaves the key unchanged, so PostgreSQL skips it.
    live_task_type    text        GENERATED ALWAYS AS (
                                      CASE WHEN deleted_at IS NULL THEN task_type END) STORED
                                  REFERENCES task_types (name)
);

-- Planner start-up and takeover: "the live schedules of partition p" (schedules_list with a
-- partition filter, ordered by id for keyset pagination).
CREATE INDEX schedules_partition_live_idx
    ON schedules (partition_id, schedule_id) WHERE deleted_at IS NULL;

-- API listing "the schedules of tenant t" (schedules_list with a tenant filter, by id).
CREATE INDEX schedules_tenant_live_idx
    ON schedules (tenant_id, schedule_id) WHERE deleted_at IS NULL;

-- No index on (live_)task_type: it would cost every planner advance of next_run_at about
-- 13% (measured on 100k schedules), while its only readers -- the in-use check of a task
-- type delete and the foreign key's own check then, schedules_list by task type -- are rare
-- administrative reads that may scan.

-- The change feed. seq follows commit order because every writer takes the change-feed
-- advisory lock before drawing from the sequence (see engine/ledger/postgres/sql.py).
CREATE TABLE schedule_changes (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- the primary key serves schedule_changes: "seq > $after ORDER BY seq LIMIT n", and
    -- max(seq) for schedule_changes_wait.
    schedule_id  text        NOT NULL,
    partition_id integer     NOT NULL,
    kind         text        NOT NULL CHECK (kind IN ('created', 'updated', 'deleted')),
    version      bigint      NOT NULL,
    at           timestamptz NOT NULL DEFAULT now()
);

-- The execution ledger, which is also the durable dispatch queue.
CREATE TABLE executions (
    execution_id       text        PRIMARY KEY,  -- "{schedule_id}:{planned_at}", deterministic
    schedule_id        text        NOT NULL,
    tenant_id          text        NOT NULL,
    task_type          text        NOT NULL,
    partition_id       integer     NOT NULL CHECK (partition_id >= 0),
    planned_at         timestamptz NOT NULL,
    status             text        NOT NULL CHECK (status IN
                           ('queued', 'running', 'succeeded', 'failed', 'dead-letter',
                            'skipped')),
    attempt            integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    not_before         timestamptz,
    attempt_expires_at timestamptz,
    enqueued_at        timestamptz NOT NULL,
    started_at         timestamptz,
    finished_at        timestamptz,
    error_code         text,
    error_message      text,
    fencing_token      bigint,
    claimed_by         text,       -- node that started the current attempt (operators' aid)
    -- When a startable execution may start: its planned instant when queued, its retry
    -- instant when failed (a failed attempt without not_before may retry at once). One
    -- column keeps the due query a single index range per partition.
    startable_at       timestamptz GENERATED ALWAYS AS (
                           CASE WHEN status = 'failed'
                                THEN coalesce(not_before, '-infinity'::timestamptz)
                                ELSE planned_at END) STORED,
    CHECK (status <> 'running' OR attempt_expires_at IS NOT NULL)
);

-- executions_due and executions_claim: "queued or failed executions of partitions P that
-- may start by t" -- a range scan per partition on startable_at. Partial, so the index only
-- holds the (small) startable backlog, not the history.
CREATE INDEX executions_startable_idx
    ON executions (partition_id, startable_at) WHERE status IN ('queued', 'failed');

-- executions_requeue_expired: "running executions of partitions P whose attempt lease has
-- run out" (attempt_expires_at <= now()).
CREATE INDEX executions_running_expiry_idx
    ON executions (partition_id, attempt_expires_at) WHERE status = 'running';

-- executions_purge (retention): "succeeded or skipped executions of partition p finished
-- before t", oldest first. Dead letters are kept, so they are not indexed here.
CREATE INDEX executions_retention_idx
    ON executions (partition_id, finished_at) WHERE status IN ('succeeded', 'skipped');

-- executions_query by schedule (history of one schedule, by planned time then id) and
-- schedules_delete: "pending executions of schedule s" to mark them skipped.
CREATE INDEX executions_schedule_idx
    ON executions (schedule_id, planned_at, execution_id);

-- executions_query by tenant, by planned time then id (API listing, dashboards).
CREATE INDEX executions_tenant_idx
    ON executions (tenant_id, planned_at, execution_id);

-- executions_query with status = 'dead-letter': dead letters are searchable and replayable.
CREATE INDEX executions_dead_letter_idx
    ON executions (planned_at, execution_id) WHERE status = 'dead-letter';

-- The history of attempts: one row per finished, failed or abandoned attempt.
CREATE TABLE execution_attempts (
    -- No foreign key: executions_purge deletes the history with its execution, and a
    -- foreign-key check on every completion measured 16-38 ms per 5,000 rows.
    execution_id  text        NOT NULL,
    attempt       integer     NOT NULL CHECK (attempt >= 1),
    outcome       text        NOT NULL CHECK (outcome IN
                                  ('succeeded', 'failed', 'dead-letter', 'skipped', 'expired')),
    started_at    timestamptz,
    finished_at   timestamptz NOT NULL,
    error_code    text,
    error_message text,
    claimed_by    text,
    -- Only the current attempt may finish, and it finishes once, so (execution, attempt) is
    -- unique; the key also serves executions_get and executions_purge.
    PRIMARY KEY (execution_id, attempt)
);

-- One lease per partition; rows are created by `carillon migrate`, never deleted.
CREATE TABLE partition_leases (
    partition_id  integer     PRIMARY KEY CHECK (partition_id >= 0),
    owner_id      text,
    fencing_token bigint      NOT NULL DEFAULT 0 CHECK (fencing_token >= 0),
    expires_at    timestamptz
);

CREATE TABLE planner_checkpoints (
    partition_id      integer     PRIMARY KEY CHECK (partition_id >= 0),
    last_evaluated_at timestamptz NOT NULL
);

CREATE TABLE nodes (
    node_id      text        PRIMARY KEY,
    region       text        NOT NULL,
    started_at   timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL
);
