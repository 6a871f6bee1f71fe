-- no-transaction
-- inbox_events_finished serves the purge, the partial indexes of events in flight and given
-- up serve the backlog (see the previous migration).
DROP INDEX CONCURRENTLY IF EXISTS inbox_events_status_received;
