-- The meter audit (docs/design.md §4.13a): per account, meter and UTC month, the value of the
-- reports sent compared with the total the provider's meter counts. A difference is a row
-- while it lasts: recorded (and alerted) once, seen again, resolved when the totals agree.
CREATE TABLE meter_audit_differences (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source        text        NOT NULL,
    customer_id   text        NOT NULL,
    -- The UTC month compared, `YYYY-MM` (Stripe counts a report in its timestamp's month).
    period        text        NOT NULL,
    -- The meter as the reports name it (Stripe's event name).
    meter         text        NOT NULL,
    -- The value of our sent reports in the compared window, and the provider's total there,
    -- as last seen.
    ours          bigint      NOT NULL,
    theirs        double precision NOT NULL,
    first_seen_at timestamptz NOT NULL DEFAULT inbox_now(),
    last_seen_at  timestamptz NOT NULL DEFAULT inbox_now(),
    resolved_at   timestamptz
);
-- One open difference per account, meter and month.
CREATE UNIQUE INDEX meter_audit_differences_open
    ON meter_audit_differences (source, customer_id, meter, period) WHERE resolved_at IS NULL;

-- When each account, meter and month was last compared: a run takes those compared longest
-- ago first, so every one gets its turn however few a run takes.
CREATE TABLE meter_audit_checks (
    source      text        NOT NULL,
    customer_id text        NOT NULL,
    meter       text        NOT NULL,
    period      text        NOT NULL,
    checked_at  timestamptz NOT NULL,
    PRIMARY KEY (source, customer_id, meter, period)
);
