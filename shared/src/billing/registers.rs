//! The register SQL: each effect is one conditional statement on its register, run inside
//! the worker's transaction for the event (docs/design.md §4). Which write lands is the
//! register's rule (billing's `rules`, plain functions); the statement writes under the same
//! condition and returns what the register held before, from which the rule says what the
//! write did — and a statement that disagrees with its rule is refused.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::model::{allowance_entry_key, Change, Effect, Fact, PaymentStatus, Rank, Version};
use super::rules::{self, Held, HeldPeriod, HeldSubscription, Ruled, Stamp};
use crate::domain::{CustomerId, Period};

/// Who an event is about and where it sits in the provider's order.
#[derive(Debug, Clone)]
pub struct EventContext<'a> {
    pub event_id: i64,
    pub source: &'a str,
    pub customer: &'a CustomerId,
    pub event_type: &'a str,
    pub version: Version,
}

/// What a register write did, and, when it changed something an app is told of, that fact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub change: Change,
    pub fact: Option<Fact>,
    /// A subscription write: the other event whose state the register held at the same
    /// provider time, before this write (a tie the status rank settled).
    pub tied_with: Option<i64>,
}

impl From<Change> for Written {
    fn from(change: Change) -> Self {
        Self {
            change,
            fact: None,
            tied_with: None,
        }
    }
}

/// Creates the account if it is new and locks its row: every transaction that touches one
/// customer's registers or ledger runs after the previous one commits.
pub async fn lock_account(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        r#"
        INSERT INTO accounts (source, customer_id) VALUES ($1, $2)
        ON CONFLICT (source, customer_id) DO UPDATE SET customer_id = EXCLUDED.customer_id
        "#,
        source,
        customer.as_str()
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Writes one effect to its register and says what it did.
pub async fn apply_effect(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    effect: &Effect,
) -> Result<Written, WriteError> {
    match effect {
        Effect::CustomerPlan { plan, key } => {
            let plan = plan.as_ref().map(|p| p.plan.as_str());
            customer_plan(conn, ctx, key.as_deref(), plan).await
        }
        Effect::Standing { past_due } => standing(conn, ctx, *past_due).await,
        Effect::Subscription {
            id,
            status,
            plan,
            rank,
        } => {
            subscription(
                conn,
                ctx,
                id,
                status,
                plan.as_ref().map(|p| (p.key.as_str(), p.plan.as_str())),
                *rank,
            )
            .await
        }
        Effect::Payment {
            id,
            status,
            plan_key,
        } => payment(conn, ctx, id, *status, plan_key.as_deref()).await,
        Effect::Grant { plan } => grant(conn, ctx, &plan.plan, plan.monthly_allowance).await,
        Effect::DeleteCustomer => delete_customer(conn, ctx).await,
        Effect::PaymentIntent {
            payment_intent,
            invoice,
        } => link_payment_intent(conn, ctx, payment_intent, invoice).await,
        Effect::RefundIntent {
            charge,
            payment_intent,
        } => refund_intent(conn, ctx, charge, payment_intent).await,
    }
}

/// A register write that failed: the database, or a statement that did not do what the
/// register's rule says it does (billing's `rules`), which is refused so that the two cannot
/// drift apart unseen; the worker rolls the event back and retries it.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("the {register} register's statement and its rule disagree on whether the event's write lands (the rule says {}); nothing was written", if *.rule_writes { "it does" } else { "it does not" })]
    Diverged {
        register: &'static str,
        rule_writes: bool,
    },
}

/// The rule's verdict, when the statement did what it says.
fn agreed(register: &'static str, ruled: Ruled, written: bool) -> Result<Written, WriteError> {
    if ruled.writes != written {
        return Err(WriteError::Diverged {
            register,
            rule_writes: ruled.writes,
        });
    }
    Ok(ruled.written)
}

/// What a register held before the write, from the statement's columns (all `None`: empty).
fn held<T>(
    value: T,
    event_id: Option<i64>,
    at: Option<DateTime<Utc>>,
    rank: Option<i16>,
    key: Option<String>,
) -> Option<Held<T>> {
    Some(Held {
        value,
        stamp: Stamp {
            at: at?,
            rank: rank?,
            key: key?,
        },
        event_id: event_id?,
    })
}

// Each register write is one statement: the conditional upsert, and beside it (read from the
// statement's snapshot, so before the write, which under the account's lock is the register
// as it stands) what the register held, for the rule to say what the write did.

async fn customer_plan(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    key: Option<&str>,
    plan: Option<&str>,
) -> Result<Written, WriteError> {
    let row = sqlx::query!(
        r#"
        WITH written AS (
            INSERT INTO customer_plans AS r (source, customer_id, plan_key, plan, version_at, version_key, event_id)
            VALUES ($1, $2, $3, $4, $5, $6, $7)
            ON CONFLICT (source, customer_id) DO UPDATE
                SET plan_key = EXCLUDED.plan_key, plan = EXCLUDED.plan, version_at = EXCLUDED.version_at,
                    version_key = EXCLUDED.version_key, event_id = EXCLUDED.event_id
                WHERE (r.version_at, r.version_rank, r.version_key)
                    < (EXCLUDED.version_at, EXCLUDED.version_rank, EXCLUDED.version_key)
            RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM written) AS "written!", h.plan_key, h.event_id AS "event_id?",
               h.version_at AS "version_at?", h.version_rank AS "version_rank?", h.version_key AS "version_key?"
        FROM (VALUES (1)) AS one (n)
        LEFT JOIN customer_plans h ON h.source = $1 AND h.customer_id = $2
        "#,
        ctx.source,
        ctx.customer.as_str(),
        key,
        plan,
        ctx.version.at.as_datetime(),
        ctx.version.key.as_str(),
        ctx.event_id,
    )
    .fetch_one(&mut *conn)
    .await?;
    let held = held(
        row.plan_key,
        row.event_id,
        row.version_at,
        row.version_rank,
        row.version_key,
    );
    let ruled = rules::customer_plan(held.as_ref(), ctx, key, plan);
    agreed("plan", ruled, row.written)
}

async fn standing(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    past_due: bool,
) -> Result<Written, WriteError> {
    let row = sqlx::query!(
        r#"
        WITH written AS (
            INSERT INTO customer_standing AS r (source, customer_id, past_due, version_at, version_key, event_id)
            VALUES ($1, $2, $3, $4, $5, $6)
            ON CONFLICT (source, customer_id) DO UPDATE
                SET past_due = EXCLUDED.past_due, version_at = EXCLUDED.version_at,
                    version_key = EXCLUDED.version_key, event_id = EXCLUDED.event_id
                WHERE (r.version_at, r.version_rank, r.version_key)
                    < (EXCLUDED.version_at, EXCLUDED.version_rank, EXCLUDED.version_key)
            RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM written) AS "written!", h.past_due AS "past_due?",
               h.event_id AS "event_id?", h.version_at AS "version_at?",
               h.version_rank AS "version_rank?", h.version_key AS "version_key?"
        FROM (VALUES (1)) AS one (n)
        LEFT JOIN customer_standing h ON h.source = $1 AND h.customer_id = $2
        "#,
        ctx.source,
        ctx.customer.as_str(),
        past_due,
        ctx.version.at.as_datetime(),
        ctx.version.key.as_str(),
        ctx.event_id,
    )
    .fetch_one(&mut *conn)
    .await?;
    let held = row.past_due.and_then(|value| {
        held(
            value,
            row.event_id,
            row.version_at,
            row.version_rank,
            row.version_key,
        )
    });
    agreed(
        "standing",
        rules::standing(held.as_ref(), ctx, past_due),
        row.written,
    )
}

async fn subscription(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    id: &str,
    status: &str,
    plan: Option<(&str, &str)>,
    rank: Rank,
) -> Result<Written, WriteError> {
    let row = sqlx::query!(
        r#"
        WITH written AS (
            INSERT INTO subscriptions AS r
                (source, subscription_id, customer_id, status, plan_key, plan, version_at,
                 version_rank, version_key, event_id)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $10, $8, $9)
            ON CONFLICT (source, subscription_id) DO UPDATE
                SET customer_id = EXCLUDED.customer_id, status = EXCLUDED.status,
                    plan_key = EXCLUDED.plan_key, plan = EXCLUDED.plan, version_at = EXCLUDED.version_at,
                    version_rank = EXCLUDED.version_rank, version_key = EXCLUDED.version_key,
                    event_id = EXCLUDED.event_id
                WHERE (r.version_at, r.version_rank, r.version_key)
                    < (EXCLUDED.version_at, EXCLUDED.version_rank, EXCLUDED.version_key)
            RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM written) AS "written!", h.status AS "status?", h.plan_key,
               h.plan, h.event_id AS "event_id?", h.version_at AS "version_at?",
               h.version_rank AS "version_rank?", h.version_key AS "version_key?"
        FROM (VALUES (1)) AS one (n)
        LEFT JOIN subscriptions h ON h.source = $1 AND h.subscription_id = $2
        "#,
        ctx.source,
        id,
        ctx.customer.as_str(),
        status,
        plan.map(|p| p.0),
        plan.map(|p| p.1),
        ctx.version.at.as_datetime(),
        ctx.version.key.as_str(),
        ctx.event_id,
        rank.0,
    )
    .fetch_one(&mut *conn)
    .await?;
    let held = row.status.and_then(|status| {
        let value = HeldSubscription {
            status,
            plan_key: row.plan_key,
            plan: row.plan,
        };
        held(
            value,
            row.event_id,
            row.version_at,
            row.version_rank,
            row.version_key,
        )
    });
    let ruled = rules::subscription(held.as_ref(), ctx, id, status, plan, rank);
    agreed("subscription", ruled, row.written)
}

async fn payment(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    id: &str,
    status: PaymentStatus,
    plan_key: Option<&str>,
) -> Result<Written, WriteError> {
    let rank = Rank::of_payment(status);
    let row = sqlx::query!(
        r#"
        WITH written AS (
            INSERT INTO payments AS r
                (source, payment_id, customer_id, status, plan_key, version_at, version_rank, version_key, event_id)
            VALUES ($1, $2, $3, $4, $5, $6, $9, $7, $8)
            ON CONFLICT (source, payment_id) DO UPDATE
                SET status = EXCLUDED.status, plan_key = COALESCE(EXCLUDED.plan_key, r.plan_key),
                    version_at = EXCLUDED.version_at, version_rank = EXCLUDED.version_rank,
                    version_key = EXCLUDED.version_key, event_id = EXCLUDED.event_id
                WHERE r.status <> 'refunded'
                  AND (EXCLUDED.status = 'refunded'
                       OR (r.version_at, r.version_rank, r.version_key)
                        < (EXCLUDED.version_at, EXCLUDED.version_rank, EXCLUDED.version_key))
            RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM written) AS "written!", h.status AS "status?",
               h.event_id AS "event_id?", h.version_at AS "version_at?",
               h.version_rank AS "version_rank?", h.version_key AS "version_key?"
        FROM (VALUES (1)) AS one (n)
        LEFT JOIN payments h ON h.source = $1 AND h.payment_id = $2
        "#,
        ctx.source,
        id,
        ctx.customer.as_str(),
        status.as_str(),
        plan_key,
        ctx.version.at.as_datetime(),
        ctx.version.key.as_str(),
        ctx.event_id,
        rank.0,
    )
    .fetch_one(&mut *conn)
    .await?;
    let held = row.status.and_then(|stored| {
        held(
            stored,
            row.event_id,
            row.version_at,
            row.version_rank,
            row.version_key,
        )
    });
    agreed(
        "payment",
        rules::payment(held.as_ref(), ctx, id, status),
        row.written,
    )
}

/// Grants a plan's allowance for the event's period, once per account, period and plan.
/// Under the account lock, `delta` tops the period up to the largest allowance granted in it.
/// A deleted customer's grants are still written — the ledger is a function of the events,
/// whichever arrived first, the tombstone or the grant — and its account shows a balance of 0
/// whatever the ledger holds (docs/design.md §4.5).
async fn grant(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    plan: &str,
    allowance: i64,
) -> Result<Written, WriteError> {
    let period = Period::of(ctx.version.at);
    let entry_key = allowance_entry_key(ctx.source, ctx.customer, &period, plan);
    let reason = format!("{plan} allowance for {period} ({})", ctx.event_type);
    let row = sqlx::query!(
        r#"
        WITH written AS (
            INSERT INTO ledger (source, customer_id, period, plan, allowance, delta, reason, entry_key, event_id)
            SELECT $1, $2, $3, $4, $5, GREATEST(0, $5 - COALESCE(max(l.allowance), 0)), $6, $7, $8
            FROM ledger l
            WHERE l.source = $1 AND l.customer_id = $2 AND l.period = $3
            ON CONFLICT (entry_key) DO NOTHING
            RETURNING delta
        )
        SELECT (SELECT delta FROM written) AS delta,
               (SELECT max(allowance) FROM ledger
                WHERE source = $1 AND customer_id = $2 AND period = $3) AS largest,
               (SELECT event_id FROM ledger WHERE entry_key = $7) AS granted_by,
               EXISTS (SELECT 1 FROM accounts WHERE source = $1 AND customer_id = $2
                       AND deleted_at IS NOT NULL) AS "deleted!"
        "#,
        ctx.source,
        ctx.customer.as_str(),
        period.as_str(),
        plan,
        allowance,
        reason,
        entry_key,
        ctx.event_id,
    )
    .fetch_one(&mut *conn)
    .await?;
    let held = HeldPeriod {
        largest: row.largest,
        granted_by: row.granted_by,
        deleted: row.deleted,
    };
    let (ruled, delta) = rules::grant(&held, ctx, plan, allowance, &entry_key);
    if delta != row.delta {
        return Err(WriteError::Diverged {
            register: "ledger",
            rule_writes: ruled.writes,
        });
    }
    agreed("ledger", ruled, row.delta.is_some())
}

/// What the payment-intent register knows after a write: the invoice and the refund.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentState {
    pub invoice: Option<String>,
    pub customer: Option<CustomerId>,
    pub refunded_by: Option<i64>,
    /// Whether the write added what it carried (a link or a refund) to the register.
    pub learned: bool,
}

/// Records that a payment intent paid an invoice, for a customer when the event names one.
/// One upsert, so a concurrent refund of the intent sees the link or is seen by it.
pub async fn remember_link(
    conn: &mut PgConnection,
    source: &str,
    payment_intent: &str,
    invoice: &str,
    customer: Option<&CustomerId>,
) -> Result<IntentState, sqlx::Error> {
    sqlx::query_as!(
        IntentState,
        r#"
        WITH before AS (
            SELECT invoice_id FROM payment_intents WHERE source = $1 AND payment_intent = $2
        )
        INSERT INTO payment_intents AS r (source, payment_intent, invoice_id, customer_id)
        VALUES ($1, $2, $3, $4)
        ON CONFLICT (source, payment_intent) DO UPDATE
            SET invoice_id = COALESCE(r.invoice_id, EXCLUDED.invoice_id),
                customer_id = COALESCE(r.customer_id, EXCLUDED.customer_id)
        RETURNING invoice_id AS invoice, customer_id AS "customer: CustomerId", refunded_by,
                  NOT EXISTS (SELECT 1 FROM before WHERE invoice_id IS NOT NULL) AS "learned!"
        "#,
        source,
        payment_intent,
        invoice,
        customer.map(CustomerId::as_str),
    )
    .fetch_one(conn)
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
    .fetch_optional(conn)
    .await?
    .flatten()
    .and_then(|c| CustomerId::parse(&c).ok()))
}

/// The invoice a payment intent is known to have paid, if any.
pub async fn linked_invoice(
    conn: &mut PgConnection,
    source: &str,
    payment_intent: &str,
) -> Result<Option<String>, sqlx::Error> {
    Ok(sqlx::query_scalar!(
        "SELECT invoice_id FROM payment_intents WHERE source = $1 AND payment_intent = $2",
        source,
        payment_intent
    )
    .fetch_optional(conn)
    .await?
    .flatten())
}

/// A link learned: when a full refund of the intent is already recorded, the invoice is
/// refunded now (the refund came first).
async fn link_payment_intent(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    payment_intent: &str,
    invoice: &str,
) -> Result<Written, WriteError> {
    let state = remember_link(
        conn,
        ctx.source,
        payment_intent,
        invoice,
        Some(ctx.customer),
    )
    .await?;
    refund_if_linked(conn, ctx, payment_intent, &state).await
}

/// What a link or a refund of a payment intent does once both halves may be known.
pub async fn refund_if_linked(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    payment_intent: &str,
    state: &IntentState,
) -> Result<Written, WriteError> {
    let change = match (&state.invoice, state.refunded_by) {
        (Some(invoice), Some(_)) => {
            let written = payment(conn, ctx, invoice, PaymentStatus::Refunded, None).await?;
            return Ok(match written.change {
                Change::Made(words) => Written {
                    change: Change::Made(format!("{words} (a full refund of {payment_intent})")),
                    ..written
                },
                _ => written,
            });
        }
        (Some(invoice), None) if state.learned => {
            Change::Made(format!("payment intent {payment_intent} paid {invoice}"))
        }
        (Some(invoice), None) => Change::AlreadyApplied(format!(
            "payment intent {payment_intent} is already known to have paid {invoice}"
        )),
        (None, _) if state.learned => Change::Made(format!(
            "refund of {payment_intent} recorded; it could not be linked to an invoice yet"
        )),
        (None, _) => Change::AlreadyApplied(format!(
            "the refund of {payment_intent} is already recorded"
        )),
    };
    Ok(change.into())
}

/// A full refund of a charge known only by its payment intent: recorded on the intent (and
/// the charge), and ending the invoice when the link is known.
async fn refund_intent(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    charge: &str,
    payment_intent: &str,
) -> Result<Written, WriteError> {
    let state = sqlx::query_as!(
        IntentState,
        r#"
        WITH before AS (
            SELECT refunded_by FROM payment_intents WHERE source = $1 AND payment_intent = $2
        )
        INSERT INTO payment_intents AS r (source, payment_intent, customer_id, refunded_charge, refunded_by)
        VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (source, payment_intent) DO UPDATE
            SET customer_id = COALESCE(r.customer_id, EXCLUDED.customer_id),
                refunded_charge = COALESCE(r.refunded_charge, EXCLUDED.refunded_charge),
                refunded_by = COALESCE(r.refunded_by, EXCLUDED.refunded_by)
        RETURNING invoice_id AS invoice, customer_id AS "customer: CustomerId", refunded_by,
                  NOT EXISTS (SELECT 1 FROM before WHERE refunded_by IS NOT NULL) AS "learned!"
        "#,
        ctx.source,
        payment_intent,
        ctx.customer.as_str(),
        charge,
        ctx.event_id,
    )
    .fetch_one(&mut *conn)
    .await?;
    refund_if_linked(conn, ctx, payment_intent, &state).await
}

async fn delete_customer(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
) -> Result<Written, WriteError> {
    let row = sqlx::query!(
        r#"
        WITH held AS (
            SELECT deleted_at FROM accounts WHERE source = $1 AND customer_id = $2
        ), written AS (
            UPDATE accounts SET deleted_at = $3
            WHERE source = $1 AND customer_id = $2 AND (deleted_at IS NULL OR deleted_at > $3)
            RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM written) AS "written!", (SELECT deleted_at FROM held) AS deleted_at
        "#,
        ctx.source,
        ctx.customer.as_str(),
        ctx.version.at.as_datetime(),
    )
    .fetch_one(&mut *conn)
    .await?;
    let ruled = rules::delete_customer(row.deleted_at, ctx);
    agreed("tombstone", ruled, row.written)
}

/// Another event's state of a subscription stamped with the same provider time as this one:
/// a tie the status rank, or a provider read, has to settle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tie {
    pub event_id: i64,
    pub status: String,
    pub plan_key: Option<String>,
}

pub async fn subscription_tie(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    subscription_id: &str,
) -> Result<Option<Tie>, sqlx::Error> {
    sqlx::query_as!(
        Tie,
        r#"SELECT event_id, status, plan_key FROM subscriptions
           WHERE source = $1 AND subscription_id = $2 AND version_at = $3 AND event_id <> $4"#,
        ctx.source,
        subscription_id,
        ctx.version.at.as_datetime(),
        ctx.event_id,
    )
    .fetch_optional(conn)
    .await
}

/// A subscription register as stored: what reconciliation compares the provider's view with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSubscription {
    pub status: String,
    pub plan_key: Option<String>,
    pub version_at: DateTime<Utc>,
}

pub async fn stored_subscription(
    conn: &mut PgConnection,
    source: &str,
    subscription_id: &str,
) -> Result<Option<StoredSubscription>, sqlx::Error> {
    sqlx::query_as!(
        StoredSubscription,
        "SELECT status, plan_key, version_at FROM subscriptions WHERE source = $1 AND subscription_id = $2",
        source,
        subscription_id
    )
    .fetch_optional(conn)
    .await
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
    .fetch_optional(conn)
    .await
}
