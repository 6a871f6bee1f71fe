//! Stripe Billing Credits, read side: `GET /v1/billing/credit_grants`, `GET
//! /v1/billing/credit_grants/{id}` and `GET /v1/billing/credit_balance_summary`, answered from the `billing.credit_grant` and
//! `billing.credit_balance_transaction` objects a test has the account hold
//! ([`super::FakeStripe::holds`]), so a summary is what the grants' own ledgers sum to.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::lists::{created, error, get, missing, page};

/// `GET /v1/billing/credit_grants`: "Retrieve a list of credit grants." (stripe/openapi,
/// GetBillingCreditGrants), filtered by "`customer`: Only return credit grants for this
/// customer.", one page of the list in reverse chronological order (docs.stripe.com/api/pagination,
/// `limit` 1 to 100, `starting_after`, `has_more`).
pub(super) fn list_grants(path: &str, held: &[&Value], query: &[(String, String)]) -> (u16, Value) {
    let customer = get(query, "customer");
    let mut listed: Vec<(usize, &Value)> = held
        .iter()
        .enumerate()
        .filter(|(_, o)| o["object"] == "billing.credit_grant")
        .filter(|(_, o)| customer.is_none_or(|c| o["customer"] == c))
        .map(|(n, o)| (n, *o))
        .collect();
    listed.sort_by_key(|(n, o)| std::cmp::Reverse((created(o), *n)));
    page(
        path,
        listed.into_iter().map(|(_, o)| o.clone()).collect(),
        query,
    )
}

/// `GET /v1/billing/credit_grants/{id}`: "Retrieves a credit grant." (stripe/openapi,
/// GetBillingCreditGrantsId; docs.stripe.com/api/billing/credit-grant/retrieve): the
/// `billing.credit_grant` as the account holds it now, its latest snapshot; an id the account
/// holds no grant of is Stripe's 404 `resource_missing`, "No such credit grant".
pub(super) fn retrieve_grant(held: &[&Value], id: &str) -> (u16, Value) {
    match held
        .iter()
        .rev()
        .find(|o| o["object"] == "billing.credit_grant" && o["id"] == id)
    {
        Some(grant) => (200, (*grant).clone()),
        None => missing("credit grant", id, "id"),
    }
}

/// `GET /v1/billing/credit_balance_summary`: "Retrieves the credit balance summary for a
/// customer." (docs.stripe.com/api/billing/credit-balance-summary/retrieve). `filter` is
/// required: "`filter.type`: The type of filter to apply to the balance summary", either
/// `credit_grant` ("`filter.credit_grant`: The credit grant for which to fetch the balance
/// summary") or `applicability_scope` ("`filter.applicability_scope`: The billing credit
/// applicability scope for which to fetch credit balance summary", `price_type: metered` or
/// `prices`). The answer is a `billing.credit_balance_summary`: "`balances`: The billing credit
/// balances. One entry per credit grant currency." (the object's reference), each an
/// `available_balance` and a `ledger_balance` in the grant's amount shape.
///
/// The ledger balance is the signed sum of the grants' credit balance transactions effective by
/// `now` (a credit adds, a debit subtracts: "A credit balance transaction is a resource
/// representing a transaction (either a credit or a debit) against an existing credit grant",
/// docs.stripe.com/api/billing/credit-balance-transaction); the available balance is that of
/// the grants that may still be applied — effective, not expired, not voided — never below
/// zero. The fake holds no invoice, so no application is pending and nothing more is held back.
pub(super) fn balance_summary(
    held: &[&Value],
    query: &[(String, String)],
    now: i64,
) -> (u16, Value) {
    let Some(customer) = get(query, "customer") else {
        return error(
            400,
            Some("parameter_missing"),
            "Missing required param: customer.".into(),
            Some("customer"),
        );
    };
    let grants: Vec<&Value> = held
        .iter()
        .filter(|o| o["object"] == "billing.credit_grant" && o["customer"] == customer)
        .copied()
        .collect();
    let chosen: Vec<&Value> = match get(query, "filter[type]") {
        Some("credit_grant") => {
            let Some(id) = get(query, "filter[credit_grant]") else {
                return error(
                    400,
                    Some("parameter_missing"),
                    "Missing required param: filter[credit_grant].".into(),
                    Some("filter[credit_grant]"),
                );
            };
            match grants.iter().find(|g| g["id"] == id) {
                Some(grant) => vec![*grant],
                None => {
                    return error(
                        404,
                        Some("resource_missing"),
                        format!("No such credit grant: '{id}'"),
                        Some("filter[credit_grant]"),
                    )
                }
            }
        }
        Some("applicability_scope") => {
            let price_type = get(query, "filter[applicability_scope][price_type]");
            let prices: Vec<&str> = query
                .iter()
                .filter(|(k, _)| {
                    k.starts_with("filter[applicability_scope][prices]") && k.ends_with("[id]")
                })
                .map(|(_, v)| v.as_str())
                .collect();
            grants
                .into_iter()
                .filter(|g| {
                    let scope = &g["applicability_config"]["scope"];
                    let typed = price_type.is_some_and(|t| scope["price_type"] == t);
                    let priced = scope["prices"].as_array().is_some_and(|listed| {
                        listed
                            .iter()
                            .any(|p| prices.iter().any(|id| p["id"] == *id))
                    });
                    typed || priced
                })
                .collect()
        }
        _ => {
            return error(
                400,
                Some("parameter_missing"),
                "Missing required param: filter[type].".into(),
                Some("filter"),
            )
        }
    };
    // Per unit (a currency or a custom pricing unit): the ledger and the available balance.
    let mut balances: BTreeMap<Unit, (Amount, Amount)> = BTreeMap::new();
    for grant in chosen {
        let Some((unit, _)) = amount_of(&grant["amount"]) else {
            continue;
        };
        let ledger: Amount = held
            .iter()
            .filter(|t| {
                t["object"] == "billing.credit_balance_transaction"
                    && t["credit_grant"] == grant["id"]
                    && t["effective_at"].as_i64().unwrap_or_else(|| created(t)) <= now
            })
            .filter_map(|t| signed(t))
            .sum();
        let at = |field: &str| grant[field].as_i64();
        let live = at("effective_at").unwrap_or_else(|| created(grant)) <= now
            && at("expires_at").is_none_or(|e| e > now)
            && at("voided_at").is_none_or(|v| v > now);
        let available = if live { ledger.max(0) } else { 0 };
        let entry = balances.entry(unit).or_default();
        entry.0 += available;
        entry.1 += ledger;
    }
    let balances: Vec<Value> = balances
        .into_iter()
        .map(|(unit, (available, ledger))| {
            json!({"available_balance": unit.shape(available),
                   "ledger_balance": unit.shape(ledger)})
        })
        .collect();
    (
        200,
        json!({"object": "billing.credit_balance_summary", "balances": balances,
               "customer": customer, "customer_account": null, "livemode": false}),
    )
}

/// An amount in 10⁻¹² of its unit, so that a custom pricing unit's decimal sums exactly.
type Amount = i128;
const SCALE: usize = 12;

/// A balance's unit: a currency (`monetary`, "`value`: A positive integer representing the
/// amount" in minor units) or a custom pricing unit (`custom_pricing_unit`, `id` and a decimal
/// string `value`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Unit {
    Currency(String),
    Custom(String),
}

impl Unit {
    fn shape(&self, amount: Amount) -> Value {
        let one = 10i128.pow(SCALE as u32);
        match self {
            Unit::Currency(currency) => json!({"type": "monetary",
                "monetary": {"currency": currency, "value": (amount / one) as i64}}),
            Unit::Custom(id) => {
                let sign = if amount < 0 { "-" } else { "" };
                let (int, frac) = (amount.abs() / one, amount.abs() % one);
                let frac = format!("{frac:012}");
                let frac = frac.trim_end_matches('0');
                let value = match frac {
                    "" => format!("{sign}{int}"),
                    frac => format!("{sign}{int}.{frac}"),
                };
                json!({"type": "custom_pricing_unit",
                       "custom_pricing_unit": {"id": id, "value": value}})
            }
        }
    }
}

/// The unit and amount of an amount object.
fn amount_of(amount: &Value) -> Option<(Unit, Amount)> {
    let one = 10i128.pow(SCALE as u32);
    match amount["type"].as_str()? {
        "monetary" => {
            let m = &amount["monetary"];
            let value = i128::from(m["value"].as_i64()?) * one;
            Some((Unit::Currency(m["currency"].as_str()?.to_owned()), value))
        }
        "custom_pricing_unit" => {
            let c = &amount["custom_pricing_unit"];
            let value = decimal(c["value"].as_str()?)?;
            Some((Unit::Custom(c["id"].as_str()?.to_owned()), value))
        }
        _ => None,
    }
}

fn decimal(s: &str) -> Option<Amount> {
    let (negative, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if frac.len() > SCALE {
        return None;
    }
    let int: i128 = int.parse().ok()?;
    let frac: i128 = format!("{frac:0<SCALE$}").parse().ok()?;
    let value = int * 10i128.pow(SCALE as u32) + frac;
    Some(if negative { -value } else { value })
}

/// A transaction's signed amount: its `credit.amount` adds, its `debit.amount` subtracts
/// ("`type`: The type of credit balance transaction (credit or debit)").
fn signed(transaction: &Value) -> Option<Amount> {
    match transaction["type"].as_str()? {
        "credit" => amount_of(&transaction["credit"]["amount"]).map(|(_, a)| a),
        "debit" => amount_of(&transaction["debit"]["amount"]).map(|(_, a)| -a),
        _ => None,
    }
}
