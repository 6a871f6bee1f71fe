//! The credits audit (docs/design.md §4.14): per account with Stripe-mirrored grants, every
//! grant Stripe lists for the customer (`GET /v1/billing/credit_grants`, paged) and each one's
//! balance at Stripe (`GET /v1/billing/credit_balance_summary`, filtered by the grant) compared
//! with the mirrored fold's balance of that grant as of now. A grant Stripe lists that is not
//! mirrored, or one mirrored that Stripe does not list, is a difference too. A difference is
//! recorded in `credit_audit_differences` and alerted once, seen again for as long as it lasts,
//! and resolved when the balances agree again.
//!
//! What is compared is Stripe's `ledger_balance`: the grant's credit balance transactions
//! summed ("A credit balance transaction is a resource representing a transaction (either a
//! credit or a debit) against an existing credit grant", docs.stripe.com/api/billing/
//! credit-balance-transaction), which is what the mirrored ledger is — the signed sum of the
//! same transactions, never clamped. The `available_balance` is what may be applied now: it
//! is zero for a grant expired, voided or not yet effective whatever its ledger holds, and
//! Stripe may hold back what it is applying to an invoice not yet final, which no event tells;
//! comparing it would find differences the events cannot explain.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use crate::billing::credits::{Origin, Quantity};
use crate::billing::credits_read;
use crate::domain::CustomerId;
use crate::platform::budget::Throttled;
use crate::platform::db::exec;
use crate::platform::differences::{self, Account, Differences};
use crate::providers::{path_id, Api};

/// Accounts a run compares at most: each is at least two Stripe reads.
pub const MAX_CHECKED_PER_RUN: i64 = 20;

/// Stripe's largest page: "Limit can range between 1 and 100" (docs.stripe.com/api/pagination).
const PAGE: usize = 100;

/// A Stripe source the audit reads, through its read budget.
pub struct CreditSource {
    pub source: String,
    pub api: Api,
}

/// A grant whose mirrored balance and Stripe's differ.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CreditDifference {
    pub source: String,
    pub customer_id: String,
    pub grant_id: String,
    pub unit: String,
    /// `None`: the grant is not mirrored.
    pub ours: Option<String>,
    /// `None`: Stripe does not list the grant for the customer.
    pub theirs: Option<String>,
    pub first_seen_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
}

/// What one audit did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CreditAudit {
    /// Accounts compared with Stripe.
    pub checked: u64,
    /// Grants compared (listed at Stripe or mirrored).
    pub grants: u64,
    /// Left for a later run: the source's API budget was spent, or Stripe asked for a pause.
    pub throttled: u64,
    /// Differences seen for the first time this run, and those resolved this run.
    pub new: u64,
    pub resolved: u64,
    /// Every open difference (of the sources audited), oldest first.
    pub differences: Vec<CreditDifference>,
    /// Reads that failed, one line each; the other accounts were still compared.
    pub errors: Vec<String>,
}

/// One grant's balance, ours or Stripe's.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GrantBalance {
    unit: String,
    balance: Quantity,
}

/// A grant's comparison: `None` when they agree.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Compared {
    grant_id: String,
    unit: String,
    ours: Option<Quantity>,
    theirs: Option<Quantity>,
}

/// Compares each grant of `ours` and `theirs` (by grant id): those that differ, or that one side
/// lacks, by grant id.
fn compare(
    ours: &BTreeMap<String, GrantBalance>,
    theirs: &BTreeMap<String, GrantBalance>,
) -> Vec<Compared> {
    let mut ids: Vec<&String> = ours.keys().chain(theirs.keys()).collect();
    ids.sort();
    ids.dedup();
    ids.into_iter()
        .filter_map(|id| {
            let (o, t) = (ours.get(id), theirs.get(id));
            if o.is_some() && o == t {
                return None;
            }
            let unit = o.or(t).map(|b| b.unit.clone()).unwrap_or_default();
            Some(Compared {
                grant_id: id.clone(),
                unit,
                ours: o.map(|b| b.balance),
                theirs: t.map(|b| b.balance),
            })
        })
        .collect()
}

/// Stripe's amount object (`monetary`: `value` in the currency's minor units;
/// `custom_pricing_unit`: `id` and a decimal string `value`) as a unit and an amount, as the
/// mirrored grant keeps them.
fn amount(amount: &Value) -> Option<(String, Quantity)> {
    match amount.get("type")?.as_str()? {
        "monetary" => {
            let currency = amount.pointer("/monetary/currency")?.as_str()?;
            let value = amount.pointer("/monetary/value")?.as_i64()?;
            Some((currency.to_ascii_lowercase(), Quantity::whole(value)))
        }
        "custom_pricing_unit" => {
            let id = amount.pointer("/custom_pricing_unit/id")?.as_str()?;
            let value = amount.pointer("/custom_pricing_unit/value")?.as_str()?;
            Some((id.to_owned(), Quantity::parse(value).ok()?))
        }
        _ => None,
    }
}

/// The ledger balance of a summary filtered by one grant: its one balance ("One entry per
/// credit grant currency"); no entry is a grant of nothing yet, in the grant's own unit.
fn ledger_of(summary: &Value, unit: &str) -> anyhow::Result<GrantBalance> {
    let balances = summary
        .get("balances")
        .and_then(Value::as_array)
        .context("the summary has no balances")?;
    match balances.as_slice() {
        [] => Ok(GrantBalance {
            unit: unit.to_owned(),
            balance: Quantity::ZERO,
        }),
        [one] => {
            let (unit, balance) = amount(&one["ledger_balance"])
                .context("the summary's ledger_balance is not an amount")?;
            Ok(GrantBalance { unit, balance })
        }
        _ => anyhow::bail!("a summary of one grant has {} balances", balances.len()),
    }
}

/// Compares at most `max` accounts with Stripe-mirrored grants (those compared longest ago
/// first) of `sources`, while `deadline` allows. An error means the database could not be
/// reached; a read's failure is one line of `errors`.
#[tracing::instrument(skip_all)]
pub async fn run(
    pool: &PgPool,
    sources: &[CreditSource],
    max: i64,
    deadline: Instant,
) -> anyhow::Result<CreditAudit> {
    let mut found = CreditAudit::default();
    if sources.is_empty() {
        return Ok(found);
    }
    let names: Vec<String> = sources.iter().map(|s| s.source.clone()).collect();
    let mut throttled: Vec<String> = Vec::new();
    for (source, customer_id) in candidates(pool, &names, max).await? {
        if Instant::now() >= deadline {
            break;
        }
        if throttled.contains(&source) {
            found.throttled += 1;
            continue;
        }
        let Some(api) = sources.iter().find(|s| s.source == source).map(|s| &s.api) else {
            continue;
        };
        // Compared now, whatever comes of it: the others get their turn before it comes again.
        checked(pool, &source, &customer_id).await?;
        let account = format!("{source}/{customer_id}");
        let customer = match CustomerId::parse(&customer_id) {
            Ok(customer) => customer,
            Err(e) => {
                found.errors.push(format!("{account}: {e}"));
                continue;
            }
        };
        let ours = mirrored(pool, &source, &customer).await?;
        let theirs = match at_stripe(api, &customer, &ours).await {
            Ok(theirs) => theirs,
            Err(e) if Throttled::find(&e).is_some() => {
                found.throttled += 1;
                throttled.push(source.clone());
                continue;
            }
            Err(e) => {
                found.errors.push(format!("{account}: {e:#}"));
                continue;
            }
        };
        found.checked += 1;
        let compared: BTreeSet<&String> = ours.keys().chain(theirs.keys()).collect();
        found.grants += compared.len() as u64;
        let differing = compare(&ours, &theirs);
        let agreeing: Vec<String> = compared
            .into_iter()
            .filter(|id| !differing.iter().any(|d| &d.grant_id == *id))
            .cloned()
            .collect();
        let account = Account {
            source: &source,
            customer_id: &customer_id,
        };
        let settled = differences::settle::<Table>(pool, account, &differing, &agreeing).await?;
        let said = |q: Option<Quantity>| q.map(|q| q.to_string());
        for d in &settled.new {
            found.new += 1;
            tracing::error!(
                alert = "credit_difference", source = %source, customer_id = %customer_id,
                grant_id = %d.grant_id, unit = %d.unit,
                ours = %said(d.ours).unwrap_or_else(|| "not mirrored".into()),
                theirs = %said(d.theirs).unwrap_or_else(|| "not listed".into()),
                "Stripe's ledger balance of a credit grant differs from the mirrored one"
            );
        }
        if settled.resolved > 0 {
            found.resolved += settled.resolved;
            tracing::info!(source = %source, customer_id = %customer_id, resolved = settled.resolved,
                "credit differences are resolved: Stripe's ledger balances agree again");
        }
    }
    let mut conn = pool
        .acquire()
        .await
        .context("reading open credit differences")?;
    found.differences = open(&mut conn, Some(&names), None)
        .await
        .context("reading open credit differences")?;
    Ok(found)
}

/// Each Stripe-mirrored grant's ledger balance as the fold gives it now (signed, unclamped).
async fn mirrored(
    pool: &PgPool,
    source: &str,
    customer: &CustomerId,
) -> anyhow::Result<BTreeMap<String, GrantBalance>> {
    let mut conn = pool.acquire().await?;
    let Some(read) = credits_read::read(&mut conn, source, customer, None)
        .await
        .context("reading an account's credits")?
    else {
        return Ok(BTreeMap::new());
    };
    Ok(read
        .credits
        .balances_at(read.at)
        .into_iter()
        .filter(|g| g.grant.origin == Origin::StripeCreditGrant)
        .map(|g| {
            let balance = GrantBalance {
                unit: g.grant.unit.clone(),
                balance: g.remaining,
            };
            (g.grant.grant_id, balance)
        })
        .collect())
}

/// Every grant Stripe lists for the customer and its ledger balance: the list read page by
/// page to its end (`has_more`, `starting_after` the last id), then one summary per grant.
async fn at_stripe(
    api: &Api,
    customer: &CustomerId,
    ours: &BTreeMap<String, GrantBalance>,
) -> anyhow::Result<BTreeMap<String, GrantBalance>> {
    // A connected account's customer is read as that account.
    let headers: Vec<(&str, &str)> = customer
        .connected_account()
        .iter()
        .map(|a| ("Stripe-Account", *a))
        .collect();
    let who = customer.at_provider().to_owned();
    let mut listed: Vec<(String, String)> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut query = vec![("customer", who.clone()), ("limit", PAGE.to_string())];
        if let Some(after) = &after {
            query.push(("starting_after", after.clone()));
        }
        let page = api
            .get_found("/v1/billing/credit_grants", &query, &headers)
            .await?
            .context("GET /v1/billing/credit_grants answered 404 Not Found")?;
        let data = page
            .get("data")
            .and_then(Value::as_array)
            .context("a list without data")?;
        for grant in data {
            let id = grant["id"].as_str().context("a grant without an id")?;
            let (unit, _) = amount(&grant["amount"])
                .with_context(|| format!("grant {id}: its amount is not one"))?;
            listed.push((path_id(id)?.to_owned(), unit));
        }
        let more = page.get("has_more").and_then(Value::as_bool) == Some(true);
        match data.last().and_then(|g| g["id"].as_str()) {
            Some(last) if more => after = Some(last.to_owned()),
            _ => break,
        }
    }
    let mut theirs = BTreeMap::new();
    for (id, unit) in listed {
        let query = [
            ("customer", who.clone()),
            ("filter[type]", "credit_grant".to_owned()),
            ("filter[credit_grant]", id.clone()),
        ];
        let summary = api
            .get_found("/v1/billing/credit_balance_summary", &query, &headers)
            .await?
            .with_context(|| format!("the balance summary of grant {id} answered 404"))?;
        let unit = ours.get(&id).map_or(unit, |o| o.unit.clone());
        theirs.insert(id, ledger_of(&summary, &unit)?);
    }
    Ok(theirs)
}

/// The accounts with Stripe-mirrored grants and those with an open difference, those compared
/// longest ago (or never) first.
async fn candidates(
    pool: &PgPool,
    sources: &[String],
    max: i64,
) -> anyhow::Result<Vec<(String, String)>> {
    let rows = sqlx::query!(
        r#"
        WITH due AS (
            SELECT DISTINCT source, customer_id FROM credit_grants
            WHERE origin = 'stripe_credit_grant' AND source = ANY($1)
            UNION
            SELECT source, customer_id FROM credit_audit_differences
            WHERE resolved_at IS NULL AND source = ANY($1)
        )
        SELECT due.source AS "source!", due.customer_id AS "customer_id!"
        FROM due LEFT JOIN credit_audit_checks c
          ON c.source = due.source AND c.customer_id = due.customer_id
        ORDER BY c.checked_at NULLS FIRST, due.source, due.customer_id
        LIMIT $2
        "#,
        sources,
        max,
    )
    .fetch_all(exec(pool))
    .await
    .context("picking accounts for the credits audit")?;
    Ok(rows
        .into_iter()
        .map(|r| (r.source, r.customer_id))
        .collect())
}

async fn checked(pool: &PgPool, source: &str, customer_id: &str) -> anyhow::Result<()> {
    sqlx::query!(
        r#"
        INSERT INTO credit_audit_checks (source, customer_id, checked_at)
        VALUES ($1, $2, inbox_now())
        ON CONFLICT (source, customer_id) DO UPDATE SET checked_at = inbox_now()
        "#,
        source,
        customer_id,
    )
    .execute(exec(pool))
    .await
    .context("marking an account compared by the credits audit")?;
    Ok(())
}

/// `credit_audit_differences`: one open difference per grant.
struct Table;

impl Differences for Table {
    type Seen = Compared;
    type Key = String;

    async fn record(pool: &PgPool, account: Account<'_>, d: &Compared) -> anyhow::Result<bool> {
        let new = sqlx::query_scalar!(
            r#"
            INSERT INTO credit_audit_differences (source, customer_id, grant_id, unit, ours, theirs)
            VALUES ($1, $2, $3, $4, $5, $6)
            ON CONFLICT (source, customer_id, grant_id) WHERE resolved_at IS NULL
            DO UPDATE SET unit = EXCLUDED.unit, ours = EXCLUDED.ours, theirs = EXCLUDED.theirs,
                          last_seen_at = inbox_now()
            RETURNING xmax = 0 AS "new!"
            "#,
            account.source,
            account.customer_id,
            d.grant_id,
            d.unit,
            d.ours.map(|q| q.to_string()),
            d.theirs.map(|q| q.to_string()),
        )
        .fetch_one(exec(pool))
        .await
        .context("recording a credit difference")?;
        Ok(new)
    }

    async fn resolve(
        pool: &PgPool,
        account: Account<'_>,
        grants: &[String],
    ) -> anyhow::Result<u64> {
        let done = sqlx::query!(
            r#"
            UPDATE credit_audit_differences
            SET resolved_at = inbox_now(), last_seen_at = inbox_now()
            WHERE source = $1 AND customer_id = $2 AND grant_id = ANY($3) AND resolved_at IS NULL
            "#,
            account.source,
            account.customer_id,
            grants,
        )
        .execute(exec(pool))
        .await
        .context("resolving credit differences")?;
        Ok(done.rows_affected())
    }
}

/// The open differences, oldest first: of these sources (`None`: of every source), at most
/// `limit` (`None`: all).
pub async fn open(
    conn: &mut PgConnection,
    sources: Option<&[String]>,
    limit: Option<i64>,
) -> Result<Vec<CreditDifference>, sqlx::Error> {
    sqlx::query_as!(
        CreditDifference,
        r#"
        SELECT source, customer_id, grant_id, unit, ours, theirs, first_seen_at, last_seen_at
        FROM credit_audit_differences
        WHERE resolved_at IS NULL AND ($1::text[] IS NULL OR source = ANY($1))
        ORDER BY first_seen_at, id
        LIMIT $2
        "#,
        sources,
        limit,
    )
    .fetch_all(exec(conn))
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b(unit: &str, n: i64) -> GrantBalance {
        GrantBalance {
            unit: unit.into(),
            balance: Quantity::whole(n),
        }
    }

    #[test]
    fn a_grant_on_one_side_only_or_of_another_balance_differs_and_equal_ones_do_not() {
        let ours = BTreeMap::from([
            ("g1".to_owned(), b("usd", 700)),
            ("g2".to_owned(), b("usd", 100)),
            ("g3".to_owned(), b("usd", 5)),
        ]);
        let theirs = BTreeMap::from([
            ("g1".to_owned(), b("usd", 700)),
            ("g2".to_owned(), b("usd", 40)),
            ("g4".to_owned(), b("usd", 9)),
        ]);
        let found = compare(&ours, &theirs);
        let said: Vec<_> = found
            .iter()
            .map(|c| (c.grant_id.as_str(), c.ours, c.theirs))
            .collect();
        assert_eq!(
            said,
            vec![
                ("g2", Some(Quantity::whole(100)), Some(Quantity::whole(40))),
                ("g3", Some(Quantity::whole(5)), None),
                ("g4", None, Some(Quantity::whole(9))),
            ]
        );
    }

    #[test]
    fn a_summary_of_one_grant_reads_its_ledger_balance_in_either_amount_shape() {
        let monetary = json!({"balances": [{
            "available_balance": {"type": "monetary", "monetary": {"currency": "usd", "value": 0}},
            "ledger_balance": {"type": "monetary", "monetary": {"currency": "usd", "value": 700}}}]});
        assert_eq!(ledger_of(&monetary, "usd").unwrap(), b("usd", 700));
        let custom = json!({"balances": [{
            "available_balance": {"type": "custom_pricing_unit",
                "custom_pricing_unit": {"id": "cpu_1", "value": "2.5"}},
            "ledger_balance": {"type": "custom_pricing_unit",
                "custom_pricing_unit": {"id": "cpu_1", "value": "2.5"}}}]});
        let read = ledger_of(&custom, "cpu_1").unwrap();
        assert_eq!(read.balance, Quantity::parse("2.5").unwrap());
        assert_eq!(
            ledger_of(&json!({"balances": []}), "eur").unwrap(),
            b("eur", 0)
        );
    }
}
