//! Stripe Billing Credits as the credits fold reads them (docs/design.md §4.14, §6.2): a
//! `billing.credit_grant` snapshot is a grant register's write, a
//! `billing.credit_balance_transaction` is a ledger entry of the grant it names. Shapes as
//! Stripe's OpenAPI gives them (`openapi/fixtures3.json` of stripe/openapi: the
//! `billing.credit_grant` and `billing.credit_balance_transaction` resources).

use serde_json::Value;

use crate::billing::credits::{
    Category, GrantSnapshot, Origin, Quantity, Transaction, TransactionKind,
};
use crate::billing::model::read::{first_text, required};
use crate::billing::Problem;

/// The snapshot event types of Stripe Billing Credits.
pub const GRANT_TYPES: &[&str] = &[
    "billing.credit_grant.created",
    "billing.credit_grant.updated",
];
pub const TRANSACTION_TYPE: &str = "billing.credit_balance_transaction.created";

/// What one credits event says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreditEvent {
    /// A grant's snapshot and the customer it is for (`customer`, else `customer_account`).
    Grant {
        customer: String,
        snapshot: GrantSnapshot,
    },
    /// A ledger entry: it names its grant, not its customer.
    Transaction(Transaction),
}

/// Whether an event type is one of Stripe Billing Credits', snapshot or thin (`v1.` twin).
pub fn is_credit_type(event_type: &str) -> bool {
    let snapshot = event_type.strip_prefix("v1.").unwrap_or(event_type);
    GRANT_TYPES.contains(&snapshot) || snapshot == TRANSACTION_TYPE
}

/// Reads a credits event's object; `event_key` is the event's dedupe key (the tie-break of two
/// grant snapshots of one `updated` second).
pub fn read(event_type: &str, object: &Value, event_key: &str) -> Result<CreditEvent, Problem> {
    if GRANT_TYPES.contains(&event_type) {
        grant(object, event_key)
    } else if event_type == TRANSACTION_TYPE {
        transaction(object).map(CreditEvent::Transaction)
    } else {
        Err(Problem(format!("{event_type} is not a credits event")))
    }
}

fn grant(object: &Value, event_key: &str) -> Result<CreditEvent, Problem> {
    let grant_id = required(object, "/id")?.to_owned();
    let customer = first_text(object, &["/customer", "/customer/id", "/customer_account"])
        .ok_or_else(|| Problem("the credit grant names no customer".into()))?
        .to_owned();
    let (unit, amount) = amount(object.pointer("/amount"))?;
    let category = match required(object, "/category")? {
        "paid" => Category::Paid,
        "promotional" => Category::Promotional,
        other => {
            return Err(Problem(format!(
                "/category '{other}' is not paid or promotional"
            )))
        }
    };
    let priority = match object.get("priority") {
        None | Some(Value::Null) => None,
        Some(p) => Some(
            p.as_u64()
                .filter(|p| *p <= 100)
                .ok_or_else(|| Problem("/priority is not a whole number from 0 to 100".into()))?
                as u8,
        ),
    };
    let created = time(object, "created")?.ok_or_else(|| Problem("/created is missing".into()))?;
    Ok(CreditEvent::Grant {
        customer,
        snapshot: GrantSnapshot {
            grant_id,
            origin: Origin::StripeCreditGrant,
            unit,
            scope: scope(object.pointer("/applicability_config/scope")),
            amount,
            category,
            priority,
            created,
            effective_at: time(object, "effective_at")?,
            expires_at: time(object, "expires_at")?,
            voided_at: time(object, "voided_at")?,
            updated: time(object, "updated")?.unwrap_or(created),
            event_key: event_key.to_owned(),
        },
    })
}

fn transaction(object: &Value) -> Result<Transaction, Problem> {
    let transaction_id = required(object, "/id")?.to_owned();
    let grant_id = first_text(object, &["/credit_grant", "/credit_grant/id"])
        .ok_or_else(|| Problem("the transaction names no credit grant".into()))?
        .to_owned();
    let side = required(object, "/type")?;
    let entry = object
        .get(side)
        .filter(|e| e.is_object())
        .ok_or_else(|| Problem(format!("a {side} transaction has no /{side}")))?;
    let named = required(entry, "/type")?;
    let kind = TransactionKind::parse(side, named)
        .ok_or_else(|| Problem(format!("'{named}' is not a known {side} type")))?;
    let (_, amount) = amount(entry.pointer("/amount"))?;
    let effective_at = match time(object, "effective_at")? {
        Some(t) => t,
        None => time(object, "created")?.ok_or_else(|| Problem("/created is missing".into()))?,
    };
    Ok(Transaction {
        transaction_id,
        grant_id,
        kind,
        amount,
        effective_at,
    })
}

/// Stripe's amount: `monetary` (`value` in the currency's minor units) or
/// `custom_pricing_unit` (`id`, `value` a decimal string). The unit is the currency or the
/// custom pricing unit's id.
fn amount(amount: Option<&Value>) -> Result<(String, Quantity), Problem> {
    let amount = amount.ok_or_else(|| Problem("no /amount".into()))?;
    match required(amount, "/type")? {
        "monetary" => {
            let currency = required(amount, "/monetary/currency")?.to_ascii_lowercase();
            let value = amount
                .pointer("/monetary/value")
                .and_then(Value::as_i64)
                .ok_or_else(|| Problem("/amount/monetary/value is not a whole number".into()))?;
            Ok((currency, Quantity::whole(value)))
        }
        "custom_pricing_unit" => {
            let unit = required(amount, "/custom_pricing_unit/id")?.to_owned();
            let value = required(amount, "/custom_pricing_unit/value")?;
            let value = Quantity::parse(value)
                .map_err(|e| Problem(format!("/amount/custom_pricing_unit/value: {e}")))?;
            Ok((unit, value))
        }
        other => Err(Problem(format!("/amount/type '{other}' is not known"))),
    }
}

/// The scope in words: `price_type:metered`, `prices:<ids, sorted>`, or `all`.
fn scope(scope: Option<&Value>) -> String {
    let Some(scope) = scope else {
        return "all".to_owned();
    };
    if let Some(prices) = scope.get("prices").and_then(Value::as_array) {
        let mut ids: Vec<&str> = prices
            .iter()
            .filter_map(|p| p.get("id").and_then(Value::as_str).or(p.as_str()))
            .collect();
        ids.sort_unstable();
        return format!("prices:{}", ids.join(","));
    }
    match scope.get("price_type").and_then(Value::as_str) {
        Some(t) => format!("price_type:{t}"),
        None => "all".to_owned(),
    }
}

/// A unix-seconds field that may be null.
fn time(object: &Value, field: &str) -> Result<Option<i64>, Problem> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| Problem(format!("/{field} is not a time in unix seconds"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::credits::Credits;

    fn corpus() -> Vec<(String, Value)> {
        let dir = format!(
            "{}/../testdata/providers/stripe/credits",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        files
            .into_iter()
            .map(|p| {
                let body = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
                (p.file_name().unwrap().to_string_lossy().into_owned(), body)
            })
            .collect()
    }

    fn read_all(files: &[(String, Value)]) -> (Credits, Vec<String>) {
        let mut credits = Credits::new();
        let mut customers = Vec::new();
        for (name, event) in files {
            let event_type = event["type"].as_str().unwrap();
            assert!(is_credit_type(event_type), "{name}");
            if event_type.starts_with("v1.") {
                // A thin twin names its object and carries none of it; its object's path is
                // one the worker reads.
                assert_eq!(event["related_object"]["type"], "billing.credit_grant");
                let url = event["related_object"]["url"].as_str().unwrap();
                assert_eq!(super::super::thin::related_path(url), Some(url), "{name}");
                continue;
            }
            let key = event["id"].as_str().unwrap();
            match read(event_type, &event["data"]["object"], key)
                .unwrap_or_else(|e| panic!("{name}: {e:?}"))
            {
                CreditEvent::Grant { customer, snapshot } => {
                    customers.push(customer);
                    credits.grant(snapshot)
                }
                CreditEvent::Transaction(t) => credits.transaction(t),
            }
        }
        (credits, customers)
    }

    /// The corpus's grant: $10.00 of metered usage, $3.00 applied to an invoice, the rest
    /// expired by Stripe at `expires_at` — the same in file order and in reverse.
    #[test]
    fn the_corpus_grant_folds_to_what_its_events_say_in_either_order() {
        let files = corpus();
        let (forward, customers) = read_all(&files);
        let mut reversed = files.clone();
        reversed.reverse();
        let (backward, _) = read_all(&reversed);
        assert!(customers.iter().all(|c| c == "cus_CreditCust0001"));
        let expires_at = 1769904000;
        for at in [
            1767225600,
            1768521600,
            expires_at - 1,
            expires_at,
            expires_at + 86400,
        ] {
            assert_eq!(forward.balances_at(at), backward.balances_at(at), "at {at}");
        }
        let [g] = forward.balances_at(expires_at - 1).try_into().unwrap();
        assert_eq!(g.grant.unit, "usd");
        assert_eq!(g.grant.scope, "price_type:metered");
        assert_eq!(g.grant.priority(), 50);
        assert_eq!(
            g.grant.updated, 1767312000,
            "the updated snapshot holds the register"
        );
        assert_eq!(g.available().to_string(), "700");
        assert!(!g.provisional);
        let [t] = forward.totals_at(expires_at).try_into().unwrap();
        assert_eq!(
            (
                t.granted.to_string(),
                t.used.to_string(),
                t.expired.to_string()
            ),
            ("1000".into(), "300".into(), "700".into())
        );
        assert_eq!(t.available, Quantity::ZERO);
    }

    #[test]
    fn a_custom_pricing_unit_grant_is_a_decimal_of_that_unit_and_null_priority_is_stripes_default()
    {
        let object = serde_json::json!({
            "id": "credgr_1", "object": "billing.credit_grant",
            "amount": {"type": "custom_pricing_unit",
                       "custom_pricing_unit": {"id": "cpu_tokens", "value": "2500.5"}},
            "applicability_config": {"scope": {"prices": [{"id": "price_b"}, {"id": "price_a"}]}},
            "category": "promotional", "created": 100, "customer": null,
            "customer_account": "acct_1Cust", "effective_at": null, "expires_at": null,
            "livemode": false, "metadata": {}, "name": null, "priority": null,
            "test_clock": null, "updated": 100, "voided_at": null
        });
        let CreditEvent::Grant { customer, snapshot } =
            read("billing.credit_grant.created", &object, "evt_1").unwrap()
        else {
            panic!("a grant")
        };
        assert_eq!(customer, "acct_1Cust");
        assert_eq!(snapshot.unit, "cpu_tokens");
        assert_eq!(snapshot.amount.to_string(), "2500.5");
        assert_eq!(snapshot.scope, "prices:price_a,price_b");
        assert_eq!(snapshot.category, Category::Promotional);
        assert_eq!((snapshot.priority, snapshot.priority()), (None, 50));
        assert_eq!(snapshot.effective_from(), 100);
    }

    /// A credits event is read whole by `decide`: a good one is ignored with what it says, a
    /// malformed one is unprocessable with its field, and no register moves.
    #[test]
    fn decide_writes_the_grant_register_or_its_ledger_and_no_other_register() {
        use crate::billing::{Decision, Effect};
        let catalog = crate::domain::Catalog::default();
        for (name, event) in corpus() {
            let event_type = event["type"].as_str().unwrap();
            if event_type.starts_with("v1.") {
                continue;
            }
            let decided = super::super::decide::decide(event_type, &event, &catalog).unwrap();
            let Decision::Apply { effects, .. } = decided else {
                panic!("{name}: {decided:?}")
            };
            let grant = match effects.as_slice() {
                [Effect::CreditGrant(g)] => g.grant_id.clone(),
                [Effect::CreditTransaction(t)] => t.grant_id.clone(),
                other => panic!("{name}: {other:?}"),
            };
            assert_eq!(grant, "credgr_test_61CrdGrant01QxW3mR8tYb2Lp5");
        }
        let mut bad = corpus()[0].1.clone();
        bad["data"]["object"]["category"] = "gift".into();
        let err = super::super::decide::decide("billing.credit_grant.created", &bad, &catalog)
            .unwrap_err();
        assert!(err.0.contains("/category"), "{err:?}");
    }

    #[test]
    fn a_transaction_of_an_unknown_type_or_without_its_side_is_unprocessable() {
        let base = serde_json::json!({
            "id": "cbtxn_1", "object": "billing.credit_balance_transaction", "created": 100,
            "credit": null, "credit_grant": "credgr_1", "debit": null, "effective_at": 100,
            "livemode": false, "test_clock": null, "type": "debit"
        });
        assert!(read(TRANSACTION_TYPE, &base, "evt_1").is_err());
        let mut odd = base.clone();
        odd["debit"] = serde_json::json!({"amount": {"type": "monetary",
            "monetary": {"currency": "usd", "value": 5}}, "type": "credits_refunded"});
        assert!(read(TRANSACTION_TYPE, &odd, "evt_1").is_err());
        assert!(is_credit_type(
            "v1.billing.credit_balance_transaction.created"
        ));
        assert!(!is_credit_type("billing.credit_balance_summary.updated"));
    }
}
