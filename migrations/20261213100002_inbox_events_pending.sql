-- no-transaction
-- An account's unfinished events (`kept::pending`, docs/design.md §4.11) by an index that holds
-- only unfinished events: each audit asks, and through `inbox_events_customer` the answer read
-- every event the account ever had to filter their status (2,100 rows, 4,400 buffers, 3–6 ms
-- for one hot account of the bench), so the audit from a checked point still grew with the
-- account's history. An event is in this index while it waits (its insert, its claim), so it
-- stays as small as the work in flight. Built CONCURRENTLY, as inbox_events_source_received
-- was (see there).
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_events_pending ON inbox_events (source, customer_key)
    WHERE status IN ('received', 'processing', 'failed');
