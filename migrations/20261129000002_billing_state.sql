-- Billing state: one last-writer-wins register per object, versioned by the provider's time
-- with the dedupe key as tie-breaker, so that the order of application cannot matter.

-- An account is a provider's customer (one customer per source). Its row is also the lock
-- that serializes the worker's transactions for one customer.
CREATE TABLE accounts (
    source      text        NOT NULL,
    customer_id text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Tombstone: the earliest provider time at which the customer was deleted. Terminal.
    deleted_at  timestamptz,
    PRIMARY KEY (source, customer_id)
);

-- The customer's plan as the provider assigns it (Kinde plan and agreement events).
CREATE TABLE customer_plans (
    source      text        NOT NULL,
    customer_id text        NOT NULL,
    plan_key    text,                -- NULL: no plan (cancelled)
    plan        text,                -- the catalog's name for plan_key
    version_at  timestamptz NOT NULL,
    version_key text COLLATE "C" NOT NULL,
    event_id    bigint      NOT NULL,
    PRIMARY KEY (source, customer_id),
    FOREIGN KEY (source, customer_id) REFERENCES accounts (source, customer_id)
);

-- Whether the customer's payments are in arrears (Kinde payment events).
CREATE TABLE customer_standing (
    source      text        NOT NULL,
    customer_id text        NOT NULL,
    past_due    boolean     NOT NULL,
    version_at  timestamptz NOT NULL,
    version_key text COLLATE "C" NOT NULL,
    event_id    bigint      NOT NULL,
    PRIMARY KEY (source, customer_id),
    FOREIGN KEY (source, customer_id) REFERENCES accounts (source, customer_id)
);

-- Each subscription (Stripe, Polar): the whole object's state as of its newest event.
CREATE TABLE subscriptions (
    source          text        NOT NULL,
    subscription_id text        NOT NULL,
    customer_id     text        NOT NULL,
    status          text        NOT NULL,
    plan_key        text,
    plan            text,
    version_at      timestamptz NOT NULL,
    version_key     text COLLATE "C" NOT NULL,
    event_id        bigint      NOT NULL,
    PRIMARY KEY (source, subscription_id),
    FOREIGN KEY (source, customer_id) REFERENCES accounts (source, customer_id)
);
CREATE INDEX subscriptions_customer ON subscriptions (source, customer_id);

-- Each payment (invoice, order, Kinde payment). `refunded` is terminal.
CREATE TABLE payments (
    source      text        NOT NULL,
    payment_id  text        NOT NULL,
    customer_id text        NOT NULL,
    status      text        NOT NULL CHECK (status IN ('paid', 'failed', 'refunded')),
    plan_key    text,
    version_at  timestamptz NOT NULL,
    version_key text COLLATE "C" NOT NULL,
    event_id    bigint      NOT NULL,
    PRIMARY KEY (source, payment_id),
    FOREIGN KEY (source, customer_id) REFERENCES accounts (source, customer_id)
);
CREATE INDEX payments_customer ON payments (source, customer_id);

-- Allowance grants. One row per (account, period, plan): the entry key makes a repeat grant
-- nothing. delta is what the grant added to the period's balance under the account lock,
-- so a period's balance (the sum) is the largest allowance granted in it.
CREATE TABLE ledger (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source      text        NOT NULL,
    customer_id text        NOT NULL,
    period      text        NOT NULL CHECK (period ~ '^[0-9]{4}-[0-9]{2}$'),
    plan        text        NOT NULL,
    allowance   bigint      NOT NULL CHECK (allowance >= 0),
    delta       bigint      NOT NULL CHECK (delta >= 0),
    reason      text        NOT NULL,
    entry_key   text        NOT NULL UNIQUE,
    event_id    bigint      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (source, customer_id) REFERENCES accounts (source, customer_id)
);
CREATE INDEX ledger_account_period ON ledger (source, customer_id, period);

-- The account's event log: what each event did, in words. Kept when inbox rows are purged.
CREATE TABLE account_log (
    event_id    bigint      PRIMARY KEY,
    source      text        NOT NULL,
    customer_id text        NOT NULL,
    event_type  text        NOT NULL,
    occurred_at timestamptz,
    outcome     text        NOT NULL CHECK (outcome IN ('applied', 'ignored', 'unprocessable')),
    reason      text        NOT NULL,
    logged_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX account_log_account ON account_log (source, customer_id, occurred_at);
