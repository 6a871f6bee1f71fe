-- An account's entitlement registers (docs/design.md §4.12): a provider's grant of features,
-- one row per grant — Stripe's active-entitlement summary (one per customer, the whole set),
-- each Polar benefit grant, Kinde's entitlements as read. The last writer wins by version, as
-- in the plan register; the account's features are its plan's in the catalog joined with the
-- features of its active rows, derived when read.
CREATE TABLE entitlements (
    source       text        NOT NULL,
    customer_id  text        NOT NULL,
    grant_id     text        NOT NULL,
    -- false: revoked or ended; the row stays so that an older grant cannot come back.
    active       boolean     NOT NULL,
    -- {"key": true | whole number | string}
    features     jsonb       NOT NULL,
    version_at   timestamptz NOT NULL,
    version_rank bigint      NOT NULL DEFAULT 0,
    version_key  text COLLATE "C" NOT NULL,
    event_id     bigint      NOT NULL,
    PRIMARY KEY (source, customer_id, grant_id),
    FOREIGN KEY (source, customer_id) REFERENCES accounts (source, customer_id)
);

-- The purge keeps the event a row holds (docs/design.md §3.9).
CREATE INDEX entitlements_event ON entitlements (event_id);
