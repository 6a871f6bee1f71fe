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
use crate::billing::model::{EventContext, SubscriptionEnds};
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
    let changed = &registers.changed;
    let plan = registers
        .customer_plan
        .as_ref()
        .filter(|_| changed.customer_plan);
    let standing = registers.standing.as_ref().filter(|_| changed.standing);
    let subscriptions: Vec<_> = changed
        .subscriptions
        .iter()
        .filter_map(|(id, read)| Some((id.as_str(), registers.subscriptions.get(id)?, *read)))
        .collect();
    let payments: Vec<_> = changed
        .payments
        .iter()
        .filter_map(|(id, read)| Some((id.as_str(), registers.payments.get(id)?, *read)))
        .collect();
    let intents: Vec<_> = changed
        .intents
        .iter()
        .filter_map(|id| Some((id.as_str(), registers.intents.get(id)?)))
        .collect();
    let ends = |field: fn(&SubscriptionEnds) -> Option<DateTime<Utc>>| {
        subscriptions
            .iter()
            .map(|(_, s, _)| field(&s.value.ends))
            .collect::<Vec<_>>()
    };
    let grants = &changed.grants;
    let period = Period::of(ctx.version.at);
    let ids: Vec<&str> = effects.iter().map(|e| e.id.as_str()).collect();
    let kinds: Vec<&str> = effects.iter().map(|e| e.kind.as_str()).collect();
    let causes: Vec<&str> = effects.iter().map(|e| e.cause.as_str()).collect();
    let bodies: Vec<Value> = effects.iter().map(|e| e.body.clone()).collect();
    let row = sqlx::query!(
        r#"
        WITH as_read AS (
            -- The account, still at the version read, and not held by another writer: one
            -- that is held or moved fails the statement at once, before it locks or writes
            -- anything (a failed attempt then costs no wait and no commit to the log). An
            -- account the read did not find is created below.
            SELECT 1 FROM accounts
            WHERE source = $3 AND customer_id = $4 AND version = $5
            FOR UPDATE SKIP LOCKED
        ), held AS (
            SELECT id FROM inbox_events
            WHERE id = $1 AND status = 'processing' AND claim_gen = $2
              AND ($5::bigint IS NULL OR EXISTS (SELECT 1 FROM as_read))
            FOR UPDATE
        ), new_effects AS (
            SELECT e.id, e.kind, e.cause, e.body, row_number() OVER (ORDER BY e.n) AS k
            FROM unnest($32::text[], $33::text[], $34::text[], $35::jsonb[])
                 WITH ORDINALITY AS e (id, kind, cause, body, n)
            WHERE NOT EXISTS (SELECT 1 FROM effects f WHERE f.id = e.id)
        ), account AS (
            INSERT INTO accounts AS a (source, customer_id, version, deleted_at, deleted_by, effect_seq)
            SELECT $3, $4, 1, $6, $47, (SELECT count(*) FROM new_effects) FROM held
            ON CONFLICT (source, customer_id) DO UPDATE
                SET version = a.version + 1, deleted_at = EXCLUDED.deleted_at,
                    deleted_by = EXCLUDED.deleted_by,
                    effect_seq = a.effect_seq + EXCLUDED.effect_seq
                WHERE a.version = $5
            RETURNING a.effect_seq - (SELECT count(*) FROM new_effects) AS base
        ), plan_written AS (
            INSERT INTO customer_plans AS r
                (source, customer_id, plan_key, plan, version_at, version_rank, version_key, event_id)
            SELECT $3, $4, $10, $11, $7, 0, $8, $1 FROM account WHERE $9
            ON CONFLICT (source, customer_id) DO UPDATE
                SET plan_key = EXCLUDED.plan_key, plan = EXCLUDED.plan,
                    version_at = EXCLUDED.version_at, version_rank = EXCLUDED.version_rank,
                    version_key = EXCLUDED.version_key, event_id = EXCLUDED.event_id
        ), standing_written AS (
            INSERT INTO customer_standing AS r
                (source, customer_id, past_due, version_at, version_rank, version_key, event_id)
            SELECT $3, $4, $13, $7, 0, $8, $1 FROM account WHERE $12
            ON CONFLICT (source, customer_id) DO UPDATE
                SET past_due = EXCLUDED.past_due, version_at = EXCLUDED.version_at,
                    version_rank = EXCLUDED.version_rank, version_key = EXCLUDED.version_key,
                    event_id = EXCLUDED.event_id
        ), subscriptions_written AS (
            -- The ends go with the status: what the winning event says, nulls included.
            INSERT INTO subscriptions AS r
                (source, subscription_id, customer_id, status, plan_key, plan,
                 current_period_end, cancel_at_period_end, cancel_at, trial_end, ended_at,
                 version_at, version_rank, version_key, event_id)
            SELECT $3, s.id, $4, s.status, s.plan_key, s.plan, s.current_period_end,
                   s.cancel_at_period_end, s.cancel_at, s.trial_end, s.ended_at, $7, s.rank, $8, $1
            FROM account, unnest($14::text[], $15::text[], $16::text[], $17::text[], $18::int8[],
                                 $42::timestamptz[], $43::bool[], $44::timestamptz[],
                                 $45::timestamptz[], $46::timestamptz[])
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
                      (SELECT x.read FROM unnest($14::text[], $40::int8[]) AS x (id, read)
                       WHERE x.id = r.subscription_id)
            RETURNING 1
        ), payments_written AS (
            INSERT INTO payments AS r
                (source, payment_id, customer_id, status, plan_key, version_at, version_rank,
                 version_key, event_id)
            SELECT $3, p.id, $4, p.status, p.plan_key, $7, p.rank, $8, $1
            FROM account, unnest($19::text[], $20::text[], $21::text[], $22::int8[])
                 AS p (id, status, plan_key, rank)
            ON CONFLICT (source, payment_id) DO UPDATE
                SET customer_id = EXCLUDED.customer_id, status = EXCLUDED.status,
                    plan_key = EXCLUDED.plan_key,
                    version_at = EXCLUDED.version_at, version_rank = EXCLUDED.version_rank,
                    version_key = EXCLUDED.version_key, event_id = EXCLUDED.event_id
                WHERE r.event_id IS NOT DISTINCT FROM
                      (SELECT x.read FROM unnest($19::text[], $41::int8[]) AS x (id, read)
                       WHERE x.id = r.payment_id)
            RETURNING 1
        ), ledger_written AS (
            INSERT INTO ledger (source, customer_id, period, plan, allowance, delta, reason, entry_key, event_id)
            SELECT $3, $4, $23, g.plan, g.allowance, g.delta, g.reason, g.entry_key, $1
            FROM account, unnest($24::text[], $25::int8[], $26::int8[], $27::text[], $28::text[])
                 AS g (plan, allowance, delta, reason, entry_key)
        ), intents_written AS (
            -- Merged, not replaced: an event without a customer may have added a link meanwhile
            -- (it takes no account lock); the caller compares what the intent holds now.
            INSERT INTO payment_intents AS r
                (source, payment_intent, invoice_id, customer_id, refunded_charge, refunded_by,
                 linked_by)
            SELECT $3, i.id, i.invoice, $4, i.charge, i.refunded_by, i.linked_by
            FROM account, unnest($29::text[], $30::text[], $31::text[], $36::int8[], $48::int8[])
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
        ), effects_written AS (
            INSERT INTO effects (id, kind, cause, source, customer_id, sequence, event_id,
                                 occurred_at, body, enqueued_at)
            SELECT n.id, n.kind, n.cause, $3, $4, account.base + n.k, $1, $7,
                   jsonb_set(n.body, '{data,sequence}', to_jsonb(account.base + n.k)), inbox_now()
            FROM account, new_effects n
            ORDER BY n.k
            RETURNING id
        ), logged AS (
            -- A line that says `applied` stays: a replay that finds its work done does not
            -- rewrite history.
            INSERT INTO account_log AS l (event_id, source, customer_id, event_type, occurred_at, outcome, reason)
            SELECT $1, $3, $4, $39, $7, $37, $38 FROM account
            ON CONFLICT (event_id) DO UPDATE
                SET outcome = EXCLUDED.outcome, reason = EXCLUDED.reason, logged_at = inbox_now()
                WHERE l.outcome <> 'applied'
        ), finished AS (
            UPDATE inbox_events
            SET status = $37, reason = $38, processed_at = inbox_now(), locked_until = NULL,
                next_attempt_at = NULL, last_error = NULL, settled = $49
            WHERE id = (SELECT id FROM held) AND EXISTS (SELECT 1 FROM account)
        )
        SELECT ($5::bigint IS NOT NULL AND NOT EXISTS (SELECT 1 FROM as_read)) AS "moved!",
               -- A subscription or payment row that no longer holds what was read fails the
               -- whole statement (serialization_failure): nothing of it is written.
               CASE WHEN (SELECT count(*) FROM subscriptions_written) < cardinality($14::text[])
                          AND EXISTS (SELECT 1 FROM account)
                    THEN inbox_register_moved('subscription')
                    WHEN (SELECT count(*) FROM payments_written) < cardinality($19::text[])
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
        event.id,
        event.claim,
        ctx.source,
        ctx.customer.as_str(),
        registers.account.version,
        registers.account.deleted_at,
        ctx.version.at.as_datetime(),
        ctx.version.key.as_str(),
        plan.is_some(),
        plan.and_then(|p| p.value.key.as_deref()),
        plan.and_then(|p| p.value.plan.as_deref()),
        standing.is_some(),
        standing.is_some_and(|s| s.value),
        &subscriptions.iter().map(|(id, _, _)| *id).collect::<Vec<_>>() as &[&str],
        &subscriptions
            .iter()
            .map(|(_, s, _)| s.value.status.as_str())
            .collect::<Vec<_>>() as &[&str],
        &subscriptions
            .iter()
            .map(|(_, s, _)| s.value.plan_key.as_deref())
            .collect::<Vec<_>>() as &[Option<&str>],
        &subscriptions
            .iter()
            .map(|(_, s, _)| s.value.plan.as_deref())
            .collect::<Vec<_>>() as &[Option<&str>],
        &subscriptions
            .iter()
            .map(|(_, s, _)| s.stamp.rank)
            .collect::<Vec<_>>(),
        &payments.iter().map(|(id, _, _)| *id).collect::<Vec<_>>() as &[&str],
        &payments
            .iter()
            .map(|(_, p, _)| p.value.status.as_str())
            .collect::<Vec<_>>() as &[&str],
        &payments
            .iter()
            .map(|(_, p, _)| p.value.plan_key.as_deref())
            .collect::<Vec<_>>() as &[Option<&str>],
        &payments.iter().map(|(_, p, _)| p.stamp.rank).collect::<Vec<_>>(),
        period.as_str(),
        &grants
            .iter()
            .map(|g| g.entry.plan.as_str())
            .collect::<Vec<_>>() as &[&str],
        &grants.iter().map(|g| g.entry.allowance).collect::<Vec<_>>(),
        &grants.iter().map(|g| g.entry.delta).collect::<Vec<_>>(),
        &grants.iter().map(|g| g.reason.as_str()).collect::<Vec<_>>() as &[&str],
        &grants
            .iter()
            .map(|g| g.entry.entry_key.as_str())
            .collect::<Vec<_>>() as &[&str],
        &intents.iter().map(|(id, _)| *id).collect::<Vec<_>>() as &[&str],
        &intents
            .iter()
            .map(|(_, i)| i.invoice.as_deref())
            .collect::<Vec<_>>() as &[Option<&str>],
        &intents
            .iter()
            .map(|(_, i)| i.refunded_charge.as_deref())
            .collect::<Vec<_>>() as &[Option<&str>],
        &ids as &[&str],
        &kinds as &[&str],
        &causes as &[&str],
        &bodies,
        &intents
            .iter()
            .map(|(_, i)| i.refunded_by)
            .collect::<Vec<_>>() as &[Option<i64>],
        status.as_str(),
        reason,
        ctx.event_type,
        &subscriptions.iter().map(|(_, _, read)| *read).collect::<Vec<_>>() as &[Option<i64>],
        &payments.iter().map(|(_, _, read)| *read).collect::<Vec<_>>() as &[Option<i64>],
        &ends(|e| e.current_period_end) as &[Option<DateTime<Utc>>],
        &subscriptions
            .iter()
            .map(|(_, s, _)| s.value.ends.cancel_at_period_end)
            .collect::<Vec<_>>(),
        &ends(|e| e.cancel_at) as &[Option<DateTime<Utc>>],
        &ends(|e| e.trial_end) as &[Option<DateTime<Utc>>],
        &ends(|e| e.ended_at) as &[Option<DateTime<Utc>>],
        registers.account.deleted_by,
        &intents
            .iter()
            .map(|(_, i)| i.linked_by)
            .collect::<Vec<_>>() as &[Option<i64>],
        settled,
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
