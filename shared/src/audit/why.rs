//! `why` (docs/design.md §5.5a): every field of an account as its kept events give it, with
//! the event that decided it, what that event beat, and the register as stored where the two
//! differ.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::PgConnection;

use crate::billing::credits_read::{self, BalanceWhy};
use crate::billing::fold::Beaten;
use crate::billing::registers;
use crate::domain::{Catalog, CustomerId};

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
    /// each grant's (the one its register holds) and each counted transaction's
    /// (docs/design.md §4.14). Grants are registers of their own, not the fold's fields.
    pub credits: Vec<BalanceWhy>,
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
    let credits = credits_read::read(&mut tx, source, customer, cut.at).await?;
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
        credits: credits.map(|c| c.explain()).unwrap_or_default(),
    }))
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
