-- no-transaction
-- The admin events list by a provider's event id without its source. Built CONCURRENTLY, as
-- inbox_events_source_received was (see there).
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_events_dedupe_key ON inbox_events (dedupe_key);
