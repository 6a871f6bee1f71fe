-- Reversal of an accepted debit (docs/design.md §4.10, §4.13): the app takes a debit back
-- (`POST …/usage/{usage_id}/reversal`), its amount is returned to the period's allowance, and
-- the provider's meter is corrected: a report that never left is withdrawn, one the provider
-- holds (or may) gets a correction, written in the same statement as the reversal and sent
-- by the dispatcher after the commit. A reversal is a stored fact, answered the same way every
-- time it is asked; the used of a period is the sum of its accepted debits not reversed.

ALTER TABLE usage_debits
    ADD COLUMN reversed_at timestamptz,
    -- The period's used and remaining right after the reversal: its answer, asked again.
    ADD COLUMN reversed_used bigint,
    ADD COLUMN reversed_remaining bigint;

-- Reversals counted per period, beside the accepted debits: both move the account's version.
ALTER TABLE usage_periods ADD COLUMN reversed integer NOT NULL DEFAULT 0;

-- A correction is a report of its own: claimed, sent, retried, rescued and replayed as a
-- report is. It takes back the value of the report it corrects (`corrects`), by the
-- provider's adjustment where it has one (Stripe's meter event adjustment, `cancel`, within
-- its window) or by a compensating report of the opposite value; `how` is chosen at its first
-- attempt and kept, so that a resend is always the same request. `withdrawn`: a report whose
-- debit was reversed before it went out (or that the provider never took), never sent now.
ALTER TABLE meter_reports
    ADD COLUMN kind text NOT NULL DEFAULT 'report' CHECK (kind IN ('report', 'correction')),
    ADD COLUMN corrects text REFERENCES meter_reports (id),
    ADD COLUMN how text CHECK (how IN ('cancel', 'compensate')),
    ADD CONSTRAINT meter_reports_correction_names_its_report
        CHECK ((kind = 'correction') = (corrects IS NOT NULL));
ALTER TABLE meter_reports DROP CONSTRAINT meter_reports_status_check;
ALTER TABLE meter_reports ADD CONSTRAINT meter_reports_status_check
    CHECK (status IN ('pending', 'sent', 'dead', 'withdrawn'));
-- One report and at most one correction per debit.
ALTER TABLE meter_reports DROP CONSTRAINT meter_reports_usage_id_key;
CREATE UNIQUE INDEX meter_reports_one_per_debit ON meter_reports (usage_id, kind);
DROP INDEX meter_reports_open;
CREATE INDEX meter_reports_open ON meter_reports (created_at)
    WHERE status NOT IN ('sent', 'withdrawn');

-- Reverses the accepted debit p_usage_id of the account, once. Outcomes: 'reversed' (with
-- replayed when it was reversed before), 'unknown_usage' (no such debit of this account),
-- 'not_accepted' (a refused debit spent nothing). Under the period's lock, as a debit: used
-- goes down by the amount. The debit's meter report, if any, is withdrawn when it never went
-- out (pending and never claimed, or dead without ever possibly reaching the provider) and
-- corrected otherwise: p_correction {"id", "identifier"} names the correction's row. With
-- p_effect (effects on), `billing.usage_reversed` is written as the debit writes its
-- `allowance_exhausted`.
CREATE FUNCTION inbox_reverse_debit(
    p_source text, p_customer text, p_usage_id text, p_effect jsonb, p_correction jsonb
) RETURNS TABLE (outcome text, period text, amount bigint, used bigint, remaining bigint,
                 reversed_at timestamptz, replayed boolean, told text, withdrawn text,
                 correction text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    d usage_debits%ROWTYPE;
    r meter_reports%ROWTYPE;
    v_allowance bigint;
    v_used bigint;
    v_seq bigint;
    v_told text;
    v_withdrawn text;
    v_correction text;
BEGIN
    SELECT * INTO d FROM usage_debits u
    WHERE u.usage_id = p_usage_id AND u.source = p_source AND u.customer_id = p_customer;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown_usage', NULL::text, NULL::bigint, NULL::bigint,
                            NULL::bigint, NULL::timestamptz, false, NULL::text, NULL::text,
                            NULL::text;
        RETURN;
    END IF;
    IF NOT d.accepted THEN
        RETURN QUERY SELECT 'not_accepted', d.period, d.amount, NULL::bigint, NULL::bigint,
                            NULL::timestamptz, false, NULL::text, NULL::text, NULL::text;
        RETURN;
    END IF;
    -- The period's lock first, as a debit takes it; then the debit as it stands under it.
    SELECT u.used INTO v_used FROM usage_periods u
    WHERE u.source = p_source AND u.customer_id = p_customer AND u.period = d.period
    FOR UPDATE;
    SELECT * INTO d FROM usage_debits u WHERE u.usage_id = p_usage_id FOR UPDATE;
    IF d.reversed_at IS NOT NULL THEN
        RETURN QUERY SELECT 'reversed', d.period, d.amount, d.reversed_used,
                            d.reversed_remaining, d.reversed_at, true, NULL::text, NULL::text,
                            NULL::text;
        RETURN;
    END IF;
    SELECT COALESCE(sum(l.delta), 0) INTO v_allowance FROM ledger l
    WHERE l.source = p_source AND l.customer_id = p_customer AND l.period = d.period;
    v_used := v_used - d.amount;
    UPDATE usage_periods u SET used = v_used, reversed = u.reversed + 1
    WHERE u.source = p_source AND u.customer_id = p_customer AND u.period = d.period;
    UPDATE usage_debits u
    SET reversed_at = inbox_now(), reversed_used = v_used,
        reversed_remaining = greatest(v_allowance - v_used, 0)
    WHERE u.usage_id = p_usage_id
    RETURNING * INTO d;

    -- The report, locked: a dispatcher's claim skips it meanwhile, and one that claimed it
    -- before has set its first send.
    SELECT * INTO r FROM meter_reports m
    WHERE m.usage_id = p_usage_id AND m.kind = 'report' FOR UPDATE;
    IF FOUND THEN
        IF (r.status = 'pending' AND r.first_sent_at IS NULL)
           OR (r.status = 'dead' AND r.unanswered_at IS NULL AND r.sent_at IS NULL) THEN
            UPDATE meter_reports m
            SET status = 'withdrawn', next_attempt_at = NULL, locked_until = NULL,
                last_error = COALESCE(m.last_error || '; ', '') || 'withdrawn: its debit was reversed'
            WHERE m.id = r.id
            RETURNING m.id INTO v_withdrawn;
        ELSIF p_correction IS NOT NULL THEN
            -- Timed as the report it corrects, so both count in the same month, while the
            -- provider takes that time (Stripe: the past 35 days); else at the reversal.
            INSERT INTO meter_reports (id, source, customer_id, usage_id, idempotency_key,
                                       identifier, meter, value, period, occurred_at,
                                       enqueued_at, kind, corrects)
            VALUES (p_correction->>'id', p_source, p_customer, p_usage_id, r.idempotency_key,
                    p_correction->>'identifier', r.meter, r.value, r.period,
                    CASE WHEN r.occurred_at > inbox_now() - interval '34 days'
                         THEN r.occurred_at ELSE inbox_now() END,
                    inbox_now(), 'correction', r.id)
            RETURNING id INTO v_correction;
        END IF;
    END IF;

    IF p_effect IS NOT NULL THEN
        UPDATE accounts a SET effect_seq = a.effect_seq + 1
        WHERE a.source = p_source AND a.customer_id = p_customer
        RETURNING a.effect_seq INTO v_seq;
        INSERT INTO effects (id, kind, cause, source, customer_id, sequence, event_id, occurred_at,
                             body, enqueued_at)
        VALUES (p_effect->>'id', 'billing.usage_reversed', p_effect->>'cause', p_source,
                p_customer, v_seq, NULL, inbox_now(),
                jsonb_set(p_effect->'body', '{data}', (p_effect->'body'->'data') || jsonb_build_object(
                    'sequence', v_seq,
                    'account', (p_effect->'body'->'data'->'account') || jsonb_build_object(
                        'period', d.period, 'balance', v_allowance, 'used', d.reversed_used,
                        'remaining', d.reversed_remaining),
                    'usage', jsonb_build_object(
                        'usage_id', d.usage_id, 'idempotency_key', d.idempotency_key,
                        'amount', d.amount, 'period', d.period,
                        'reversed_at', to_char(d.reversed_at AT TIME ZONE 'UTC',
                                               'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')),
                    'meter', CASE
                        WHEN v_withdrawn IS NOT NULL THEN jsonb_build_object(
                            'report_id', v_withdrawn, 'correction', 'withdrawn')
                        WHEN v_correction IS NOT NULL THEN jsonb_build_object(
                            'report_id', r.id, 'correction', 'correcting',
                            'correction_id', v_correction)
                        ELSE NULL END))
                || jsonb_build_object('occurred_at',
                       to_char(inbox_now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')),
                inbox_now())
        ON CONFLICT (id) DO NOTHING
        RETURNING id INTO v_told;
    END IF;
    RETURN QUERY SELECT 'reversed', d.period, d.amount, d.reversed_used, d.reversed_remaining,
                        d.reversed_at, false, v_told, v_withdrawn, v_correction;
END
$$;
