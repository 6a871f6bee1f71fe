-- no-transaction
-- One index for the event's key, in the order that serves both of its lookups (docs/design.md
-- §3): the store's `(source, dedupe_key)` conflict and the admin list's provider event id
-- without its source (which inbox_events_dedupe_key served). Each index on the event's row is
-- written again at every status change (received, processing, applied: none is HOT while
-- `status` is indexed), so two indexes over the same two columns cost every event six index
-- entries where three serve. Built CONCURRENTLY, as inbox_events_source_received was (see
-- there); the next migration makes it the table's unique key.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS inbox_events_dedupe_key_source
    ON inbox_events (dedupe_key, source);
