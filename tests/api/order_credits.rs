//! The order property for credits (docs/design.md §4.14): random sets of Stripe credit grant
//! snapshots (priorities moved, voids), their transactions (Stripe's grant, applications past
//! the grant's amount, an invoice voided that gives back, Stripe's own expiry), and catalog
//! packs paid by an invoice and refunded, delivered in random order with copies and injected
//! failures, end in the same grant registers, ledgers and balances as each applied once in
//! provider-time order — and in the balances Stripe's ledger gives, computed here apart from
//! the fold (so a fold that clamps inside its sums, or adds its provisional expiry to
//! Stripe's, is caught). Every effect the complete set tells is written in every order, once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::{DateTime, Duration, TimeZone, Utc};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Value};
use shared::billing::credits::{self, Credits, Quantity};
use shared::domain::{Catalog, CustomerId};
use shared::handlers::worker::WorkerState;
use shared::platform::sim::{with_interrupts, Fault, FaultAction, Point};
use sqlx::PgPool;

use crate::helpers::{create_queue, sqs_client, test_worker};
use crate::order::{process, store, stripe_materialized};

pub(crate) const CUSTOMERS: u8 = 2;
const GRANTS: u8 = 3;
/// A grant's amount (usd minor units) and a pack's (credits).
const GRANT_AMOUNT: i64 = 1000;
const PACK_AMOUNT: i64 = 500;
/// Stripe's own expiry, as it would say it (it saw an application the set does not hold).
const STRIPE_EXPIRED: i64 = 100;

const CATALOG: &str = r#"{
    "price_pack": {"credits": {"amount": 500, "unit": "credits", "expires_after_days": 30}},
    "free": {"plan": "free", "monthly_allowance": 0,
             "credits_low": {"usd": 500, "credits": 300}}
}"#;

pub(crate) fn time(at: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap() + Duration::hours(i64::from(at) * 73)
}

/// One event, in terms small enough to shrink. What Stripe fixes once (a grant's amount, its
/// expiry, when it was voided; a transaction's kind, amount and time; when an invoice was paid
/// and refunded) is a function of the ids, so that two events of one object never disagree.
#[derive(Debug, Clone)]
pub(crate) enum CreditsEvent {
    /// A snapshot of grant `grant` (customer `grant % CUSTOMERS`) as of `at`, at `priority`,
    /// voided (at its one void time) or not.
    Grant {
        grant: u8,
        priority: Option<u8>,
        voided: bool,
        at: u32,
    },
    /// Transaction `txn` of grant `grant` ([`txn_of`]).
    Txn { grant: u8, txn: u8 },
    /// A paid invoice of one credit pack.
    PackPaid { customer: u8, invoice: u8 },
    /// The full refund of that invoice's charge.
    PackRefund { customer: u8, invoice: u8 },
}

fn customer_of(grant: u8) -> u8 {
    grant % CUSTOMERS
}

pub(crate) fn customer_id(customer: u8, ns: &str) -> String {
    format!("cus_crd{customer}_{ns}")
}

/// Grant 2 never expires; the others at their own time, after the voids and applications.
fn expires_at(grant: u8) -> Option<u32> {
    (grant < 2).then_some(20 + u32::from(grant))
}

const VOID_AT: u32 = 12;

/// A transaction's kind, amount and time: Stripe's grant; three applications (together more
/// than the grant: over-applied); an invoice voided that gives 700 back; Stripe's expiry.
fn txn_of(grant: u8, txn: u8) -> (&'static str, &'static str, i64, u32) {
    match txn {
        0 => ("credit", "credits_granted", GRANT_AMOUNT, 0),
        1 => ("debit", "credits_applied", 600, 5),
        2 => ("debit", "credits_applied", 700, 8),
        3 => ("debit", "credits_applied", 300, 11),
        4 => ("credit", "credits_application_invoice_voided", 700, 14),
        _ => match expires_at(grant) {
            Some(at) => ("debit", "credits_expired", STRIPE_EXPIRED, at),
            None => ("debit", "credits_applied", 50, 16),
        },
    }
}

fn paid_at(customer: u8, invoice: u8) -> u32 {
    2 + u32::from(customer) + 3 * u32::from(invoice)
}

fn refunded_at(customer: u8, invoice: u8) -> u32 {
    paid_at(customer, invoice) + 4
}

fn strategy() -> impl Strategy<Value = CreditsEvent> {
    prop_oneof![
        4 => (0..GRANTS, proptest::option::of(Just(10u8)), proptest::bool::weighted(0.25), 0u32..30)
            .prop_map(|(grant, priority, voided, at)| CreditsEvent::Grant { grant, priority, voided, at }),
        6 => (0..GRANTS, 0u8..6).prop_map(|(grant, txn)| CreditsEvent::Txn { grant, txn }),
        2 => (0..CUSTOMERS, 0u8..2).prop_map(|(customer, invoice)| CreditsEvent::PackPaid { customer, invoice }),
        1 => (0..CUSTOMERS, 0u8..2).prop_map(|(customer, invoice)| CreditsEvent::PackRefund { customer, invoice }),
    ]
}

/// The events, and each delivered one to three times, shuffled, a quarter of the attempts
/// failing before their write.
pub(crate) fn cases() -> impl Strategy<Value = (Vec<CreditsEvent>, Vec<(usize, bool)>)> {
    proptest::collection::vec(strategy(), 1..14).prop_flat_map(|events| {
        let n = events.len();
        (
            Just(events),
            proptest::collection::vec((1usize..=3, proptest::bool::weighted(0.25)), n),
        )
            .prop_flat_map(|(events, copies)| {
                let deliveries: Vec<(usize, bool)> = copies
                    .iter()
                    .enumerate()
                    .flat_map(|(i, (count, fail))| (0..*count).map(move |c| (i, *fail && c == 0)))
                    .collect();
                (Just(events), Just(deliveries).prop_shuffle())
            })
    })
}

/// The event as Stripe would send it, every id in namespace `ns`.
pub(crate) fn payload(index: usize, event: &CreditsEvent, ns: &str) -> Value {
    let key = format!("evt_crd{index:02}_{ns}");
    let body = |event_type: &str, at: u32, object: Value| {
        json!({"id": key, "object": "event", "type": event_type, "created": time(at).timestamp(),
               "livemode": false, "pending_webhooks": 1, "data": {"object": object}})
    };
    match *event {
        CreditsEvent::Grant {
            grant,
            priority,
            voided,
            at,
        } => body(
            "billing.credit_grant.updated",
            at,
            json!({"id": format!("credgr_{grant}_{ns}"), "object": "billing.credit_grant",
                   "amount": {"type": "monetary", "monetary": {"currency": "usd", "value": GRANT_AMOUNT}},
                   "applicability_config": {"scope": {"price_type": "metered"}},
                   "category": "paid", "created": time(0).timestamp(),
                   "customer": customer_id(customer_of(grant), ns), "customer_account": null,
                   "effective_at": time(0).timestamp(),
                   "expires_at": expires_at(grant).map(|e| time(e).timestamp()),
                   "livemode": false, "metadata": {}, "name": "Credit", "priority": priority,
                   "test_clock": null, "updated": time(at).timestamp(),
                   "voided_at": voided.then(|| time(VOID_AT).timestamp())}),
        ),
        CreditsEvent::Txn { grant, txn } => {
            let (side, kind, amount, at) = txn_of(grant, txn);
            let entry = json!({"amount": {"type": "monetary",
                                          "monetary": {"currency": "usd", "value": amount}},
                               "type": kind});
            let mut object = json!({"id": format!("cbtxn_{grant}_{txn}_{ns}"),
                "object": "billing.credit_balance_transaction", "created": time(at).timestamp(),
                "credit": null, "debit": null, "credit_grant": format!("credgr_{grant}_{ns}"),
                "effective_at": time(at).timestamp(), "livemode": false, "test_clock": null,
                "type": side});
            object[side] = entry;
            body("billing.credit_balance_transaction.created", at, object)
        }
        CreditsEvent::PackPaid { customer, invoice } => body(
            "invoice.paid",
            paid_at(customer, invoice),
            json!({"id": format!("inpk{customer}{invoice}_{ns}"), "object": "invoice",
                   "customer": customer_id(customer, ns),
                   "lines": {"data": [{"price": {"id": "price_pack"}, "quantity": 1}]}}),
        ),
        CreditsEvent::PackRefund { customer, invoice } => body(
            "charge.refunded",
            refunded_at(customer, invoice),
            json!({"id": format!("chpk{customer}{invoice}_{ns}"), "object": "charge",
                   "refunded": true, "customer": customer_id(customer, ns),
                   "invoice": format!("inpk{customer}{invoice}_{ns}")}),
        ),
    }
}

/// What Stripe's ledger (and the catalog's pack rule) gives each grant of the set, computed
/// apart from the fold: `(granted, used, expired, remaining)` once every end has passed, and
/// what is available at [`MID`], by grant id without the namespace.
pub(crate) fn expected(events: &[CreditsEvent]) -> BTreeMap<String, ([i64; 4], i64)> {
    let mut out = BTreeMap::new();
    let txns: BTreeSet<(u8, u8)> = events
        .iter()
        .filter_map(|e| match *e {
            CreditsEvent::Txn { grant, txn } => Some((grant, txn)),
            _ => None,
        })
        .collect();
    for grant in 0..GRANTS {
        let snapshots: Vec<bool> = events
            .iter()
            .filter_map(|e| match *e {
                CreditsEvent::Grant {
                    grant: g, voided, ..
                } if g == grant => Some(voided),
                _ => None,
            })
            .collect();
        if snapshots.is_empty() {
            continue;
        }
        let voided = snapshots.iter().any(|v| *v).then_some(VOID_AT);
        let end = match (voided, expires_at(grant)) {
            (Some(v), Some(e)) => Some(v.min(e)),
            (v, e) => v.or(e),
        };
        let ledger: Vec<(&str, i64, u32)> = txns
            .iter()
            .filter(|(g, _)| *g == grant)
            .map(|(g, t)| {
                let (_, kind, amount, at) = txn_of(*g, *t);
                (kind, amount, at)
            })
            .collect();
        let sum = |kind: &str, before: Option<u32>| -> i64 {
            ledger
                .iter()
                .filter(|(k, _, at)| *k == kind && before.is_none_or(|b| *at < b))
                .map(|(_, amount, _)| amount)
                .sum()
        };
        let used = sum("credits_applied", None) - sum("credits_application_invoice_voided", None);
        let stripes_end = sum("credits_expired", None);
        let expired = match (stripes_end, end) {
            (told, _) if told > 0 => told,
            (_, Some(end)) => (GRANT_AMOUNT - sum("credits_applied", Some(end))
                + sum("credits_application_invoice_voided", Some(end)))
            .max(0),
            (_, None) => 0,
        };
        let remaining = GRANT_AMOUNT - used - expired;
        let at_mid = GRANT_AMOUNT - sum("credits_applied", Some(MID + 1))
            + sum("credits_application_invoice_voided", Some(MID + 1));
        out.insert(
            format!("credgr_{grant}_"),
            ([GRANT_AMOUNT, used, expired, remaining], at_mid.max(0)),
        );
    }
    for event in events {
        let CreditsEvent::PackPaid { customer, invoice } = *event else {
            continue;
        };
        let refunded = events.iter().any(|e| {
            matches!(*e, CreditsEvent::PackRefund { customer: c, invoice: i } if c == customer && i == invoice)
        });
        let mid = if paid_at(customer, invoice) <= MID
            && !(refunded && refunded_at(customer, invoice) <= MID)
        {
            PACK_AMOUNT
        } else {
            0
        };
        out.insert(
            format!("pack:inpk{customer}{invoice}_:price_pack"),
            ([PACK_AMOUNT, 0, PACK_AMOUNT, 0], mid),
        );
    }
    out
}

/// The coarse time the balances are compared at besides the end: after the first
/// applications, before any void or expiry.
pub(crate) const MID: u32 = 9;

async fn credits_of(pool: &PgPool, customer: &str) -> Option<Credits> {
    let mut conn = pool.acquire().await.unwrap();
    let customer = CustomerId::parse(customer).unwrap();
    shared::billing::registers::of_account(&mut conn, "stripe", &customer)
        .await
        .unwrap()
        .map(|(registers, _)| registers.credits)
}

/// Everything the credits say of namespace `ns`'s customers, the namespace taken out: each
/// grant's balance at [`MID`] and at the end, the totals, the rows.
async fn state_of(pool: &PgPool, ns: &str) -> Value {
    let mut out = Vec::new();
    let end = time(60).timestamp();
    for customer in 0..CUSTOMERS {
        let Some(c) = credits_of(pool, &customer_id(customer, ns)).await else {
            out.push(Value::Null);
            continue;
        };
        let view = |at: i64| serde_json::to_value(credits::CreditsView::of(&c, at)).unwrap();
        out.push(json!({"mid": view(time(MID).timestamp()), "end": view(end),
                        "held": c.held().len()}));
    }
    let rows: Value = sqlx::query_scalar(
        "SELECT COALESCE(jsonb_agg(jsonb_build_object('grant', grant_id, 'amount', amount::text,
                    'priority', priority, 'voided_at', voided_at, 'expires_at', expires_at,
                    'version_at', version_at) ORDER BY grant_id), '[]')
         FROM credit_grants WHERE customer_id = ANY($1)",
    )
    .bind(
        (0..CUSTOMERS)
            .map(|c| customer_id(c, ns))
            .collect::<Vec<_>>(),
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let txns: Value = sqlx::query_scalar(
        "SELECT COALESCE(jsonb_agg(jsonb_build_object('id', transaction_id, 'kind', kind,
                    'amount', amount::text, 'at', effective_at) ORDER BY transaction_id), '[]')
         FROM credit_transactions WHERE transaction_id LIKE '%\\_' || $1",
    )
    .bind(ns)
    .fetch_one(pool)
    .await
    .unwrap();
    let text = json!({"accounts": out, "grants": rows, "transactions": txns})
        .to_string()
        .replace(&format!("_{ns}"), "_");
    serde_json::from_str(&text).unwrap()
}

/// Each grant's balances against what Stripe's ledger gives ([`expected`]).
async fn is_stripes(pool: &PgPool, ns: &str, events: &[CreditsEvent]) -> Result<(), TestCaseError> {
    let mut found = BTreeMap::new();
    for customer in 0..CUSTOMERS {
        let Some(c) = credits_of(pool, &customer_id(customer, ns)).await else {
            continue;
        };
        let mid: BTreeMap<String, Quantity> = c
            .balances_at(time(MID).timestamp())
            .into_iter()
            .map(|b| (b.grant.grant_id.clone(), b.available()))
            .collect();
        for b in c.balances_at(time(60).timestamp()) {
            let id = b.grant.grant_id.replace(&format!("_{ns}"), "_");
            let sums = [b.granted, b.used, b.expired, b.remaining];
            found.insert(id, (sums, mid[&b.grant.grant_id]));
        }
    }
    let expected: BTreeMap<String, ([Quantity; 4], Quantity)> = expected(events)
        .into_iter()
        .map(|(id, (sums, mid))| (id, (sums.map(Quantity::whole), Quantity::whole(mid))))
        .collect();
    prop_assert_eq!(found, expected, "namespace {}", ns);
    Ok(())
}

/// The credits effects written for namespace `ns`: (kind, body without id, sequence and
/// namespace), by effect id.
pub(crate) async fn told_of(pool: &PgPool, ns: &str) -> BTreeMap<String, (String, Value)> {
    let rows: Vec<(String, String, Value)> = sqlx::query_as(
        "SELECT id, kind, body FROM effects
         WHERE kind LIKE 'billing.credits\\_%' AND customer_id LIKE '%\\_' || $1",
    )
    .bind(ns)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(id, kind, mut body)| {
            body.as_object_mut().unwrap().remove("id");
            body["data"].as_object_mut().unwrap().remove("sequence");
            let body =
                serde_json::from_str(&body.to_string().replace(&format!("_{ns}"), "_")).unwrap();
            (id, (kind, body))
        })
        .collect()
}

/// What the complete set tells, once every time has passed, written as the scheduler's tick
/// writes it; returns it as [`told_of`] shows effects.
async fn tell_at_rest(
    pool: &PgPool,
    catalog: &Catalog,
    ns: &str,
) -> BTreeMap<String, (String, Value)> {
    let mut conn = pool.acquire().await.unwrap();
    let mut all = BTreeMap::new();
    for customer in 0..CUSTOMERS {
        let id = customer_id(customer, ns);
        let Some(c) = credits_of(pool, &id).await else {
            continue;
        };
        let low = credits::low_levels(&catalog.credits_low_of("free"));
        let told = credits::told(("stripe", &id), &c, &low, Utc::now().timestamp());
        shared::effects::credits::write(&mut conn, ("stripe", &id), &told)
            .await
            .unwrap();
        for e in told {
            let mut body = e.body;
            body.as_object_mut().unwrap().remove("id");
            let body =
                serde_json::from_str(&body.to_string().replace(&format!("_{ns}"), "_")).unwrap();
            all.insert(e.id, (e.kind.as_str().to_owned(), body));
        }
    }
    all
}

static CASE: AtomicUsize = AtomicUsize::new(0);

async fn check(
    pool: &PgPool,
    worker: &WorkerState,
    (events, deliveries): &(Vec<CreditsEvent>, Vec<(usize, bool)>),
) -> Result<(), TestCaseError> {
    let n = CASE.fetch_add(1, Ordering::Relaxed);
    let (canon, shuffled) = (format!("k{n}"), format!("s{n}"));
    // The reference: each once, in provider-time order (ties by key).
    let mut reference: Vec<_> = events
        .iter()
        .enumerate()
        .map(|(i, e)| stripe_materialized(&payload(i, e, &canon)))
        .collect();
    reference.sort_by(|a, b| (a.at, &a.dedupe_key).cmp(&(b.at, &b.dedupe_key)));
    for m in &reference {
        let id = store(pool, m).await;
        process(worker, id).await?;
    }
    // The same set, shuffled, with copies and failures.
    let materialized: Vec<_> = events
        .iter()
        .enumerate()
        .map(|(i, e)| stripe_materialized(&payload(i, e, &shuffled)))
        .collect();
    let mut ids = Vec::new();
    for (index, fail) in deliveries {
        let id = store(pool, &materialized[*index]).await;
        ids.push(id);
        let fault = Fault::new(Point::WorkerDecided, FaultAction::Fail(u32::from(*fail)));
        let attempt = shared::handlers::worker::process_event(worker, id);
        with_interrupts(fault, attempt).await.unwrap();
    }
    for id in ids {
        process(worker, id).await?;
    }

    prop_assert_eq!(
        state_of(pool, &shuffled).await,
        state_of(pool, &canon).await
    );
    for ns in [&canon, &shuffled] {
        is_stripes(pool, ns, events).await?;
    }
    // Every effect the complete set tells was written in both orders with the same body (the
    // tick writes those whose time no event passed), and none twice.
    let written = (told_of(pool, &canon).await, told_of(pool, &shuffled).await);
    let at_rest = (
        tell_at_rest(pool, &worker.catalog, &canon).await,
        tell_at_rest(pool, &worker.catalog, &shuffled).await,
    );
    let bodies = |told: &BTreeMap<String, (String, Value)>| -> BTreeSet<String> {
        told.values().map(|(k, b)| format!("{k} {b}")).collect()
    };
    prop_assert_eq!(bodies(&at_rest.0), bodies(&at_rest.1));
    for (told, at_rest) in [(&written.0, &at_rest.0), (&written.1, &at_rest.1)] {
        for (id, effect) in at_rest {
            if let Some(before) = told.get(id) {
                prop_assert_eq!(before, effect, "one body per effect id");
            }
        }
    }
    Ok(())
}

#[test]
fn credits_are_the_same_for_every_order_copies_and_failures() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (pool, database) = runtime.block_on(crate::helpers::fresh_database());
    let mut worker = test_worker(pool.clone());
    worker.catalog = Catalog::parse(CATALOG).unwrap();
    let sqs = runtime.block_on(sqs_client());
    let url = runtime.block_on(create_queue(&sqs));
    worker.effects = Some(shared::platform::queue::Queue::new(sqs, url));
    let cases_run = std::env::var("INBOX_PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(96);
    let mut runner = TestRunner::new(Config {
        cases: cases_run,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&cases(), |case| {
        runtime.block_on(check(&pool, &worker, &case))
    });
    runtime.block_on(crate::helpers::drop_database(pool, &database));
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// One coarse time unit ([`time`]) in seconds.
pub(crate) const UNIT_SECS: i64 = 73 * 3_600;

/// What the simulated app's debits are checked against (docs/design.md §4.14, §10): the grants
/// a set of credits events makes and the app's debits, spent by burn order version 1, computed
/// here apart from the fold, in seconds.
pub(crate) mod oracle {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    /// An accepted debit of the app: its customer (`0..CUSTOMERS`), unit, amount and the
    /// second it was decided at, in the order the debits were accepted.
    #[derive(Debug, Clone)]
    pub(crate) struct AppDebit {
        pub usage_id: String,
        pub customer: u8,
        pub unit: String,
        pub amount: i64,
        pub at: i64,
    }

    /// A grant as the set's events make it: the register's fields and Stripe's ledger
    /// (`kind`, amount, second), its id without the namespace.
    #[derive(Debug, Clone)]
    pub(crate) struct Grant {
        pub id: String,
        pub customer: u8,
        pub unit: &'static str,
        amount: i64,
        priority: u8,
        expires: Option<i64>,
        voided: Option<i64>,
        effective: i64,
        ledger: Vec<(&'static str, i64, i64)>,
    }

    impl Grant {
        fn end(&self) -> Option<i64> {
            match (self.voided, self.expires) {
                (Some(v), Some(e)) => Some(v.min(e)),
                (v, e) => v.or(e),
            }
        }

        fn live(&self, at: i64) -> bool {
            self.effective <= at && self.end().is_none_or(|end| end > at)
        }

        fn told(&self, kind: &str, until: i64) -> i64 {
            (self.ledger.iter())
                .filter(|(k, _, at)| *k == kind && *at <= until)
                .map(|(_, amount, _)| amount)
                .sum()
        }

        fn has(&self, kind: &str) -> bool {
            self.ledger.iter().any(|(k, ..)| *k == kind)
        }

        /// In: Stripe's `credits_granted`, else the amount from `effective_at`.
        fn granted(&self, at: i64) -> i64 {
            match self.has("credits_granted") {
                true => self.told("credits_granted", at),
                false if self.effective <= at => self.amount,
                false => 0,
            }
        }

        /// What the provider's ledger leaves of a live grant at `at` (no end counted yet).
        fn remaining_told(&self, at: i64) -> i64 {
            self.granted(at) - self.told("credits_applied", at)
                + self.told("credits_application_invoice_voided", at)
                - self.told("credits_expired", at)
                - self.told("credits_voided", at)
        }

        /// Burn order version 1: priority ascending, `expires_at` ascending with none last,
        /// promotional before paid (every grant here is paid), `effective_at`, the id.
        fn burn_key(&self) -> (u8, bool, Option<i64>, i64, &str) {
            let expires = (self.expires.is_none(), self.expires);
            (
                self.priority,
                expires.0,
                expires.1,
                self.effective,
                &self.id,
            )
        }
    }

    /// Every grant the events make (Stripe's registers by their latest snapshot, packs by
    /// their paid invoice, voided by its refund), each customer's in burn order.
    pub(crate) fn grants(events: &[CreditsEvent]) -> Vec<Grant> {
        let mut out = Vec::new();
        let txns: BTreeSet<(u8, u8)> = (events.iter())
            .filter_map(|e| match *e {
                CreditsEvent::Txn { grant, txn } => Some((grant, txn)),
                _ => None,
            })
            .collect();
        for grant in 0..GRANTS {
            // The latest snapshot by `updated`, ties by the event's key (its index here).
            let snapshots: Vec<(u32, usize, Option<u8>, bool)> = (events.iter().enumerate())
                .filter_map(|(i, e)| match *e {
                    CreditsEvent::Grant {
                        grant: g,
                        priority,
                        voided,
                        at,
                    } if g == grant => Some((at, i, priority, voided)),
                    _ => None,
                })
                .collect();
            let Some(latest) = snapshots.iter().max_by_key(|s| (s.0, s.1)) else {
                continue;
            };
            let ledger = (txns.iter())
                .filter(|(g, _)| *g == grant)
                .map(|(g, t)| {
                    let (_, kind, amount, at) = txn_of(*g, *t);
                    (kind, amount, time(at).timestamp())
                })
                .collect();
            out.push(Grant {
                id: format!("credgr_{grant}_"),
                customer: customer_of(grant),
                unit: "usd",
                amount: GRANT_AMOUNT,
                priority: latest.2.unwrap_or(50),
                expires: expires_at(grant).map(|e| time(e).timestamp()),
                voided: (snapshots.iter().any(|s| s.3)).then(|| time(VOID_AT).timestamp()),
                effective: time(0).timestamp(),
                ledger,
            });
        }
        let packs: BTreeSet<(u8, u8)> = (events.iter())
            .filter_map(|e| match *e {
                CreditsEvent::PackPaid { customer, invoice } => Some((customer, invoice)),
                _ => None,
            })
            .collect();
        for (customer, invoice) in packs {
            let refunded = events.iter().any(|e| {
                matches!(*e, CreditsEvent::PackRefund { customer: c, invoice: i } if c == customer && i == invoice)
            });
            let paid = time(paid_at(customer, invoice)).timestamp();
            out.push(Grant {
                id: format!("pack:inpk{customer}{invoice}_:price_pack"),
                customer,
                unit: "credits",
                amount: PACK_AMOUNT,
                priority: 50,
                expires: Some(paid + 30 * 86_400),
                voided: refunded.then(|| time(refunded_at(customer, invoice)).timestamp()),
                effective: paid,
                ledger: Vec::new(),
            });
        }
        out.sort_by(|a, b| {
            (a.customer, a.unit, a.burn_key()).cmp(&(b.customer, b.unit, b.burn_key()))
        });
        out
    }

    /// What one debit took: from each grant, in burn order, and what nothing held.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) struct Taken {
        pub usage_id: String,
        pub from_grants: Vec<(String, i64)>,
        pub unfunded: i64,
    }

    /// What each grant of `debit`'s customer and unit may spend at its time, less what the
    /// debits before it took (`spent`), in burn order, those with any.
    fn spendable(
        grants: &[Grant],
        spent: &BTreeMap<String, i64>,
        debit: &AppDebit,
    ) -> Vec<(String, i64)> {
        (grants.iter())
            .filter(|g| g.customer == debit.customer && g.unit == debit.unit && g.live(debit.at))
            .map(|g| {
                let taken = spent.get(&g.id).copied().unwrap_or_default();
                (g.id.clone(), (g.remaining_told(debit.at) - taken).max(0))
            })
            .filter(|(_, q)| *q > 0)
            .collect()
    }

    /// The allocation of each accepted debit, derived from the grants as the set makes them:
    /// in the order accepted, each spending what each grant held at its time less what the
    /// debits before it took; one that no longer fits takes what there is, the rest unfunded.
    pub(crate) fn derive(grants: &[Grant], debits: &[AppDebit]) -> Vec<Taken> {
        let mut spent: BTreeMap<String, i64> = BTreeMap::new();
        let mut out = Vec::new();
        for d in debits {
            let mut left = d.amount;
            let mut from_grants = Vec::new();
            for (id, available) in spendable(grants, &spent, d) {
                if left == 0 {
                    break;
                }
                let take = left.min(available);
                *spent.entry(id.clone()).or_default() += take;
                from_grants.push((id, take));
                left -= take;
            }
            out.push(Taken {
                usage_id: d.usage_id.clone(),
                from_grants,
                unfunded: left,
            });
        }
        out
    }

    /// Amounts by grant id, in burn order.
    pub(crate) type ByGrant = Vec<(String, i64)>;

    /// A new debit as the store must decide it, knowing `grants` and the debits accepted
    /// before it (`before`, in order): accepted with what it takes, or refused with what each
    /// grant had left.
    pub(crate) fn decide(
        grants: &[Grant],
        before: &[AppDebit],
        debit: &AppDebit,
    ) -> Result<ByGrant, ByGrant> {
        let mut spent: BTreeMap<String, i64> = BTreeMap::new();
        for t in derive(grants, before) {
            for (id, q) in t.from_grants {
                *spent.entry(id).or_default() += q;
            }
        }
        let spendable = spendable(grants, &spent, debit);
        if debit.amount > spendable.iter().map(|(_, q)| q).sum() {
            return Err(spendable);
        }
        let mut left = debit.amount;
        let mut out = Vec::new();
        for (id, available) in spendable {
            if left == 0 {
                break;
            }
            let take = left.min(available);
            out.push((id, take));
            left -= take;
        }
        Ok(out)
    }

    /// The debits' spends of each grant: (second, amount).
    fn spends(taken: &[Taken], debits: &[AppDebit]) -> BTreeMap<String, Vec<(i64, i64)>> {
        let mut out: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
        for (t, d) in taken.iter().zip(debits) {
            for (id, q) in &t.from_grants {
                out.entry(id.clone()).or_default().push((d.at, *q));
            }
        }
        out
    }

    /// A grant's `(granted, used, expired, remaining)` and what it may spend, as of `at`, its
    /// spends by the app counted as applications.
    fn balance(g: &Grant, spends: &[(i64, i64)], at: i64) -> ([i64; 4], i64) {
        let spent = |until: i64, strictly: bool| -> i64 {
            (spends.iter())
                .filter(|(when, _)| {
                    if strictly {
                        *when < until
                    } else {
                        *when <= until
                    }
                })
                .map(|(_, q)| q)
                .sum()
        };
        let granted = g.granted(at);
        let used = g.told("credits_applied", at) - g.told("credits_application_invoice_voided", at)
            + spent(at, false);
        let mut expired = g.told("credits_expired", at) + g.told("credits_voided", at);
        let told_end = g.has("credits_expired") || g.has("credits_voided");
        if let (Some(end), false) = (g.end().filter(|end| *end <= at), told_end) {
            // The provisional end: what remained just before it.
            let before = |kind: &str| -> i64 {
                (g.ledger.iter())
                    .filter(|(k, _, when)| *k == kind && *when < end)
                    .map(|(_, amount, _)| amount)
                    .sum()
            };
            let base = match g.has_before("credits_granted", end) || g.effective >= end {
                true => before("credits_granted"),
                false => g.amount,
            };
            let then = base - before("credits_applied")
                + before("credits_application_invoice_voided")
                - before("credits_expired")
                - before("credits_voided")
                - spent(end, true);
            expired += then.max(0);
        }
        let remaining = granted - used - expired;
        let available = match g.live(at) {
            true => remaining.max(0),
            false => 0,
        };
        ([granted, used, expired, remaining], available)
    }

    impl Grant {
        fn has_before(&self, kind: &str, when: i64) -> bool {
            self.ledger
                .iter()
                .any(|(k, _, at)| *k == kind && *at < when)
        }
    }

    /// Each grant's balances once every end has passed and what it may spend at [`MID`], as
    /// [`expected`] gives them, the debits' derived spends counted.
    pub(crate) fn balances(
        grants: &[Grant],
        debits: &[AppDebit],
    ) -> BTreeMap<String, ([i64; 4], i64)> {
        let spends = spends(&derive(grants, debits), debits);
        (grants.iter())
            .map(|g| {
                let own = spends.get(&g.id).map(Vec::as_slice).unwrap_or_default();
                let (end, _) = balance(g, own, time(60).timestamp());
                let (_, mid) = balance(g, own, time(MID).timestamp());
                (g.id.clone(), (end, mid))
            })
            .collect()
    }

    /// A downward crossing: unit, level (`None`: depleted), second, what was left.
    pub(crate) type Crossing = (String, Option<i64>, i64, i64);

    /// The downward crossings of each unit of `customer`'s credits up to `until`, the debits'
    /// spends counted: the available balance read at every time it can move, each fall below
    /// a level (`low`, by unit) or to nothing told once, re-armed at or above it.
    pub(crate) fn crossings(
        grants: &[Grant],
        debits: &[AppDebit],
        customer: u8,
        low: &BTreeMap<String, i64>,
        until: i64,
    ) -> Vec<Crossing> {
        let spends = spends(&derive(grants, debits), debits);
        let own: Vec<&Grant> = grants.iter().filter(|g| g.customer == customer).collect();
        let mut moments: Vec<i64> = (own.iter())
            .flat_map(|g| {
                let ledger = g.ledger.iter().map(|(_, _, at)| Some(*at));
                let spent = (spends.get(&g.id).into_iter().flatten()).map(|(at, _)| Some(*at));
                [Some(g.effective), g.expires, g.voided]
                    .into_iter()
                    .chain(ledger)
                    .chain(spent)
            })
            .flatten()
            .filter(|at| *at <= until)
            .collect();
        moments.sort_unstable();
        moments.dedup();
        let units: BTreeSet<&str> = own.iter().map(|g| g.unit).collect();
        let mut out = Vec::new();
        for unit in units {
            let levels: Vec<Option<i64>> = low
                .get(unit)
                .map(|l| Some(*l))
                .into_iter()
                .chain([None])
                .collect();
            let mut armed = vec![false; levels.len()];
            for &at in &moments {
                let available: i64 = (own.iter())
                    .filter(|g| g.unit == unit)
                    .map(|g| {
                        let spent = spends.get(&g.id).map(Vec::as_slice).unwrap_or_default();
                        balance(g, spent, at).1
                    })
                    .sum();
                for (i, level) in levels.iter().enumerate() {
                    let below = match level {
                        Some(level) => available < *level,
                        None => available <= 0,
                    };
                    if !below {
                        armed[i] = true;
                    } else if armed[i] {
                        armed[i] = false;
                        out.push((unit.to_owned(), *level, at, available));
                    }
                }
            }
        }
        out
    }
}

/// A debit in a unit other than the allowance's spends grants only and is no `used` of its
/// period (docs/design.md §4.14): the audit's fold of the account agrees with what is stored
/// (it once summed every unit's debits into the period's `used`, and reported the account).
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_debit_of_another_unit_is_no_used_of_its_period_for_the_audit(pool: PgPool) {
    use shared::billing::usage::{self, Debit, DebitPeriod, DebitRequest};
    let mut worker = test_worker(pool.clone());
    worker.catalog = Catalog::parse(CATALOG).unwrap();
    // Grant 2 (customer 0) never expires: 1000 usd to spend now.
    let grant = CreditsEvent::Grant {
        grant: 2,
        priority: None,
        voided: false,
        at: 0,
    };
    let id = store(&pool, &stripe_materialized(&payload(0, &grant, "u"))).await;
    process(&worker, id).await.unwrap();
    let customer = CustomerId::parse(&customer_id(0, "u")).unwrap();
    let period = shared::domain::Period::parse(&Utc::now().format("%Y-%m").to_string()).unwrap();
    let request = DebitRequest {
        source: "stripe",
        customer: &customer,
        key: "k1",
        amount: 265,
        period: DebitPeriod::Named(period),
        note: None,
        unit: "usd",
        effects: None,
        meter: None,
    };
    let mut conn = pool.acquire().await.unwrap();
    let debited = usage::debit(&mut conn, &request).await.unwrap();
    assert!(
        matches!(debited.debit, Debit::Accepted { used: 0, .. }),
        "{debited:?}"
    );
    let sources = crate::helpers::audit_sources(&worker);
    let audited =
        shared::audit::audit_account(&mut conn, &sources, &worker.catalog, ("stripe", &customer))
            .await
            .unwrap();
    assert!(
        matches!(&audited, shared::audit::Audited::Checked(found) if found.is_empty()),
        "{audited:?}"
    );
}

/// The order property for Polar's meter credits (docs/design.md §6.3, §4.14): per customer one
/// `meter_credit` benefit grant (customer 1's benefit with rollover), its events drawn from its
/// life — granted, cycled twice, revoked (the last crediting taken back), granted again —
/// delivered shuffled with copies and a quarter of the attempts failing before their write,
/// end in the same grant registers and balances as each applied once in provider order, and
/// in what Polar's strategy gives (`BenefitMeterCreditService`, polarsource/polar
/// `server/polar/benefit/strategies/meter_credit/service.py`), computed here apart from the
/// fold. Its own events, apart from the Stripe set the simulator draws too.
mod polar_meter {
    use super::*;
    use crate::order::polar_materialized;

    /// The steps of a grant's life: granted, cycled, cycled, revoked, granted again; each
    /// crediting (the revocation's a negative one) at its step's coarse time.
    const LIFE: usize = 5;
    const AT: [u32; LIFE] = [1, 5, 9, 12, 15];
    const UNITS: i64 = 1000;
    /// The coarse times the balances are compared at: within each crediting, and at rest.
    const READ_AT: [u32; 6] = [3, 7, 10, 13, 16, 40];

    fn rollover(customer: u8) -> bool {
        customer == 1
    }

    fn stamp(at: u32, micros: i64) -> String {
        (time(at) + Duration::microseconds(micros))
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    }

    /// A grant's `properties` once `step` ran (`last_credited_at` is Python's `isoformat()`).
    fn properties(step: usize) -> Value {
        let units = if step == 3 { -UNITS } else { UNITS };
        json!({"last_credited_meter_id": "7d3a9e62-c1f4-4b8d-95a0-3e6b2f8c1d94",
               "last_credited_units": units,
               "last_credited_at": stamp(AT[step], 0).replace('Z', "+00:00")})
    }

    /// The event's own time: a new grant's `created_at`, else its `modified_at`.
    fn at(step: usize) -> DateTime<Utc> {
        let micros = if step == 0 { -2_000 } else { 900 };
        time(AT[step]) + Duration::microseconds(micros)
    }

    fn key(customer: u8, step: usize, ns: &str) -> String {
        format!("msg_mc{customer}{step}_{ns}")
    }

    /// Step `step` of customer `customer`'s grant as Polar sends it (the corpus's
    /// `benefit_grant.created`, `testdata/providers/polar/meter_credit/`, made this step's).
    fn payload(customer: u8, step: usize, ns: &str) -> Value {
        let (_, mut p) = crate::corpus::corpus("polar/meter_credit").remove(0);
        let kind = match step {
            0 | 4 => "benefit_grant.created",
            3 => "benefit_grant.revoked",
            _ => "benefit_grant.cycled",
        };
        let revoked = step == 3;
        let granted_at = if step == 4 {
            stamp(AT[4], 0)
        } else {
            stamp(AT[0], -2_500)
        };
        p["type"] = json!(kind);
        p["timestamp"] = json!(stamp(AT[step], 60_000));
        let id = customer_id(customer, ns);
        let d = &mut p["data"];
        d["id"] = json!(format!("mcgrant{customer}_{ns}"));
        d["created_at"] = json!(stamp(AT[0], -2_000));
        d["modified_at"] = if step == 0 {
            Value::Null
        } else {
            json!(stamp(AT[step], 900))
        };
        d["granted_at"] = if revoked {
            Value::Null
        } else {
            json!(granted_at)
        };
        d["is_granted"] = json!(!revoked);
        d["revoked_at"] = if revoked {
            json!(stamp(AT[3], 500))
        } else {
            Value::Null
        };
        d["is_revoked"] = json!(revoked);
        d["customer_id"] = json!(id);
        d["user_id"] = json!(id);
        d["customer"]["id"] = json!(id);
        d["benefit"]["properties"]["rollover"] = json!(rollover(customer));
        d["properties"] = properties(step);
        d["previous_properties"] = if step == 0 {
            json!({})
        } else {
            properties(step - 1)
        };
        p
    }

    /// What Polar's strategy gives each crediting the set names, apart from the fold: its
    /// effective time and its end (the next cycle's reset without rollover, the revocation
    /// that took it back), by (customer, step).
    fn creditings(set: &BTreeSet<(u8, usize)>) -> BTreeMap<(u8, usize), (u32, Option<u32>)> {
        let mut out = BTreeMap::new();
        for &(customer, step) in set {
            // An event names its own crediting and the one before it (a positive one).
            let named = [Some(step), step.checked_sub(1)];
            for crediting in named.into_iter().flatten().filter(|c| *c != 3) {
                let next = crediting + 1;
                let end = match next {
                    1 | 2 if !rollover(customer) && set.contains(&(customer, next)) => {
                        Some(AT[next])
                    }
                    3 if set.contains(&(customer, 3)) => Some(AT[3]),
                    _ => None,
                };
                out.insert((customer, crediting), (AT[crediting], end));
            }
        }
        out
    }

    /// Each customer's available `credits` at [`READ_AT`], from [`creditings`].
    fn expected(set: &BTreeSet<(u8, usize)>) -> Vec<Vec<i64>> {
        let known = creditings(set);
        (0..CUSTOMERS)
            .map(|customer| {
                READ_AT
                    .iter()
                    .map(|&t| {
                        known
                            .iter()
                            .filter(|((c, _), (from, end))| {
                                *c == customer && *from <= t && end.is_none_or(|e| e > t)
                            })
                            .count() as i64
                            * UNITS
                    })
                    .collect()
            })
            .collect()
    }

    async fn available(pool: &PgPool, ns: &str) -> Vec<Vec<i64>> {
        let mut out = Vec::new();
        for customer in 0..CUSTOMERS {
            let mut conn = pool.acquire().await.unwrap();
            let id = CustomerId::parse(&customer_id(customer, ns)).unwrap();
            let credits = shared::billing::registers::of_account(&mut conn, "polar", &id)
                .await
                .unwrap()
                .map(|(r, _)| r.credits)
                .unwrap_or_default();
            out.push(
                READ_AT
                    .iter()
                    .map(|&t| {
                        let total = credits
                            .totals_at(time(t).timestamp())
                            .into_iter()
                            .find(|b| b.unit == "credits")
                            .map(|b| b.available)
                            .unwrap_or(Quantity::ZERO);
                        assert_eq!(total.to_string().parse::<i64>().unwrap() % UNITS, 0);
                        total.to_string().parse().unwrap()
                    })
                    .collect(),
            );
        }
        out
    }

    async fn rows(pool: &PgPool, ns: &str) -> Value {
        let rows: Value = sqlx::query_scalar(
            "SELECT COALESCE(jsonb_agg(jsonb_build_object('grant', grant_id, 'origin', origin,
                        'amount', amount::text, 'effective_at', effective_at,
                        'expires_at', expires_at, 'voided_at', voided_at,
                        'version_at', version_at, 'version_key', version_key)
                        ORDER BY grant_id), '[]')
             FROM credit_grants WHERE source = 'polar' AND customer_id = ANY($1)",
        )
        .bind(
            (0..CUSTOMERS)
                .map(|c| customer_id(c, ns))
                .collect::<Vec<_>>(),
        )
        .fetch_one(pool)
        .await
        .unwrap();
        serde_json::from_str(&rows.to_string().replace(&format!("_{ns}"), "_")).unwrap()
    }

    type Case = (Vec<(u8, usize)>, Vec<(usize, bool)>);

    fn cases() -> impl Strategy<Value = Case> {
        proptest::collection::vec(proptest::bool::ANY, usize::from(CUSTOMERS) * LIFE)
            .prop_flat_map(|drawn| {
                let events: Vec<(u8, usize)> = drawn
                    .iter()
                    .enumerate()
                    .filter(|(_, d)| **d)
                    .map(|(i, _)| ((i / LIFE) as u8, i % LIFE))
                    .collect();
                let n = events.len();
                (
                    Just(events),
                    proptest::collection::vec((1usize..=3, proptest::bool::weighted(0.25)), n),
                )
            })
            .prop_flat_map(|(events, copies)| {
                let deliveries: Vec<(usize, bool)> = copies
                    .iter()
                    .enumerate()
                    .flat_map(|(i, (count, fail))| (0..*count).map(move |c| (i, *fail && c == 0)))
                    .collect();
                (Just(events), Just(deliveries).prop_shuffle())
            })
    }

    static POLAR_CASE: AtomicUsize = AtomicUsize::new(0);

    async fn check(
        pool: &PgPool,
        worker: &WorkerState,
        (events, deliveries): &Case,
    ) -> Result<(), TestCaseError> {
        let n = POLAR_CASE.fetch_add(1, Ordering::Relaxed);
        let (canon, shuffled) = (format!("pk{n}"), format!("ps{n}"));
        let materialized = |ns: &str| -> Vec<_> {
            events
                .iter()
                .map(|&(c, step)| {
                    polar_materialized(&key(c, step, ns), &payload(c, step, ns), at(step))
                })
                .collect()
        };
        let mut reference = materialized(&canon);
        reference.sort_by(|a, b| (a.at, &a.dedupe_key).cmp(&(b.at, &b.dedupe_key)));
        for m in &reference {
            let id = store(pool, m).await;
            process(worker, id).await?;
        }
        let shuffled_events = materialized(&shuffled);
        let mut ids = Vec::new();
        for (index, fail) in deliveries {
            let id = store(pool, &shuffled_events[*index]).await;
            ids.push(id);
            let fault = Fault::new(Point::WorkerDecided, FaultAction::Fail(u32::from(*fail)));
            let attempt = shared::handlers::worker::process_event(worker, id);
            with_interrupts(fault, attempt).await.unwrap();
        }
        for id in ids {
            process(worker, id).await?;
        }
        prop_assert_eq!(rows(pool, &shuffled).await, rows(pool, &canon).await);
        let set: BTreeSet<(u8, usize)> = events.iter().copied().collect();
        for ns in [&canon, &shuffled] {
            prop_assert_eq!(
                available(pool, ns).await,
                expected(&set),
                "namespace {}",
                ns
            );
        }
        Ok(())
    }

    #[test]
    fn polar_meter_credits_are_the_same_for_every_order_copies_and_failures() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let (pool, database) = runtime.block_on(crate::helpers::fresh_database());
        let worker = test_worker(pool.clone());
        let cases_run = std::env::var("INBOX_PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(48);
        let mut runner = TestRunner::new(Config {
            cases: cases_run,
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&cases(), |case| {
            runtime.block_on(check(&pool, &worker, &case))
        });
        runtime.block_on(crate::helpers::drop_database(pool, &database));
        if let Err(failure) = result {
            panic!("{failure}");
        }
    }
}
