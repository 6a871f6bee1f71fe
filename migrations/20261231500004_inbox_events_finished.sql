-- no-transaction
-- The purge's index (docs/design.md §3.9): finished events by their arrival, entered once, at
-- the event's finish. It takes the place of inbox_events_status_received (status,
-- received_at), which every event entered three times (its insert, its claim, its finish);
-- the backlog's counts and age read the in-flight and given-up partial indexes instead
-- (`inbox::read::backlog`). Built CONCURRENTLY, as inbox_events_source_received was (see
-- there); the old index is dropped by the next migration.
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_events_finished ON inbox_events (received_at)
    WHERE status IN ('applied', 'ignored');
