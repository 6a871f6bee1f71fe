//! Usage: the app spends a period's allowance (docs/design.md §4.10). A debit is a stored fact
//! keyed by the account and the app's idempotency key, decided and stored with its answer in
//! one call of `inbox_debit` (migrations/20261205100001_usage.sql) under the lock of the
//! account's period, so concurrent debits never spend past the allowance and a key asked
//! again answers the same. `remaining = allowance − used`, the allowance being the period's
//! largest grant.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::PgConnection;

use super::account;
use super::model::period_totals;
use crate::domain::effect::{effect_id, Kind};
use crate::domain::{Catalog, CustomerId, Period};
use crate::platform::db::exec;

/// One debit as the app asks for it.
#[derive(Debug, Clone)]
pub struct DebitRequest<'a> {
    pub source: &'a str,
    pub customer: &'a CustomerId,
    /// The app's idempotency key (the API checks it: 1–255 visible ASCII characters).
    pub key: &'a str,
    /// At least 1.
    pub amount: i64,
    pub period: Period,
    pub note: Option<&'a str>,
    /// `Some(catalog)` when effects are configured (`INBOX_EFFECTS`): the period's
    /// `billing.allowance_exhausted` is written with the debit that exhausts it, its
    /// `account` block naming the plan the catalog derives. Then a debit costs two round
    /// trips (the account's snapshot, then the debit), else one.
    pub effects: Option<&'a Catalog>,
}

/// What a debit got. A key asked again gets the same answer, but `replayed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Debit {
    Accepted {
        usage_id: String,
        amount: i64,
        period: Period,
        /// The period's used and remaining right after this debit.
        used: i64,
        remaining: i64,
        replayed: bool,
    },
    /// Refused for lack of allowance; stable under its key (a later grant does not turn it
    /// into an acceptance: the app sends a new key).
    Exhausted {
        remaining: i64,
        replayed: bool,
    },
    /// The key was used with another amount, period or note.
    KeyConflict,
    CustomerDeleted,
    UnknownCustomer,
}

impl Debit {
    /// An accepted debit as the app is answered (docs/api.md: `{usage_id, amount, period,
    /// used, remaining, replayed}`); `None` for a refusal.
    pub fn accepted_body(&self) -> Option<serde_json::Value> {
        let Debit::Accepted {
            usage_id,
            amount,
            period,
            used,
            remaining,
            replayed,
        } = self
        else {
            return None;
        };
        Some(json!({
            "usage_id": usage_id,
            "amount": amount,
            "period": period.as_str(),
            "used": used,
            "remaining": remaining,
            "replayed": replayed,
        }))
    }
}

/// A debit's answer, and the id of the `billing.allowance_exhausted` outbox row it wrote, if
/// it did: the caller hands it to the effects queue (the rescue sends it otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Debited {
    pub debit: Debit,
    pub told: Option<String>,
}

/// The cause of the period's `billing.allowance_exhausted`: once per account and period.
fn exhausted_cause(source: &str, customer: &CustomerId, period: &Period) -> String {
    format!("allowance of {source}/{customer} for {period} exhausted")
}

/// Spends `req.amount` of the period's allowance, once per key: at most two round trips, one
/// when effects are off.
#[tracing::instrument(skip_all, fields(source = req.source, period = req.period.as_str()))]
pub async fn debit(
    conn: &mut PgConnection,
    req: &DebitRequest<'_>,
) -> Result<Debited, sqlx::Error> {
    let effect = match req.effects {
        Some(catalog) => {
            // The plan as read just before the debit: the debit does not move it. No
            // account, no debit either (accounts are never deleted, so no key of it exists).
            let Some(snapshot) =
                account::snapshot(conn, req.source, req.customer, &req.period, catalog).await?
            else {
                return Ok(Debited {
                    debit: Debit::UnknownCustomer,
                    told: None,
                });
            };
            let plan = snapshot.plan;
            let cause = exhausted_cause(req.source, req.customer, &req.period);
            let id = effect_id(Kind::AllowanceExhausted, &cause);
            let body = json!({
                "id": id,
                "type": Kind::AllowanceExhausted.as_str(),
                "data": {
                    "source": req.source,
                    "customer_id": req.customer.as_str(),
                    "period": req.period.as_str(),
                    "account": {"plan": plan, "period": req.period.as_str()},
                },
            });
            Some(json!({"id": id, "cause": cause, "body": body}))
        }
        None => None,
    };
    let usage_id = format!("use_{}", uuid::Uuid::new_v4().simple());
    let row = sqlx::query!(
        r#"SELECT outcome AS "outcome!", usage_id, used, remaining, replayed AS "replayed!", told
           FROM inbox_debit($1, $2, $3, $4, $5, $6, $7, $8)"#,
        req.source,
        req.customer.as_str(),
        req.key,
        req.amount,
        req.period.as_str(),
        req.note,
        usage_id,
        effect,
    )
    .fetch_one(exec(conn))
    .await?;
    let missing = |what: &str| sqlx::Error::Decode(format!("inbox_debit: no {what}").into());
    let debit = match row.outcome.as_str() {
        "accepted" => Debit::Accepted {
            usage_id: row.usage_id.ok_or_else(|| missing("usage_id"))?,
            amount: req.amount,
            period: req.period.clone(),
            used: row.used.ok_or_else(|| missing("used"))?,
            remaining: row.remaining.ok_or_else(|| missing("remaining"))?,
            replayed: row.replayed,
        },
        "allowance_exhausted" => Debit::Exhausted {
            remaining: row.remaining.ok_or_else(|| missing("remaining"))?,
            replayed: row.replayed,
        },
        "idempotency_conflict" => Debit::KeyConflict,
        "customer_deleted" => Debit::CustomerDeleted,
        "unknown_customer" => Debit::UnknownCustomer,
        other => {
            return Err(sqlx::Error::Decode(
                format!("inbox_debit: unknown outcome '{other}'").into(),
            ))
        }
    };
    Ok(Debited {
        debit,
        told: row.told,
    })
}

/// One accepted debit, as the usage list shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsageLine {
    pub usage_id: String,
    pub amount: i64,
    pub idempotency_key: String,
    pub note: Option<String>,
    pub recorded_at: DateTime<Utc>,
}

/// A page of a period's usage, oldest first, with the period's totals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsagePage {
    pub period: String,
    pub allowance: i64,
    pub used: i64,
    pub remaining: i64,
    pub usage: Vec<UsageLine>,
    /// The cursor of the next page (`after`), when there is one.
    pub next: Option<String>,
}

/// Lists the period's accepted debits, `limit` at a time, after the debit `after` names (an
/// opaque cursor: a `usage_id` of an earlier page); `None` for an unknown customer. A
/// cursor that names no debit of this account and period starts from the beginning.
#[tracing::instrument(skip_all, fields(source, period = period.as_str()))]
pub async fn list(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    period: &Period,
    limit: i64,
    after: Option<&str>,
) -> Result<Option<UsagePage>, sqlx::Error> {
    let limit = limit.max(1);
    let row = sqlx::query!(
        r#"
        SELECT (a.deleted_at IS NOT NULL) AS "deleted!",
               (SELECT COALESCE(sum(delta), 0) FROM ledger
                WHERE source = $1 AND customer_id = $2 AND period = $3)::bigint AS "granted!",
               COALESCE((SELECT used FROM usage_periods
                         WHERE source = $1 AND customer_id = $2 AND period = $3), 0) AS "used!",
               (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                           'usage_id', d.usage_id, 'amount', d.amount,
                           'idempotency_key', d.idempotency_key, 'note', d.note,
                           'recorded_at', d.recorded_at) ORDER BY d.seq), '[]')
                FROM (SELECT * FROM usage_debits u
                      WHERE u.source = $1 AND u.customer_id = $2 AND u.period = $3 AND u.accepted
                        AND u.seq > COALESCE((SELECT seq FROM usage_debits c
                                              WHERE c.usage_id = $4 AND c.source = $1
                                                AND c.customer_id = $2 AND c.period = $3), 0)
                      ORDER BY u.seq LIMIT $5::bigint + 1) d) AS "usage!"
        FROM accounts a WHERE a.source = $1 AND a.customer_id = $2
        "#,
        source,
        customer.as_str(),
        period.as_str(),
        after,
        limit,
    )
    .fetch_optional(exec(conn))
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    #[derive(serde::Deserialize)]
    struct Line {
        usage_id: String,
        amount: i64,
        idempotency_key: String,
        note: Option<String>,
        recorded_at: DateTime<Utc>,
    }
    let mut lines: Vec<Line> = serde_json::from_value(row.usage)
        .map_err(|e| sqlx::Error::Decode(format!("usage: {e}").into()))?;
    // One more than asked for says whether there is a next page.
    let more = lines.len() as i64 > limit;
    lines.truncate(limit as usize);
    let (allowance, remaining) = period_totals(row.deleted, row.granted, row.used);
    let usage: Vec<UsageLine> = lines
        .into_iter()
        .map(|l| UsageLine {
            usage_id: l.usage_id,
            amount: l.amount,
            idempotency_key: l.idempotency_key,
            note: l.note,
            recorded_at: l.recorded_at,
        })
        .collect();
    Ok(Some(UsagePage {
        period: period.to_string(),
        allowance,
        used: row.used,
        remaining,
        next: usage.last().filter(|_| more).map(|l| l.usage_id.clone()),
        usage,
    }))
}
