-- A debit's stored request is what the app sent (docs/design.md §4.10): whether it named its
-- period, beside the period it spent. A request that names none spends the month it arrives
-- in, and inbox_debit compared only that month, so the same request retried after midnight
-- UTC (its answer lost at 23:59:59) was a conflict (422 idempotency_conflict) instead of the
-- first answer (app_api::a_debit_retried_across_midnight_gets_its_first_answer).
--
-- period_named: true when the request named its period, false when it named none; NULL for
-- a debit stored before this column (or by the release that runs while this one deploys),
-- whose request is not known: it answers a repeat that names its period, or names none.
-- A stored debit whose period is not the month it was recorded in must have named it.
ALTER TABLE usage_debits ADD COLUMN period_named boolean;
UPDATE usage_debits SET period_named = true
WHERE period <> to_char(recorded_at AT TIME ZONE 'UTC', 'YYYY-MM');

-- inbox_debit as before, but for the request it compares and stores (p_period_named) and the
-- period it answers with (a replay's is the stored one). The 8-argument inbox_debit stays
-- for the release that runs until the functions are updated (docs/deploy.md, Migrations): it
-- stores period_named NULL; a later release drops it.
CREATE FUNCTION inbox_debit(
    p_source text, p_customer text, p_key text, p_amount bigint, p_period text,
    p_period_named boolean, p_note text, p_usage_id text, p_effect jsonb
) RETURNS TABLE (outcome text, usage_id text, period text, used bigint, remaining bigint,
                 replayed boolean, told text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    d usage_debits%ROWTYPE;
    v_deleted boolean;
    v_allowance bigint;
    v_used bigint;
    v_ok boolean;
    v_seq bigint;
    v_told text;
BEGIN
    FOR attempt IN 1..2 LOOP
        -- The second pass runs under the period's lock.
        SELECT * INTO d FROM usage_debits u
        WHERE u.source = p_source AND u.customer_id = p_customer AND u.idempotency_key = p_key;
        IF FOUND THEN
            -- The same request: the same amount and note, and the same period named, or none
            -- named (whatever month this copy arrived in).
            IF d.amount <> p_amount OR d.note IS DISTINCT FROM p_note
               OR (p_period_named AND (d.period <> p_period OR d.period_named IS FALSE))
               OR (NOT p_period_named AND d.period_named IS TRUE) THEN
                RETURN QUERY SELECT 'idempotency_conflict', d.usage_id, NULL::text, NULL::bigint,
                                    NULL::bigint, true, NULL::text;
            ELSE
                RETURN QUERY SELECT CASE WHEN d.accepted THEN 'accepted' ELSE 'allowance_exhausted' END,
                                    d.usage_id, d.period, d.used, d.remaining, true, NULL::text;
            END IF;
            RETURN;
        END IF;
        EXIT WHEN attempt = 2;
        SELECT a.deleted_at IS NOT NULL INTO v_deleted FROM accounts a
        WHERE a.source = p_source AND a.customer_id = p_customer;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'unknown_customer', NULL::text, NULL::text, NULL::bigint,
                                NULL::bigint, false, NULL::text;
            RETURN;
        END IF;
        IF v_deleted THEN
            RETURN QUERY SELECT 'customer_deleted', NULL::text, NULL::text, NULL::bigint,
                                NULL::bigint, false, NULL::text;
            RETURN;
        END IF;
        INSERT INTO usage_periods AS u (source, customer_id, period)
        VALUES (p_source, p_customer, p_period) ON CONFLICT DO NOTHING;
        SELECT u.used INTO v_used FROM usage_periods u
        WHERE u.source = p_source AND u.customer_id = p_customer AND u.period = p_period
        FOR UPDATE;
    END LOOP;
    -- A grant arriving after this read only raises the allowance: a debit decided on the
    -- smaller one is refused, never over-spent.
    SELECT COALESCE(sum(l.delta), 0) INTO v_allowance FROM ledger l
    WHERE l.source = p_source AND l.customer_id = p_customer AND l.period = p_period;
    v_ok := v_used + p_amount <= v_allowance;
    IF v_ok THEN
        v_used := v_used + p_amount;
        UPDATE usage_periods u SET used = v_used, accepted = u.accepted + 1
        WHERE u.source = p_source AND u.customer_id = p_customer AND u.period = p_period;
    END IF;
    INSERT INTO usage_debits (usage_id, source, customer_id, idempotency_key, period,
                              period_named, amount, note, accepted, used, remaining)
    VALUES (p_usage_id, p_source, p_customer, p_key, p_period, p_period_named, p_amount, p_note,
            v_ok, v_used, greatest(v_allowance - v_used, 0))
    RETURNING * INTO d;
    IF p_effect IS NOT NULL AND (NOT v_ok OR d.remaining = 0)
       AND (SELECT u.exhausted_told FROM usage_periods u
            WHERE u.source = p_source AND u.customer_id = p_customer AND u.period = p_period) IS NULL
       AND NOT EXISTS (SELECT 1 FROM effects f WHERE f.id = p_effect->>'id') THEN
        UPDATE accounts a SET effect_seq = a.effect_seq + 1
        WHERE a.source = p_source AND a.customer_id = p_customer
        RETURNING a.effect_seq INTO v_seq;
        INSERT INTO effects (id, kind, cause, source, customer_id, sequence, event_id, occurred_at,
                             body, enqueued_at)
        VALUES (p_effect->>'id', 'billing.allowance_exhausted', p_effect->>'cause', p_source,
                p_customer, v_seq, NULL, inbox_now(),
                jsonb_set(p_effect->'body', '{data}', (p_effect->'body'->'data') || jsonb_build_object(
                    'sequence', v_seq,
                    'account', (p_effect->'body'->'data'->'account') || jsonb_build_object(
                        'balance', v_allowance, 'used', d.used, 'remaining', d.remaining),
                    'usage', jsonb_build_object(
                        'usage_id', d.usage_id, 'idempotency_key', p_key, 'amount', p_amount,
                        'accepted', v_ok)))
                || jsonb_build_object('occurred_at',
                       to_char(inbox_now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')),
                inbox_now())
        ON CONFLICT (id) DO NOTHING
        RETURNING id INTO v_told;
        UPDATE usage_periods u SET exhausted_told = p_effect->>'id'
        WHERE u.source = p_source AND u.customer_id = p_customer AND u.period = p_period;
    END IF;
    RETURN QUERY SELECT CASE WHEN v_ok THEN 'accepted' ELSE 'allowance_exhausted' END,
                        d.usage_id, d.period, d.used, d.remaining, false, v_told;
END
$$;
