-- An account's credits rows in one call (docs/design.md §4.14): what the credits read
-- (billing::credits_read), the account read (billing::account) and an event's read of the
-- account's registers (billing::registers) fold, so that the three read the same rows the same
-- way. A jsonb object:
--
-- - `grants`: the account's grant registers (times in unix seconds as the fold counts them,
--   `inbox_secs`; amounts as numeric's text, so nothing passes through a float), each with the
--   event its register holds (`event_id`, `type`, `occurred_at`) and the event that said its
--   void (`voided_by`);
-- - `transactions`: the ledgers of those grants and of the grants p_grants names (an event's
--   own grant, whose transactions may have come before it), each with its event;
-- - `debits`: of the account's accepted debits not reversed, in a unit it holds grants of, the
--   ones that reached the grants, in the order they were accepted, each with only its part
--   past its period's allowance (`amount`).
--
-- Why only those debits: a debit of the allowance's unit takes from its period's allowance
-- first, whatever the grants hold, so what the allowance covers is decided by the period's
-- allowance and the debits before it alone. With A the period's allowance and S the sum of
-- the period's debits up to and including this one (in the order accepted), the allowance has
-- given min(A, S) by then, so this debit's part past it is
-- max(S − A, 0) − max(S − amount − A, 0). A debit the allowance covered takes nothing from a
-- grant, and the grants' allocation (credits::allocations) of the rest, each with that part
-- and no allowance, is the allocation of the whole. So the read carries the debits that spent
-- credit, not every debit the app ever made.
CREATE FUNCTION inbox_account_credits(p_source text, p_customer text,
                                      p_grants text[] DEFAULT '{}')
RETURNS jsonb
LANGUAGE plpgsql STABLE
-- One plan for every account (each table read by its (source, customer) or grant index), kept
-- for the session: planned anew at each call, as a custom plan is, the statement cost several
-- times its execution.
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    -- Most accounts hold no grant: nothing to fold, and no debit is read for them.
    IF cardinality(p_grants) = 0
       AND NOT EXISTS (SELECT 1 FROM credit_grants c
                       WHERE c.source = p_source AND c.customer_id = p_customer) THEN
        RETURN jsonb_build_object('grants', '[]'::jsonb, 'transactions', '[]'::jsonb,
                                  'debits', '[]'::jsonb);
    END IF;
    RETURN jsonb_build_object(
        'grants',
        (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                    'grant_id', g.grant_id, 'origin', g.origin, 'unit', g.unit,
                    'scope', g.scope, 'amount', g.amount::text, 'category', g.category,
                    'priority', g.priority, 'created', inbox_secs(g.created_at),
                    'effective_at', inbox_secs(g.effective_at),
                    'expires_at', inbox_secs(g.expires_at),
                    'voided_at', inbox_secs(g.voided_at), 'updated', inbox_secs(g.version_at),
                    'version_key', g.version_key, 'event_id', g.event_id,
                    'voided_by', g.voided_by, 'type', e.type,
                    'occurred_at', e.occurred_at)), '[]')
         FROM credit_grants g LEFT JOIN inbox_events e ON e.id = g.event_id
         WHERE g.source = p_source AND g.customer_id = p_customer),
        'transactions',
        (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                    'transaction_id', t.transaction_id, 'grant_id', t.grant_id,
                    'kind', t.kind, 'amount', t.amount::text,
                    'effective_at', inbox_secs(t.effective_at), 'event_id', t.event_id,
                    'type', e.type, 'occurred_at', e.occurred_at)), '[]')
         FROM credit_transactions t LEFT JOIN inbox_events e ON e.id = t.event_id
         -- One list of grant ids, so each grant's ledger is found by its index.
         WHERE t.source = p_source
           AND t.grant_id IN (SELECT c.grant_id FROM credit_grants c
                              WHERE c.source = p_source AND c.customer_id = p_customer
                              UNION
                              SELECT unnest(p_grants))),
        'debits',
        (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                    'usage_id', d.usage_id, 'unit', d.unit, 'period', d.period,
                    'amount', d.past, 'whole', d.amount, 'at', d.at) ORDER BY d.seq), '[]')
         FROM (SELECT u.usage_id, u.unit, u.period, u.seq, u.amount,
                      inbox_secs(u.recorded_at) AS at,
                      CASE WHEN u.unit <> 'credits' THEN u.amount
                           ELSE greatest(sum(u.amount) OVER w - COALESCE(a.allowance, 0), 0)
                                - greatest(sum(u.amount) OVER w - u.amount
                                           - COALESCE(a.allowance, 0), 0)
                      END AS past
               FROM usage_debits u
               LEFT JOIN (SELECT l.period, greatest(sum(l.delta), 0) AS allowance FROM ledger l
                          WHERE l.source = p_source AND l.customer_id = p_customer
                          GROUP BY l.period) AS a ON a.period = u.period
               WHERE u.source = p_source AND u.customer_id = p_customer AND u.accepted
                 AND u.reversed_at IS NULL
                 AND u.unit IN (SELECT c.unit FROM credit_grants c
                                WHERE c.source = p_source AND c.customer_id = p_customer)
               WINDOW w AS (PARTITION BY u.unit, u.period ORDER BY u.seq)) AS d
         WHERE d.past > 0));
END
$$;
