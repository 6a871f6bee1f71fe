//! The product's promise as a property: the billing state is a pure function of the set of
//! events stored. Random event sets over a few customers, subscriptions, payments, Polar
//! benefit grants and Stripe entitlement summaries (the account's features among the state
//! compared; two summaries of one second are common, settled by the list Stripe shows) are
//! delivered in random order with random copies and injected failures, and must end in
//! exactly the state that applying each once in provider-time order gives.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, TimeZone, Utc};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Value};
use shared::domain::{CustomerId, EventStatus, SourceKind};
use shared::handlers::worker::{Processed, WorkerState};
use shared::platform::sim::{with_interrupts, Fault, FaultAction, Point};
use shared::providers::{kinde, standard_webhooks, stripe, Reads, SubscriptionNow};
use shared::BoxFuture;
use sqlx::PgPool;

use crate::helpers::test_worker;

pub(crate) const PERIODS: [&str; 3] = ["2026-03", "2026-04", "2026-05"];
pub(crate) const CUSTOMERS: u8 = 3;

/// One event, in terms small enough to shrink.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    KindePlan {
        customer: u8,
        plan: Option<&'static str>,
        at: u32,
    },
    KindePayment {
        customer: u8,
        payment: u8,
        plan: Option<&'static str>,
        ok: bool,
        at: u32,
    },
    StripeSubscription {
        customer: u8,
        sub: u8,
        status: &'static str,
        plan: &'static str,
        /// Which of a few ends the object carries (see [`Ends`]).
        ends: u8,
        /// From basil on the period end is on the items, before it on the subscription.
        basil: bool,
        at: u32,
    },
    StripeInvoicePaid {
        customer: u8,
        invoice: u8,
        plan: Option<&'static str>,
        /// Before basil the invoice names its payment intent.
        names_intent: bool,
        at: u32,
    },
    StripeRefund {
        customer: u8,
        invoice: u8,
        /// From basil on the charge names only its payment intent.
        basil: bool,
        at: u32,
    },
    /// Basil's `invoice_payment.paid`: links the intent to the invoice, names no customer.
    StripeInvoicePayment { customer: u8, invoice: u8, at: u32 },
    /// `customer.deleted`: the account is a tombstone from then on.
    StripeCustomerDeleted { customer: u8, at: u32 },
    /// Polar (Standard Webhooks): a subscription's state, with its product.
    PolarSubscription {
        customer: u8,
        sub: u8,
        status: &'static str,
        product: &'static str,
        ends: u8,
        at: u32,
    },
    /// Polar `order.paid` (or `order.refunded`) for a product.
    PolarOrder {
        customer: u8,
        order: u8,
        product: &'static str,
        refunded: bool,
        at: u32,
    },
    /// Polar `customer.deleted`.
    PolarCustomerDeleted { customer: u8, at: u32 },
    /// Paddle Billing: a subscription's state (`subscription.*`), with its price.
    PaddleSubscription {
        customer: u8,
        sub: u8,
        status: &'static str,
        price: &'static str,
        ends: u8,
        at: u32,
    },
    /// Paddle Billing: a transaction of one of the customer's subscriptions
    /// (`transaction.completed`, `transaction.payment_failed`) or its full refund
    /// (`adjustment.updated`), as `outcome` 0, 1 or 2.
    PaddleTransaction {
        customer: u8,
        txn: u8,
        price: &'static str,
        outcome: u8,
        at: u32,
    },
    /// Lemon Squeezy: a subscription's state (`subscription_*`, by its status), its variant
    /// fixed by `sub` ([`ls_variant`]): a subscription invoice names its subscription, never a
    /// variant, so it grants the plan of its subscription (docs/design.md §6.5).
    LsSubscription {
        customer: u8,
        sub: u8,
        status: &'static str,
        ends: u8,
        at: u32,
    },
    /// Lemon Squeezy: an invoice of one of the customer's subscriptions
    /// (`subscription_payment_success`, `_failed`, `_refunded`), as `outcome` 0, 1 or 2.
    LsInvoice {
        customer: u8,
        invoice: u8,
        outcome: u8,
        at: u32,
    },
    /// Lemon Squeezy: an order of a variant (`order_created`, or `order_refunded`).
    LsOrder {
        customer: u8,
        order: u8,
        variant: u32,
        refunded: bool,
        at: u32,
    },
    /// A Polar benefit grant (`benefit_grant.updated` or `.revoked`) of a feature-flag benefit
    /// whose metadata names `feature` (`key` or `key=value`). The property test draws it
    /// ([`grant_strategy`]), and the simulator beside its workload ([`entitlement_strategy`]).
    PolarGrant {
        customer: u8,
        grant: u8,
        granted: bool,
        feature: &'static str,
        at: u32,
    },
    /// Stripe `entitlements.active_entitlement_summary.updated`: the customer's active
    /// entitlements as of `at`, the [`LOOKUP_KEYS`] whose bits `keys` sets, in that order, of
    /// which the event embeds the first `embedded` and says `has_more` when that is fewer
    /// (Stripe embeds one page of a list). A list that says `has_more`, or a summary that finds
    /// another of the same second in its register, is read whole from the fake Stripe API (the
    /// simulator's; the property's [`CaseObjects`]).
    StripeSummary {
        customer: u8,
        keys: u8,
        embedded: u8,
        at: u32,
    },
    /// Stripe `v2.core.health.event_generation_failure.resolved` that names no object
    /// (docs/design.md §6.2): the worker sweeps every Stripe subscription as Stripe lists it
    /// ([`CaseObjects`]: each one's latest state), each stored as a read at the notice's time.
    /// Delivered after the subscriptions' events (the reference order, when it is later), the
    /// sweep finds registers that already show what Stripe lists; before them, none. Only the
    /// property test and the simulator draw it ([`notice_strategy`], [`notice_cases`]).
    StripeHealthNotice { at: u32 },
}

/// The lookup keys of the features Stripe's summaries list (as the corpus's,
/// `testdata/providers/stripe/entitlements/`); some are keys the catalog's plans or Polar's
/// benefits give too, one (`export`) of another kind there.
pub(crate) const LOOKUP_KEYS: [&str; 8] = [
    "sso",
    "audit-log",
    "priority-support",
    "api-access",
    "custom-domain",
    "export",
    "webhooks",
    "advanced-analytics",
];

/// The customer's active entitlements the bits of `keys` name, as Stripe lists them
/// (`Entitlements.ActiveEntitlement`, one id per customer and feature), in [`LOOKUP_KEYS`]
/// order: the summary's whole list, and what `GET /v1/entitlements/active_entitlements`
/// lists.
pub(crate) fn active_entitlements(customer: u8, keys: u8) -> Vec<Value> {
    LOOKUP_KEYS
        .iter()
        .enumerate()
        .filter(|(n, _)| keys & (1 << n) != 0)
        .map(|(n, key)| stripe::fixtures::active_entitlement(&format!("{customer}{n}"), key))
        .collect()
}

/// The Lemon Squeezy variants of subscription 0 and 1 (the catalog's `101` pro and `102`
/// team), and one the catalog does not know; every variant is of product 9, which it does not
/// know either.
pub(crate) const LS_VARIANTS: [u32; 2] = [101, 102];
const LS_UNKNOWN_VARIANT: u32 = 109;
const LS_PRODUCT: u32 = 9;

/// The variant of the customer's Lemon Squeezy subscription `sub`.
pub(crate) fn ls_variant(sub: u8) -> u32 {
    LS_VARIANTS[usize::from(sub % 2)]
}

/// The id of the customer's Lemon Squeezy subscription `sub` (the namespace makes it text).
pub(crate) fn ls_subscription_id(customer: u8, sub: u8, ns: &str) -> String {
    format!("ls{customer}{sub}_{ns}")
}

/// A Lemon Squeezy time, as its objects write them (microseconds).
fn ls_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// The `data` of corpus file `name` (testdata/providers/lemonsqueezy/): the shape every
/// Lemon Squeezy event of the property is made from.
fn ls_template(name: &str) -> Value {
    static FILES: std::sync::LazyLock<std::collections::HashMap<String, Value>> =
        std::sync::LazyLock::new(|| {
            crate::corpus::corpus("lemonsqueezy")
                .into_iter()
                .map(|(name, body)| (name, body["data"].clone()))
                .collect()
        });
    FILES[name].clone()
}

/// A Lemon Squeezy delivery's body: `meta` as the corpus's, `data` the object.
fn ls_body(event_name: &str, data: Value) -> Value {
    json!({"meta": {"test_mode": true, "event_name": event_name,
                    "webhook_id": "9a3c1d52-7e1b-4f0a-8c55-2b6f4a1e9d07"},
           "data": data})
}

/// A subscription's ends in the few shapes providers send: nothing scheduled, a
/// cancellation at period end, a cancellation on a date, a trial; each with its own period
/// end, so that two states that differ only there are told apart. A canceled subscription
/// has ended at its event's time.
pub(crate) struct Ends {
    pub(crate) current_period_end: DateTime<Utc>,
    pub(crate) cancel_at_period_end: bool,
    pub(crate) cancel_at: Option<DateTime<Utc>>,
    pub(crate) trial_end: Option<DateTime<Utc>>,
    pub(crate) ended_at: Option<DateTime<Utc>>,
}

pub(crate) const ENDS: u8 = 4;

impl Ends {
    pub(crate) fn of(variant: u8, status: &str, at: u32) -> Self {
        let period_end = time(0) + Duration::days(30 + i64::from(variant % 2));
        Self {
            current_period_end: period_end,
            cancel_at_period_end: variant == 1,
            cancel_at: match variant {
                1 => Some(period_end),
                2 => Some(period_end - Duration::days(10)),
                _ => None,
            },
            trial_end: (variant == 3).then(|| time(0) + Duration::days(14)),
            ended_at: (status == "canceled").then(|| time(at)),
        }
    }
}

/// A provider time: hours into March 2026, coarse enough that ties happen.
pub(crate) fn time(at: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap() + Duration::hours(i64::from(at) * 73)
}

fn event_strategy() -> impl Strategy<Value = Event> {
    let customer = 0..CUSTOMERS;
    // Four events in ten land on one of three instants: same-second ties are common, as
    // with Stripe's 1 s `created`.
    let at = prop_oneof![4 => 0u32..3, 6 => 0u32..40];
    let plan = prop_oneof![Just("free"), Just("pro"), Just("team")];
    let price = prop_oneof![Just("price_pro"), Just("price_team"), Just("price_legacy")];
    // Now and then a customer is deleted (and its later events find a tombstone).
    let deletion = prop_oneof![
        (customer.clone(), at.clone())
            .prop_map(|(customer, at)| Event::StripeCustomerDeleted { customer, at }),
        (customer.clone(), at.clone())
            .prop_map(|(customer, at)| Event::PolarCustomerDeleted { customer, at }),
    ];
    let product = prop_oneof![Just("prod_pro"), Just("prod_team"), Just("prod_legacy")];
    let polar = prop_oneof![
        (
            customer.clone(),
            0u8..2,
            prop_oneof![
                Just("incomplete"),
                Just("trialing"),
                Just("active"),
                Just("past_due"),
                Just("canceled"),
                Just("unpaid")
            ],
            product.clone(),
            0..ENDS,
            at.clone()
        )
            .prop_map(|(customer, sub, status, product, ends, at)| {
                Event::PolarSubscription {
                    customer,
                    sub,
                    status,
                    product,
                    ends,
                    at,
                }
            }),
        (
            customer.clone(),
            0u8..3,
            product,
            proptest::bool::weighted(0.2),
            at.clone()
        )
            .prop_map(
                |(customer, order, product, refunded, at)| Event::PolarOrder {
                    customer,
                    order,
                    product,
                    refunded,
                    at
                }
            ),
    ];
    // Subscription 1 stays on one price (team) and its transactions may name a price the
    // catalog does not know (`pri_legacy`): such a renewal grants its subscription's plan, from
    // the register or, before any event of the subscription, from its read (the property's
    // worker reads [`CaseObjects`]). A plan that changed between the two events' times would
    // make it depend on their arrival (docs/design.md §9, the fold's limits), so subscription
    // 0, whose price changes, has only renewals that name theirs.
    let paddle_price = prop_oneof![Just("pro"), Just("team")];
    let paddle = prop_oneof![
        (
            customer.clone(),
            0u8..2,
            prop_oneof![
                Just("trialing"),
                Just("active"),
                Just("past_due"),
                Just("paused"),
                Just("canceled")
            ],
            paddle_price.clone(),
            0..ENDS,
            at.clone()
        )
            .prop_map(|(customer, sub, status, price, ends, at)| {
                Event::PaddleSubscription {
                    customer,
                    sub,
                    status,
                    price: if sub == 1 { "team" } else { price },
                    ends,
                    at,
                }
            }),
        (
            customer.clone(),
            0u8..3,
            paddle_price,
            proptest::bool::weighted(0.4),
            prop_oneof![6 => Just(0u8), 2 => Just(1u8), 2 => Just(2u8)],
            at.clone()
        )
            .prop_map(|(customer, txn, price, unknown, outcome, at)| {
                Event::PaddleTransaction {
                    customer,
                    txn,
                    price: if unknown && txn % 2 == 1 {
                        "pri_legacy"
                    } else {
                        price
                    },
                    outcome,
                    at,
                }
            }),
    ];
    let lemonsqueezy = prop_oneof![
        (
            customer.clone(),
            0u8..2,
            prop_oneof![
                Just("on_trial"),
                Just("active"),
                Just("paused"),
                Just("past_due"),
                Just("unpaid"),
                Just("cancelled"),
                Just("expired")
            ],
            0..ENDS,
            at.clone()
        )
            .prop_map(|(customer, sub, status, ends, at)| Event::LsSubscription {
                customer,
                sub,
                status,
                ends,
                at
            }),
        (
            customer.clone(),
            0u8..3,
            prop_oneof![6 => Just(0u8), 2 => Just(1u8), 2 => Just(2u8)],
            at.clone()
        )
            .prop_map(|(customer, invoice, outcome, at)| Event::LsInvoice {
                customer,
                invoice,
                outcome,
                at
            }),
        (
            customer.clone(),
            0u8..2,
            prop_oneof![
                Just(LS_VARIANTS[0]),
                Just(LS_VARIANTS[1]),
                Just(LS_UNKNOWN_VARIANT)
            ],
            proptest::bool::weighted(0.2),
            at.clone()
        )
            .prop_map(|(customer, order, variant, refunded, at)| Event::LsOrder {
                customer,
                order,
                variant,
                refunded,
                at
            }),
    ];
    let billing = prop_oneof![
        (
            customer.clone(),
            proptest::option::weighted(0.8, plan.clone()),
            at.clone()
        )
            .prop_map(|(customer, plan, at)| Event::KindePlan { customer, plan, at }),
        (
            customer.clone(),
            0u8..3,
            proptest::option::of(plan),
            any::<bool>(),
            at.clone()
        )
            .prop_map(|(customer, payment, plan, ok, at)| Event::KindePayment {
                customer,
                payment,
                plan,
                ok,
                at
            }),
        (
            customer.clone(),
            0u8..2,
            prop_oneof![
                Just("incomplete"),
                Just("trialing"),
                Just("active"),
                Just("past_due"),
                Just("unpaid"),
                Just("canceled")
            ],
            price.clone(),
            0..ENDS,
            any::<bool>(),
            at.clone()
        )
            .prop_map(|(customer, sub, status, plan, ends, basil, at)| {
                Event::StripeSubscription {
                    customer,
                    sub,
                    status,
                    plan,
                    ends,
                    basil,
                    at,
                }
            }),
        (
            customer.clone(),
            0u8..3,
            proptest::option::of(price),
            any::<bool>(),
            at.clone()
        )
            .prop_map(|(customer, invoice, plan, names_intent, at)| {
                Event::StripeInvoicePaid {
                    customer,
                    invoice,
                    plan,
                    names_intent,
                    at,
                }
            }),
        (customer.clone(), 0u8..3, any::<bool>(), at.clone()).prop_map(
            |(customer, invoice, basil, at)| Event::StripeRefund {
                customer,
                invoice,
                basil,
                at
            }
        ),
        (customer, 0u8..3, at).prop_map(|(customer, invoice, at)| {
            Event::StripeInvoicePayment {
                customer,
                invoice,
                at,
            }
        }),
    ];
    prop_oneof![14 => billing, 4 => polar, 3 => paddle, 3 => lemonsqueezy, 1 => deletion]
}

/// A delivery of event `index`: copies deliver the same event again; `fail` injects a
/// failure into the worker's attempt that follows it.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub(crate) index: usize,
    fail: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub(crate) events: Vec<Event>,
    pub(crate) deliveries: Vec<Delivery>,
}

/// Polar benefit grants over a few grants of each customer: granted and revoked, of one
/// feature at several values (the larger wins) or another, at the same coarse times.
fn grant_strategy() -> impl Strategy<Value = Event> {
    let at = prop_oneof![4 => 0u32..3, 6 => 0u32..40];
    let feature = prop_oneof![Just("sso"), Just("seats=5"), Just("seats=20")];
    (
        0..CUSTOMERS,
        0u8..3,
        proptest::bool::weighted(0.6),
        feature,
        at,
    )
        .prop_map(
            |(customer, grant, granted, feature, at)| Event::PolarGrant {
                customer,
                grant,
                granted,
                feature,
                at,
            },
        )
}

/// Stripe's notices that it failed to generate events, each sweeping the case's Stripe
/// subscriptions, at the workload's coarse times but not crowded at its first instants: most
/// come after the subscriptions' changes, in a later month, where the reference order's sweep
/// finds registers that already show what Stripe lists.
fn notice_strategy() -> impl Strategy<Value = Event> {
    (0u32..40).prop_map(|at| Event::StripeHealthNotice { at })
}

/// The simulator's notices, drawn apart from its workload (none to two a seed).
pub(crate) fn notice_cases() -> impl Strategy<Value = Case> {
    cases(notice_strategy().boxed(), 0..3)
}

/// The simulator's workload and the property test's events without benefit grants.
pub(crate) fn case_strategy() -> impl Strategy<Value = Case> {
    cases(event_strategy().boxed(), 1..12)
}

/// The property test's: the workload's events, Polar benefit grants, Stripe summaries and
/// Stripe's notices of events it failed to generate.
fn case_strategy_with_grants() -> impl Strategy<Value = Case> {
    cases(
        prop_oneof![12 => event_strategy(), 4 => grant_strategy(), 4 => summary_strategy(), 3 => notice_strategy()].boxed(),
        1..12,
    )
}

/// Stripe summaries of a customer's features at the workload's coarse times, so two of one
/// second are common (their ids sort either way); four in ten say `has_more` with only their
/// first entries embedded.
fn summary_strategy() -> impl Strategy<Value = Event> {
    let at = prop_oneof![4 => 0u32..3, 6 => 0u32..40];
    let embedded = prop_oneof![6 => Just(LOOKUP_KEYS.len() as u8), 4 => 1u8..5];
    (0..CUSTOMERS, any::<u8>(), embedded, at).prop_map(|(customer, keys, embedded, at)| {
        Event::StripeSummary {
            customer,
            keys,
            embedded,
            at,
        }
    })
}

/// The simulator's entitlement events, drawn apart from its workload (none to four a seed):
/// Polar benefit grants, each grant of one benefit (its feature fixed by the grant: `sso`,
/// `seats` at 5 or at 20), granted and revoked at the workload's coarse times, so out of
/// order; and Stripe summaries of a customer's features, four in ten saying `has_more` with
/// only their first entries embedded.
pub(crate) fn entitlement_strategy() -> impl Strategy<Value = Case> {
    let at = prop_oneof![4 => 0u32..3, 6 => 0u32..40];
    let grant = (
        0..CUSTOMERS,
        0u8..3,
        proptest::bool::weighted(0.6),
        at.clone(),
    )
        .prop_map(|(customer, grant, granted, at)| Event::PolarGrant {
            customer,
            grant,
            granted,
            feature: ["sso", "seats=5", "seats=20"][usize::from(grant)],
            at,
        });
    cases(prop_oneof![grant, summary_strategy()].boxed(), 0..5)
}

impl Case {
    /// `more`'s events and deliveries after this case's (its indices moved past them).
    pub(crate) fn extend(&mut self, more: Case) {
        let base = self.events.len();
        self.events.extend(more.events);
        self.deliveries
            .extend(more.deliveries.into_iter().map(|d| Delivery {
                index: base + d.index,
                fail: d.fail,
            }));
    }
}

fn cases(event: BoxedStrategy<Event>, size: std::ops::Range<usize>) -> impl Strategy<Value = Case> {
    proptest::collection::vec(event, size).prop_flat_map(|events| {
        let n = events.len();
        // Each event is delivered 1 to 3 times, in a shuffled order.
        let copies = proptest::collection::vec(1usize..=3, n);
        let faults = proptest::collection::vec(proptest::bool::weighted(0.25), n * 3);
        (Just(events), copies, faults)
            .prop_flat_map(|(events, copies, faults)| {
                let mut deliveries: Vec<Delivery> = Vec::new();
                for (index, count) in copies.iter().enumerate() {
                    for _ in 0..*count {
                        let fail = faults[deliveries.len()];
                        deliveries.push(Delivery { index, fail });
                    }
                }
                (Just(events), Just(deliveries).prop_shuffle())
            })
            .prop_map(|(events, deliveries)| Case { events, deliveries })
    })
}

pub(crate) struct Materialized {
    source: &'static str,
    pub(crate) dedupe_key: String,
    pub(crate) at: DateTime<Utc>,
    verified: shared::domain::VerifiedEvent,
    body: Vec<u8>,
}

pub(crate) fn customer_id(customer: u8, ns: &str) -> String {
    format!("c{customer}_{ns}")
}

/// The event as its provider would send it, with every id in namespace `ns`.
pub(crate) fn materialize(index: usize, event: &Event, ns: &str) -> Materialized {
    let (source, payload, at) = payload(index, event, ns);
    let key = format!("e{index:02}_{ns}");
    let body = serde_json::to_vec(&payload).unwrap();
    let verified = match source {
        "kinde" => kinde::parse_claims(payload, Some(key.clone()), Utc::now()),
        "polar" => standard_webhooks::parse_event(&key, &body, Utc::now()),
        "paddle" => shared::providers::paddle::parse_event(&body, Utc::now()),
        "lemonsqueezy" => shared::providers::lemonsqueezy::parse_event(&body, Utc::now()),
        _ => stripe::parse_event(&body, Utc::now()),
    };
    let (dedupe_key, at) = match source {
        // Its key is made from the body (no event id), its time has microseconds.
        "lemonsqueezy" => (verified.dedupe_key.as_str().to_owned(), ls_at(index, at)),
        _ => (key, time(at)),
    };
    Materialized {
        source,
        dedupe_key,
        at,
        verified,
        body,
    }
}

/// A Stripe snapshot event as Stripe would send it, keyed by its `id`, at its `created`
/// (the credits property's events, `order_credits`).
pub(crate) fn stripe_materialized(payload: &Value) -> Materialized {
    let body = serde_json::to_vec(payload).unwrap();
    let verified = stripe::parse_event(&body, Utc::now());
    Materialized {
        source: "stripe",
        dedupe_key: payload["id"].as_str().unwrap().to_owned(),
        at: DateTime::from_timestamp(payload["created"].as_i64().unwrap(), 0).unwrap(),
        verified,
        body,
    }
}

/// A Polar event as Polar would send it, keyed by its `webhook-id` `key`, at `at` (the Polar
/// meter credits property's events, `order_credits`).
pub(crate) fn polar_materialized(key: &str, payload: &Value, at: DateTime<Utc>) -> Materialized {
    let body = serde_json::to_vec(payload).unwrap();
    let verified = standard_webhooks::parse_event(key, &body, Utc::now());
    Materialized {
        source: "polar",
        dedupe_key: key.to_owned(),
        at,
        verified,
        body,
    }
}

/// A Lemon Squeezy event's time: its coarse time and, in microseconds, its index. Its key is
/// a digest of its body, which the namespace changes, so two states of one object at one time
/// would be ordered apart in two namespaces: its times never tie (Lemon Squeezy's are in
/// microseconds, where ties are rare).
fn ls_at(index: usize, at: u32) -> DateTime<Utc> {
    time(at) + Duration::microseconds(index as i64 + 1)
}

/// The event's source, its payload (Stripe's event, Kinde's claims) and its time.
pub(crate) fn payload(index: usize, event: &Event, ns: &str) -> (&'static str, Value, u32) {
    let key = format!("e{index:02}_{ns}");
    let kinde_claims = |event_type: &str, customer: u8, data: Value, at: u32| {
        let mut data = data;
        data["customer_id"] = json!(customer_id(customer, ns));
        json!({"type": event_type, "event_id": key, "event_timestamp": time(at).to_rfc3339(),
               "timestamp": Utc::now().to_rfc3339(), "source": "api", "data": data})
    };
    let polar_body = |event_type: &str, at: u32, data: Value| json!({"type": event_type, "timestamp": time(at).to_rfc3339(), "data": data});
    let stripe_body = |event_type: &str, at: u32, object: Value| {
        json!({"id": key, "object": "event", "type": event_type, "created": time(at).timestamp(),
               "pending_webhooks": 1, "data": {"object": object}})
    };
    let (source, payload, at) = match event {
        Event::KindePlan { customer, plan, at } => {
            let claims = match plan {
                Some(plan) => kinde_claims(
                    "customer.plan_changed",
                    *customer,
                    json!({"plan": {"key": plan}}),
                    *at,
                ),
                None => kinde_claims("customer.agreement_cancelled", *customer, json!({}), *at),
            };
            ("kinde", claims, *at)
        }
        Event::KindePayment {
            customer,
            payment,
            plan,
            ok,
            at,
        } => {
            let mut data = json!({"payment_id": format!("pay{customer}{payment}_{ns}")});
            if let Some(plan) = plan {
                data["plan"] = json!({"key": plan});
            }
            let event_type = if *ok {
                "customer.payment_succeeded"
            } else {
                "customer.payment_failed"
            };
            ("kinde", kinde_claims(event_type, *customer, data, *at), *at)
        }
        Event::StripeSubscription {
            customer,
            sub,
            status,
            plan,
            ends,
            basil,
            at,
        } => {
            let ends = Ends::of(*ends, status, *at);
            let unix = |t: Option<DateTime<Utc>>| t.map(|t| t.timestamp());
            let mut item = json!({"price": {"id": plan}});
            let mut object = json!({"id": format!("sub{customer}{sub}_{ns}"), "object": "subscription",
                "customer": customer_id(*customer, ns), "status": status,
                "cancel_at_period_end": ends.cancel_at_period_end, "cancel_at": unix(ends.cancel_at),
                "trial_end": unix(ends.trial_end), "ended_at": unix(ends.ended_at)});
            let period_end = json!(ends.current_period_end.timestamp());
            match basil {
                true => item["current_period_end"] = period_end,
                false => object["current_period_end"] = period_end,
            }
            object["items"] = json!({"data": [item]});
            (
                "stripe",
                stripe_body("customer.subscription.updated", *at, object),
                *at,
            )
        }
        Event::StripeInvoicePaid {
            customer,
            invoice,
            plan,
            names_intent,
            at,
        } => {
            let lines: Vec<Value> = plan.iter().map(|p| json!({"price": {"id": p}})).collect();
            let mut object = json!({"id": format!("in{customer}{invoice}_{ns}"), "object": "invoice",
                "customer": customer_id(*customer, ns), "lines": {"data": lines}});
            if *names_intent {
                object["payment_intent"] = json!(format!("pi{customer}{invoice}_{ns}"));
            }
            ("stripe", stripe_body("invoice.paid", *at, object), *at)
        }
        Event::StripeRefund {
            customer,
            invoice,
            basil,
            at,
        } => {
            let mut object = json!({"id": format!("ch{customer}{invoice}_{ns}"), "object": "charge",
                "payment_intent": format!("pi{customer}{invoice}_{ns}"), "refunded": true,
                "customer": customer_id(*customer, ns)});
            if !*basil {
                object["invoice"] = json!(format!("in{customer}{invoice}_{ns}"));
            }
            ("stripe", stripe_body("charge.refunded", *at, object), *at)
        }
        Event::StripeInvoicePayment {
            customer,
            invoice,
            at,
        } => {
            let object = json!({"id": format!("inpay{customer}{invoice}_{ns}"),
                "object": "invoice_payment", "invoice": format!("in{customer}{invoice}_{ns}"),
                "status": "paid",
                "payment": {"type": "payment_intent", "payment_intent": format!("pi{customer}{invoice}_{ns}")}});
            (
                "stripe",
                stripe_body("invoice_payment.paid", *at, object),
                *at,
            )
        }
        Event::StripeCustomerDeleted { customer, at } => {
            let object = json!({"id": customer_id(*customer, ns), "object": "customer",
                "livemode": false, "email": null, "invoice_prefix": "B1C2D3E4"});
            ("stripe", stripe_body("customer.deleted", *at, object), *at)
        }
        Event::PolarSubscription {
            customer,
            sub,
            status,
            product,
            ends,
            at,
        } => {
            let ends = Ends::of(*ends, status, *at);
            let iso = |t: Option<DateTime<Utc>>| t.map(|t| t.to_rfc3339());
            let data = json!({"id": format!("psub{customer}{sub}_{ns}"), "status": status,
                "customer_id": customer_id(*customer, ns), "product_id": product,
                "created_at": time(0).to_rfc3339(), "modified_at": time(*at).to_rfc3339(),
                "amount": 2000, "currency": "usd", "recurring_interval": "month",
                "current_period_start": time(0).to_rfc3339(),
                "current_period_end": ends.current_period_end.to_rfc3339(),
                "cancel_at_period_end": ends.cancel_at_period_end, "ends_at": iso(ends.cancel_at),
                "trial_end": iso(ends.trial_end), "ended_at": iso(ends.ended_at)});
            let event_type = match *status {
                "active" => "subscription.active",
                "canceled" => "subscription.canceled",
                _ => "subscription.updated",
            };
            ("polar", polar_body(event_type, *at, data), *at)
        }
        Event::PolarOrder {
            customer,
            order,
            product,
            refunded,
            at,
        } => {
            let status = if *refunded { "refunded" } else { "paid" };
            let data = json!({"id": format!("pord{customer}{order}_{ns}"), "status": status,
                "paid": true, "customer_id": customer_id(*customer, ns), "product_id": product,
                "billing_reason": "subscription_cycle", "total_amount": 2000, "currency": "usd",
                "created_at": time(0).to_rfc3339(), "modified_at": time(*at).to_rfc3339()});
            let event_type = if *refunded {
                "order.refunded"
            } else {
                "order.paid"
            };
            ("polar", polar_body(event_type, *at, data), *at)
        }
        Event::PaddleSubscription {
            customer,
            sub,
            status,
            price,
            ends,
            at,
        } => {
            let ends = Ends::of(*ends, status, *at);
            let iso = |t: DateTime<Utc>| t.to_rfc3339();
            let data = json!({"id": format!("pdsub{customer}{sub}_{ns}"), "status": status,
                "customer_id": customer_id(*customer, ns), "currency_code": "USD",
                "collection_mode": "automatic", "created_at": iso(time(0)),
                "updated_at": iso(time(*at)), "started_at": iso(time(0)),
                "canceled_at": ends.ended_at.map(iso), "custom_data": null,
                "billing_cycle": {"interval": "month", "frequency": 1},
                "current_billing_period": {"starts_at": iso(time(0)),
                                           "ends_at": iso(ends.current_period_end)},
                "scheduled_change": ends.cancel_at.map(|t| json!({"action": "cancel",
                    "effective_at": iso(t), "resume_at": null})),
                "items": [{"status": "active", "quantity": 1, "recurring": true,
                           "trial_dates": ends.trial_end.map(|t| json!({"starts_at": iso(time(0)),
                                                                         "ends_at": iso(t)})),
                           "price": {"id": price, "product_id": "pro_01gsz4t5hdjse780zja8vvr7jg"}}]});
            let event_type = match *status {
                "active" => "subscription.activated",
                "trialing" => "subscription.trialing",
                "past_due" => "subscription.past_due",
                "paused" => "subscription.paused",
                "canceled" => "subscription.canceled",
                _ => "subscription.updated",
            };
            let event = json!({"event_id": format!("e{index:02}_{ns}"), "event_type": event_type,
                "occurred_at": iso(time(*at)), "notification_id": format!("ntf_{index:02}_{ns}"),
                "data": data});
            ("paddle", event, *at)
        }
        Event::PaddleTransaction {
            customer,
            txn,
            price,
            outcome,
            at,
        } => {
            let iso = |t: DateTime<Utc>| t.to_rfc3339();
            let id = format!("pdtxn{customer}{txn}_{ns}");
            let (event_type, data) = match outcome {
                0 | 1 => (
                    if *outcome == 0 {
                        "transaction.completed"
                    } else {
                        "transaction.payment_failed"
                    },
                    json!({"id": id, "status": if *outcome == 0 { "completed" } else { "ready" },
                        "customer_id": customer_id(*customer, ns),
                        "subscription_id": format!("pdsub{customer}{}_{ns}", txn % 2),
                        "origin": "subscription_recurring", "currency_code": "USD",
                        "created_at": iso(time(0)), "updated_at": iso(time(*at)),
                        "custom_data": null,
                        "items": [{"price": {"id": price, "product_id": "pro_01gsz4t5hdjse780zja8vvr7jg"},
                                   "quantity": 1}]}),
                ),
                _ => (
                    "adjustment.updated",
                    json!({"id": format!("adj{customer}{txn}_{ns}"), "action": "refund",
                        "type": "full", "status": "approved", "reason": "error",
                        "customer_id": customer_id(*customer, ns), "transaction_id": id,
                        "currency_code": "USD", "created_at": iso(time(*at)),
                        "updated_at": iso(time(*at))}),
                ),
            };
            let event = json!({"event_id": format!("e{index:02}_{ns}"), "event_type": event_type,
                "occurred_at": iso(time(*at)), "notification_id": format!("ntf_{index:02}_{ns}"),
                "data": data});
            ("paddle", event, *at)
        }
        Event::LsSubscription {
            customer,
            sub,
            status,
            ends,
            at,
        } => {
            let t = ls_at(index, *at);
            let ends = Ends::of(*ends, status, *at);
            let mut data = ls_template("subscription_created");
            data["id"] = json!(ls_subscription_id(*customer, *sub, ns));
            let a = &mut data["attributes"];
            a["customer_id"] = json!(customer_id(*customer, ns));
            a["variant_id"] = json!(ls_variant(*sub));
            a["product_id"] = json!(LS_PRODUCT);
            a["status"] = json!(status);
            a["cancelled"] = json!(*status == "cancelled");
            a["renews_at"] = json!(ls_time(ends.current_period_end));
            a["trial_ends_at"] = json!(ends.trial_end.map(ls_time));
            a["ends_at"] = match *status {
                "cancelled" => json!(ls_time(ends.current_period_end)),
                "expired" => json!(ls_time(t)),
                _ => Value::Null,
            };
            a["created_at"] = json!(ls_time(time(0)));
            a["updated_at"] = json!(ls_time(t));
            let event_name = match *status {
                "cancelled" => "subscription_cancelled",
                "expired" => "subscription_expired",
                "paused" => "subscription_paused",
                _ => "subscription_updated",
            };
            ("lemonsqueezy", ls_body(event_name, data), *at)
        }
        Event::LsInvoice {
            customer,
            invoice,
            outcome,
            at,
        } => {
            let t = ls_at(index, *at);
            let mut data = ls_template("subscription_payment_success");
            data["id"] = json!(format!("lsinv{customer}{invoice}_{ns}"));
            let a = &mut data["attributes"];
            a["subscription_id"] = json!(ls_subscription_id(*customer, invoice % 2, ns));
            a["customer_id"] = json!(customer_id(*customer, ns));
            a["billing_reason"] = json!("renewal");
            let (event_name, status) = match outcome {
                0 => ("subscription_payment_success", "paid"),
                1 => ("subscription_payment_failed", "pending"),
                _ => ("subscription_payment_refunded", "refunded"),
            };
            a["status"] = json!(status);
            a["refunded"] = json!(*outcome == 2);
            if *outcome == 2 {
                a["refunded_amount"] = a["total"].clone();
                a["refunded_at"] = json!(ls_time(t));
            }
            a["created_at"] = json!(ls_time(time(0)));
            a["updated_at"] = json!(ls_time(t));
            ("lemonsqueezy", ls_body(event_name, data), *at)
        }
        Event::LsOrder {
            customer,
            order,
            variant,
            refunded,
            at,
        } => {
            let t = ls_at(index, *at);
            let mut data = ls_template("order_created");
            data["id"] = json!(format!("lsord{customer}{order}_{ns}"));
            let a = &mut data["attributes"];
            a["customer_id"] = json!(customer_id(*customer, ns));
            a["first_order_item"]["variant_id"] = json!(variant);
            a["first_order_item"]["product_id"] = json!(LS_PRODUCT);
            a["status"] = json!(if *refunded { "refunded" } else { "paid" });
            a["refunded"] = json!(refunded);
            if *refunded {
                a["refunded_amount"] = a["total"].clone();
                a["refunded_at"] = json!(ls_time(t));
            }
            a["created_at"] = json!(ls_time(time(0)));
            a["updated_at"] = json!(ls_time(t));
            let event_name = if *refunded {
                "order_refunded"
            } else {
                "order_created"
            };
            ("lemonsqueezy", ls_body(event_name, data), *at)
        }
        Event::PolarCustomerDeleted { customer, at } => {
            let data = json!({"id": customer_id(*customer, ns), "email": "gone@example.com",
                "organization_id": "org_1", "created_at": time(0).to_rfc3339(),
                "modified_at": time(*at).to_rfc3339(), "deleted_at": time(*at).to_rfc3339()});
            ("polar", polar_body("customer.deleted", *at, data), *at)
        }
        Event::PolarGrant {
            customer,
            grant,
            granted,
            feature,
            at,
        } => {
            // Polar's shape, as the development fixtures build it; the grant's time is its
            // `modified_at` (a grant's later events carry one).
            let kind = if *granted {
                "benefit-grant-updated"
            } else {
                "benefit-grant-revoked"
            };
            let spec = shared::providers::fixtures::Spec {
                kind: kind.into(),
                customer: customer_id(*customer, ns),
                at: time(*at),
                object_id: Some(format!("pgrant{customer}{grant}_{ns}")),
                event_id: Some(key.clone()),
                feature: Some((*feature).to_owned()),
                ..Default::default()
            };
            let (_, body) = shared::providers::fixtures::payload(
                shared::domain::SourceKind::StandardWebhooks,
                &spec,
            )
            .unwrap();
            ("polar", body, *at)
        }
        Event::StripeSummary {
            customer,
            keys,
            embedded,
            at,
        } => {
            // As the corpus's summaries (`testdata/providers/stripe/entitlements/`), built by
            // the development fixtures.
            let mut listed = active_entitlements(*customer, *keys);
            let has_more = usize::from(*embedded) < listed.len();
            listed.truncate(usize::from(*embedded));
            let id = customer_id(*customer, ns);
            let summary = stripe::fixtures::entitlement_summary(&id, listed, has_more);
            let created = time(*at).timestamp();
            let body = stripe::fixtures::summary_event(&key, created, summary, None);
            ("stripe", body, *at)
        }
        Event::StripeHealthNotice { at } => {
            // The notification with the `data` its v2 event shows (stripe-node's
            // `V2CoreHealthEventGenerationFailureResolvedEvent.Data`), without `impact`: it names
            // no object, so the worker sweeps the subscriptions (tests/api/health.rs reads the
            // same `data` from a fake `GET /v2/core/events/{id}`).
            let created = time(*at).to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            let body = json!({"id": key, "object": "v2.core.event",
                "type": "v2.core.health.event_generation_failure.resolved", "livemode": false,
                "created": created, "context": null, "reason": null,
                "data": {"alert_id": format!("halert_{index:02}"), "resolved_at": created,
                         "grouping_key": format!("_grouping_{index:02}"),
                         "summary": "We have failed to create a notification for your Stripe account.",
                         "severity": "critical"}});
            ("stripe", body, *at)
        }
    };
    (source, payload, at)
}

pub(crate) async fn store(pool: &PgPool, m: &Materialized) -> i64 {
    let headers = json!({});
    let origin = shared::inbox::store::Origin::Delivery(&headers);
    shared::inbox::store::store_verified(pool, m.source, &m.body, &m.verified, origin)
        .await
        .unwrap()
        .event_id
}

/// Works the reads the sweeps of namespace `ns` stored and nothing sent yet (the rescue sends
/// them a minute later, docs/design.md §6.2) until each is final.
async fn apply_swept_reads(
    pool: &PgPool,
    worker: &WorkerState,
    ns: &str,
) -> Result<(), TestCaseError> {
    let reads: Vec<i64> = sqlx::query_scalar(
        "SELECT r.id FROM inbox_events r JOIN inbox_events n ON n.id = r.made_for
         WHERE r.status = 'received' AND n.type = 'v2.core.health.event_generation_failure.resolved'
           AND n.dedupe_key LIKE '%\\_' || $1 ORDER BY r.id",
    )
    .bind(ns)
    .fetch_all(pool)
    .await
    .unwrap();
    for id in reads {
        process(worker, id).await?;
    }
    Ok(())
}

/// Works the event until it is final (a failed attempt is retried at once).
pub(crate) async fn process(worker: &WorkerState, event_id: i64) -> Result<(), TestCaseError> {
    for _ in 0..10 {
        match shared::handlers::worker::process_event(worker, event_id)
            .await
            .unwrap()
        {
            Processed::Failed {
                status: EventStatus::Dead,
                error,
            } => {
                return Err(TestCaseError::fail(format!(
                    "event {event_id} died: {error}"
                )))
            }
            Processed::Failed { .. }
            | Processed::Unfinished { .. }
            | Processed::Deferred { .. } => continue,
            Processed::Finished { .. } | Processed::Skipped => return Ok(()),
        }
    }
    Err(TestCaseError::fail(format!(
        "event {event_id} never finished"
    )))
}

/// Everything the billing state says about the namespace's customers, with the namespace
/// removed so that two namespaces compare.
pub(crate) async fn state_of(pool: &PgPool, worker: &WorkerState, ns: &str) -> Value {
    let mut conn = pool.acquire().await.unwrap();
    let mut accounts = Vec::new();
    for customer in 0..CUSTOMERS {
        for source in ["kinde", "stripe", "polar", "paddle", "lemonsqueezy"] {
            let id = customer_id(customer, ns);
            let mut balances = Vec::new();
            for period in PERIODS {
                balances.push(
                    shared::billing::account::period_balance(&mut conn, source, &id, period)
                        .await
                        .unwrap(),
                );
            }
            let view = shared::billing::account::load(
                &mut conn,
                source,
                &shared::domain::CustomerId::parse(&id).unwrap(),
                &shared::domain::Period::parse("2026-03").unwrap(),
                &worker.catalog,
            )
            .await
            .unwrap();
            accounts.push(view.map(|v| {
                json!({"source": source, "customer": customer, "plan": v.plan, "customer_plan": v.customer_plan,
                       "past_due": v.past_due, "balances": balances, "subscriptions": v.subscriptions,
                       "payments": v.payments, "deleted": v.deleted, "features": v.features})
            }));
        }
    }
    let text = serde_json::to_string(&accounts)
        .unwrap()
        .replace(&format!("_{ns}"), "");
    serde_json::from_str(&text).unwrap()
}

/// What Paddle and Lemon Squeezy show of each subscription the case names, as their
/// `GET /subscriptions/{id}` and `GET /v1/subscriptions/{id}` would answer once every event
/// happened: its latest state, by provider time then key (the same in every namespace); one
/// no event names is unknown (404). A tie's read shows that state too, so the provider
/// settles a same-time tie, in every order alike (docs/design.md §4.2). Stripe's
/// subscriptions are kept the same way for `GET /v1/subscriptions?status=all`, which a
/// notice's sweep reads ([`Event::StripeHealthNotice`]): every subscription of the namespace
/// being worked ([`CaseObjects::list_for`]) as its latest event shows it. A Stripe tie's read
/// answers "unknown", so the status rank settles Stripe's ties as before its source had a key.
/// And what Stripe lists of each customer's active entitlements
/// (`GET /v1/entitlements/active_entitlements`): the whole set of its latest summary, of two in
/// one second the one whose key sorts first, so that a tie left to the keys ends elsewhere
/// than Stripe's list.
#[derive(Clone, Default)]
pub(crate) struct CaseObjects(Arc<Mutex<HashMap<String, Shown>>>, Arc<Mutex<String>>);

/// Where [`CaseObjects`] keeps what Stripe lists of a customer's active entitlements.
fn listed_key(customer: &str) -> String {
    format!("active_entitlements:{customer}")
}

/// A subscription's latest event: its place in the order, its provider's kind and the event.
struct Shown {
    at: DateTime<Utc>,
    key: String,
    kind: SourceKind,
    event_type: String,
    payload: Value,
}

impl CaseObjects {
    /// Takes the subscriptions of `events` (one namespace's) as their providers show them.
    pub(crate) fn show(&self, events: &[Materialized]) {
        let mut objects = self.0.lock().unwrap();
        for m in events {
            let (Some(payload), Ok(meta)) = (m.verified.payload.as_ref(), &m.verified.meta) else {
                continue;
            };
            let kind = match m.source {
                "paddle" if meta.event_type.starts_with("subscription.") => SourceKind::Paddle,
                "lemonsqueezy" if payload["data"]["type"] == "subscriptions" => {
                    SourceKind::LemonSqueezy
                }
                "stripe" if meta.event_type.starts_with("customer.subscription.") => {
                    SourceKind::Stripe
                }
                _ => continue,
            };
            let id = match kind {
                SourceKind::Stripe => payload["data"]["object"]["id"].as_str(),
                _ => payload["data"]["id"].as_str(),
            };
            let Some(id) = id else {
                continue;
            };
            let newer = objects
                .get(id)
                .is_none_or(|held| (m.at, &m.dedupe_key) > (held.at, &held.key));
            if newer {
                objects.insert(
                    id.to_owned(),
                    Shown {
                        at: m.at,
                        key: m.dedupe_key.clone(),
                        kind,
                        event_type: meta.event_type.clone(),
                        payload: payload.clone(),
                    },
                );
            }
        }
    }

    /// Takes each Stripe summary of `events` (materialized in namespace `ns`) as what Stripe
    /// lists of its customer: its whole set, of the latest summary (of one second, the one whose
    /// key sorts first).
    pub(crate) fn show_summaries(&self, events: &[Event], ns: &str) {
        let mut objects = self.0.lock().unwrap();
        for (index, event) in events.iter().enumerate() {
            let Event::StripeSummary {
                customer, keys, at, ..
            } = event
            else {
                continue;
            };
            let (id, at, key) = (
                customer_id(*customer, ns),
                time(*at),
                format!("e{index:02}_{ns}"),
            );
            let listed = listed_key(&id);
            let newer = objects
                .get(&listed)
                .is_none_or(|held| at > held.at || (at == held.at && key < held.key));
            if newer {
                let all = active_entitlements(*customer, *keys);
                let payload = stripe::fixtures::entitlement_summary(&id, all, false);
                let event_type = stripe::entitlements::SUMMARY_TYPE.to_owned();
                let kind = SourceKind::Stripe;
                let shown = Shown {
                    at,
                    key,
                    kind,
                    event_type,
                    payload,
                };
                objects.insert(listed, shown);
            }
        }
    }

    /// The lookup keys Stripe lists for `customer`, if any summary of it was shown.
    fn listed(&self, customer: &str) -> Option<Value> {
        let objects = self.0.lock().unwrap();
        objects
            .get(&listed_key(customer))
            .map(|shown| shown.payload.clone())
    }

    /// From now on, Stripe's list of subscriptions is namespace `ns`'s (the one being worked).
    pub(crate) fn list_for(&self, ns: &str) {
        *self.1.lock().unwrap() = ns.to_owned();
    }

    /// The subscription as its provider's API answers it (the `data` of its latest event;
    /// Stripe's: its `data.object`).
    fn object(&self, id: &str) -> Option<Value> {
        let objects = self.0.lock().unwrap();
        objects.get(id).map(|shown| match shown.kind {
            SourceKind::Stripe => shown.payload["data"]["object"].clone(),
            _ => shown.payload["data"].clone(),
        })
    }

    /// Every Stripe subscription of the namespace being worked, by id, as Stripe lists them.
    fn stripe_list(&self) -> Vec<Value> {
        let ns = format!("_{}", self.1.lock().unwrap());
        let objects = self.0.lock().unwrap();
        let mut listed: Vec<(&String, Value)> = objects
            .iter()
            .filter(|(id, shown)| {
                shown.kind == SourceKind::Stripe
                    && id.ends_with(&ns)
                    && !id.starts_with(&listed_key(""))
            })
            .map(|(id, shown)| (id, shown.payload["data"]["object"].clone()))
            .collect();
        listed.sort_by(|a, b| a.0.cmp(b.0));
        listed.into_iter().map(|(_, object)| object).collect()
    }

    /// The subscription as `decide` reads its latest event, with the ids it names.
    fn now(&self, id: &str) -> Option<SubscriptionNow> {
        let objects = self.0.lock().unwrap();
        let shown = objects.get(id).filter(|s| s.kind != SourceKind::Stripe)?;
        let catalog = shared::domain::Catalog::parse(crate::helpers::PLANS).unwrap();
        let decision =
            shared::providers::decide(shown.kind, &shown.event_type, &shown.payload, &catalog);
        let shared::billing::Decision::Apply { effects, .. } = decision else {
            return None;
        };
        let (status, ends) = effects.into_iter().find_map(|e| match e {
            shared::billing::Effect::Subscription { status, ends, .. } => Some((status, ends)),
            _ => None,
        })?;
        let data = &shown.payload["data"];
        let text = |v: &Value| match v {
            Value::Number(n) => Some(n.to_string()),
            Value::String(s) => Some(s.clone()),
            _ => None,
        };
        let plan_keys = match shown.kind {
            SourceKind::Paddle => data["items"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|item| [&item["price"]["id"], &item["price"]["product_id"]])
                .filter_map(text)
                .collect(),
            _ => [
                &data["attributes"]["variant_id"],
                &data["attributes"]["product_id"],
            ]
            .into_iter()
            .filter_map(text)
            .collect(),
        };
        Some(SubscriptionNow {
            status,
            plan_keys,
            ends,
        })
    }
}

impl Reads for CaseObjects {
    fn subscription<'a>(
        &'a self,
        _customer: &'a CustomerId,
        id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<SubscriptionNow>>> {
        Box::pin(std::future::ready(Ok(self.now(id))))
    }

    fn subscription_object<'a>(
        &'a self,
        _customer: &'a CustomerId,
        id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<Value>>> {
        Box::pin(std::future::ready(Ok(self.object(id))))
    }

    /// Stripe's list of a summary's customer, whole (what `read_summary` makes of its pages).
    fn carried_object<'a>(
        &'a self,
        _carrier: &'a shared::providers::Carrier,
        path: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<Value>>> {
        let customer = path
            .strip_prefix(stripe::entitlements::LIST_PATH)
            .and_then(|q| q.strip_prefix("?customer="));
        Box::pin(std::future::ready(
            Ok(customer.and_then(|c| self.listed(c))),
        ))
    }

    /// `GET /v1/subscriptions?status=all`: one page, every subscription.
    fn subscriptions_page<'a>(
        &'a self,
        _context: Option<&'a str>,
        _after: Option<&'a str>,
    ) -> BoxFuture<'a, anyhow::Result<(Vec<Value>, Option<String>)>> {
        Box::pin(std::future::ready(Ok((self.stripe_list(), None))))
    }
}

/// The property's worker: the test worker, whose Paddle, Lemon Squeezy and Stripe sources read
/// `objects`.
pub(crate) fn reading_worker(pool: PgPool, objects: &CaseObjects) -> WorkerState {
    let mut worker = test_worker(pool);
    for (name, kind) in [
        ("paddle", SourceKind::Paddle),
        ("lemonsqueezy", SourceKind::LemonSqueezy),
        ("stripe", SourceKind::Stripe),
    ] {
        worker.sources.insert(
            name.into(),
            shared::handlers::worker::WorkerSource {
                kind,
                livemode: None,
                reads: Some(Box::new(objects.clone())),
            },
        );
    }
    worker
}

static CASE: AtomicUsize = AtomicUsize::new(0);

async fn check(
    pool: &PgPool,
    worker: &WorkerState,
    objects: &CaseObjects,
    case: &Case,
) -> Result<(), TestCaseError> {
    let n = CASE.fetch_add(1, Ordering::Relaxed);
    let (canon, shuffled) = (format!("k{n}"), format!("s{n}"));

    // The reference: each event once, in provider-time order (ties by dedupe key).
    let mut reference: Vec<Materialized> = case
        .events
        .iter()
        .enumerate()
        .map(|(i, e)| materialize(i, e, &canon))
        .collect();
    objects.show(&reference);
    objects.show_summaries(&case.events, &canon);
    objects.list_for(&canon);
    reference.sort_by(|a, b| (a.at, &a.dedupe_key).cmp(&(b.at, &b.dedupe_key)));
    for m in &reference {
        let id = store(pool, m).await;
        process(worker, id).await?;
        apply_swept_reads(pool, worker, &canon).await?;
    }

    // The same set delivered shuffled, with copies and failures.
    let events: Vec<Materialized> = case
        .events
        .iter()
        .enumerate()
        .map(|(i, e)| materialize(i, e, &shuffled))
        .collect();
    objects.show(&events);
    objects.show_summaries(&case.events, &shuffled);
    objects.list_for(&shuffled);
    let mut ids = Vec::new();
    for delivery in &case.deliveries {
        let id = store(pool, &events[delivery.index]).await;
        ids.push(id);
        // One attempt now, as the message for this delivery would bring; it fails before
        // its write when the case says so.
        let fails = match delivery.fail {
            true => 1,
            false => 0,
        };
        let fault = Fault::new(Point::WorkerDecided, FaultAction::Fail(fails));
        let attempt = shared::handlers::worker::process_event(worker, id);
        with_interrupts(fault, attempt).await.unwrap();
    }
    // Then the retries, until every event is final, and the sweeps' reads, as the rescue
    // sends them.
    for id in ids {
        process(worker, id).await?;
    }
    apply_swept_reads(pool, worker, &shuffled).await?;

    let expected = state_of(pool, worker, &canon).await;
    let actual = state_of(pool, worker, &shuffled).await;
    prop_assert_eq!(actual, expected);
    // In both, each customer's summary register is what Stripe lists, its latest
    // summary's set, whatever the keys of two summaries of one second say.
    for ns in [&canon, &shuffled] {
        summaries_are_stripes_lists(pool, objects, case, ns).await?;
    }
    Ok(())
}

/// Each Stripe customer's summary register holds the set Stripe lists for it (a deleted
/// customer's, which its later summaries do not move, aside).
async fn summaries_are_stripes_lists(
    pool: &PgPool,
    objects: &CaseObjects,
    case: &Case,
    ns: &str,
) -> Result<(), TestCaseError> {
    for customer in 0..CUSTOMERS {
        let deleted = case.events.iter().any(
            |e| matches!(e, Event::StripeCustomerDeleted { customer: c, .. } if *c == customer),
        );
        let id = customer_id(customer, ns);
        let Some(listed) = objects.listed(&id).filter(|_| !deleted) else {
            continue;
        };
        let held: Option<Value> = sqlx::query_scalar(
            "SELECT features FROM entitlements WHERE source = 'stripe' AND customer_id = $1
               AND grant_id = 'active_entitlement_summary'",
        )
        .bind(&id)
        .fetch_optional(pool)
        .await
        .unwrap();
        let lookup_keys: serde_json::Map<String, Value> = listed["entitlements"]["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["lookup_key"].as_str().unwrap().to_owned(), json!(true)))
            .collect();
        prop_assert_eq!(held, Some(Value::Object(lookup_keys)), "customer {}", id);
    }
    Ok(())
}

#[test]
fn billing_state_is_the_same_for_every_order_copies_and_failures() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (pool, database) = runtime.block_on(crate::helpers::fresh_database());
    let objects = CaseObjects::default();
    let worker = reading_worker(pool.clone(), &objects);
    let cases = std::env::var("INBOX_PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&case_strategy_with_grants(), |case| {
        runtime.block_on(check(&pool, &worker, &objects, &case))
    });
    runtime.block_on(crate::helpers::drop_database(pool, &database));
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// A payment that takes its subscription's plan, delivered before the subscription's only
/// event (a month earlier), ends as in provider order: its worker reads the subscription
/// (Paddle's renewal of a price the catalog does not know, a Lemon Squeezy invoice). Without
/// the read it granted nothing in its month (docs/design.md §6.4, §6.5).
#[test]
fn a_payment_before_its_subscription_ends_as_in_provider_order() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (pool, database) = runtime.block_on(crate::helpers::fresh_database());
    let objects = CaseObjects::default();
    let worker = reading_worker(pool.clone(), &objects);
    let paddle = vec![
        Event::PaddleSubscription {
            customer: 0,
            sub: 1,
            status: "active",
            price: "team",
            ends: 0,
            at: 0,
        },
        Event::PaddleTransaction {
            customer: 0,
            txn: 1,
            price: "pri_legacy",
            outcome: 0,
            at: 30,
        },
    ];
    let lemonsqueezy = vec![
        Event::LsSubscription {
            customer: 1,
            sub: 1,
            status: "active",
            ends: 0,
            at: 0,
        },
        Event::LsInvoice {
            customer: 1,
            invoice: 1,
            outcome: 0,
            at: 30,
        },
    ];
    let payment_first = || [1, 0].map(|index| Delivery { index, fail: false }).to_vec();
    let result = runtime.block_on(async {
        for events in [paddle, lemonsqueezy] {
            let case = Case {
                events,
                deliveries: payment_first(),
            };
            check(&pool, &worker, &objects, &case).await?;
        }
        Ok::<(), TestCaseError>(())
    });
    runtime.block_on(crate::helpers::drop_database(pool, &database));
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// A Stripe subscription's change near the end of a month and Stripe's notice that it failed
/// to generate events early in the next, the notice delivered first: its sweep finds no
/// register, while in provider order it finds the register showing what Stripe lists. The
/// sweep stores the same reads either way, so the state is the same (docs/design.md §6.2).
#[test]
fn a_sweep_before_the_change_it_lists_ends_as_in_provider_order() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (pool, database) = runtime.block_on(crate::helpers::fresh_database());
    let objects = CaseObjects::default();
    let worker = reading_worker(pool.clone(), &objects);
    // 73 h apart from March 1: `at` 9 is March 28, 10 is March 31, 11 is April 3.
    let events = vec![
        Event::StripeSubscription {
            customer: 0,
            sub: 0,
            status: "active",
            plan: "price_pro",
            ends: 0,
            basil: true,
            at: 10,
        },
        Event::StripeHealthNotice { at: 11 },
    ];
    let notice_first = [1, 0].map(|index| Delivery { index, fail: false }).to_vec();
    let result = runtime.block_on(async {
        let case = Case {
            events,
            deliveries: notice_first,
        };
        check(&pool, &worker, &objects, &case).await?;
        let swept: i64 =
            sqlx::query_scalar("SELECT count(*) FROM inbox_events WHERE dedupe_key LIKE 'read:%'")
                .fetch_one(&pool)
                .await
                .unwrap();
        prop_assert_eq!(swept, 2, "a read of the subscription in each order");
        Ok::<(), TestCaseError>(())
    });
    runtime.block_on(crate::helpers::drop_database(pool, &database));
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// The property's Paddle events are read and applied as Paddle's own would be: none is
/// unprocessable, so the property compares real Paddle state.
#[test]
fn the_propertys_paddle_events_are_applied() {
    let catalog = shared::domain::Catalog::parse(crate::helpers::PLANS).unwrap();
    let events = [
        Event::PaddleSubscription {
            customer: 0,
            sub: 1,
            status: "trialing",
            price: "pro",
            ends: 3,
            at: 2,
        },
        Event::PaddleSubscription {
            customer: 0,
            sub: 1,
            status: "active",
            price: "team",
            ends: 1,
            at: 3,
        },
        Event::PaddleSubscription {
            customer: 0,
            sub: 1,
            status: "canceled",
            price: "team",
            ends: 2,
            at: 4,
        },
        Event::PaddleTransaction {
            customer: 0,
            txn: 1,
            price: "pri_legacy",
            outcome: 0,
            at: 5,
        },
        Event::PaddleTransaction {
            customer: 0,
            txn: 1,
            price: "pro",
            outcome: 1,
            at: 5,
        },
        Event::PaddleTransaction {
            customer: 0,
            txn: 1,
            price: "pro",
            outcome: 2,
            at: 6,
        },
    ];
    for (index, event) in events.iter().enumerate() {
        let m = materialize(index, event, "t");
        assert_eq!(m.source, "paddle");
        let meta = m.verified.meta.as_ref().unwrap();
        assert_eq!(meta.customer.as_ref().unwrap().as_str(), "c0_t");
        let payload = m.verified.payload.as_ref().unwrap();
        let decision = shared::providers::decide(
            shared::domain::SourceKind::Paddle,
            &meta.event_type,
            payload,
            &catalog,
        );
        assert!(
            matches!(decision, shared::billing::Decision::Apply { .. }),
            "{event:?}: {decision:?}"
        );
    }
}

/// The property's Lemon Squeezy events are read and applied as Lemon Squeezy's own would be:
/// none is unprocessable, so the property compares real Lemon Squeezy state.
#[test]
fn the_propertys_lemonsqueezy_events_are_applied() {
    let catalog = shared::domain::Catalog::parse(crate::helpers::PLANS).unwrap();
    let mut events: Vec<Event> = ["on_trial", "active", "paused", "past_due", "unpaid"]
        .into_iter()
        .chain(["cancelled", "expired"])
        .enumerate()
        .map(|(n, status)| Event::LsSubscription {
            customer: 0,
            sub: (n % 2) as u8,
            status,
            ends: (n % 4) as u8,
            at: n as u32,
        })
        .collect();
    events.extend((0..3).map(|outcome| Event::LsInvoice {
        customer: 0,
        invoice: 1,
        outcome,
        at: 8,
    }));
    events.extend([false, true].map(|refunded| Event::LsOrder {
        customer: 0,
        order: 1,
        variant: LS_VARIANTS[1],
        refunded,
        at: 9,
    }));
    for (index, event) in events.iter().enumerate() {
        let m = materialize(index, event, "t");
        assert_eq!(m.source, "lemonsqueezy");
        let meta = m.verified.meta.as_ref().unwrap();
        assert_eq!(meta.customer.as_ref().unwrap().as_str(), "c0_t");
        assert_eq!(meta.occurred_at.as_datetime(), m.at);
        let payload = m.verified.payload.as_ref().unwrap();
        let decision = shared::providers::decide(
            SourceKind::LemonSqueezy,
            &meta.event_type,
            payload,
            &catalog,
        );
        assert!(
            matches!(decision, shared::billing::Decision::Apply { .. }),
            "{event:?}: {decision:?}"
        );
    }
}
