//! The register SQL: an event's read of the account's registers in one statement (which
//! write lands and what it did is the registers' rules, billing's `rules`; the event's one
//! statement that writes them is `inbox::commit`), the payment-intent link an event without
//! a customer keeps, and the registers reconciliation compares with the provider
//! (docs/design.md §4).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use serde_json::Value;

use super::credits::Transaction;
use super::model::{Effect, EventContext, SubscriptionEnds};
use super::rules::{
    GrantRow, Held, HeldAccount, HeldEntitlement, HeldIntent, HeldPayment, HeldPlan,
    HeldSubscription, LedgerEntry, Registers, Stamp,
};
use crate::domain::{CustomerId, Features, Period};
use crate::platform::db::exec;

/// Reads, in one statement, what the rules need to apply `effects` to the account: the
/// account row, its plan and standing, the subscriptions the effects name (and, with
/// `plan`, the distinct states of the account's others, for its derived plan), the
/// payments the effects name (and the invoices of the payment intents they name), those
/// payment intents, and the ledger in the event's period (and, with `plan`, what the
/// account's debits spent in it). Outside a transaction it is a
/// snapshot the event's write re-checks (the account's version); under the account's lock it
/// is the account as it stands.
pub async fn read(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    effects: &[Effect],
    plan: bool,
) -> Result<Registers, sqlx::Error> {
    let mut named = Named {
        period: Period::of(ctx.version.at),
        subscriptions: Vec::new(),
        payments: Vec::new(),
        intents: Vec::new(),
        plan,
        credits: false,
        grants: Vec::new(),
    };
    for effect in effects {
        // The account's credits, for an event that writes them or may refund a payment that
        // bought a pack (docs/design.md §4.14).
        named.credits |= matches!(
            effect,
            Effect::CreditGrant(_)
                | Effect::CreditTransaction(_)
                | Effect::PackBought { .. }
                | Effect::Payment { .. }
                | Effect::PaymentIntent { .. }
                | Effect::RefundIntent { .. }
        );
        match effect {
            Effect::CreditGrant(g) => named.grants.push(g.grant_id.clone()),
            Effect::CreditTransaction(t) => named.grants.push(t.grant_id.clone()),
            Effect::PackBought { payment, price, .. } => {
                named.grants.push(format!("pack:{payment}:{price}"))
            }
            _ => {}
        }
        match effect {
            Effect::Subscription { id, .. } => named.subscriptions.push(id.as_str()),
            // The invoice's subscriptions, for the plan their registers hold.
            Effect::GrantOfSubscription {
                subscriptions: ids, ..
            } => named.subscriptions.extend(ids.iter().map(String::as_str)),
            Effect::Payment { id, .. } => named.payments.push(id.as_str()),
            Effect::PaymentIntent {
                payment_intent,
                invoice,
            } => {
                named.intents.push(payment_intent.as_str());
                named.payments.push(invoice.as_str());
            }
            Effect::RefundIntent { payment_intent, .. } => {
                named.intents.push(payment_intent.as_str())
            }
            _ => {}
        }
    }
    let (mut registers, ledger) = select(conn, ctx.source, ctx.customer, Some(&named)).await?;
    registers.ledger = ledger.into_iter().map(|(_, entry)| entry).collect();
    Ok(registers)
}

/// Every register of an account as stored, in one statement: the account row, its plan and
/// standing, its subscriptions, payments and payment intents, and its whole ledger by period
/// — what the audit compares with the fold of its events (docs/design.md §4.11). `None` when
/// the account does not exist.
pub async fn of_account(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
) -> Result<Option<(Registers, BTreeMap<String, Vec<LedgerEntry>>)>, sqlx::Error> {
    let (registers, entries) = select(conn, source, customer, None).await?;
    if registers.account.version.is_none() {
        return Ok(None);
    }
    let mut ledger: BTreeMap<String, Vec<LedgerEntry>> = BTreeMap::new();
    for (period, entry) in entries {
        ledger.entry(period).or_default().push(entry);
    }
    Ok(Some((registers, ledger)))
}

/// The rows of an account an event's read takes: those its effects name, the ledger of its
/// period, and with `plan` the states of the other subscriptions and the period's spending.
struct Named<'a> {
    period: Period,
    subscriptions: Vec<&'a str>,
    payments: Vec<&'a str>,
    intents: Vec<&'a str>,
    plan: bool,
    /// Whether to read the account's credits, and the grants the event names (whose
    /// transactions may have come before them).
    credits: bool,
    grants: Vec<String>,
}

/// The one read of an account's registers, [`read`]'s and [`of_account`]'s: the rows
/// `named` (`None`: all of the account's, the ledger of every period), each register's
/// columns projected once, and the ledger's entries with their period, in the order written.
async fn select(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    named: Option<&Named<'_>>,
) -> Result<(Registers, Vec<(String, LedgerEntry)>), sqlx::Error> {
    let no_rows: &[&str] = &[];
    // Each register's rows come from two branches, one gated off by `$8` (whole): the
    // planner skips the other branch's scan, and each keeps its own index.
    let row = sqlx::query!(
        r#"
        SELECT a.version AS "version?", a.deleted_at AS "deleted_at?", a.deleted_by AS "deleted_by?",
               (SELECT jsonb_build_object('key', plan_key, 'plan', plan, 'at', version_at,
                                          'rank', version_rank, 'version_key', version_key,
                                          'event_id', event_id)
                FROM customer_plans WHERE source = $1 AND customer_id = $2) AS customer_plan,
               (SELECT jsonb_build_object('past_due', past_due, 'at', version_at,
                                          'rank', version_rank, 'version_key', version_key,
                                          'event_id', event_id)
                FROM customer_standing WHERE source = $1 AND customer_id = $2) AS standing,
               (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                           'id', subscription_id, 'customer', customer_id, 'status', status,
                           'plan_key', plan_key, 'plan', plan, 'at', version_at,
                           'rank', version_rank, 'version_key', version_key, 'event_id', event_id,
                           'current_period_end', current_period_end,
                           'cancel_at_period_end', cancel_at_period_end, 'cancel_at', cancel_at,
                           'trial_end', trial_end, 'ended_at', ended_at)), '[]')
                FROM (SELECT * FROM subscriptions
                      WHERE NOT $8 AND source = $1 AND subscription_id = ANY($4)
                      UNION ALL
                      SELECT * FROM subscriptions
                      WHERE $8 AND source = $1 AND customer_id = $2) AS s) AS "subscriptions!",
               -- Distinct states, not rows: an account may hold thousands of subscriptions.
               (SELECT COALESCE(jsonb_agg(jsonb_build_object('status', o.status, 'plan', o.plan)), '[]')
                FROM (SELECT DISTINCT status, plan FROM subscriptions
                      WHERE $7 AND source = $1 AND customer_id = $2
                        AND NOT (subscription_id = ANY($4))) AS o) AS "others!",
               (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                           'id', payment_id, 'status', status, 'plan_key', plan_key, 'at', version_at,
                           'rank', version_rank, 'version_key', version_key, 'event_id', event_id)), '[]')
                FROM (SELECT * FROM payments
                      WHERE NOT $8 AND source = $1
                        AND (payment_id = ANY($5)
                             OR payment_id IN (SELECT invoice_id FROM payment_intents
                                               WHERE source = $1 AND payment_intent = ANY($6)))
                      UNION ALL
                      SELECT * FROM payments
                      WHERE $8 AND source = $1 AND customer_id = $2) AS p) AS "payments!",
               (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                           'id', payment_intent, 'invoice', invoice_id, 'customer', customer_id,
                           'refunded_charge', refunded_charge, 'refunded_by', refunded_by,
                           'linked_by', linked_by)), '[]')
                FROM (SELECT * FROM payment_intents
                      WHERE NOT $8 AND source = $1 AND payment_intent = ANY($6)
                      UNION ALL
                      SELECT * FROM payment_intents
                      WHERE $8 AND source = $1 AND customer_id = $2) AS i) AS "intents!",
               (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                           'period', period, 'plan', plan, 'allowance', allowance, 'delta', delta,
                           'entry_key', entry_key, 'event_id', event_id) ORDER BY id), '[]')
                FROM (SELECT * FROM ledger
                      WHERE NOT $8 AND source = $1 AND customer_id = $2 AND period = $3
                      UNION ALL
                      SELECT * FROM ledger
                      WHERE $8 AND source = $1 AND customer_id = $2) AS g) AS "ledger!",
               COALESCE((SELECT used FROM usage_periods
                         WHERE $7 AND source = $1 AND customer_id = $2 AND period = $3), 0) AS "used!",
               -- Every entitlement register of the account (few): its features before and
               -- after the event are its effects' to compare.
               (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                           'id', grant_id, 'active', active, 'features', features,
                           'at', version_at, 'rank', version_rank, 'version_key', version_key,
                           'event_id', event_id)), '[]')
                FROM entitlements WHERE source = $1 AND customer_id = $2) AS "entitlements!",
               -- The account's credits rows (inbox_account_credits, as the credits read
               -- takes them), when the event touches credits ($9), with the transactions of
               -- the grants it names ($10), which may have come before their grant.
               CASE WHEN $8 OR $9 THEN inbox_account_credits($1, $2, $10) END AS credits
        FROM (VALUES (1)) AS one (n)
        LEFT JOIN accounts a ON a.source = $1 AND a.customer_id = $2
        "#,
        source,
        customer.as_str(),
        named.map(|n| n.period.as_str()),
        named.map_or(no_rows, |n| n.subscriptions.as_slice()) as &[&str],
        named.map_or(no_rows, |n| n.payments.as_slice()) as &[&str],
        named.map_or(no_rows, |n| n.intents.as_slice()) as &[&str],
        named.is_some_and(|n| n.plan),
        named.is_none(),
        named.is_some_and(|n| n.credits),
        named.map_or(&[][..], |n| n.grants.as_slice()) as &[String],
    )
    .fetch_one(exec(conn))
    .await?;
    let decode = |what: &str, value: Value| -> Result<Vec<Stored>, sqlx::Error> {
        serde_json::from_value(value)
            .map_err(|e| sqlx::Error::Decode(format!("{what}: {e}").into()))
    };
    let one = |what: &str, value: Option<Value>| -> Result<Option<Stored>, sqlx::Error> {
        Ok(decode(what, Value::Array(value.into_iter().collect()))?.pop())
    };
    let mut registers = Registers {
        account: HeldAccount {
            version: row.version,
            deleted_at: row.deleted_at,
            deleted_by: row.deleted_by,
        },
        customer_plan: one("customer plan", row.customer_plan)?.map(|r| r.plan()),
        standing: one("standing", row.standing)?.map(|r| r.held(r.past_due.unwrap_or(false))),
        subscriptions: decode("subscriptions", row.subscriptions)?
            .into_iter()
            .map(|r| r.subscription())
            .collect(),
        other_subscriptions: decode("other subscriptions", row.others)?
            .into_iter()
            .map(|r| (r.status.unwrap_or_default(), r.plan))
            .collect(),
        payments: decode("payments", row.payments)?
            .into_iter()
            .map(|r| r.payment())
            .collect(),
        intents: decode("payment intents", row.intents)?
            .into_iter()
            .map(Stored::intent)
            .collect(),
        ledger: Vec::new(),
        entitlements: decode("entitlements", row.entitlements)?
            .into_iter()
            .map(Stored::entitlement)
            .collect(),
        used: row.used,
        credits: Default::default(),
        credit_rows: Default::default(),
        spends: Default::default(),
        changed: Default::default(),
    };
    if let Some(credits) = row.credits {
        let rows = super::credits_read::CreditRows::decode(credits)?;
        registers.credit_rows = rows
            .grant_events
            .iter()
            .map(|(grant, event)| {
                let row = GrantRow {
                    event_id: event.event_id,
                    voided_by: rows.voided_by.get(grant).copied(),
                };
                (grant.clone(), row)
            })
            .collect();
        registers.credits = rows.credits;
        registers.spends = rows.spends;
    }
    let ledger = decode("ledger", row.ledger)?
        .into_iter()
        .map(|mut r| (r.period.take().unwrap_or_default(), r.entry()))
        .collect();
    Ok((registers, ledger))
}

/// The customer a credit grant is for, if the grant is known: a transaction names its grant,
/// not its customer, and belongs to the grant's (docs/design.md §4.14).
pub async fn grant_customer(
    conn: &mut PgConnection,
    source: &str,
    grant_id: &str,
) -> Result<Option<CustomerId>, sqlx::Error> {
    let customer = sqlx::query_scalar!(
        "SELECT customer_id FROM credit_grants WHERE source = $1 AND grant_id = $2",
        source,
        grant_id
    )
    .fetch_optional(exec(conn))
    .await?;
    Ok(customer.and_then(|c| CustomerId::parse(&c).ok()))
}

/// Keeps a transaction whose grant is not known yet (docs/design.md §4.14): its row, keyed by
/// its grant, is counted when the grant comes. Returns the grant's customer if the grant came
/// meanwhile (then the event is the account's, and is applied to it).
pub async fn keep_transaction(
    conn: &mut PgConnection,
    source: &str,
    t: &Transaction,
    event_id: i64,
) -> Result<Option<CustomerId>, sqlx::Error> {
    sqlx::query!(
        r#"INSERT INTO credit_transactions
               (source, transaction_id, grant_id, kind, amount, effective_at, event_id)
           VALUES ($1, $2, $3, $4, $5::text::numeric, to_timestamp($6), $7)
           ON CONFLICT (source, transaction_id) DO NOTHING"#,
        source,
        t.transaction_id,
        t.grant_id,
        t.kind.as_str(),
        t.amount.to_string(),
        t.effective_at as f64,
        event_id,
    )
    .execute(exec(&mut *conn))
    .await?;
    grant_customer(conn, source, &t.grant_id).await
}

/// One register row as [`select`] returns it (each register's columns, as JSON).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct Stored {
    id: Option<String>,
    customer: Option<String>,
    status: Option<String>,
    key: Option<String>,
    plan: Option<String>,
    plan_key: Option<String>,
    past_due: Option<bool>,
    active: Option<bool>,
    features: Option<Features>,
    invoice: Option<String>,
    refunded_charge: Option<String>,
    refunded_by: Option<i64>,
    linked_by: Option<i64>,
    allowance: Option<i64>,
    delta: Option<i64>,
    entry_key: Option<String>,
    period: Option<String>,
    at: Option<DateTime<Utc>>,
    current_period_end: Option<DateTime<Utc>>,
    cancel_at_period_end: Option<bool>,
    cancel_at: Option<DateTime<Utc>>,
    trial_end: Option<DateTime<Utc>>,
    ended_at: Option<DateTime<Utc>>,
    rank: i64,
    version_key: String,
    event_id: i64,
}

impl Stored {
    fn plan(&self) -> Held<HeldPlan> {
        let value = HeldPlan {
            key: self.key.clone(),
            plan: self.plan.clone(),
        };
        self.held(value)
    }

    fn subscription(self) -> (String, Held<HeldSubscription>) {
        let value = HeldSubscription {
            customer: self.customer.clone().unwrap_or_default(),
            status: self.status.clone().unwrap_or_default(),
            plan_key: self.plan_key.clone(),
            plan: self.plan.clone(),
            ends: SubscriptionEnds {
                current_period_end: self.current_period_end,
                cancel_at_period_end: self.cancel_at_period_end.unwrap_or(false),
                cancel_at: self.cancel_at,
                trial_end: self.trial_end,
                ended_at: self.ended_at,
            },
        };
        let held = self.held(value);
        (self.id.unwrap_or_default(), held)
    }

    fn payment(self) -> (String, Held<HeldPayment>) {
        let value = HeldPayment {
            status: self.status.clone().unwrap_or_default(),
            plan_key: self.plan_key.clone(),
        };
        let held = self.held(value);
        (self.id.unwrap_or_default(), held)
    }

    fn entitlement(mut self) -> (String, Held<HeldEntitlement>) {
        let value = HeldEntitlement {
            active: self.active.unwrap_or(false),
            features: self.features.take().unwrap_or_default(),
        };
        (self.id.clone().unwrap_or_default(), self.held(value))
    }

    fn intent(self) -> (String, HeldIntent) {
        let intent = HeldIntent {
            invoice: self.invoice,
            customer: self.customer,
            refunded_charge: self.refunded_charge,
            refunded_by: self.refunded_by,
            linked_by: self.linked_by,
        };
        (self.id.unwrap_or_default(), intent)
    }

    fn entry(self) -> LedgerEntry {
        LedgerEntry {
            plan: self.plan.unwrap_or_default(),
            allowance: self.allowance.unwrap_or_default(),
            delta: self.delta.unwrap_or_default(),
            entry_key: self.entry_key.unwrap_or_default(),
            event_id: self.event_id,
        }
    }

    fn held<T>(&self, value: T) -> Held<T> {
        Held {
            value,
            stamp: Stamp {
                at: self.at.unwrap_or_default(),
                rank: self.rank,
                key: self.version_key.clone(),
            },
            event_id: self.event_id,
        }
    }
}

/// Records that a payment intent paid an invoice, for an event that names no customer; the
/// customer the intent is known under after the write, if any. One upsert, so a concurrent
/// refund of the intent sees the link or is seen by it. `event_id` is the event that told it,
/// kept with the link when it is the first (the fold reads it, docs/design.md §4.11).
pub async fn remember_link(
    conn: &mut PgConnection,
    source: &str,
    payment_intent: &str,
    invoice: &str,
    event_id: i64,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"
        INSERT INTO payment_intents AS r (source, payment_intent, invoice_id, linked_by)
        VALUES ($1, $2, $3, $4)
        ON CONFLICT (source, payment_intent) DO UPDATE
            SET invoice_id = COALESCE(r.invoice_id, EXCLUDED.invoice_id),
                linked_by = CASE WHEN r.invoice_id IS NULL THEN EXCLUDED.linked_by
                                 ELSE r.linked_by END
        RETURNING customer_id
        "#,
        source,
        payment_intent,
        invoice,
        event_id,
    )
    .fetch_one(exec(conn))
    .await
}

/// The customer a payment intent is known under, if any.
pub async fn intent_customer(
    conn: &mut PgConnection,
    source: &str,
    payment_intent: &str,
) -> Result<Option<CustomerId>, sqlx::Error> {
    Ok(sqlx::query_scalar!(
        "SELECT customer_id FROM payment_intents WHERE source = $1 AND payment_intent = $2",
        source,
        payment_intent
    )
    .fetch_optional(exec(conn))
    .await?
    .flatten()
    .and_then(|c| CustomerId::parse(&c).ok()))
}

/// A subscription register as stored: what reconciliation compares the provider's view with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSubscription {
    pub status: String,
    pub plan_key: Option<String>,
    pub ends: SubscriptionEnds,
    pub version_at: DateTime<Utc>,
}

pub async fn stored_subscription(
    conn: &mut PgConnection,
    source: &str,
    subscription_id: &str,
) -> Result<Option<StoredSubscription>, sqlx::Error> {
    let mut found = stored_subscriptions(conn, source, &[subscription_id]).await?;
    Ok(found.remove(subscription_id))
}

/// The registers of the subscriptions `ids` of `source` that exist, by id, in one statement:
/// a page of a health notice's sweep compares each with what the provider lists.
pub async fn stored_subscriptions(
    conn: &mut PgConnection,
    source: &str,
    ids: &[&str],
) -> Result<std::collections::HashMap<String, StoredSubscription>, sqlx::Error> {
    let ids: Vec<String> = ids.iter().map(|id| (*id).to_owned()).collect();
    let rows = sqlx::query!(
        r#"SELECT subscription_id, status, plan_key, version_at, current_period_end,
                  cancel_at_period_end, cancel_at, trial_end, ended_at
           FROM subscriptions WHERE source = $1 AND subscription_id = ANY($2)"#,
        source,
        &ids,
    )
    .fetch_all(exec(conn))
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let stored = StoredSubscription {
                status: r.status,
                plan_key: r.plan_key,
                ends: SubscriptionEnds {
                    current_period_end: r.current_period_end,
                    cancel_at_period_end: r.cancel_at_period_end,
                    cancel_at: r.cancel_at,
                    trial_end: r.trial_end,
                    ended_at: r.ended_at,
                },
                version_at: r.version_at,
            };
            (r.subscription_id, stored)
        })
        .collect())
}

/// A plan register as stored: what Kinde reconciliation compares the provider's view with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPlan {
    pub plan_key: Option<String>,
    pub version_at: DateTime<Utc>,
}

pub async fn stored_plan(
    conn: &mut PgConnection,
    source: &str,
    customer: &str,
) -> Result<Option<StoredPlan>, sqlx::Error> {
    sqlx::query_as!(
        StoredPlan,
        "SELECT plan_key, version_at FROM customer_plans WHERE source = $1 AND customer_id = $2",
        source,
        customer
    )
    .fetch_optional(exec(conn))
    .await
}

/// An entitlement register as stored: what Kinde reconciliation compares its read of the
/// customer's entitlements with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEntitlement {
    pub grant: String,
    pub active: bool,
    pub features: Features,
    pub version_at: DateTime<Utc>,
}

/// The customer's entitlement registers (an account holds few), by grant id.
pub async fn stored_entitlements(
    conn: &mut PgConnection,
    source: &str,
    customer: &str,
) -> Result<Vec<StoredEntitlement>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        SELECT grant_id, active, features AS "features: sqlx::types::Json<Features>", version_at
        FROM entitlements WHERE source = $1 AND customer_id = $2
        ORDER BY grant_id
        "#,
        source,
        customer
    )
    .fetch_all(exec(conn))
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| StoredEntitlement {
            grant: r.grant_id,
            active: r.active,
            features: r.features.0,
            version_at: r.version_at,
        })
        .collect())
}
