//! An event's commit: one statement that re-checks the lease, takes the account at the
//! version the event's read found it at, writes what the register rules changed (registers,
//! ledger, tombstone, payment intents), the effects with the account's next sequence numbers,
//! the account's log line, and finishes the event (docs/design.md §3.5, §8). Outside a
//! transaction it is the whole write: the statement is atomic, and an account that moved
//! since the read, a subscription or payment row another customer's event wrote meanwhile
//! (those rows are keyed by their provider id, not by the account), or a lease lost, writes
//! nothing.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;

use super::lease::Claimed;
use crate::billing::model::EventContext;
use crate::billing::rules::{HeldIntent, Registers};
use crate::domain::effect::NewEffect;
use crate::domain::{EventStatus, Period};
use crate::platform::db::exec;

/// What became of the statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Committed {
    /// Written and finished; the ids of the effects written now, and the payment intents as
    /// they stand after the write (another event may have added to one meanwhile).
    Done {
        effects: Vec<String>,
        intents: Vec<(String, HeldIntent)>,
    },
    /// Another worker holds the event now: nothing was written.
    LeaseLost,
    /// The account moved since it was read, or a subscription or payment row it writes was
    /// written meanwhile by another customer's event: nothing was written; read again.
    Moved,
}

/// The SQLSTATE of `inbox_register_moved`: serialization_failure.
const REGISTER_MOVED: &str = "40001";

/// Writes `registers`' changes for the event, with its outcome and its effects, if the lease
/// still holds and the account is still at the version read.
pub async fn commit(
    conn: &mut PgConnection,
    event: &Claimed,
    ctx: &EventContext<'_>,
    registers: &Registers,
    (status, reason): (EventStatus, &str),
    (effects, settled): (&[NewEffect], Option<&Value>),
) -> Result<Committed, sqlx::Error> {
    debug_assert!(status.is_final());
    let w = BillingWrite {
        every: EveryRow::of(event, ctx),
        event: EventFinish::of(event, ctx, (status, reason), settled),
        account: AccountRow::of(registers),
        plan: PlanRow::of(registers),
        standing: StandingRow::of(registers),
        subscriptions: SubscriptionRows::of(registers),
        payments: PaymentRows::of(registers),
        ledger: LedgerRows::of(registers, ctx),
        intents: IntentRows::of(registers),
        effects: EffectRows::of(effects),
        entitlements: EntitlementRows::of(registers),
        credit_grants: CreditGrantRows::of(registers),
        credit_transactions: CreditTransactionRows::of(registers),
    };
    // One group of parameters a table, bound in the order of `BillingWrite`'s fields.
    let row = sqlx::query!(
        r#"
        -- The parameters come in groups, one a table, in the order of `BillingWrite`:
        --   $1-$5    every row: the event's id, the account (source, customer), the version
        --   $6-$10   inbox_events and account_log: the claim, status, reason, type, settled
        --   $11-$13  accounts: the version read, deleted_at, deleted_by
        --   $14-$16  customer_plans      $17-$18  customer_standing
        --   $19-$29  subscriptions       $30-$34  payments         $35-$40  ledger
        --   $41-$45  payment_intents     $46-$49  effects          $50-$53  entitlements
        --   $54-$68  credit_grants       $69-$73  credit_transactions
        WITH as_read AS (
            -- accounts ($11): the account, still at the version read, and not held by
            -- another writer: one that is held or moved fails the statement at once, before
            -- it locks or writes anything (a failed attempt then costs no wait and no commit
            -- to the log). An account the read did not find is created below.
            SELECT 1 FROM accounts
            WHERE source = $2 AND customer_id = $3 AND version = $11
            FOR UPDATE SKIP LOCKED
        ), held AS (
            -- inbox_events ($6): the lease re-check.
            SELECT id FROM inbox_events
            WHERE id = $1 AND status = 'processing' AND claim_gen = $6
              AND ($11::bigint IS NULL OR EXISTS (SELECT 1 FROM as_read))
            FOR UPDATE
        ), new_effects AS (
            -- effects ($46-$49: id, kind, cause, body), those not written yet.
            SELECT e.id, e.kind, e.cause, e.body, row_number() OVER (ORDER BY e.n) AS k
            FROM unnest($46::text[], $47::text[], $48::text[], $49::jsonb[])
                 WITH ORDINALITY AS e (id, kind, cause, body, n)
            WHERE NOT EXISTS (SELECT 1 FROM effects f WHERE f.id = e.id)
        ), account AS (
            -- accounts ($11-$13: the version read, deleted_at, deleted_by).
            INSERT INTO accounts AS a (source, customer_id, version, deleted_at, deleted_by, effect_seq)
            SELECT $2, $3, 1, $12, $13, (SELECT count(*) FROM new_effects) FROM held
            ON CONFLICT (source, customer_id) DO UPDATE
                SET version = a.version + 1, deleted_at = EXCLUDED.deleted_at,
                    deleted_by = EXCLUDED.deleted_by,
                    effect_seq = a.effect_seq + EXCLUDED.effect_seq
                WHERE a.version = $11
            RETURNING a.effect_seq - (SELECT count(*) FROM new_effects) AS base
        ), plan_written AS (
            -- customer_plans ($14-$16: written, plan_key, plan).
            INSERT INTO customer_plans AS r
                (source, customer_id, plan_key, plan, version_at, version_rank, version_key, event_id)
            SELECT $2, $3, $15, $16, $4, 0, $5, $1 FROM account WHERE $14
            ON CONFLICT (source, customer_id) DO UPDATE
                SET plan_key = EXCLUDED.plan_key, plan = EXCLUDED.plan,
                    version_at = EXCLUDED.version_at, version_rank = EXCLUDED.version_rank,
                    version_key = EXCLUDED.version_key, event_id = EXCLUDED.event_id
        ), standing_written AS (
            -- customer_standing ($17-$18: written, past_due).
            INSERT INTO customer_standing AS r
                (source, customer_id, past_due, version_at, version_rank, version_key, event_id)
            SELECT $2, $3, $18, $4, 0, $5, $1 FROM account WHERE $17
            ON CONFLICT (source, customer_id) DO UPDATE
                SET past_due = EXCLUDED.past_due, version_at = EXCLUDED.version_at,
                    version_rank = EXCLUDED.version_rank, version_key = EXCLUDED.version_key,
                    event_id = EXCLUDED.event_id
        ), subscriptions_written AS (
            -- subscriptions ($19-$29: id, status, plan_key, plan, rank, the event read, then
            -- the ends). The ends go with the status: what the winning event says, nulls
            -- included.
            INSERT INTO subscriptions AS r
                (source, subscription_id, customer_id, status, plan_key, plan,
                 current_period_end, cancel_at_period_end, cancel_at, trial_end, ended_at,
                 version_at, version_rank, version_key, event_id)
            SELECT $2, s.id, $3, s.status, s.plan_key, s.plan, s.current_period_end,
                   s.cancel_at_period_end, s.cancel_at, s.trial_end, s.ended_at, $4, s.rank, $5, $1
            FROM account, unnest($19::text[], $20::text[], $21::text[], $22::text[], $23::int8[],
                                 $25::timestamptz[], $26::bool[], $27::timestamptz[],
                                 $28::timestamptz[], $29::timestamptz[])
                 AS s (id, status, plan_key, plan, rank, current_period_end, cancel_at_period_end,
                       cancel_at, trial_end, ended_at)
            ON CONFLICT (source, subscription_id) DO UPDATE
                SET customer_id = EXCLUDED.customer_id, status = EXCLUDED.status,
                    plan_key = EXCLUDED.plan_key, plan = EXCLUDED.plan,
                    current_period_end = EXCLUDED.current_period_end,
                    cancel_at_period_end = EXCLUDED.cancel_at_period_end,
                    cancel_at = EXCLUDED.cancel_at, trial_end = EXCLUDED.trial_end,
                    ended_at = EXCLUDED.ended_at,
                    version_at = EXCLUDED.version_at, version_rank = EXCLUDED.version_rank,
                    version_key = EXCLUDED.version_key, event_id = EXCLUDED.event_id
                -- Another customer's event may have written it since the read: see `checked`.
                WHERE r.event_id IS NOT DISTINCT FROM
                      (SELECT x.read FROM unnest($19::text[], $24::int8[]) AS x (id, read)
                       WHERE x.id = r.subscription_id)
            RETURNING 1
        ), payments_written AS (
            -- payments ($30-$34: id, status, plan_key, rank, the event read).
            INSERT INTO payments AS r
                (source, payment_id, customer_id, status, plan_key, version_at, version_rank,
                 version_key, event_id)
            SELECT $2, p.id, $3, p.status, p.plan_key, $4, p.rank, $5, $1
            FROM account, unnest($30::text[], $31::text[], $32::text[], $33::int8[])
                 AS p (id, status, plan_key, rank)
            ON CONFLICT (source, payment_id) DO UPDATE
                SET customer_id = EXCLUDED.customer_id, status = EXCLUDED.status,
                    plan_key = EXCLUDED.plan_key,
                    version_at = EXCLUDED.version_at, version_rank = EXCLUDED.version_rank,
                    version_key = EXCLUDED.version_key, event_id = EXCLUDED.event_id
                WHERE r.event_id IS NOT DISTINCT FROM
                      (SELECT x.read FROM unnest($30::text[], $34::int8[]) AS x (id, read)
                       WHERE x.id = r.payment_id)
            RETURNING 1
        ), ledger_written AS (
            -- ledger ($35-$40: the period, then plan, allowance, delta, reason, entry_key).
            INSERT INTO ledger (source, customer_id, period, plan, allowance, delta, reason, entry_key, event_id)
            SELECT $2, $3, $35, g.plan, g.allowance, g.delta, g.reason, g.entry_key, $1
            FROM account, unnest($36::text[], $37::int8[], $38::int8[], $39::text[], $40::text[])
                 AS g (plan, allowance, delta, reason, entry_key)
        ), intents_written AS (
            -- payment_intents ($41-$45: id, invoice, refunded_charge, refunded_by,
            -- linked_by). Merged, not replaced: an event without a customer may have added a
            -- link meanwhile (it takes no account lock); the caller compares what the intent
            -- holds now.
            INSERT INTO payment_intents AS r
                (source, payment_intent, invoice_id, customer_id, refunded_charge, refunded_by,
                 linked_by)
            SELECT $2, i.id, i.invoice, $3, i.charge, i.refunded_by, i.linked_by
            FROM account, unnest($41::text[], $42::text[], $43::text[], $44::int8[], $45::int8[])
                 AS i (id, invoice, charge, refunded_by, linked_by)
            ON CONFLICT (source, payment_intent) DO UPDATE
                SET invoice_id = COALESCE(r.invoice_id, EXCLUDED.invoice_id),
                    linked_by = CASE WHEN r.invoice_id IS NULL THEN EXCLUDED.linked_by
                                     ELSE r.linked_by END,
                    customer_id = COALESCE(r.customer_id, EXCLUDED.customer_id),
                    refunded_charge = COALESCE(r.refunded_charge, EXCLUDED.refunded_charge),
                    refunded_by = COALESCE(r.refunded_by, EXCLUDED.refunded_by)
            RETURNING payment_intent, invoice_id, customer_id, refunded_charge, refunded_by,
                      linked_by
        ), entitlements_written AS (
            -- entitlements ($50-$53: grant id, active, features, rank). Keyed by the
            -- account, whose version the statement holds: no other account's event writes them.
            INSERT INTO entitlements AS r
                (source, customer_id, grant_id, active, features, version_at, version_rank,
                 version_key, event_id)
            SELECT $2, $3, g.id, g.active, g.features, $4, g.rank, $5, $1
            FROM account, unnest($50::text[], $51::bool[], $52::jsonb[], $53::bigint[])
                 AS g (id, active, features, rank)
            ON CONFLICT (source, customer_id, grant_id) DO UPDATE
                SET active = EXCLUDED.active, features = EXCLUDED.features,
                    version_at = EXCLUDED.version_at, version_rank = EXCLUDED.version_rank,
                    version_key = EXCLUDED.version_key, event_id = EXCLUDED.event_id
        ), credit_grants_written AS (
            -- credit_grants ($54-$68), each whole: keyed by the account, whose version the
            -- statement holds (docs/design.md §4.14).
            INSERT INTO credit_grants AS r
                (source, customer_id, grant_id, origin, unit, scope, amount, category, priority,
                 created_at, effective_at, expires_at, voided_at, version_at, version_key,
                 event_id, voided_by)
            SELECT $2, $3, g.id, g.origin, g.unit, g.scope, g.amount::numeric, g.category,
                   g.priority, g.created_at, g.effective_at, g.expires_at, g.voided_at,
                   g.version_at, g.version_key, g.event_id, g.voided_by
            FROM account, unnest($54::text[], $55::text[], $56::text[], $57::text[], $58::text[],
                                 $59::text[], $60::int2[], $61::timestamptz[],
                                 $62::timestamptz[], $63::timestamptz[], $64::timestamptz[],
                                 $65::timestamptz[], $66::text[], $67::int8[], $68::int8[])
                 AS g (id, origin, unit, scope, amount, category, priority, created_at,
                       effective_at, expires_at, voided_at, version_at, version_key, event_id,
                       voided_by)
            ON CONFLICT (source, customer_id, grant_id) DO UPDATE
                SET origin = EXCLUDED.origin, unit = EXCLUDED.unit, scope = EXCLUDED.scope,
                    amount = EXCLUDED.amount, category = EXCLUDED.category,
                    priority = EXCLUDED.priority, created_at = EXCLUDED.created_at,
                    effective_at = EXCLUDED.effective_at, expires_at = EXCLUDED.expires_at,
                    voided_at = EXCLUDED.voided_at, version_at = EXCLUDED.version_at,
                    version_key = EXCLUDED.version_key, event_id = EXCLUDED.event_id,
                    voided_by = EXCLUDED.voided_by
        ), credit_transactions_written AS (
            -- credit_transactions ($69-$73), each once by its id; one kept before its grant
            -- came (written without an account) is already there.
            INSERT INTO credit_transactions
                (source, transaction_id, grant_id, kind, amount, effective_at, event_id)
            SELECT $2, t.id, t.grant_id, t.kind, t.amount::numeric, t.effective_at, $1
            FROM account, unnest($69::text[], $70::text[], $71::text[], $72::text[],
                                 $73::timestamptz[]) AS t (id, grant_id, kind, amount, effective_at)
            ON CONFLICT (source, transaction_id) DO NOTHING
        ), held_logged AS (
            -- account_log: the events of transactions kept before their grant came, which no
            -- account's log showed, join this account's log now (their reason says so).
            INSERT INTO account_log AS l
                (event_id, source, customer_id, event_type, occurred_at, outcome, reason)
            SELECT t.event_id, $2, $3, e.type, e.occurred_at, 'applied',
                   e.reason || '; counted since its grant came (event ' || $1 || ')'
            FROM account, credit_transactions t JOIN inbox_events e ON e.id = t.event_id
            WHERE t.source = $2 AND t.grant_id = ANY($54::text[]) AND t.event_id <> $1
            ON CONFLICT (event_id) DO NOTHING
        ), effects_written AS (
            -- effects (new_effects above), with the account's next sequence numbers.
            INSERT INTO effects (id, kind, cause, source, customer_id, sequence, event_id,
                                 occurred_at, body, enqueued_at)
            SELECT n.id, n.kind, n.cause, $2, $3, account.base + n.k, $1, $4,
                   jsonb_set(n.body, '{data,sequence}', to_jsonb(account.base + n.k)), inbox_now()
            FROM account, new_effects n
            ORDER BY n.k
            RETURNING id
        ), logged AS (
            -- account_log ($7-$9: outcome, reason, event type). A line that says `applied`
            -- stays: a replay that finds its work done does not rewrite history.
            INSERT INTO account_log AS l (event_id, source, customer_id, event_type, occurred_at, outcome, reason)
            SELECT $1, $2, $3, $9, $4, $7, $8 FROM account
            ON CONFLICT (event_id) DO UPDATE
                SET outcome = EXCLUDED.outcome, reason = EXCLUDED.reason, logged_at = inbox_now()
                WHERE l.outcome <> 'applied'
        ), finished AS (
            -- inbox_events ($7, $8, $10: status, reason, settled): the finish.
            UPDATE inbox_events
            SET status = $7, reason = $8, processed_at = inbox_now(), locked_until = NULL,
                next_attempt_at = NULL, last_error = NULL, settled = $10
            WHERE id = (SELECT id FROM held) AND EXISTS (SELECT 1 FROM account)
        )
        SELECT ($11::bigint IS NOT NULL AND NOT EXISTS (SELECT 1 FROM as_read)) AS "moved!",
               -- A subscription or payment row that no longer holds what was read fails the
               -- whole statement (serialization_failure): nothing of it is written.
               CASE WHEN (SELECT count(*) FROM subscriptions_written) < cardinality($19::text[])
                          AND EXISTS (SELECT 1 FROM account)
                    THEN inbox_register_moved('subscription')
                    WHEN (SELECT count(*) FROM payments_written) < cardinality($30::text[])
                          AND EXISTS (SELECT 1 FROM account)
                    THEN inbox_register_moved('payment')
               END AS checked,
               EXISTS (SELECT 1 FROM held) AS "held!",
               EXISTS (SELECT 1 FROM account) AS "written!",
               ARRAY(SELECT id FROM effects_written) AS "effects!",
               (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                           'id', payment_intent, 'invoice', invoice_id, 'customer', customer_id,
                           'refunded_charge', refunded_charge, 'refunded_by', refunded_by,
                           'linked_by', linked_by)), '[]')
                FROM intents_written) AS "intents!"
        "#,
        // $1-$5: every row
        w.every.event_id,
        w.every.source,
        w.every.customer,
        w.every.at,
        w.every.version_key,
        // $6-$10: inbox_events, account_log
        w.event.claim,
        w.event.status,
        w.event.reason,
        w.event.event_type,
        w.event.settled,
        // $11-$13: accounts
        w.account.version_read,
        w.account.deleted_at,
        w.account.deleted_by,
        // $14-$16: customer_plans
        w.plan.written,
        w.plan.plan_key,
        w.plan.plan,
        // $17-$18: customer_standing
        w.standing.written,
        w.standing.past_due,
        // $19-$29: subscriptions
        &w.subscriptions.id as &[&str],
        &w.subscriptions.status as &[&str],
        &w.subscriptions.plan_key as &[Option<&str>],
        &w.subscriptions.plan as &[Option<&str>],
        &w.subscriptions.rank,
        &w.subscriptions.read as &[Option<i64>],
        &w.subscriptions.current_period_end as &[Option<DateTime<Utc>>],
        &w.subscriptions.cancel_at_period_end,
        &w.subscriptions.cancel_at as &[Option<DateTime<Utc>>],
        &w.subscriptions.trial_end as &[Option<DateTime<Utc>>],
        &w.subscriptions.ended_at as &[Option<DateTime<Utc>>],
        // $30-$34: payments
        &w.payments.id as &[&str],
        &w.payments.status as &[&str],
        &w.payments.plan_key as &[Option<&str>],
        &w.payments.rank,
        &w.payments.read as &[Option<i64>],
        // $35-$40: ledger
        w.ledger.period.as_str(),
        &w.ledger.plan as &[&str],
        &w.ledger.allowance,
        &w.ledger.delta,
        &w.ledger.reason as &[&str],
        &w.ledger.entry_key as &[&str],
        // $41-$45: payment_intents
        &w.intents.id as &[&str],
        &w.intents.invoice as &[Option<&str>],
        &w.intents.refunded_charge as &[Option<&str>],
        &w.intents.refunded_by as &[Option<i64>],
        &w.intents.linked_by as &[Option<i64>],
        // $46-$49: effects
        &w.effects.id as &[&str],
        &w.effects.kind as &[&str],
        &w.effects.cause as &[&str],
        &w.effects.body,
        // $50-$53: entitlements
        &w.entitlements.id as &[&str],
        &w.entitlements.active,
        &w.entitlements.features,
        &w.entitlements.rank,
        // $54-$68: credit_grants
        &w.credit_grants.id as &[&str],
        &w.credit_grants.origin as &[&str],
        &w.credit_grants.unit as &[&str],
        &w.credit_grants.scope as &[&str],
        &w.credit_grants.amount,
        &w.credit_grants.category as &[&str],
        &w.credit_grants.priority as &[Option<i16>],
        &w.credit_grants.created_at,
        &w.credit_grants.effective_at as &[Option<DateTime<Utc>>],
        &w.credit_grants.expires_at as &[Option<DateTime<Utc>>],
        &w.credit_grants.voided_at as &[Option<DateTime<Utc>>],
        &w.credit_grants.version_at,
        &w.credit_grants.version_key as &[&str],
        &w.credit_grants.event_id,
        &w.credit_grants.voided_by as &[Option<i64>],
        // $69-$73: credit_transactions
        &w.credit_transactions.id as &[&str],
        &w.credit_transactions.grant_id as &[&str],
        &w.credit_transactions.kind as &[&str],
        &w.credit_transactions.amount,
        &w.credit_transactions.effective_at,
    )
    .fetch_one(exec(conn))
    .await;
    let row = match row {
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(REGISTER_MOVED) => {
            return Ok(Committed::Moved)
        }
        other => other?,
    };
    if row.moved {
        return Ok(Committed::Moved);
    }
    if !row.held {
        return Ok(Committed::LeaseLost);
    }
    if !row.written {
        return Ok(Committed::Moved);
    }
    let intents: Vec<IntentRow> = serde_json::from_value(row.intents)
        .map_err(|e| sqlx::Error::Decode(format!("payment intents: {e}").into()))?;
    Ok(Committed::Done {
        effects: row.effects,
        intents: intents
            .into_iter()
            .map(|i| {
                let intent = HeldIntent {
                    invoice: i.invoice,
                    customer: i.customer,
                    refunded_charge: i.refunded_charge,
                    refunded_by: i.refunded_by,
                    linked_by: i.linked_by,
                };
                (i.id, intent)
            })
            .collect(),
    })
}

/// A payment intent as the statement leaves it.
#[derive(Debug, serde::Deserialize)]
struct IntentRow {
    id: String,
    invoice: Option<String>,
    customer: Option<String>,
    refunded_charge: Option<String>,
    refunded_by: Option<i64>,
    linked_by: Option<i64>,
}

/// What an event's one statement writes, one part a table it feeds (thirteen tables), in the
/// order the statement takes its parameters: each part's columns are one run of `$n`.
struct BillingWrite<'a> {
    /// $1-$5: what every row written carries.
    every: EveryRow<'a>,
    /// $6-$10: `inbox_events` (the lease re-check, the finish) and `account_log`.
    event: EventFinish<'a>,
    /// $11-$13: `accounts`.
    account: AccountRow,
    /// $14-$16: `customer_plans`.
    plan: PlanRow<'a>,
    /// $17-$18: `customer_standing`.
    standing: StandingRow,
    /// $19-$29: `subscriptions`.
    subscriptions: SubscriptionRows<'a>,
    /// $30-$34: `payments`.
    payments: PaymentRows<'a>,
    /// $35-$40: `ledger`.
    ledger: LedgerRows<'a>,
    /// $41-$45: `payment_intents`.
    intents: IntentRows<'a>,
    /// $46-$49: `effects`.
    effects: EffectRows<'a>,
    /// $50-$53: `entitlements`.
    entitlements: EntitlementRows<'a>,
    /// $54-$68: `credit_grants`.
    credit_grants: CreditGrantRows<'a>,
    /// $69-$73: `credit_transactions`.
    credit_transactions: CreditTransactionRows<'a>,
}

/// The event and the account every row is written for, and the event's place in the
/// provider's order (the registers' `version_at`, `version_key`).
struct EveryRow<'a> {
    event_id: i64,
    source: &'a str,
    customer: &'a str,
    at: DateTime<Utc>,
    version_key: &'a str,
}

impl<'a> EveryRow<'a> {
    fn of(event: &'a Claimed, ctx: &'a EventContext<'_>) -> Self {
        EveryRow {
            event_id: event.id,
            source: ctx.source,
            customer: ctx.customer.as_str(),
            at: ctx.version.at.as_datetime(),
            version_key: ctx.version.key.as_str(),
        }
    }
}

/// The lease the event is written under, and its outcome: its `inbox_events` row's finish
/// and its `account_log` line.
struct EventFinish<'a> {
    claim: i64,
    status: &'static str,
    reason: &'a str,
    event_type: &'a str,
    settled: Option<&'a Value>,
}

impl<'a> EventFinish<'a> {
    fn of(
        event: &Claimed,
        ctx: &'a EventContext<'_>,
        (status, reason): (EventStatus, &'a str),
        settled: Option<&'a Value>,
    ) -> Self {
        EventFinish {
            claim: event.claim,
            status: status.as_str(),
            reason,
            event_type: ctx.event_type,
            settled,
        }
    }
}

/// The `accounts` row: the version the read found (`None`: no row), which the write moves
/// by one, and the deletion the account keeps.
struct AccountRow {
    version_read: Option<i64>,
    deleted_at: Option<DateTime<Utc>>,
    deleted_by: Option<i64>,
}

impl AccountRow {
    fn of(registers: &Registers) -> Self {
        let account = &registers.account;
        AccountRow {
            version_read: account.version,
            deleted_at: account.deleted_at,
            deleted_by: account.deleted_by,
        }
    }
}

/// The `customer_plans` row, written only if the rules changed it.
struct PlanRow<'a> {
    written: bool,
    plan_key: Option<&'a str>,
    plan: Option<&'a str>,
}

impl<'a> PlanRow<'a> {
    fn of(registers: &'a Registers) -> Self {
        let plan = registers
            .customer_plan
            .as_ref()
            .filter(|_| registers.changed.customer_plan);
        PlanRow {
            written: plan.is_some(),
            plan_key: plan.and_then(|p| p.value.key.as_deref()),
            plan: plan.and_then(|p| p.value.plan.as_deref()),
        }
    }
}

/// The `customer_standing` row, written only if the rules changed it.
struct StandingRow {
    written: bool,
    past_due: bool,
}

impl StandingRow {
    fn of(registers: &Registers) -> Self {
        let standing = registers
            .standing
            .as_ref()
            .filter(|_| registers.changed.standing);
        StandingRow {
            written: standing.is_some(),
            past_due: standing.is_some_and(|s| s.value),
        }
    }
}

/// The `subscriptions` rows the rules changed, a column an array; `read` is the event that
/// held each row when it was read (`None`: no row), which the row must still hold.
#[derive(Default)]
struct SubscriptionRows<'a> {
    id: Vec<&'a str>,
    status: Vec<&'a str>,
    plan_key: Vec<Option<&'a str>>,
    plan: Vec<Option<&'a str>>,
    rank: Vec<i64>,
    read: Vec<Option<i64>>,
    current_period_end: Vec<Option<DateTime<Utc>>>,
    cancel_at_period_end: Vec<bool>,
    cancel_at: Vec<Option<DateTime<Utc>>>,
    trial_end: Vec<Option<DateTime<Utc>>>,
    ended_at: Vec<Option<DateTime<Utc>>>,
}

impl<'a> SubscriptionRows<'a> {
    fn of(registers: &'a Registers) -> Self {
        let mut rows = Self::default();
        for (id, read) in &registers.changed.subscriptions {
            let Some(held) = registers.subscriptions.get(id) else {
                continue;
            };
            let s = &held.value;
            rows.id.push(id.as_str());
            rows.status.push(s.status.as_str());
            rows.plan_key.push(s.plan_key.as_deref());
            rows.plan.push(s.plan.as_deref());
            rows.rank.push(held.stamp.rank);
            rows.read.push(*read);
            rows.current_period_end.push(s.ends.current_period_end);
            rows.cancel_at_period_end.push(s.ends.cancel_at_period_end);
            rows.cancel_at.push(s.ends.cancel_at);
            rows.trial_end.push(s.ends.trial_end);
            rows.ended_at.push(s.ends.ended_at);
        }
        rows
    }
}

/// The `payments` rows the rules changed, with the event each held when read.
#[derive(Default)]
struct PaymentRows<'a> {
    id: Vec<&'a str>,
    status: Vec<&'a str>,
    plan_key: Vec<Option<&'a str>>,
    rank: Vec<i64>,
    read: Vec<Option<i64>>,
}

impl<'a> PaymentRows<'a> {
    fn of(registers: &'a Registers) -> Self {
        let mut rows = Self::default();
        for (id, read) in &registers.changed.payments {
            let Some(held) = registers.payments.get(id) else {
                continue;
            };
            rows.id.push(id.as_str());
            rows.status.push(held.value.status.as_str());
            rows.plan_key.push(held.value.plan_key.as_deref());
            rows.rank.push(held.stamp.rank);
            rows.read.push(*read);
        }
        rows
    }
}

/// The `ledger` rows the rules granted, in the event's period.
struct LedgerRows<'a> {
    period: Period,
    plan: Vec<&'a str>,
    allowance: Vec<i64>,
    delta: Vec<i64>,
    reason: Vec<&'a str>,
    entry_key: Vec<&'a str>,
}

impl<'a> LedgerRows<'a> {
    fn of(registers: &'a Registers, ctx: &EventContext<'_>) -> Self {
        let grants = &registers.changed.grants;
        LedgerRows {
            period: Period::of(ctx.version.at),
            plan: grants.iter().map(|g| g.entry.plan.as_str()).collect(),
            allowance: grants.iter().map(|g| g.entry.allowance).collect(),
            delta: grants.iter().map(|g| g.entry.delta).collect(),
            reason: grants.iter().map(|g| g.reason.as_str()).collect(),
            entry_key: grants.iter().map(|g| g.entry.entry_key.as_str()).collect(),
        }
    }
}

/// The `payment_intents` rows the rules changed (merged into what each holds).
#[derive(Default)]
struct IntentRows<'a> {
    id: Vec<&'a str>,
    invoice: Vec<Option<&'a str>>,
    refunded_charge: Vec<Option<&'a str>>,
    refunded_by: Vec<Option<i64>>,
    linked_by: Vec<Option<i64>>,
}

impl<'a> IntentRows<'a> {
    fn of(registers: &'a Registers) -> Self {
        let mut rows = Self::default();
        for id in &registers.changed.intents {
            let Some(intent) = registers.intents.get(id) else {
                continue;
            };
            rows.id.push(id.as_str());
            rows.invoice.push(intent.invoice.as_deref());
            rows.refunded_charge.push(intent.refunded_charge.as_deref());
            rows.refunded_by.push(intent.refunded_by);
            rows.linked_by.push(intent.linked_by);
        }
        rows
    }
}

/// The `effects` rows, before their sequence numbers (the statement gives them the
/// account's next ones).
struct EffectRows<'a> {
    id: Vec<&'a str>,
    kind: Vec<&'static str>,
    cause: Vec<&'a str>,
    body: Vec<Value>,
}

impl<'a> EffectRows<'a> {
    fn of(effects: &'a [NewEffect]) -> Self {
        EffectRows {
            id: effects.iter().map(|e| e.id.as_str()).collect(),
            kind: effects.iter().map(|e| e.kind.as_str()).collect(),
            cause: effects.iter().map(|e| e.cause.as_str()).collect(),
            body: effects.iter().map(|e| e.body.clone()).collect(),
        }
    }
}

/// The `entitlements` rows the rules changed, each whole.
#[derive(Default)]
struct EntitlementRows<'a> {
    id: Vec<&'a str>,
    active: Vec<bool>,
    features: Vec<Value>,
    rank: Vec<i64>,
}

impl<'a> EntitlementRows<'a> {
    fn of(registers: &'a Registers) -> Self {
        let mut rows = Self::default();
        for id in registers.changed.entitlements.keys() {
            let Some(held) = registers.entitlements.get(id) else {
                continue;
            };
            rows.id.push(id.as_str());
            rows.active.push(held.value.active);
            rows.features
                .push(serde_json::to_value(&held.value.features).unwrap_or(Value::Null));
            rows.rank.push(held.stamp.rank);
        }
        rows
    }
}

/// A time of the credits fold (unix seconds) as the tables keep it.
fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(secs, 0).unwrap_or_default()
}

/// The `credit_grants` rows the rules changed, each whole (docs/design.md §4.14).
#[derive(Default)]
struct CreditGrantRows<'a> {
    id: Vec<&'a str>,
    origin: Vec<&'static str>,
    unit: Vec<&'a str>,
    scope: Vec<&'a str>,
    amount: Vec<String>,
    category: Vec<&'static str>,
    priority: Vec<Option<i16>>,
    created_at: Vec<DateTime<Utc>>,
    effective_at: Vec<Option<DateTime<Utc>>>,
    expires_at: Vec<Option<DateTime<Utc>>>,
    voided_at: Vec<Option<DateTime<Utc>>>,
    version_at: Vec<DateTime<Utc>>,
    version_key: Vec<&'a str>,
    event_id: Vec<i64>,
    voided_by: Vec<Option<i64>>,
}

impl<'a> CreditGrantRows<'a> {
    fn of(registers: &'a Registers) -> Self {
        let mut rows = Self::default();
        for id in &registers.changed.credit_grants {
            let (Some(r), Some(row)) = (
                registers.credits.register(id),
                registers.credit_rows.get(id),
            ) else {
                continue;
            };
            let g = &r.latest;
            rows.id.push(id.as_str());
            rows.origin.push(g.origin.as_str());
            rows.unit.push(g.unit.as_str());
            rows.scope.push(g.scope.as_str());
            rows.amount.push(g.amount.to_string());
            rows.category.push(g.category.as_str());
            rows.priority.push(g.priority.map(i16::from));
            rows.created_at.push(at(g.created));
            rows.effective_at.push(g.effective_at.map(at));
            rows.expires_at.push(g.expires_at.map(at));
            rows.voided_at.push(r.voided_at.map(at));
            rows.version_at.push(at(g.updated));
            rows.version_key.push(g.event_key.as_str());
            rows.event_id.push(row.event_id);
            rows.voided_by.push(row.voided_by);
        }
        rows
    }
}

/// The `credit_transactions` rows counted now.
#[derive(Default)]
struct CreditTransactionRows<'a> {
    id: Vec<&'a str>,
    grant_id: Vec<&'a str>,
    kind: Vec<&'static str>,
    amount: Vec<String>,
    effective_at: Vec<DateTime<Utc>>,
}

impl<'a> CreditTransactionRows<'a> {
    fn of(registers: &'a Registers) -> Self {
        let mut rows = Self::default();
        for t in &registers.changed.credit_transactions {
            rows.id.push(t.transaction_id.as_str());
            rows.grant_id.push(t.grant_id.as_str());
            rows.kind.push(t.kind.as_str());
            rows.amount.push(t.amount.to_string());
            rows.effective_at.push(at(t.effective_at));
        }
        rows
    }
}
