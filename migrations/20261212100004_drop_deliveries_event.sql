-- no-transaction
-- deliveries_event_first (event_id, id) covers every lookup deliveries_event (event_id) served.
DROP INDEX CONCURRENTLY IF EXISTS deliveries_event;
