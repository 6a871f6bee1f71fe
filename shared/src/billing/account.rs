//! An account as operators and tests read it: the derived plan, the registers behind it,
//! the balance for a period and the event log that explains them.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use super::catalog::Catalog;
use super::model::{derive_plan, status_entitles, AccountState};
use crate::domain::{CustomerId, Period};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SubscriptionView {
    pub id: String,
    pub status: String,
    pub plan: Option<String>,
    /// Its ends (docs/design.md §4.4), as the winning event's object says.
    pub current_period_end: Option<DateTime<Utc>>,
    pub cancel_at_period_end: bool,
    pub cancel_at: Option<DateTime<Utc>>,
    pub trial_end: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PaymentView {
    pub id: String,
    pub status: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogLine {
    pub event_id: i64,
    #[serde(rename = "type")]
    pub event_type: String,
    pub occurred_at: Option<DateTime<Utc>>,
    pub outcome: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AccountView {
    pub source: String,
    pub customer_id: String,
    pub plan: String,
    pub deleted: bool,
    /// The plan register (Kinde plan events): its plan, if any.
    pub customer_plan: Option<String>,
    pub past_due: bool,
    pub period: String,
    pub balance: i64,
    pub subscriptions: Vec<SubscriptionView>,
    pub payments: Vec<PaymentView>,
    /// The log in provider order, the newest last: all of it, or its latest lines when the
    /// reader asked for fewer.
    pub log: Vec<LogLine>,
    /// How many lines the whole log has.
    pub log_total: i64,
}

/// Reads an account with its whole log; `None` when the source has no such customer.
pub async fn load(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    period: &Period,
    catalog: &Catalog,
) -> Result<Option<AccountView>, sqlx::Error> {
    load_with_log(conn, source, customer, period, catalog, None).await
}

/// Like [`load`], with only the latest `log_lines` lines of the log when given. An account
/// with thousands of events a day keeps a log of millions of lines (it outlives the
/// purge), and the reader wants the latest; the index on `(source, customer_id,
/// occurred_at)` gives them without reading the rest.
pub async fn load_with_log(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    period: &Period,
    catalog: &Catalog,
    log_lines: Option<i64>,
) -> Result<Option<AccountView>, sqlx::Error> {
    let customer = customer.as_str();
    let Some(account) = sqlx::query!(
        "SELECT deleted_at FROM accounts WHERE source = $1 AND customer_id = $2",
        source,
        customer
    )
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    let customer_plan = sqlx::query_scalar!(
        "SELECT plan FROM customer_plans WHERE source = $1 AND customer_id = $2",
        source,
        customer
    )
    .fetch_optional(&mut *conn)
    .await?
    .flatten();
    let past_due = sqlx::query_scalar!(
        "SELECT past_due FROM customer_standing WHERE source = $1 AND customer_id = $2",
        source,
        customer
    )
    .fetch_optional(&mut *conn)
    .await?
    .unwrap_or(false);
    let subscriptions: Vec<SubscriptionView> = sqlx::query_as!(
        SubscriptionView,
        r#"SELECT subscription_id AS id, status, plan, current_period_end, cancel_at_period_end,
                  cancel_at, trial_end, ended_at FROM subscriptions
           WHERE source = $1 AND customer_id = $2 ORDER BY subscription_id"#,
        source,
        customer
    )
    .fetch_all(&mut *conn)
    .await?;
    // A refunded charge whose invoice is not known yet shows as its own refunded payment
    // until the link arrives and the invoice takes the refund.
    let payments: Vec<PaymentView> = sqlx::query_as!(
        PaymentView,
        r#"SELECT payment_id AS "id!", status AS "status!" FROM payments
           WHERE source = $1 AND customer_id = $2
           UNION ALL
           SELECT refunded_charge, 'refunded' FROM payment_intents
           WHERE source = $1 AND customer_id = $2 AND invoice_id IS NULL
             AND refunded_charge IS NOT NULL
           ORDER BY 1"#,
        source,
        customer
    )
    .fetch_all(&mut *conn)
    .await?;
    let deleted = account.deleted_at.is_some();
    // A deleted customer holds nothing, whatever was granted before the deletion arrived.
    let balance = if deleted {
        0
    } else {
        period_balance(conn, source, customer, period.as_str()).await?
    };
    // LIMIT NULL is no limit.
    let log: Vec<LogLine> = sqlx::query_as!(
        LogLine,
        r#"SELECT event_id AS "event_id!", event_type AS "event_type!",
                  occurred_at, outcome AS "outcome!", reason AS "reason!"
           FROM (SELECT event_id, event_type, occurred_at, outcome, reason FROM account_log
                 WHERE source = $1 AND customer_id = $2
                 ORDER BY occurred_at DESC, event_id DESC LIMIT $3) latest
           ORDER BY occurred_at, event_id"#,
        source,
        customer,
        log_lines
    )
    .fetch_all(&mut *conn)
    .await?;
    let log_total = match log_lines {
        Some(lines) if log.len() as i64 >= lines => sqlx::query_scalar!(
            r#"SELECT count(*) AS "count!" FROM account_log WHERE source = $1 AND customer_id = $2"#,
            source,
            customer
        )
        .fetch_one(&mut *conn)
        .await?,
        _ => log.len() as i64,
    };
    let plan = derive_plan(
        deleted,
        customer_plan.as_deref(),
        past_due,
        subscriptions
            .iter()
            .filter(|s| status_entitles(&s.status))
            .filter_map(|s| s.plan.as_deref()),
        catalog,
    );
    Ok(Some(AccountView {
        source: source.to_owned(),
        customer_id: customer.to_owned(),
        plan,
        deleted,
        customer_plan,
        past_due,
        period: period.to_string(),
        balance,
        subscriptions,
        payments,
        log,
        log_total,
    }))
}

/// Reads [`AccountState`] in one statement, as it stands (the worker derives it from its
/// read instead: `rules::Registers::state`; this is what checks that against the database).
/// An account that does not exist is on the free plan with nothing.
pub async fn state(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    period: &Period,
    catalog: &Catalog,
) -> Result<AccountState, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        SELECT a.deleted_at IS NOT NULL AS "deleted!",
               (SELECT plan FROM customer_plans WHERE source = $1 AND customer_id = $2) AS customer_plan,
               COALESCE((SELECT past_due FROM customer_standing
                         WHERE source = $1 AND customer_id = $2), false) AS "past_due!",
               ARRAY(SELECT status FROM subscriptions
                     WHERE source = $1 AND customer_id = $2 ORDER BY subscription_id) AS "statuses!",
               ARRAY(SELECT plan FROM subscriptions
                     WHERE source = $1 AND customer_id = $2 ORDER BY subscription_id) AS "plans!: Vec<Option<String>>",
               (SELECT COALESCE(sum(delta), 0) FROM ledger
                WHERE source = $1 AND customer_id = $2 AND period = $3)::bigint AS "balance!"
        FROM accounts a WHERE a.source = $1 AND a.customer_id = $2
        "#,
        source,
        customer.as_str(),
        period.as_str(),
    )
    .fetch_optional(conn)
    .await?;
    let Some(row) = row else {
        return Ok(AccountState {
            plan: super::FREE.to_owned(),
            balance: 0,
            period: period.clone(),
        });
    };
    let plan = derive_plan(
        row.deleted,
        row.customer_plan.as_deref(),
        row.past_due,
        row.statuses
            .iter()
            .zip(&row.plans)
            .filter(|(status, _)| status_entitles(status))
            .filter_map(|(_, plan)| plan.as_deref()),
        catalog,
    );
    // A deleted customer holds nothing, whatever was granted before the deletion arrived.
    let balance = if row.deleted { 0 } else { row.balance };
    Ok(AccountState {
        plan,
        balance,
        period: period.clone(),
    })
}

/// A period's balance: the allowance granted in it (the largest, by construction of `delta`).
pub async fn period_balance(
    conn: &mut PgConnection,
    source: &str,
    customer: &str,
    period: &str,
) -> Result<i64, sqlx::Error> {
    let balance = sqlx::query_scalar!(
        r#"SELECT COALESCE(sum(delta), 0)::bigint AS "balance!" FROM ledger
           WHERE source = $1 AND customer_id = $2 AND period = $3"#,
        source,
        customer,
        period
    )
    .fetch_one(conn)
    .await?;
    Ok(balance)
}

/// The sources in which a customer has an account.
pub async fn account_sources(
    conn: &mut PgConnection,
    customer: &CustomerId,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT source FROM accounts WHERE customer_id = $1 ORDER BY source",
        customer.as_str()
    )
    .fetch_all(conn)
    .await
}
