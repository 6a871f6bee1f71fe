-- no-transaction
-- An account's events that gave up without a line in its log (dead, unprocessable), by an index
-- that holds only them: the account's log (`account_events`, the next migration) lists them
-- beside its finished events, and through `inbox_events_customer` it would read every event the
-- account ever had to find them. A row enters it only once it has given up, so it stays as
-- small as what needs a person. Built CONCURRENTLY, as inbox_events_pending was (see there).
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_events_given_up ON inbox_events (source, customer_key)
    WHERE status IN ('dead', 'unprocessable');
