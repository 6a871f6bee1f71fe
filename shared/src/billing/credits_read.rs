//! The credits read (docs/design.md §4.14, §12): an account's grant registers and their
//! ledgers in one statement, folded by `billing::credits` as of a time, with the event behind
//! each row, so `GET …/credits`, the account read and `why` answer from the same rows.

use std::collections::{BTreeMap, BTreeSet};

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

/// A grant register's row as `inbox_account_credits` writes it (times in unix seconds,
/// amounts as numeric's text, so nothing passes through a float).
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
    #[serde(default)]
    voided_by: Option<i64>,
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

/// An accepted debit's row as `inbox_account_credits` writes it: `amount` is the part past
/// its period's allowance, the part that reached the grants.
#[derive(Debug, Deserialize)]
struct DebitRow {
    usage_id: String,
    unit: String,
    period: String,
    amount: i64,
    /// The whole debit, as the app asked it.
    whole: i64,
    at: i64,
}

/// What `inbox_account_credits` returns: the account's grants, their transactions and the
/// debits that reached them (docs/design.md §4.14).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Rows {
    grants: Vec<GrantRow>,
    transactions: Vec<TransactionRow>,
    debits: Vec<DebitRow>,
}

fn bad(what: impl std::fmt::Display) -> sqlx::Error {
    sqlx::Error::Decode(format!("credits: {what}").into())
}

fn amount(s: &str) -> Result<Quantity, sqlx::Error> {
    Quantity::parse(s).map_err(bad)
}

/// An account's credits rows as the fold's values, not yet folded as of a time: what the
/// credits read, the account read and an event's read of the registers share.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreditRows {
    /// The provider's grants and transactions (the app's debits not counted).
    pub credits: Credits,
    /// The app's debits that reached the grants, each with its part past its period's
    /// allowance, in the order they were accepted: their derived allocations are what the
    /// debits took from the grants (`Spends::counted`).
    pub spends: Spends,
    /// The event each grant's register holds, by grant id.
    pub grant_events: BTreeMap<String, RowEvent>,
    /// The event that said each voided grant's void, by grant id.
    pub voided_by: BTreeMap<String, i64>,
    /// The event each transaction came with, by transaction id.
    pub transaction_events: BTreeMap<String, RowEvent>,
    /// What its period's allowance covered of each debit in `spends`, by usage id (the part
    /// `spends` leaves out), for `why`'s whole debit.
    pub covered: BTreeMap<String, Quantity>,
}

impl CreditRows {
    /// The value of one call of `inbox_account_credits` (a row no fold can read — an unknown
    /// origin, a priority outside 0–100 — is a decode error, never a guess).
    pub fn decode(value: Value) -> Result<CreditRows, sqlx::Error> {
        let rows: Rows = serde_json::from_value(value).map_err(bad)?;
        let mut out = CreditRows::default();
        for g in rows.grants {
            let priority = match g.priority {
                None => None,
                Some(p @ 0..=100) => Some(p as u8),
                Some(p) => return Err(bad(format!("priority {p}"))),
            };
            out.credits.grant(GrantSnapshot {
                grant_id: g.grant_id.clone(),
                origin: Origin::parse(&g.origin)
                    .ok_or_else(|| bad(format!("origin '{}'", g.origin)))?,
                unit: g.unit,
                scope: g.scope,
                amount: amount(&g.amount)?,
                category: Category::parse(&g.category)
                    .ok_or_else(|| bad(format!("category '{}'", g.category)))?,
                priority,
                created: g.created,
                effective_at: g.effective_at,
                expires_at: g.expires_at,
                voided_at: g.voided_at,
                updated: g.updated,
                event_key: g.version_key,
            });
            if let Some(by) = g.voided_by {
                out.voided_by.insert(g.grant_id.clone(), by);
            }
            out.grant_events.insert(g.grant_id, g.event);
        }
        for t in rows.transactions {
            out.credits.transaction(Transaction {
                transaction_id: t.transaction_id.clone(),
                grant_id: t.grant_id,
                kind: TransactionKind::named(&t.kind)
                    .ok_or_else(|| bad(format!("transaction kind '{}'", t.kind)))?,
                amount: amount(&t.amount)?,
                effective_at: t.effective_at,
            });
            out.transaction_events.insert(t.transaction_id, t.event);
        }
        // Each debit carries only its part past the allowance, so it is allocated as if no
        // allowance were left (`allowances` empty): the same grants, the same amounts.
        out.covered = rows
            .debits
            .iter()
            .filter(|d| d.whole > d.amount)
            .map(|d| (d.usage_id.clone(), Quantity::whole(d.whole - d.amount)))
            .collect();
        out.spends.debits = rows
            .debits
            .into_iter()
            .map(|d| SpentDebit {
                usage_id: d.usage_id,
                unit: d.unit,
                period: d.period,
                amount: Quantity::whole(d.amount),
                at: d.at,
            })
            .collect();
        Ok(out)
    }

    /// The rows folded as of `at`, the app's debits' derived allocations counted as local
    /// applications (`credits::with_spends`), each debit kept whole with its allocation for
    /// `why`: the part its period's allowance covered is added back as `from_allowance`.
    pub fn as_of(self, at: i64) -> AccountCredits {
        let derived = allocations(&self.credits, &self.spends.allowances, &self.spends.debits);
        let credits = if self.spends.debits.is_empty() {
            self.credits
        } else {
            with_spends(&self.credits, &self.spends.debits, &derived)
        };
        let debits = self
            .spends
            .debits
            .into_iter()
            .zip(derived)
            .map(|(mut debit, mut derived)| {
                if let Some(covered) = self.covered.get(&debit.usage_id) {
                    debit.amount = debit.amount + *covered;
                    derived.allocation.from_allowance =
                        derived.allocation.from_allowance + *covered;
                }
                (debit, derived)
            })
            .collect();
        AccountCredits {
            credits,
            at,
            grant_events: self.grant_events,
            transaction_events: self.transaction_events,
            debits,
        }
    }

    /// The rows without the debits `left_out` names (by usage id): what the store held before
    /// they were accepted, as `why` asked as of what was received before a time reads it (the
    /// debits left are allocated again, each as the debits accepted before it left the grants).
    pub fn without_debits(mut self, left_out: &BTreeSet<String>) -> CreditRows {
        self.spends
            .debits
            .retain(|d| !left_out.contains(&d.usage_id));
        self.covered.retain(|id, _| !left_out.contains(id));
        self
    }
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
    Ok(rows(conn, source, customer, at)
        .await?
        .map(|(rows, at)| rows.as_of(at)))
}

/// [`read`]'s rows not yet folded, and the time (unix seconds) they are to be read as of.
#[tracing::instrument(skip_all, fields(source))]
pub async fn rows(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    at: Option<DateTime<Utc>>,
) -> Result<Option<(CreditRows, i64)>, sqlx::Error> {
    let Some(row) = sqlx::query!(
        r#"
        SELECT inbox_secs(COALESCE($3::timestamptz, inbox_now())) AS "at!",
               inbox_account_credits($1, $2) AS "credits!"
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
    Ok(Some((CreditRows::decode(row.credits)?, row.at)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rows() -> Value {
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
        json!({"grants": grants, "transactions": transactions, "debits": []})
    }

    #[test]
    fn rows_fold_to_the_view_and_each_balance_names_its_events() {
        let read = CreditRows::decode(rows()).unwrap().as_of(500);
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
        let read = CreditRows::decode(rows()).unwrap().as_of(150);
        assert_eq!(read.view().balances[0].available, "1000");
        assert_eq!(read.explain()[0].events.len(), 1);
    }

    #[test]
    fn a_row_no_fold_can_read_is_a_decode_error_not_a_guess() {
        let mut rows = rows();
        rows["grants"][0]["origin"] = json!("stripe_customer_balance");
        assert!(CreditRows::decode(rows.clone()).is_err());
        rows["grants"][0]["origin"] = json!("stripe_credit_grant");
        rows["grants"][0]["priority"] = json!(101);
        assert!(CreditRows::decode(rows).is_err());
    }
}
