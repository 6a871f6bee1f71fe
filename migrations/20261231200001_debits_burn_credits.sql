-- The app's debits burn the period's allowance, then credit grants (docs/design.md §4.10,
-- §4.14). A debit names its `unit` (default `credits`, the unit of the monthly allowance and
-- of catalog packs); one of the allowance's unit spends what the period's allowance has left,
-- then the account's grants of that unit in the burn order (version 1), each as far as it is
-- available at the debit's time. All or nothing, and never past what is there under
-- concurrency: the account and unit's row of `credit_spending` is the lock that serializes
-- the debits that spend grants, taken after the period's `usage_periods` row, always in that
-- order.
--
-- What each debit took is derived, never stored as truth (`credits::allocations`): from the
-- grants and their ledger, the periods' allowances and the accepted debits not reversed, in
-- the order they were accepted. `credit_spending.spent` is that derivation's sum per grant,
-- kept for the check under the lock, with the `basis` it was derived from; a debit that finds
-- the basis moved (a grant told late or again, a transaction, a grant of allowance, a
-- reversal) derives it again first. `usage_debits.allocation` is the answer the debit was
-- given, replayed under its key, as `used` and `remaining` are.

ALTER TABLE usage_debits
    ADD COLUMN unit text NOT NULL DEFAULT 'credits',
    -- Accepted: {"from_allowance", "from_grants": [{"grant_id", "amount"}], "order_version"};
    -- refused: {"remaining_allowance", "grants": [{"grant_id", "remaining"}], "order_version"}.
    -- NULL for a debit stored before units.
    ADD COLUMN allocation jsonb;

CREATE TABLE credit_spending (
    source      text  NOT NULL,
    customer_id text  NOT NULL,
    unit        text  NOT NULL,
    -- {grant_id: amount}: what the accepted debits took from each grant, as derived.
    spent       jsonb NOT NULL DEFAULT '{}',
    -- The inputs `spent` was derived from (inbox_credit_basis); NULL: derive before use.
    basis       text,
    PRIMARY KEY (source, customer_id, unit)
);

-- Unix seconds, as the fold counts time (credits.rs: times are whole seconds).
CREATE FUNCTION inbox_secs(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT floor(extract(epoch FROM t))::bigint $$;

-- What a grant may spend at p_at (unix seconds), as `GrantBalance::available` gives it: the
-- remaining of a grant that is effective and not yet ended (voided or expired), never below
-- zero; the provider's amount (`credits_granted`) once told, the grant's amount until then.
CREATE FUNCTION inbox_credit_available(g credit_grants, p_at bigint) RETURNS numeric
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN inbox_secs(COALESCE(g.effective_at, g.created_at)) > p_at
          OR inbox_secs(least(g.voided_at, g.expires_at)) <= p_at THEN 0
        ELSE greatest(
            CASE WHEN bool_or(t.kind = 'credits_granted') IS TRUE
                 THEN COALESCE(sum(t.amount) FILTER (WHERE t.kind = 'credits_granted'
                                                       AND inbox_secs(t.effective_at) <= p_at), 0)
                 ELSE g.amount END
            - COALESCE(sum(CASE WHEN t.kind = 'credits_application_invoice_voided' THEN -t.amount
                                WHEN t.kind = 'credits_granted' THEN 0
                                ELSE t.amount END)
                       FILTER (WHERE inbox_secs(t.effective_at) <= p_at), 0),
            0)
    END
    FROM (SELECT 1) one
    LEFT JOIN credit_transactions t ON t.source = g.source AND t.grant_id = g.grant_id
$$;

-- The inputs of an account and unit's derived allocation: its grants as they stand, how many
-- transactions they have (a transaction never changes), the account's allowance grants and
-- reversals. Equal bases, equal derivations.
CREATE FUNCTION inbox_credit_basis(p_source text, p_customer text, p_unit text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT md5(concat_ws('|',
        (SELECT string_agg(concat_ws(',', c.grant_id, c.version_at, c.version_key, c.voided_at),
                           ';' ORDER BY c.grant_id COLLATE "C")
         FROM credit_grants c
         WHERE c.source = p_source AND c.customer_id = p_customer AND c.unit = p_unit),
        (SELECT count(*) FROM credit_transactions t JOIN credit_grants c
           ON c.source = t.source AND c.grant_id = t.grant_id
         WHERE c.source = p_source AND c.customer_id = p_customer AND c.unit = p_unit),
        (SELECT concat_ws(',', count(*), sum(l.delta)) FROM ledger l
         WHERE l.source = p_source AND l.customer_id = p_customer),
        (SELECT sum(u.reversed) FROM usage_periods u
         WHERE u.source = p_source AND u.customer_id = p_customer)))
$$;

-- The per-grant sum of the derived allocation of the account's accepted debits of p_unit not
-- reversed (credits::allocations, in SQL): each in the order it was accepted spends its
-- period's allowance as the debits before it left it (the allowance's unit only), then the
-- grants in the burn order as available at its time less what the debits before it took.
CREATE FUNCTION inbox_credit_derive_spent(p_source text, p_customer text, p_unit text)
RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    d record;
    g record;
    v_spent jsonb := '{}';
    v_allowance_used jsonb := '{}';
    v_left numeric;
    v_take numeric;
    v_allowance numeric;
BEGIN
    FOR d IN SELECT u.period, u.amount, inbox_secs(u.recorded_at) AS at FROM usage_debits u
             WHERE u.source = p_source AND u.customer_id = p_customer AND u.unit = p_unit
               AND u.accepted AND u.reversed_at IS NULL
             ORDER BY u.seq LOOP
        v_left := d.amount;
        IF p_unit = 'credits' THEN
            SELECT COALESCE(sum(l.delta), 0) INTO v_allowance FROM ledger l
            WHERE l.source = p_source AND l.customer_id = p_customer AND l.period = d.period;
            v_take := least(v_left, greatest(
                v_allowance - COALESCE((v_allowance_used->>d.period)::numeric, 0), 0));
            v_allowance_used := v_allowance_used || jsonb_build_object(d.period,
                COALESCE((v_allowance_used->>d.period)::numeric, 0) + v_take);
            v_left := v_left - v_take;
        END IF;
        IF v_left > 0 THEN
            FOR g IN SELECT c.grant_id,
                            greatest(inbox_credit_available(c, d.at)
                                     - COALESCE((v_spent->>c.grant_id)::numeric, 0), 0) AS available
                     FROM credit_grants c
                     WHERE c.source = p_source AND c.customer_id = p_customer AND c.unit = p_unit
                     ORDER BY COALESCE(c.priority, 50), c.expires_at IS NULL,
                              inbox_secs(c.expires_at), c.category = 'paid',
                              inbox_secs(COALESCE(c.effective_at, c.created_at)),
                              c.grant_id COLLATE "C" LOOP
                EXIT WHEN v_left <= 0;
                v_take := least(v_left, g.available);
                IF v_take > 0 THEN
                    v_spent := v_spent || jsonb_build_object(g.grant_id,
                        COALESCE((v_spent->>g.grant_id)::numeric, 0) + v_take);
                    v_left := v_left - v_take;
                END IF;
            END LOOP;
        END IF;
    END LOOP;
    RETURN v_spent;
END
$$;

-- One debit, whole, in one call, as 20261211100001's inbox_debit, and besides: the request's
-- unit (the same key with another unit is a conflict), the grants it spends past the
-- allowance, and the answer's allocation. The 10-argument inbox_debit stays for the release
-- that runs until the functions are updated: it spends the allowance alone.
CREATE FUNCTION inbox_debit(
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
