-- A same-second tie settled by a provider read ranks the confirmed state by the read's time
-- (docs/design.md §4.2): of two states the provider confirmed, the one it showed last is the
-- newer. That rank is microseconds since the epoch, past what smallint holds.
ALTER TABLE customer_plans    ALTER COLUMN version_rank TYPE bigint;
ALTER TABLE customer_standing ALTER COLUMN version_rank TYPE bigint;
ALTER TABLE subscriptions     ALTER COLUMN version_rank TYPE bigint;
ALTER TABLE payments          ALTER COLUMN version_rank TYPE bigint;
