-- A reversal gives back to its period's allowance only what the debit took from it: a debit in
-- another unit than the allowance's (`credits`) never counted in `used` (inbox_debit,
-- 20261231200001), so its reversal leaves `used` and `remaining` as they were
-- (credits_debit::reversing_a_debit_of_another_unit_leaves_the_allowance_as_it_was). The
-- function as 20261212100001 wrote it, with that one rule.
CREATE OR REPLACE FUNCTION inbox_reverse_debit(
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
    -- Only a debit of the allowance's unit counted in `used` (inbox_debit), so only its
    -- reversal gives back to the allowance; another unit's gives back its grants' credit,
    -- which the read derives from the debits not reversed.
    IF d.unit = 'credits' THEN
        v_used := v_used - d.amount;
    END IF;
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
