//! An account's period in time, for the console's pictures (docs/design.md §12.7): the grants
//! of its allowance, each with the event that made it, and what its debits used day by day
//! (reversals given back). Read from the ledger and the accepted debits on their account's
//! indexes: a period is a month, so at most 31 days whatever the debits' number.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use crate::platform::db::exec;

/// A grant of the period's allowance: its plan, the allowance it grants, by how much it raised
/// the period's balance, and its event (at the event's provider time when the account's log
/// has it, else when the grant was written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Grant {
    pub at: DateTime<Utc>,
    pub event_id: i64,
    pub plan: String,
    pub allowance: i64,
    pub delta: i64,
}

/// A day's use of the period's allowance: the debits accepted that day and the debits
/// reversed that day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DayOfUse {
    pub day: DateTime<Utc>,
    pub debited: i64,
    pub reversed: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AllowanceHistory {
    pub period: String,
    /// When it was read: a picture of the current period ends there, not at the month's end.
    pub as_of: DateTime<Utc>,
    pub grants: Vec<Grant>,
    pub days: Vec<DayOfUse>,
}

/// The account's `period` (`YYYY-MM`) in time, read at `as_of`.
pub async fn allowance_history(
    conn: &mut PgConnection,
    (source, customer): (&str, &str),
    period: &str,
    as_of: DateTime<Utc>,
) -> Result<AllowanceHistory, sqlx::Error> {
    let grants = sqlx::query_as!(
        Grant,
        r#"
        SELECT COALESCE(a.occurred_at, l.created_at) AS "at!", l.event_id, l.plan,
               l.allowance, l.delta
        FROM ledger l
        LEFT JOIN account_log a ON a.event_id = l.event_id
        WHERE l.source = $1 AND l.customer_id = $2 AND l.period = $3
        ORDER BY 1, l.id
        "#,
        source,
        customer,
        period,
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    let days = sqlx::query_as!(
        DayOfUse,
        r#"
        SELECT day AS "day!", sum(debited)::bigint AS "debited!", sum(reversed)::bigint AS "reversed!"
        FROM (
            SELECT date_trunc('day', recorded_at, 'UTC') AS day, amount AS debited, 0 AS reversed
            FROM usage_debits
            WHERE source = $1 AND customer_id = $2 AND period = $3 AND accepted
            UNION ALL
            SELECT date_trunc('day', reversed_at, 'UTC'), 0, amount
            FROM usage_debits
            WHERE source = $1 AND customer_id = $2 AND period = $3 AND accepted
              AND reversed_at IS NOT NULL
        ) moves
        GROUP BY day
        ORDER BY day
        "#,
        source,
        customer,
        period,
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    Ok(AllowanceHistory {
        period: period.to_owned(),
        as_of,
        grants,
        days,
    })
}
