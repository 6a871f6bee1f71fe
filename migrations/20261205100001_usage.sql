-- Usage: the app spends a period's allowance (docs/design.md §4.8). A debit is a fact stored
-- with its answer, keyed by the account and the app's idempotency key, so a key asked again
-- answers the same, accepted or refused. Nothing in the event pipeline (replay,
-- reconciliation, purge, the simulator's faults) writes or deletes these rows.

-- What an account has spent in a period: the sum of its accepted debits, kept beside them
-- so that a debit reads it under one row lock (the lock that serializes the account's
-- debits of the period) instead of summing the period's debits.
CREATE TABLE usage_periods (
    source      text   NOT NULL,
    customer_id text   NOT NULL,
    period      text   NOT NULL CHECK (period ~ '^[0-9]{4}-[0-9]{2}$'),
    used        bigint NOT NULL DEFAULT 0 CHECK (used >= 0),
    -- How many debits were accepted: with accounts.version, the account snapshot's version.
    accepted    bigint NOT NULL DEFAULT 0 CHECK (accepted >= 0),
    PRIMARY KEY (source, customer_id, period),
    FOREIGN KEY (source, customer_id) REFERENCES accounts (source, customer_id)
);

-- Each debit asked for, with the answer it got. The request (amount, period, note) is kept
-- whole: the same key with another request is a conflict, not a replay.
CREATE TABLE usage_debits (
    seq             bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    usage_id        text        PRIMARY KEY,
    source          text        NOT NULL,
    customer_id     text        NOT NULL,
    idempotency_key text        NOT NULL,
    period          text        NOT NULL CHECK (period ~ '^[0-9]{4}-[0-9]{2}$'),
    amount          bigint      NOT NULL CHECK (amount > 0),
    note            text,
    accepted        boolean     NOT NULL,
    -- The answer: the period's used and remaining right after this debit was decided.
    used            bigint      NOT NULL,
    remaining       bigint      NOT NULL,
    recorded_at     timestamptz NOT NULL DEFAULT inbox_now(),
    UNIQUE (source, customer_id, idempotency_key),
    FOREIGN KEY (source, customer_id) REFERENCES accounts (source, customer_id)
);
-- A period's usage in the order it was recorded (the list's pages).
CREATE INDEX usage_debits_period ON usage_debits (source, customer_id, period, seq) WHERE accepted;

-- An effect told by a debit (billing.allowance_exhausted) has no causing event.
ALTER TABLE effects ALTER COLUMN event_id DROP NOT NULL;

-- One debit, whole, in one call: the stored answer when the key was seen before (or a
-- conflict when it came with another request), else the decision under the lock of the
-- account's period: accepted when used + amount stays within the allowance (the period's
-- largest grant, 0 for a deleted customer), refused otherwise, and stored either way.
-- Each statement of a PL/pgSQL function reads what committed before it started, so a copy of
-- the key that was decided while this call waited for the lock is found and replayed.
--
-- `effect` (NULL when effects are off): {"id", "cause", "body"} of the period's
-- billing.allowance_exhausted, written once per account and period, the first time a debit
-- leaves nothing or is refused for lack of allowance; the function adds the account's
-- allowance, used and remaining, the debit and the account's next sequence number to the
-- body. `told` is its id when this call wrote it.
CREATE FUNCTION inbox_debit(
    p_source text, p_customer text, p_key text, p_amount bigint, p_period text, p_note text,
    p_usage_id text, p_effect jsonb
) RETURNS TABLE (outcome text, usage_id text, used bigint, remaining bigint, replayed boolean,
                 told text)
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
            IF d.amount <> p_amount OR d.period <> p_period OR d.note IS DISTINCT FROM p_note THEN
                RETURN QUERY SELECT 'idempotency_conflict', d.usage_id, NULL::bigint, NULL::bigint,
                                    true, NULL::text;
            ELSE
                RETURN QUERY SELECT CASE WHEN d.accepted THEN 'accepted' ELSE 'allowance_exhausted' END,
                                    d.usage_id, d.used, d.remaining, true, NULL::text;
            END IF;
            RETURN;
        END IF;
        EXIT WHEN attempt = 2;
        SELECT a.deleted_at IS NOT NULL INTO v_deleted FROM accounts a
        WHERE a.source = p_source AND a.customer_id = p_customer;
        IF NOT FOUND THEN
            RETURN QUERY SELECT 'unknown_customer', NULL::text, NULL::bigint, NULL::bigint, false,
                                NULL::text;
            RETURN;
        END IF;
        IF v_deleted THEN
            RETURN QUERY SELECT 'customer_deleted', NULL::text, NULL::bigint, NULL::bigint, false,
                                NULL::text;
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
    INSERT INTO usage_debits (usage_id, source, customer_id, idempotency_key, period, amount, note,
                              accepted, used, remaining)
    VALUES (p_usage_id, p_source, p_customer, p_key, p_period, p_amount, p_note, v_ok, v_used,
            greatest(v_allowance - v_used, 0))
    RETURNING * INTO d;
    IF p_effect IS NOT NULL AND (NOT v_ok OR d.remaining = 0)
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
    END IF;
    RETURN QUERY SELECT CASE WHEN v_ok THEN 'accepted' ELSE 'allowance_exhausted' END,
                        d.usage_id, d.used, d.remaining, false, v_told;
END
$$;

-- Published for apps that share the database (docs/design.md §4.8): a period's allowance,
-- used and remaining per account, read-only, with these columns and meanings kept. The
-- derived plan is not here: it needs the plan catalog, which is configuration, not data.
-- Only periods with a grant or a debit have a row.
CREATE VIEW billing_allowance AS
SELECT a.source, a.customer_id, p.period,
       a.deleted_at IS NOT NULL AS deleted,
       CASE WHEN a.deleted_at IS NOT NULL THEN 0
            ELSE COALESCE((SELECT sum(l.delta) FROM ledger l
                           WHERE l.source = a.source AND l.customer_id = a.customer_id
                             AND l.period = p.period), 0) END::bigint AS allowance,
       COALESCE(u.used, 0)::bigint AS used,
       greatest(CASE WHEN a.deleted_at IS NOT NULL THEN 0
                     ELSE COALESCE((SELECT sum(l.delta) FROM ledger l
                                    WHERE l.source = a.source AND l.customer_id = a.customer_id
                                      AND l.period = p.period), 0) END
                - COALESCE(u.used, 0), 0)::bigint AS remaining
FROM accounts a
JOIN (SELECT source, customer_id, period FROM ledger
      UNION
      SELECT source, customer_id, period FROM usage_periods) p
  ON p.source = a.source AND p.customer_id = a.customer_id
LEFT JOIN usage_periods u
  ON u.source = a.source AND u.customer_id = a.customer_id AND u.period = p.period;
