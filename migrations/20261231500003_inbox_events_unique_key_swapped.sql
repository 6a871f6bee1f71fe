-- The event's unique key on (dedupe_key, source), built by the previous migration: the same
-- constraint, under the same name (the store's `ON CONFLICT (source, dedupe_key)` infers it by
-- its columns, in any order), and inbox_events_dedupe_key, which it now covers, dropped. Both
-- take the table's lock for a moment only: no row is read.
ALTER TABLE inbox_events
    DROP CONSTRAINT inbox_events_source_dedupe_key,
    ADD CONSTRAINT inbox_events_source_dedupe_key UNIQUE USING INDEX inbox_events_dedupe_key_source;
DROP INDEX IF EXISTS inbox_events_dedupe_key;
