-- no-transaction
-- The overview's deliveries of the last hour. Built CONCURRENTLY, as
-- inbox_events_source_received was (see there); one statement a file, since Postgres runs
-- several sent at once in one transaction.
CREATE INDEX CONCURRENTLY IF NOT EXISTS deliveries_received ON deliveries (received_at);
