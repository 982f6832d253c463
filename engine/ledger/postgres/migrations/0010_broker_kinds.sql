-- Carillon schema, version 10: task types may publish to a message broker.
--
-- Three more handler kinds (docs/targets.md; engine/handlers/redis_stream.py, nats_jetstream.py,
-- rabbitmq.py): 'redis' appends to a Redis stream once per execution id, 'nats' publishes to a
-- JetStream subject with the execution id as its Nats-Msg-Id, 'rabbitmq' publishes a confirmed
-- persistent message with the execution id as its message_id. Their settings are jsonb like
-- every kind's, checked by the handler registry before they are stored.
--
-- The new check is wider than the old one, so every stored row satisfies it: NOT VALID skips
-- re-reading the table under the migration's exclusive lock (task_types is small anyway);
-- new and changed rows are checked all the same.
ALTER TABLE task_types DROP CONSTRAINT task_types_kind_check;
ALTER TABLE task_types ADD CONSTRAINT task_types_kind_check
    CHECK (kind IN ('webhook', 'python', 'shell', 'noop', 'redis', 'nats', 'rabbitmq')) NOT VALID;
