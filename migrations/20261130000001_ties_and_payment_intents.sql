-- Same-second ties (docs/design.md §4.2): a register's version is (provider time, rank,
-- dedupe key). The rank is the status progression of what the event says the object is,
-- or a provider read's verdict on a tie; 0 where no progression applies.
ALTER TABLE customer_plans    ADD COLUMN version_rank smallint NOT NULL DEFAULT 0;
ALTER TABLE customer_standing ADD COLUMN version_rank smallint NOT NULL DEFAULT 0;
ALTER TABLE subscriptions     ADD COLUMN version_rank smallint NOT NULL DEFAULT 0;
ALTER TABLE payments          ADD COLUMN version_rank smallint NOT NULL DEFAULT 0;

-- Stripe payment intents: which invoice each one paid, and whether a full refund of its
-- charge was received. From API 2025-03-31 (basil) on, a refunded charge names only its
-- payment intent; the refund ends the invoice once the link is known, whichever of the two
-- events (or a provider read) came first (docs/design.md §4.5).
CREATE TABLE payment_intents (
    source          text   NOT NULL,
    payment_intent  text   NOT NULL,
    invoice_id      text,            -- the invoice it paid, once an event or a read says so
    customer_id     text,            -- the customer, once an event that names one says so
    refunded_charge text,            -- the charge a full refund was received for
    refunded_by     bigint,          -- that refund's event
    PRIMARY KEY (source, payment_intent)
);
CREATE INDEX payment_intents_customer ON payment_intents (source, customer_id);
