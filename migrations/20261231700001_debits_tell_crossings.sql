-- A debit that spends grants writes the low and depleted crossings it causes (docs/design.md
-- §4.14): every writer of `billing.credits_low` / `billing.credits_depleted` counts the app's
-- debits the same way (`credits::with_spends`), so a crossing a debit makes has one id, the
-- debit's time in whole seconds, whether the debit, a later event's commit or the scheduler's
-- tick writes it first. The account plan's low level of the unit comes in p_effect
-- (`credits_low`); a debit with effects off writes none. Otherwise as 20261231200001.

CREATE OR REPLACE FUNCTION inbox_debit(
    p_source text, p_customer text, p_key text, p_amount bigint, p_period text,
    p_period_named boolean, p_note text, p_usage_id text, p_effect jsonb, p_meter jsonb,
    p_unit text
) RETURNS TABLE (outcome text, usage_id text, period text, used bigint, remaining bigint,
                 replayed boolean, told text, reported text, allocation jsonb)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    d usage_debits%ROWTYPE;
    g record;
    v_deleted boolean;
    v_allowance bigint;
    v_used bigint;
    v_ok boolean;
    v_seq bigint;
    v_told text;
    v_reported text;
    v_from_allowance bigint;
    v_left numeric;
    v_take numeric;
    v_spent jsonb;
    v_basis text;
    v_stored_basis text;
    v_from_grants jsonb := '[]';
    v_remains jsonb := '[]';
    v_allocation jsonb;
    v_at bigint;
    v_before numeric;
    v_after numeric;
    v_level numeric;
    x record;
BEGIN
    FOR attempt IN 1..2 LOOP
        -- The second pass runs under the period's lock.
        SELECT * INTO d FROM usage_debits u
        WHERE u.source = p_source AND u.customer_id = p_customer AND u.idempotency_key = p_key;
        IF FOUND THEN
            IF d.amount <> p_amount OR d.note IS DISTINCT FROM p_note OR d.unit <> p_unit
               OR (p_period_named AND (d.period <> p_period OR d.period_named IS FALSE))
               OR (NOT p_period_named AND d.period_named IS TRUE) THEN
                RETURN QUERY SELECT 'idempotency_conflict', d.usage_id, NULL::text, NULL::bigint,
                                    NULL::bigint, true, NULL::text, NULL::text, NULL::jsonb;
            ELSE
                RETURN QUERY SELECT CASE WHEN d.accepted THEN 'accepted' ELSE 'allowance_exhausted' END,
                                    d.usage_id, d.period, d.used, d.remaining, true, NULL::text,
                                    NULL::text, d.allocation;
            END IF;
            RETURN;
        END IF;
        EXIT WHEN attempt = 2;
        SELECT a.deleted_at IS NOT NULL INTO v_deleted FROM accounts a
        WHERE a.source = p_source AND a.customer_id = p_customer;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'unknown_customer', NULL::text, NULL::text, NULL::bigint,
                                NULL::bigint, false, NULL::text, NULL::text, NULL::jsonb;
            RETURN;
        END IF;
        IF v_deleted THEN
            RETURN QUERY SELECT 'customer_deleted', NULL::text, NULL::text, NULL::bigint,
                                NULL::bigint, false, NULL::text, NULL::text, NULL::jsonb;
            RETURN;
        END IF;
        INSERT INTO usage_periods AS u (source, customer_id, period)
        VALUES (p_source, p_customer, p_period) ON CONFLICT DO NOTHING;
        SELECT u.used INTO v_used FROM usage_periods u
        WHERE u.source = p_source AND u.customer_id = p_customer AND u.period = p_period
        FOR UPDATE;
    END LOOP;
    -- A grant arriving after this read only raises the allowance: a debit decided on the
    -- smaller one spends more of the grants, or is refused, never over-spends.
    SELECT COALESCE(sum(l.delta), 0) INTO v_allowance FROM ledger l
    WHERE l.source = p_source AND l.customer_id = p_customer AND l.period = p_period;
    -- `used` counts the period's accepted debits of the allowance's unit, what the grants
    -- paid beyond the allowance included: so what the allowance has left is always
    -- allowance − used, whichever debits the grants paid for.
    v_from_allowance := CASE WHEN p_unit = 'credits'
                             THEN least(p_amount, greatest(v_allowance - v_used, 0)) ELSE 0 END;
    v_left := p_amount - v_from_allowance;
    -- An account with no grant of the unit has nothing to lock: the debit is refused as the
    -- allowance alone refused it (a grant told after this read is as a grant of allowance
    -- told after it).
    IF v_left > 0 AND NOT EXISTS (SELECT 1 FROM credit_grants c
                                  WHERE c.source = p_source AND c.customer_id = p_customer
                                    AND c.unit = p_unit) THEN
        v_ok := false;
    ELSIF v_left > 0 THEN
        -- The account and unit's lock, after the period's: every debit that spends grants of
        -- the unit, whatever its period, waits here for the one before it.
        INSERT INTO credit_spending AS s (source, customer_id, unit)
        VALUES (p_source, p_customer, p_unit) ON CONFLICT DO NOTHING;
        SELECT s.spent, s.basis INTO v_spent, v_stored_basis FROM credit_spending s
        WHERE s.source = p_source AND s.customer_id = p_customer AND s.unit = p_unit
        FOR UPDATE;
        v_basis := inbox_credit_basis(p_source, p_customer, p_unit);
        IF v_stored_basis IS DISTINCT FROM v_basis THEN
            v_spent := inbox_credit_derive_spent(p_source, p_customer, p_unit);
        END IF;
        v_at := inbox_secs(inbox_now());
        FOR g IN SELECT c.grant_id,
                        greatest(inbox_credit_available(c, v_at)
                                 - COALESCE((v_spent->>c.grant_id)::numeric, 0), 0) AS available
                 FROM credit_grants c
                 WHERE c.source = p_source AND c.customer_id = p_customer AND c.unit = p_unit
                 ORDER BY COALESCE(c.priority, 50), c.expires_at IS NULL,
                          inbox_secs(c.expires_at), c.category = 'paid',
                          inbox_secs(COALESCE(c.effective_at, c.created_at)),
                          c.grant_id COLLATE "C" LOOP
            -- Accepted once covered; a refusal reads on, to say what each grant had.
            EXIT WHEN v_left <= 0;
            CONTINUE WHEN g.available <= 0;
            v_remains := v_remains || jsonb_build_array(jsonb_build_object(
                'grant_id', g.grant_id, 'remaining', trim_scale(g.available)::text));
            v_take := least(v_left, g.available);
            IF v_take > 0 THEN
                v_from_grants := v_from_grants || jsonb_build_array(jsonb_build_object(
                    'grant_id', g.grant_id, 'amount', trim_scale(v_take)::text));
                v_left := v_left - v_take;
            END IF;
        END LOOP;
        v_ok := v_left <= 0;
        -- The unit's available balance (every scope) as the debits before this one left it,
        -- as `Credits::totals_at` counts it with their spends.
        SELECT COALESCE(sum(greatest(inbox_credit_available(c, v_at)
                                     - COALESCE((v_spent->>c.grant_id)::numeric, 0), 0)), 0)
        INTO v_before FROM credit_grants c
        WHERE c.source = p_source AND c.customer_id = p_customer AND c.unit = p_unit;
        IF v_ok THEN
            SELECT v_spent || COALESCE(jsonb_object_agg(f->>'grant_id',
                       COALESCE((v_spent->>(f->>'grant_id'))::numeric, 0)
                       + (f->>'amount')::numeric), '{}')
            INTO v_spent FROM jsonb_array_elements(v_from_grants) f;
        END IF;
        UPDATE credit_spending s SET spent = v_spent, basis = v_basis
        WHERE s.source = p_source AND s.customer_id = p_customer AND s.unit = p_unit;
    ELSE
        v_ok := true;
    END IF;
    IF v_ok THEN
        v_allocation := jsonb_build_object('from_allowance', v_from_allowance,
                                           'from_grants', v_from_grants, 'order_version', 1);
        IF p_unit = 'credits' THEN
            v_used := v_used + p_amount;
        END IF;
        UPDATE usage_periods u SET used = v_used, accepted = u.accepted + 1
        WHERE u.source = p_source AND u.customer_id = p_customer AND u.period = p_period;
    ELSE
        v_allocation := jsonb_build_object('remaining_allowance', v_from_allowance,
                                           'grants', v_remains, 'order_version', 1);
    END IF;
    INSERT INTO usage_debits (usage_id, source, customer_id, idempotency_key, period,
                              period_named, amount, note, accepted, used, remaining, unit,
                              allocation)
    VALUES (p_usage_id, p_source, p_customer, p_key, p_period, p_period_named, p_amount, p_note,
            v_ok, v_used, greatest(v_allowance - v_used, 0), p_unit, v_allocation)
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
    -- A debit that takes the unit's available balance below a level the account's plan
    -- watches (`credits_low` in p_effect, whole units) or to nothing writes that crossing,
    -- as `billing::credits::told` makes it: the same id, cause and body whoever writes it
    -- (the event's commit, the scheduler's tick), once. Written unenqueued: the rescue sends
    -- it.
    IF p_effect IS NOT NULL AND v_ok AND v_before IS NOT NULL
       AND jsonb_array_length(v_from_grants) > 0 THEN
        v_after := v_before - (p_amount - v_from_allowance);
        v_level := (p_effect->>'credits_low')::numeric;
        FOR x IN
            SELECT t.kind, t.level,
                   'credits of ' || p_source || '/' || p_customer || ' in ' || p_unit || ' '
                   || CASE WHEN t.level IS NULL THEN 'depleted'
                           ELSE 'below ' || trim_scale(t.level)::text END
                   || ' at ' || inbox_secs(d.recorded_at) AS cause
            FROM (VALUES ('billing.credits_low', v_level), ('billing.credits_depleted', NULL))
                 AS t (kind, level)
            WHERE (t.level IS NOT NULL AND v_before >= t.level AND v_after < t.level)
               OR (t.kind = 'billing.credits_depleted' AND v_before > 0 AND v_after <= 0)
            ORDER BY t.level IS NULL
        LOOP
            CONTINUE WHEN EXISTS (SELECT 1 FROM effects f WHERE f.id = 'eff_' || left(encode(
                sha256(convert_to(x.kind || E'\n' || x.cause, 'UTF8')), 'hex'), 32));
            UPDATE accounts a SET effect_seq = a.effect_seq + 1
            WHERE a.source = p_source AND a.customer_id = p_customer
            RETURNING a.effect_seq INTO v_seq;
            INSERT INTO effects (id, kind, cause, source, customer_id, sequence, event_id,
                                 occurred_at, body)
            SELECT e.id, x.kind, x.cause, p_source, p_customer, v_seq, NULL,
                   to_timestamp(inbox_secs(d.recorded_at)),
                   jsonb_build_object(
                       'id', e.id, 'type', x.kind,
                       'occurred_at', to_char(to_timestamp(inbox_secs(d.recorded_at))
                                              AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                       'data', jsonb_build_object(
                           'source', p_source, 'customer_id', p_customer, 'unit', p_unit,
                           'level', trim_scale(x.level)::text,
                           'crossed_at', to_char(to_timestamp(inbox_secs(d.recorded_at))
                                                 AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                           'sequence', v_seq))
            FROM (SELECT 'eff_' || left(encode(sha256(convert_to(x.kind || E'\n' || x.cause,
                                                                  'UTF8')), 'hex'), 32) AS id) e;
        END LOOP;
    END IF;
    IF p_meter IS NOT NULL AND v_ok THEN
        INSERT INTO meter_reports (id, source, customer_id, usage_id, idempotency_key,
                                   identifier, meter, value, period, occurred_at, enqueued_at)
        VALUES (p_meter->>'id', p_source, p_customer, d.usage_id, p_key, p_meter->>'identifier',
                p_meter->>'meter', p_amount, d.period, d.recorded_at, inbox_now())
        RETURNING id INTO v_reported;
    END IF;
    RETURN QUERY SELECT CASE WHEN v_ok THEN 'accepted' ELSE 'allowance_exhausted' END,
                        d.usage_id, d.period, d.used, d.remaining, false, v_told, v_reported,
                        d.allocation;
END
$$;
