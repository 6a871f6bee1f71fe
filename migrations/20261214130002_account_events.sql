-- An account's event log: the one list the app's `GET …/events`, the console's account page,
-- replay's "is it this account's?" and `inboxctl account` read (docs/api.md, "The account's
-- events"; docs/design.md §12.6), so that they show the same events.
--
-- First, every event the account's log names: its line is written when the event finishes,
-- for the account the event was decided for, whatever its row names. A Stripe thin event, a
-- links-only `invoice_payment.paid` and the refund of a customer that is an Account name no
-- customer on their row and are the account's by their line (the purge takes rows, never
-- lines).
--
-- Then the account's events that have no line, as their row names the account: those not
-- finished yet, by `inbox_events_pending`, and those that gave up (dead, unprocessable), by
-- `inbox_events_given_up`; never the whole history of the account. A read made for another
-- event (`read:…`) stands for that event: it is listed only by a line of its own.
--
-- The rows' other columns (status, provider id, copies) are joined by the reader to the page
-- it keeps, by primary key: joined here, a page of a large account joined every one of its
-- events before it could sort them.
CREATE VIEW account_events AS
SELECT l.source, l.customer_id, l.event_id, l.event_type, l.occurred_at, l.outcome, l.reason
FROM account_log l
UNION ALL
SELECT e.source, e.customer_key, e.id, e.type, e.occurred_at, NULL, e.reason
FROM inbox_events e
WHERE (e.status IN ('received', 'processing', 'failed') OR e.status IN ('dead', 'unprocessable'))
  AND e.customer_key IS NOT NULL
  AND e.dedupe_key NOT LIKE 'read:%'
  AND NOT EXISTS (SELECT 1 FROM account_log l WHERE l.event_id = e.id);
