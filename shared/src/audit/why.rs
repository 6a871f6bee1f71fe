//! `why` (docs/design.md §5.5a): every field of an account as its kept events give it, with
//! the event that decided it, what that event beat, and the register as stored where the two
//! differ.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::PgConnection;

use crate::billing::credits_read::{self, AccountCredits, BalanceWhy};
use crate::billing::fold::Beaten;
use crate::billing::registers;
use crate::domain::{Catalog, CustomerId};
use crate::platform::db::exec;

use super::fold_io::{
    compare, fold_with, snapshot, used_by_period, Cut, EventRef, FoldError, PlanStep, Reading,
    Sources,
};

/// One field of `why`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WhyField {
    pub field: String,
    pub value: Value,
    pub decided_by: Option<EventRef>,
    pub beaten: Vec<Beaten>,
    /// What the register holds now, when it is not what the fold gives (a register moved by
    /// something other than its events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored: Option<Value>,
}

/// `inboxctl why` and `GET …/why`: every field of the account as its kept events give it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Why {
    pub source: String,
    pub customer_id: String,
    /// The cut, when one was asked for.
    pub at: Option<DateTime<Utc>>,
    pub received_before: Option<DateTime<Utc>>,
    pub fields: Vec<WhyField>,
    /// Events the purge took: the answer is whole only for times at or after `complete_from`.
    pub purged: i64,
    pub complete_from: Option<DateTime<Utc>>,
    /// Events of the account not finished yet: the registers do not show them yet.
    pub pending: Vec<i64>,
    /// Fields whose register differs from the fold (empty for a cut in the past, which is
    /// not compared).
    pub divergent: Vec<String>,
    /// Each prepaid credit balance as of `at` (now without one), with the events behind it:
    /// each grant's (the one its register holds) and each counted transaction's, and the app's
    /// debits that spent its grants (docs/design.md §4.14). Grants are registers of their own,
    /// not the fold's fields.
    pub credits: Vec<CreditsWhy>,
}

/// A credits balance of `why`: its figures, the events behind them, and each debit of the app
/// that spent its grants, naming the grants and how much it took of each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CreditsWhy {
    #[serde(flatten)]
    pub balance: BalanceWhy,
    pub debits: Vec<DebitWhy>,
}

/// An accepted debit as the balance counts it: its allocation as derived from everything known
/// (`credits::allocations`, the same derivation the read and the debit's check agree with),
/// which a grant told later that comes first in the burn order moves; the debit's own answer
/// stays as it was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DebitWhy {
    pub usage_id: String,
    pub period: String,
    /// When it was accepted: it spent the grants live then.
    pub at: Option<DateTime<Utc>>,
    pub amount: String,
    pub from_allowance: String,
    /// The grants of this balance it took from, in the burn order (a debit that spent grants of
    /// two scopes is listed under each balance, with that balance's grants).
    pub from_grants: Vec<GrantSpent>,
    /// What nothing held once everything known is counted (an application the provider told
    /// later took the credit first): 0 unless so.
    pub unfunded: String,
    pub order_version: u32,
}

/// One grant a debit took from: where the grant comes from, and how much it took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrantSpent {
    /// A Stripe credit grant's id, or a catalog pack's `pack:{payment}:{price}`.
    pub grant_id: String,
    pub origin: &'static str,
    /// The event the grant's register holds (a pack's: the payment that bought it, or the
    /// refund that voided it), as the balance's `events` list it.
    pub event_id: Option<i64>,
    pub amount: String,
}

/// Each balance of the read with the events behind it and the debits that spent it, as of the
/// read's time: a debit accepted after it is not counted, so not named.
pub fn credits_why(read: &AccountCredits) -> Vec<CreditsWhy> {
    read.explain()
        .into_iter()
        .map(|balance| {
            let of_balance = |grant_id: &str| {
                let grant = &read.credits.register(grant_id)?.latest;
                (grant.unit == balance.balance.unit && grant.scope == balance.balance.scope)
                    .then_some(grant)
            };
            let debits = read
                .debits
                .iter()
                .filter(|(debit, _)| debit.at <= read.at)
                .filter_map(|(debit, derived)| {
                    let from_grants: Vec<GrantSpent> = derived
                        .allocation
                        .from_grants
                        .iter()
                        .filter_map(|(grant_id, amount)| {
                            let grant = of_balance(grant_id)?;
                            Some(GrantSpent {
                                grant_id: grant_id.clone(),
                                origin: grant.origin.as_str(),
                                event_id: read.grant_events.get(grant_id).map(|e| e.event_id),
                                amount: amount.to_string(),
                            })
                        })
                        .collect();
                    (!from_grants.is_empty()).then(|| DebitWhy {
                        usage_id: debit.usage_id.clone(),
                        period: debit.period.clone(),
                        at: DateTime::from_timestamp(debit.at, 0),
                        amount: debit.amount.to_string(),
                        from_allowance: derived.allocation.from_allowance.to_string(),
                        from_grants,
                        unfunded: derived.unfunded.to_string(),
                        order_version: derived.allocation.order_version,
                    })
                })
                .collect();
            CreditsWhy { balance, debits }
        })
        .collect()
}

/// Explains the account, as of the cut. `None` when the account does not exist and has no
/// kept event.
pub async fn why(
    conn: &mut PgConnection,
    sources: &Sources,
    catalog: &Catalog,
    (source, customer): (&str, &CustomerId),
    cut: Cut,
) -> Result<Option<Why>, FoldError> {
    let mut tx = snapshot(conn).await?;
    let stored = registers::of_account(&mut tx, source, customer).await?;
    let reading = Reading {
        cut,
        with_purged: true,
        ..Reading::default()
    };
    let account = fold_with(
        &mut tx,
        sources,
        catalog,
        (source, customer),
        stored.as_ref(),
        reading,
    )
    .await?;
    let used = used_by_period(&mut tx, source, customer).await?;
    let credits = match credits_read::rows(&mut tx, source, customer, cut.at).await? {
        // As of what the store had received before a time: not the debits accepted since.
        Some((rows, at)) => Some(match cut.received_before {
            Some(t) => {
                let since = debits_accepted_since(&mut tx, source, customer, t).await?;
                rows.without_debits(&since).as_of(at)
            }
            None => rows.as_of(at),
        }),
        None => None,
    };
    tx.commit().await?;
    if stored.is_none() && account.events.is_empty() {
        return Ok(None);
    }
    let whole = cut.at.is_none() && cut.received_before.is_none();
    let differences: BTreeMap<String, Value> = match (&stored, whole) {
        (Some(stored), true) => compare(stored, &account, &used, (source, customer))
            .into_iter()
            .map(|d| (d.field, d.stored))
            .collect(),
        _ => BTreeMap::new(),
    };
    let mut fields: Vec<WhyField> = account
        .folded
        .explain(customer, catalog)
        .into_iter()
        .map(|e| WhyField {
            stored: differences.get(&e.field).cloned(),
            decided_by: e.decided_by.and_then(|id| account.events.get(&id).cloned()),
            field: e.field,
            value: e.value,
            beaten: e.beaten,
        })
        .collect();
    if whole {
        // A period's `used` is the sum of its accepted debits, as the audit compares it.
        for (period, (_, debited)) in &used {
            let field = format!("used:{period}");
            fields.push(WhyField {
                stored: differences.get(&field).cloned(),
                field,
                value: json!(debited),
                decided_by: None,
                beaten: Vec::new(),
            });
        }
    }
    // A register the fold does not give at all (written by hand, or by a purged event).
    for (field, value) in &differences {
        if !fields.iter().any(|f| &f.field == field) {
            fields.push(WhyField {
                field: field.clone(),
                value: Value::Null,
                decided_by: None,
                beaten: Vec::new(),
                stored: Some(value.clone()),
            });
        }
    }
    let divergent: Vec<String> = differences.into_keys().collect();
    Ok(Some(Why {
        source: source.to_owned(),
        customer_id: customer.as_str().to_owned(),
        at: cut.at,
        received_before: cut.received_before,
        fields,
        purged: account.purged.count,
        complete_from: account.purged.latest,
        pending: account.pending,
        divergent,
        credits: credits.as_ref().map(credits_why).unwrap_or_default(),
    }))
}

/// The account's debits accepted at or after `t` (by the store's clock, `recorded_at`): what
/// a `why` asked as of what was received before `t` leaves out.
async fn debits_accepted_since(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    t: DateTime<Utc>,
) -> Result<BTreeSet<String>, sqlx::Error> {
    let ids = sqlx::query_scalar!(
        r#"SELECT usage_id FROM usage_debits
           WHERE source = $1 AND customer_id = $2 AND accepted AND recorded_at >= $3"#,
        source,
        customer.as_str(),
        t,
    )
    .fetch_all(exec(conn))
    .await?;
    Ok(ids.into_iter().collect())
}

/// The account's plan through its kept events, as the fold gives it (the console's timeline):
/// each event after which the plan differs from before it, in provider order.
pub async fn plan_timeline(
    conn: &mut PgConnection,
    sources: &Sources,
    catalog: &Catalog,
    (source, customer): (&str, &CustomerId),
) -> Result<Vec<PlanStep>, FoldError> {
    let mut tx = snapshot(conn).await?;
    let stored = registers::of_account(&mut tx, source, customer).await?;
    let reading = Reading {
        plan_steps: true,
        ..Reading::default()
    };
    let account = fold_with(
        &mut tx,
        sources,
        catalog,
        (source, customer),
        stored.as_ref(),
        reading,
    )
    .await?;
    tx.commit().await?;
    Ok(account.plan_steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two packs of 100 bought by two payments (the second spent first, by its priority) and
    /// a Stripe grant in dollars, as the read's statement writes their rows.
    fn grants() -> Value {
        let pack = |grant_id: &str, priority: Option<i64>, event_id: i64| {
            json!({
                "grant_id": grant_id, "origin": "catalog_pack", "unit": "credits", "scope": "all",
                "amount": "100.000000000000", "category": "paid", "priority": priority,
                "created": 100, "effective_at": 100, "expires_at": null, "voided_at": null,
                "updated": 100, "version_key": format!("evt_{event_id}"), "event_id": event_id,
                "type": "invoice.paid", "occurred_at": "1970-01-01T00:01:40+00:00"
            })
        };
        json!([
            pack("pack:in_a:price_pack", None, 7),
            pack("pack:in_b:price_pack_first", Some(10), 8),
            {"grant_id": "credgr_1", "origin": "stripe_credit_grant", "unit": "usd",
             "scope": "price_type:metered", "amount": "1000.000000000000", "category": "paid",
             "priority": null, "created": 100, "effective_at": null, "expires_at": null,
             "voided_at": null, "updated": 100, "version_key": "evt_9", "event_id": 9,
             "type": "billing.credit_grant.created", "occurred_at": null}
        ])
    }

    /// A debit as `inbox_account_credits` writes it: `amount` is its part past its period's
    /// allowance, `whole` what the app asked.
    fn debit(usage_id: &str, amount: i64, whole: i64, at: i64) -> Value {
        json!({"usage_id": usage_id, "unit": "credits", "period": "1970-01",
               "amount": amount, "whole": whole, "at": at})
    }

    #[test]
    fn a_debit_names_each_grant_it_took_from_and_how_much_as_derived() {
        // An allowance of 50: `use_1` (20) within it is not read at all; `use_2` (180) takes
        // the 30 left and 150 past it, 100 of the first pack and 50 of the other; `use_3`
        // after the time read is not counted.
        let rows = json!({
            "grants": grants(),
            "transactions": [],
            "debits": [debit("use_2", 150, 180, 300), debit("use_3", 10, 10, 900)],
        });
        let read = credits_read::CreditRows::decode(rows).unwrap().as_of(500);
        let why = credits_why(&read);
        let credits = why
            .iter()
            .find(|b| b.balance.balance.unit == "credits")
            .unwrap();
        assert_eq!(credits.balance.balance.available, "50");
        let [debit] = credits.debits.as_slice() else {
            panic!("one debit took from the packs: {:?}", credits.debits)
        };
        assert_eq!(
            (debit.usage_id.as_str(), debit.from_allowance.as_str()),
            ("use_2", "30")
        );
        let grants: Vec<(&str, &str, Option<i64>, &str)> = debit
            .from_grants
            .iter()
            .map(|g| (g.grant_id.as_str(), g.origin, g.event_id, g.amount.as_str()))
            .collect();
        assert_eq!(
            grants,
            [
                ("pack:in_b:price_pack_first", "catalog_pack", Some(8), "100"),
                ("pack:in_a:price_pack", "catalog_pack", Some(7), "50"),
            ]
        );
        let usd = why
            .iter()
            .find(|b| b.balance.balance.unit == "usd")
            .unwrap();
        assert!(
            usd.debits.is_empty(),
            "a debit of credits spends no dollars"
        );
    }
}
