//! The register SQL: each effect is one conditional statement on its register, run inside
//! the worker's transaction for the event (docs/design.md §4). A write lands only when the
//! event's version is newer than the register's; the same statement says, when it does not,
//! which event the register holds.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::model::{allowance_entry_key, Change, Effect, Version};
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
) -> Result<Change, sqlx::Error> {
    match effect {
        Effect::CustomerPlan { plan } => {
            customer_plan(
                conn,
                ctx,
                plan.as_ref().map(|p| (p.key.as_str(), p.plan.as_str())),
            )
            .await
        }
        Effect::Standing { past_due } => standing(conn, ctx, *past_due).await,
        Effect::Subscription { id, status, plan } => {
            subscription(
                conn,
                ctx,
                id,
                status,
                plan.as_ref().map(|p| (p.key.as_str(), p.plan.as_str())),
            )
            .await
        }
        Effect::Payment {
            id,
            status,
            plan_key,
        } => payment(conn, ctx, id, status.as_str(), plan_key.as_deref()).await,
        Effect::Grant { plan } => grant(conn, ctx, &plan.plan, plan.monthly_allowance).await,
        Effect::DeleteCustomer => delete_customer(conn, ctx).await,
    }
}

/// After a conditional write did nothing: is it because this event is what is stored?
fn unchanged(
    stored_event: Option<i64>,
    ctx: &EventContext<'_>,
    what: &str,
    superseded: &str,
) -> Change {
    if stored_event == Some(ctx.event_id) {
        Change::AlreadyApplied(format!("this {what} is already stored"))
    } else {
        Change::Superseded(superseded.to_owned())
    }
}

// Each register write is one statement: the conditional upsert, and beside it (read from the
// statement's snapshot, so before the write) which event the register held, to say why a
// write that did not happen did not.

async fn customer_plan(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    plan: Option<(&str, &str)>,
) -> Result<Change, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        WITH written AS (
            INSERT INTO customer_plans AS r (source, customer_id, plan_key, plan, version_at, version_key, event_id)
            VALUES ($1, $2, $3, $4, $5, $6, $7)
            ON CONFLICT (source, customer_id) DO UPDATE
                SET plan_key = EXCLUDED.plan_key, plan = EXCLUDED.plan, version_at = EXCLUDED.version_at,
                    version_key = EXCLUDED.version_key, event_id = EXCLUDED.event_id
                WHERE (r.version_at, r.version_key) < (EXCLUDED.version_at, EXCLUDED.version_key)
            RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM written) AS "written!",
               (SELECT event_id FROM customer_plans WHERE source = $1 AND customer_id = $2) AS stored_event
        "#,
        ctx.source,
        ctx.customer.as_str(),
        plan.map(|p| p.0),
        plan.map(|p| p.1),
        ctx.version.at.as_datetime(),
        ctx.version.key.as_str(),
        ctx.event_id,
    )
    .fetch_one(&mut *conn)
    .await?;
    if row.written {
        return Ok(Change::Made(match plan {
            Some((_, name)) => format!("plan set to {name}"),
            None => "plan cancelled".to_owned(),
        }));
    }
    Ok(unchanged(
        row.stored_event,
        ctx,
        "plan change",
        "a newer plan change is already stored",
    ))
}

async fn standing(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    past_due: bool,
) -> Result<Change, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        WITH written AS (
            INSERT INTO customer_standing AS r (source, customer_id, past_due, version_at, version_key, event_id)
            VALUES ($1, $2, $3, $4, $5, $6)
            ON CONFLICT (source, customer_id) DO UPDATE
                SET past_due = EXCLUDED.past_due, version_at = EXCLUDED.version_at,
                    version_key = EXCLUDED.version_key, event_id = EXCLUDED.event_id
                WHERE (r.version_at, r.version_key) < (EXCLUDED.version_at, EXCLUDED.version_key)
            RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM written) AS "written!",
               (SELECT event_id FROM customer_standing WHERE source = $1 AND customer_id = $2) AS stored_event
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
    if row.written {
        let words = if past_due {
            "payments past due"
        } else {
            "payments in good standing"
        };
        return Ok(Change::Made(words.to_owned()));
    }
    Ok(unchanged(
        row.stored_event,
        ctx,
        "payment standing",
        "a newer payment standing is already stored",
    ))
}

async fn subscription(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    id: &str,
    status: &str,
    plan: Option<(&str, &str)>,
) -> Result<Change, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        WITH written AS (
            INSERT INTO subscriptions AS r
                (source, subscription_id, customer_id, status, plan_key, plan, version_at, version_key, event_id)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
            ON CONFLICT (source, subscription_id) DO UPDATE
                SET customer_id = EXCLUDED.customer_id, status = EXCLUDED.status,
                    plan_key = EXCLUDED.plan_key, plan = EXCLUDED.plan, version_at = EXCLUDED.version_at,
                    version_key = EXCLUDED.version_key, event_id = EXCLUDED.event_id
                WHERE (r.version_at, r.version_key) < (EXCLUDED.version_at, EXCLUDED.version_key)
            RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM written) AS "written!",
               (SELECT event_id FROM subscriptions WHERE source = $1 AND subscription_id = $2) AS stored_event
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
    )
    .fetch_one(&mut *conn)
    .await?;
    if row.written {
        return Ok(Change::Made(format!("subscription {id} is {status}")));
    }
    Ok(unchanged(
        row.stored_event,
        ctx,
        "subscription state",
        &format!("a newer state of subscription {id} is already stored"),
    ))
}

async fn payment(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    id: &str,
    status: &str,
    plan_key: Option<&str>,
) -> Result<Change, sqlx::Error> {
    // Refunded is terminal: nothing moves a refunded payment, and a refund moves any other
    // state whatever its time, so the end state does not depend on the order.
    let row = sqlx::query!(
        r#"
        WITH written AS (
            INSERT INTO payments AS r (source, payment_id, customer_id, status, plan_key, version_at, version_key, event_id)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
            ON CONFLICT (source, payment_id) DO UPDATE
                SET status = EXCLUDED.status, plan_key = COALESCE(EXCLUDED.plan_key, r.plan_key),
                    version_at = EXCLUDED.version_at, version_key = EXCLUDED.version_key,
                    event_id = EXCLUDED.event_id
                WHERE r.status <> 'refunded'
                  AND (EXCLUDED.status = 'refunded'
                       OR (r.version_at, r.version_key) < (EXCLUDED.version_at, EXCLUDED.version_key))
            RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM written) AS "written!",
               (SELECT event_id FROM payments WHERE source = $1 AND payment_id = $2) AS stored_event,
               (SELECT status FROM payments WHERE source = $1 AND payment_id = $2) AS stored_status
        "#,
        ctx.source,
        id,
        ctx.customer.as_str(),
        status,
        plan_key,
        ctx.version.at.as_datetime(),
        ctx.version.key.as_str(),
        ctx.event_id,
    )
    .fetch_one(&mut *conn)
    .await?;
    if row.written {
        return Ok(Change::Made(format!("payment {id} is {status}")));
    }
    let superseded = if row.stored_status.as_deref() == Some("refunded") {
        format!("payment {id} is refunded, which is final")
    } else {
        format!("a newer state of payment {id} is already stored")
    };
    Ok(unchanged(
        row.stored_event,
        ctx,
        "payment state",
        &superseded,
    ))
}

/// Grants a plan's allowance for the event's period, once per account, period and plan.
/// Under the account lock, `delta` tops the period up to the largest allowance granted in it.
async fn grant(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    plan: &str,
    allowance: i64,
) -> Result<Change, sqlx::Error> {
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
               (SELECT event_id FROM ledger WHERE entry_key = $7) AS granted_by
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
    if let Some(delta) = row.delta {
        return Ok(Change::Made(format!(
            "granted {delta} for {plan} in {period}"
        )));
    }
    Ok(unchanged(
        row.granted_by,
        ctx,
        "grant",
        &format!("the {plan} allowance for {period} is already granted"),
    ))
}

async fn delete_customer(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
) -> Result<Change, sqlx::Error> {
    // The earliest deletion is the tombstone; it never lifts.
    let written = sqlx::query!(
        r#"
        UPDATE accounts SET deleted_at = $3
        WHERE source = $1 AND customer_id = $2 AND (deleted_at IS NULL OR deleted_at > $3)
        "#,
        ctx.source,
        ctx.customer.as_str(),
        ctx.version.at.as_datetime(),
    )
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(if written == 1 {
        Change::Made("customer deleted".to_owned())
    } else {
        Change::AlreadyApplied("the customer is already deleted".to_owned())
    })
}

/// Writes (or keeps) the account's log line for an event. A line that says `applied` stays:
/// a replay that finds its work done does not rewrite history.
pub async fn log_outcome(
    conn: &mut PgConnection,
    ctx: &EventContext<'_>,
    outcome: &str,
    reason: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        r#"
        INSERT INTO account_log AS l (event_id, source, customer_id, event_type, occurred_at, outcome, reason)
        VALUES ($1, $2, $3, $4, $5, $6, $7)
        ON CONFLICT (event_id) DO UPDATE
            SET outcome = EXCLUDED.outcome, reason = EXCLUDED.reason, logged_at = now()
            WHERE l.outcome <> 'applied'
        "#,
        ctx.event_id,
        ctx.source,
        ctx.customer.as_str(),
        ctx.event_type,
        ctx.version.at.as_datetime(),
        outcome,
        reason,
    )
    .execute(conn)
    .await?;
    Ok(())
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
