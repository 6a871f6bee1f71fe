-- no-transaction
-- An event's first delivery (`via`, docs/design.md §4.11) by an index in that order. With
-- `deliveries_event` (event_id) alone, `WHERE event_id = $1 ORDER BY id LIMIT 1` may be planned
-- as a walk of `deliveries_pkey` filtered by the event, as it was on freshly loaded tables:
-- every delivery read for each event of the account, 3.2 s for one account of 1,400 events
-- (the audit's "hot account"). Built CONCURRENTLY, as inbox_events_source_received was (see
-- there); it takes the place of deliveries_event, which it covers (dropped by the next
-- migration: one statement each, as CONCURRENTLY needs).
CREATE INDEX CONCURRENTLY IF NOT EXISTS deliveries_event_first ON deliveries (event_id, id);
