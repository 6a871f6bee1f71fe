-- The fold of an account's events (docs/design.md §4.11): what it needs kept with the events,
-- and the audit that compares it with the registers.

-- What a provider read settled for the event when it was applied (a same-second tie's rank,
-- a refund's payment intent linked to its invoice), so that the fold repeats it; and how many
-- times an operator replayed it.
ALTER TABLE inbox_events
    ADD COLUMN settled jsonb,
    ADD COLUMN replays integer NOT NULL DEFAULT 0;

-- The event that told the intent's invoice (the link's half), beside the refund's.
ALTER TABLE payment_intents ADD COLUMN linked_by bigint;
-- The event that deleted the customer (the earliest deletion).
ALTER TABLE accounts ADD COLUMN deleted_by bigint;

-- The purge keeps every event a register, a grant or an intent names (docs/design.md §3.9):
-- these indexes make that check one probe each.
CREATE INDEX customer_plans_event ON customer_plans (event_id);
CREATE INDEX customer_standing_event ON customer_standing (event_id);
CREATE INDEX subscriptions_event ON subscriptions (event_id);
CREATE INDEX payments_event ON payments (event_id);
CREATE INDEX ledger_event ON ledger (event_id);
CREATE INDEX payment_intents_linked_by ON payment_intents (linked_by) WHERE linked_by IS NOT NULL;
CREATE INDEX payment_intents_refunded_by ON payment_intents (refunded_by) WHERE refunded_by IS NOT NULL;
CREATE INDEX accounts_deleted_by ON accounts (deleted_by) WHERE deleted_by IS NOT NULL;
-- The audit's "touched since the last run".
CREATE INDEX account_log_logged ON account_log (logged_at);

-- The audit's place: the scheduler re-folds the accounts touched since `touched_since`, then
-- walks all accounts in key order after (`after_source`, `after_customer`).
CREATE TABLE audit_position (
    id             boolean PRIMARY KEY DEFAULT true CHECK (id),
    touched_since  timestamptz,
    after_source   text,
    after_customer text,
    updated_at     timestamptz NOT NULL DEFAULT inbox_now()
);

-- A difference the audit found between a register and the fold, logged once: kept while it
-- lasts, removed when an audit finds the field agreeing again.
CREATE TABLE audit_divergences (
    source      text        NOT NULL,
    customer_id text        NOT NULL,
    field       text        NOT NULL,
    stored      jsonb       NOT NULL,
    folded      jsonb       NOT NULL,
    first_seen  timestamptz NOT NULL DEFAULT inbox_now(),
    last_seen   timestamptz NOT NULL DEFAULT inbox_now(),
    PRIMARY KEY (source, customer_id, field)
);
