-- The credits audit (docs/design.md §4.14): each Stripe-mirrored credit grant's balance, as the
-- fold of its register and ledger gives it, compared with Stripe's credit balance summary of
-- the grant. A difference is a row while it lasts: recorded (and alerted) once, seen again,
-- resolved when the balances agree.
CREATE TABLE credit_audit_differences (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source        text        NOT NULL,
    customer_id   text        NOT NULL,
    grant_id      text        NOT NULL,
    -- The grant's unit (a currency, amounts in minor units, or a custom pricing unit's id).
    unit          text        NOT NULL,
    -- The mirrored ledger balance and Stripe's, as last seen, as decimal strings; `NULL`: the
    -- grant is not mirrored (ours) or Stripe does not list it for the customer (theirs).
    ours          text,
    theirs        text,
    first_seen_at timestamptz NOT NULL DEFAULT inbox_now(),
    last_seen_at  timestamptz NOT NULL DEFAULT inbox_now(),
    resolved_at   timestamptz
);
-- One open difference per grant.
CREATE UNIQUE INDEX credit_audit_differences_open
    ON credit_audit_differences (source, customer_id, grant_id) WHERE resolved_at IS NULL;

-- When each account was last compared: a run takes those compared longest ago first, so
-- every one gets its turn however few a run takes.
CREATE TABLE credit_audit_checks (
    source      text        NOT NULL,
    customer_id text        NOT NULL,
    checked_at  timestamptz NOT NULL,
    PRIMARY KEY (source, customer_id)
);
