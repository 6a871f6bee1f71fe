-- Meter reports (docs/design.md §4.13): an accepted debit of a source with a meter, told to
-- the provider's meter once. The row is written by inbox_debit in the statement that accepts
-- the debit, so a debit and its report commit or vanish together; the dispatcher sends it
-- after the commit and records what the provider answered.
CREATE TABLE meter_reports (
    -- 'mrp_' and 32 hex digits.
    id              text        PRIMARY KEY,
    source          text        NOT NULL,
    customer_id     text        NOT NULL,
    -- The debit told; one report per debit.
    usage_id        text        NOT NULL UNIQUE REFERENCES usage_debits (usage_id),
    idempotency_key text        NOT NULL,
    -- The provider's dedupe key: derived from the account and the app's idempotency key, the
    -- same for every attempt (Stripe's `identifier`, Polar's `external_id`).
    identifier      text        NOT NULL,
    -- The meter as the source named it when the debit was accepted (Stripe's and Polar's
    -- event name, Kinde's feature code).
    meter           text        NOT NULL,
    value           bigint      NOT NULL CHECK (value > 0),
    period          text        NOT NULL,
    -- The debit's time: the report's timestamp at the provider.
    occurred_at     timestamptz NOT NULL,
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'sent', 'dead')),
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz,
    locked_until    timestamptz,
    enqueued_at     timestamptz,
    last_error      text,
    -- When a send first went out (the start of Stripe's 24-hour dedupe window), and when one
    -- ended without the provider's answer: the provider may hold the report, so a send after
    -- it is a resend under the dedupe key within the window, and after a read-back otherwise.
    first_sent_at   timestamptz,
    unanswered_at   timestamptz,
    sent_at         timestamptz,
    -- What the provider said of the report after it took it (Stripe's meter error reports).
    provider_error  text,
    provider_error_at timestamptz,
    alerted_at      timestamptz,
    created_at      timestamptz NOT NULL DEFAULT inbox_now(),
    FOREIGN KEY (source, customer_id) REFERENCES accounts (source, customer_id)
);
CREATE INDEX meter_reports_open ON meter_reports (created_at) WHERE status <> 'sent';
CREATE INDEX meter_reports_by_account ON meter_reports (source, customer_id, period);
CREATE INDEX meter_reports_by_identifier ON meter_reports (identifier);

-- inbox_debit as before (20261208310001), and for a source with a meter (p_meter: {"id",
-- "identifier", "meter"}) the accepted debit's report, written in the same statement. A
-- refused debit, or a key asked again, writes none. The 9-argument inbox_debit stays for the
-- release that runs until the functions are updated (it writes no report: its release knows
-- no meters).
CREATE FUNCTION inbox_debit(
    p_source text, p_customer text, p_key text, p_amount bigint, p_period text,
    p_period_named boolean, p_note text, p_usage_id text, p_effect jsonb, p_meter jsonb
) RETURNS TABLE (outcome text, usage_id text, period text, used bigint, remaining bigint,
                 replayed boolean, told text, reported text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r record;
    v_reported text;
BEGIN
    SELECT * INTO r FROM inbox_debit(p_source, p_customer, p_key, p_amount, p_period,
                                     p_period_named, p_note, p_usage_id, p_effect) d;
    IF p_meter IS NOT NULL AND r.outcome = 'accepted' AND NOT r.replayed THEN
        INSERT INTO meter_reports (id, source, customer_id, usage_id, idempotency_key,
                                   identifier, meter, value, period, occurred_at, enqueued_at)
        SELECT p_meter->>'id', p_source, p_customer, u.usage_id, p_key, p_meter->>'identifier',
               p_meter->>'meter', p_amount, u.period, u.recorded_at, inbox_now()
        FROM usage_debits u WHERE u.usage_id = r.usage_id
        RETURNING id INTO v_reported;
    END IF;
    RETURN QUERY SELECT r.outcome, r.usage_id, r.period, r.used, r.remaining, r.replayed,
                        r.told, v_reported;
END
$$;
