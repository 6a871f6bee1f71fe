-- Credits: prepaid grants as a fold (docs/design.md §4.14). A grant is a register, its ledger
-- the set of its transactions, each once by its id; the balances, the burn order's allocation
-- of the app's debits and the low-balance crossings are derived from these rows when read,
-- never stored as truth.

-- Each grant's register, one row per grant: a Stripe Billing Credits grant, a catalog credit
-- pack a paid payment minted (`pack:{payment}:{price}`), a Polar meter credit. The latest
-- snapshot by (version_at, version_key) wins, as in the other registers; `voided_at` is the
-- earliest any snapshot ever said (absorbing: a later snapshot without it never revives the
-- grant), so the row is the same in every order.
CREATE TABLE credit_grants (
    source       text           NOT NULL,
    customer_id  text           NOT NULL,
    grant_id     text           NOT NULL,
    origin       text           NOT NULL
        CHECK (origin IN ('stripe_credit_grant', 'catalog_pack', 'polar_meter_credit')),
    -- A currency in its minor units, a custom pricing unit's id, or `credits`.
    unit         text           NOT NULL,
    -- `all`, `price_type:metered`, `prices:<ids>`: balances are kept per unit and scope.
    scope        text           NOT NULL,
    -- Exact to 12 decimal places (credits::Quantity): a float's sum depends on its order.
    amount       numeric(38, 12) NOT NULL CHECK (amount >= 0),
    category     text           NOT NULL CHECK (category IN ('paid', 'promotional')),
    -- NULL: the provider's default (credits::DEFAULT_PRIORITY).
    priority     smallint       CHECK (priority BETWEEN 0 AND 100),
    created_at   timestamptz    NOT NULL,
    -- NULL: from created_at.
    effective_at timestamptz,
    expires_at   timestamptz,
    voided_at    timestamptz,
    -- The snapshot's own time (Stripe's `updated`) and the event's dedupe key, its tie-break.
    version_at   timestamptz    NOT NULL,
    version_key  text COLLATE "C" NOT NULL,
    event_id     bigint         NOT NULL,
    PRIMARY KEY (source, customer_id, grant_id),
    FOREIGN KEY (source, customer_id) REFERENCES accounts (source, customer_id)
);

-- A transaction names its grant, not its customer: it finds the grant by its id.
CREATE UNIQUE INDEX credit_grants_by_id ON credit_grants (source, grant_id);
-- The purge keeps the event a row holds (docs/design.md §3.9).
CREATE INDEX credit_grants_event ON credit_grants (event_id);

-- Each grant's ledger: the provider's transactions, each once by its id. Keyed by the grant
-- alone, so a transaction that arrives before its grant is kept here (held) and counted when
-- the grant comes, never dropped or guessed. `amount` is as the provider writes it, never
-- negative; `kind` gives the sign. Never clamped: the fold sums, the read clamps.
CREATE TABLE credit_transactions (
    source         text            NOT NULL,
    transaction_id text            NOT NULL,
    grant_id       text            NOT NULL,
    kind           text            NOT NULL CHECK (kind IN (
        'credits_granted', 'credits_application_invoice_voided',
        'credits_applied', 'credits_expired', 'credits_voided')),
    amount         numeric(38, 12) NOT NULL CHECK (amount >= 0),
    effective_at   timestamptz     NOT NULL,
    event_id       bigint          NOT NULL,
    PRIMARY KEY (source, transaction_id)
);

CREATE INDEX credit_transactions_grant ON credit_transactions (source, grant_id);
CREATE INDEX credit_transactions_event ON credit_transactions (event_id);
