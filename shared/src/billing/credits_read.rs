//! The credits read (docs/design.md §4.14, §12): an account's grant registers and their
//! ledgers in one statement, folded by `billing::credits` as of a time, with the event behind
//! each row, so `GET …/credits`, the account read and `why` answer from the same rows.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgConnection;

use super::credits::{
    allocations, with_spends, Category, Credits, CreditsView, DebitAllocation, GrantSnapshot,
    Origin, Quantity, Spends, SpentDebit, Transaction, TransactionKind,
};
use crate::domain::CustomerId;
use crate::platform::db::exec;

/// An account's credits as read: the fold of its rows, the time they are read as of, and the
/// event behind each grant and transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountCredits {
    pub credits: Credits,
    /// Unix seconds: the `at` asked for, else the store's clock (`inbox_now()`).
    pub at: i64,
    /// The event each grant's register holds, by grant id.
    pub grant_events: BTreeMap<String, RowEvent>,
    /// The event each transaction came with, by transaction id.
    pub transaction_events: BTreeMap<String, RowEvent>,
    /// The app's accepted debits not reversed, in the order accepted, each with the allocation
    /// derived for it (`credits::allocations`): what `credits` counts as their applications.
    pub debits: Vec<(SpentDebit, DebitAllocation)>,
}

impl AccountCredits {
    /// The read's answer: balances per unit and scope, grants in burn order.
    pub fn view(&self) -> CreditsView {
        CreditsView::of(&self.credits, self.at)
    }

    /// The events behind each balance (`why`): every grant of the unit and scope (the event
    /// its register holds) and every transaction counted as of `at` (the event it came with).
    pub fn explain(&self) -> Vec<BalanceWhy> {
        let view = self.view();
        let grants = self.credits.balances_at(self.at);
        view.balances
            .into_iter()
            .map(|balance| {
                let mut events = Vec::new();
                for g in grants
                    .iter()
                    .filter(|g| g.grant.unit == balance.unit && g.grant.scope == balance.scope)
                {
                    let grant_id = &g.grant.grant_id;
                    if let Some(e) = self.grant_events.get(grant_id) {
                        events.push(Behind::of(e, grant_id, None));
                    }
                    for txn in &g.transactions {
                        if let Some(e) = self.transaction_events.get(txn) {
                            events.push(Behind::of(e, grant_id, Some(txn)));
                        }
                    }
                }
                BalanceWhy { balance, events }
            })
            .collect()
    }
}

/// A stored event as a credits row names it; `type` and `occurred_at` are null once the purge
/// took the event (a row keeps it while it holds it, §3.9, so only a hand-written row lacks it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowEvent {
    pub event_id: i64,
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    pub occurred_at: Option<DateTime<Utc>>,
}

/// One event behind a balance: the grant it is about and, for a ledger entry, its transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Behind {
    pub event_id: i64,
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    pub occurred_at: Option<DateTime<Utc>>,
    pub grant_id: String,
    pub transaction_id: Option<String>,
}

impl Behind {
    fn of(e: &RowEvent, grant_id: &str, transaction_id: Option<&String>) -> Behind {
        Behind {
            event_id: e.event_id,
            event_type: e.event_type.clone(),
            occurred_at: e.occurred_at,
            grant_id: grant_id.to_owned(),
            transaction_id: transaction_id.cloned(),
        }
    }
}

/// A balance of `why`: its figures and the events they come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BalanceWhy {
    #[serde(flatten)]
    pub balance: super::credits::BalanceView,
    pub events: Vec<Behind>,
}

/// A grant register's row as the read's statement writes it (times in unix seconds, amounts
/// as numeric's text, so nothing passes through a float).
#[derive(Debug, Deserialize)]
struct GrantRow {
    grant_id: String,
    origin: String,
    unit: String,
    scope: String,
    amount: String,
    category: String,
    priority: Option<i16>,
    created: i64,
    effective_at: Option<i64>,
    expires_at: Option<i64>,
    voided_at: Option<i64>,
    updated: i64,
    version_key: String,
    #[serde(flatten)]
    event: RowEvent,
}

#[derive(Debug, Deserialize)]
struct TransactionRow {
    transaction_id: String,
    grant_id: String,
    kind: String,
    amount: String,
    effective_at: i64,
    #[serde(flatten)]
    event: RowEvent,
}

fn bad(what: impl std::fmt::Display) -> sqlx::Error {
    sqlx::Error::Decode(format!("credits: {what}").into())
}

fn origin(s: &str) -> Result<Origin, sqlx::Error> {
    [
        Origin::StripeCreditGrant,
        Origin::CatalogPack,
        Origin::PolarMeterCredit,
    ]
    .into_iter()
    .find(|o| o.as_str() == s)
    .ok_or_else(|| bad(format!("origin '{s}'")))
}

fn category(s: &str) -> Result<Category, sqlx::Error> {
    [Category::Promotional, Category::Paid]
        .into_iter()
        .find(|c| c.as_str() == s)
        .ok_or_else(|| bad(format!("category '{s}'")))
}

fn kind(s: &str) -> Result<TransactionKind, sqlx::Error> {
    TransactionKind::parse("credit", s)
        .or_else(|| TransactionKind::parse("debit", s))
        .ok_or_else(|| bad(format!("transaction kind '{s}'")))
}

fn amount(s: &str) -> Result<Quantity, sqlx::Error> {
    Quantity::parse(s).map_err(bad)
}

/// An accepted debit's row as the statements that read credits write it.
#[derive(Debug, Deserialize)]
struct DebitRow {
    usage_id: String,
    unit: String,
    period: String,
    amount: i64,
    at: i64,
}

/// The account's accepted debits (a JSON array, in the order they were accepted) and its
/// periods' allowances (a JSON object of whole units by month), as the allocation reads them.
pub fn decode_spends(debits: Value, allowances: Value) -> Result<Spends, sqlx::Error> {
    let debits: Vec<DebitRow> = serde_json::from_value(debits).map_err(bad)?;
    let allowances: BTreeMap<String, i64> = serde_json::from_value(allowances).map_err(bad)?;
    Ok(Spends {
        debits: debits
            .into_iter()
            .map(|d| SpentDebit {
                usage_id: d.usage_id,
                unit: d.unit,
                period: d.period,
                amount: Quantity::whole(d.amount),
                at: d.at,
            })
            .collect(),
        allowances: allowances
            .into_iter()
            .map(|(period, granted)| (period, Quantity::whole(granted)))
            .collect(),
    })
}

/// The rows of one statement (`grants` and `transactions` as JSON arrays) folded as of `at`,
/// the app's debits' derived allocations (`spends`) counted as local applications
/// (`credits::with_spends`).
pub fn decode(
    grants: Value,
    transactions: Value,
    spends: &Spends,
    at: i64,
) -> Result<AccountCredits, sqlx::Error> {
    let grants: Vec<GrantRow> = serde_json::from_value(grants).map_err(bad)?;
    let transactions: Vec<TransactionRow> = serde_json::from_value(transactions).map_err(bad)?;
    let mut out = AccountCredits {
        credits: Credits::new(),
        at,
        grant_events: BTreeMap::new(),
        transaction_events: BTreeMap::new(),
        debits: Vec::new(),
    };
    for g in grants {
        let priority = g
            .priority
            .map(|p| u8::try_from(p).map_err(|_| bad(format!("priority {p}"))))
            .transpose()?;
        out.credits.grant(GrantSnapshot {
            grant_id: g.grant_id.clone(),
            origin: origin(&g.origin)?,
            unit: g.unit,
            scope: g.scope,
            amount: amount(&g.amount)?,
            category: category(&g.category)?,
            priority,
            created: g.created,
            effective_at: g.effective_at,
            expires_at: g.expires_at,
            voided_at: g.voided_at,
            updated: g.updated,
            event_key: g.version_key,
        });
        out.grant_events.insert(g.grant_id, g.event);
    }
    for t in transactions {
        out.credits.transaction(Transaction {
            transaction_id: t.transaction_id.clone(),
            grant_id: t.grant_id,
            kind: kind(&t.kind)?,
            amount: amount(&t.amount)?,
            effective_at: t.effective_at,
        });
        out.transaction_events.insert(t.transaction_id, t.event);
    }
    // As `Spends::counted`, keeping each debit's allocation for `why`.
    let derived = allocations(&out.credits, &spends.allowances, &spends.debits);
    out.credits = with_spends(&out.credits, &spends.debits, &derived);
    out.debits = spends.debits.iter().cloned().zip(derived).collect();
    Ok(out)
}

/// An account's grants and their transactions in one statement, as of `at` (the store's clock
/// when `None`). `None` when the account does not exist. A transaction whose grant is not
/// stored yet names no customer, so it is not the account's until its grant comes (held,
/// `Credits::held`).
#[tracing::instrument(skip_all, fields(source))]
pub async fn read(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    at: Option<DateTime<Utc>>,
) -> Result<Option<AccountCredits>, sqlx::Error> {
    let Some(row) = sqlx::query!(
        r#"
        SELECT floor(extract(epoch FROM COALESCE($3::timestamptz, inbox_now())))::bigint AS "at!",
               (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                           'grant_id', g.grant_id, 'origin', g.origin, 'unit', g.unit,
                           'scope', g.scope, 'amount', g.amount::text, 'category', g.category,
                           'priority', g.priority,
                           'created', floor(extract(epoch FROM g.created_at))::bigint,
                           'effective_at', floor(extract(epoch FROM g.effective_at))::bigint,
                           'expires_at', floor(extract(epoch FROM g.expires_at))::bigint,
                           'voided_at', floor(extract(epoch FROM g.voided_at))::bigint,
                           'updated', floor(extract(epoch FROM g.version_at))::bigint,
                           'version_key', g.version_key, 'event_id', g.event_id,
                           'type', e.type, 'occurred_at', e.occurred_at)), '[]')
                FROM credit_grants g LEFT JOIN inbox_events e ON e.id = g.event_id
                WHERE g.source = $1 AND g.customer_id = $2) AS "grants!",
               (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                           'transaction_id', t.transaction_id, 'grant_id', t.grant_id,
                           'kind', t.kind, 'amount', t.amount::text,
                           'effective_at', floor(extract(epoch FROM t.effective_at))::bigint,
                           'event_id', t.event_id, 'type', e.type,
                           'occurred_at', e.occurred_at)), '[]')
                FROM credit_grants g
                JOIN credit_transactions t ON t.source = g.source AND t.grant_id = g.grant_id
                LEFT JOIN inbox_events e ON e.id = t.event_id
                WHERE g.source = $1 AND g.customer_id = $2) AS "transactions!",
               -- The account's accepted debits, in the order they were accepted, and its
               -- periods' allowances: their derived allocations count in the balances.
               (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                           'usage_id', u.usage_id, 'unit', u.unit, 'period', u.period,
                           'amount', u.amount, 'at', inbox_secs(u.recorded_at)) ORDER BY u.seq), '[]')
                FROM usage_debits u
                WHERE u.source = $1 AND u.customer_id = $2 AND u.accepted
                  AND u.reversed_at IS NULL
                  AND EXISTS (SELECT 1 FROM credit_grants c
                              WHERE c.source = $1 AND c.customer_id = $2)) AS "debits!",
               (SELECT COALESCE(jsonb_object_agg(l.period, l.granted), '{}')
                FROM (SELECT period, sum(delta)::bigint AS granted FROM ledger
                      WHERE source = $1 AND customer_id = $2
                        AND EXISTS (SELECT 1 FROM credit_grants c
                                    WHERE c.source = $1 AND c.customer_id = $2)
                      GROUP BY period) AS l) AS "allowances!"
        FROM accounts a WHERE a.source = $1 AND a.customer_id = $2
        "#,
        source,
        customer.as_str(),
        at,
    )
    .fetch_optional(exec(conn))
    .await?
    else {
        return Ok(None);
    };
    let spends = decode_spends(row.debits, row.allowances)?;
    decode(row.grants, row.transactions, &spends, row.at).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rows() -> (Value, Value) {
        let grants = json!([{
            "grant_id": "credgr_1", "origin": "stripe_credit_grant", "unit": "usd",
            "scope": "price_type:metered", "amount": "1000.000000000000", "category": "paid",
            "priority": null, "created": 100, "effective_at": null, "expires_at": 1000,
            "voided_at": null, "updated": 100, "version_key": "evt_1", "event_id": 7,
            "type": "billing.credit_grant.created", "occurred_at": "1970-01-01T00:01:40+00:00"
        }]);
        let transactions = json!([{
            "transaction_id": "cbtxn_1", "grant_id": "credgr_1", "kind": "credits_applied",
            "amount": "300.000000000000", "effective_at": 200, "event_id": 8,
            "type": "billing.credit_balance_transaction.created", "occurred_at": null
        }]);
        (grants, transactions)
    }

    #[test]
    fn rows_fold_to_the_view_and_each_balance_names_its_events() {
        let (grants, transactions) = rows();
        let read = decode(grants, transactions, &Spends::default(), 500).unwrap();
        let view = read.view();
        assert_eq!(view.balances.len(), 1);
        let b = &view.balances[0];
        assert_eq!(
            (b.available.as_str(), b.granted.as_str(), b.used.as_str()),
            ("700", "1000", "300")
        );
        assert_eq!(view.grants[0].remaining, "700");
        let why = read.explain();
        let events: Vec<(i64, Option<&str>)> = why[0]
            .events
            .iter()
            .map(|e| (e.event_id, e.transaction_id.as_deref()))
            .collect();
        assert_eq!(events, vec![(7, None), (8, Some("cbtxn_1"))]);
    }

    #[test]
    fn a_transaction_after_the_time_asked_is_neither_counted_nor_named() {
        let (grants, transactions) = rows();
        let read = decode(grants, transactions, &Spends::default(), 150).unwrap();
        assert_eq!(read.view().balances[0].available, "1000");
        assert_eq!(read.explain()[0].events.len(), 1);
    }

    #[test]
    fn a_row_no_fold_can_read_is_a_decode_error_not_a_guess() {
        let (mut grants, transactions) = rows();
        grants[0]["origin"] = json!("stripe_customer_balance");
        assert!(decode(grants, transactions, &Spends::default(), 500).is_err());
    }
}
