-- no-transaction
-- The scheduler's measure of each source's silence (hours since its last stored event, the
-- SourceSilenceHours metric): max(received_at) for one source is one step down this index,
-- whatever the table's size. Built CONCURRENTLY so that the intake keeps storing while it is
-- built on a large table (hence outside a transaction); IF NOT EXISTS makes a re-run after an
-- interrupted build a no-op, so an interrupted build needs `REINDEX INDEX CONCURRENTLY
-- inbox_events_source_received` by hand (Postgres marks such an index invalid).
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_events_source_received
    ON inbox_events (source, received_at);
