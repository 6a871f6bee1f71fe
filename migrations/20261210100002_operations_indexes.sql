-- no-transaction
-- The overview's deliveries of the last hour, and the admin events list by a provider's event
-- id without its source. Built CONCURRENTLY, as inbox_events_source_received was (see there).
CREATE INDEX CONCURRENTLY IF NOT EXISTS deliveries_received ON deliveries (received_at);
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_events_dedupe_key ON inbox_events (dedupe_key);
