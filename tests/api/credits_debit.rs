//! The app's debits burn the period's allowance, then credit grants in the burn order
//! (docs/design.md §4.10, §4.14): all or nothing, never past what is there under concurrency,
//! each answer naming what it took, the check under the lock agreeing with the derivation
//! (`usage::allocations`) even after a grant told late that comes first, and `why` naming
//! each grant a debit took from as the derivation gives it.
//!
//! The account is a Stripe customer on pro (500 of allowance this month, its subscription's
//! event delivered signed through intake and worker), and its packs are bought as a user buys
//! them: a paid invoice of a pack's price, signed and delivered the same way, which the worker
//! mints into the pack's grant (`credits::pack_grant`, keyed by the invoice).

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use http::StatusCode;
use serde_json::{json, Value};
use shared::billing::credits::{self, Quantity, ALLOWANCE_UNIT};
use shared::billing::usage::{self, Debit, DebitPeriod, DebitRequest};
use shared::domain::{Catalog, CustomerId, Period};
use sqlx::{PgConnection, PgPool};

use crate::app_api::{api_state, call, APP_KEY, READER_KEY};
use crate::helpers::*;

/// The tests' plans (Stripe's `price_pro` is pro, 500 a month) and the packs Stripe prices buy:
/// 100 credits at the default priority, 100 spent first (priority 10), 100 spent first that
/// last a day, 1000 spent before anything (priority 0) that last 9 days, and 40 that last a
/// month or for ever.
fn catalog() -> Catalog {
    let mut entries: Value = serde_json::from_str(PLANS).unwrap();
    let packs = json!({
        "price_pack": {"credits": {"amount": 100}},
        "price_pack_first": {"credits": {"amount": 100, "priority": 10}},
        "price_pack_day": {"credits": {"amount": 100, "priority": 10, "expires_after_days": 1}},
        "price_pack_top": {"credits": {"amount": 1000, "priority": 0, "expires_after_days": 9}},
        "price_pack_40_month": {"credits": {"amount": 40, "expires_after_days": 30}},
        "price_pack_40": {"credits": {"amount": 40}},
    });
    for (key, entry) in packs.as_object().unwrap() {
        entries[key] = entry.clone();
    }
    Catalog::parse(&entries.to_string()).unwrap()
}

/// An app whose worker knows the packs, with `customer` put on Stripe's pro plan now (500 of
/// allowance this month) by its subscription's event.
async fn on_pro_with_packs(pool: &PgPool, customer: &str) -> TestApp {
    let mut app = TestApp::spawn(pool.clone()).await;
    app.worker.catalog = catalog();
    let subscribed = stripe_event(
        &format!("evt_{customer}_pro"),
        customer,
        Utc::now().timestamp(),
    );
    let (status, answer) = app.post("stripe", &stripe_delivery(&subscribed)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.run_worker().await;
    app
}

/// Buys `quantity` packs of `price` by the paid invoice `invoice` at `paid_at`, signed and
/// delivered through intake and worker; the stored event's id.
async fn buy(
    app: &TestApp,
    customer: &str,
    invoice: &str,
    (price, quantity): (&str, u32),
    paid_at: DateTime<Utc>,
) -> i64 {
    let paid = pack_invoice(customer, invoice, price, quantity, paid_at.timestamp());
    let (status, answer) = app.post("stripe", &stripe_delivery(&paid)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.run_worker().await;
    let event_id = answer["event_id"].as_i64().unwrap();
    let (outcome, minted): (String, bool) = sqlx::query_as(
        "SELECT status, EXISTS (SELECT 1 FROM credit_grants WHERE grant_id = $2)
         FROM inbox_events WHERE id = $1",
    )
    .bind(event_id)
    .bind(format!("pack:{invoice}:{price}"))
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((outcome.as_str(), minted), ("applied", true), "{invoice}");
    event_id
}

/// A debit through the app API (`POST /v1/accounts/stripe/{customer}/usage`).
async fn debit(
    state: &shared::handlers::api::ApiState,
    customer: &str,
    key: &str,
    body: Value,
) -> crate::app_api::Answer {
    call(
        state,
        "POST",
        &format!("/v1/accounts/stripe/{customer}/usage"),
        Some(APP_KEY),
        &[("idempotency-key", key)],
        Some(body),
    )
    .await
}

fn q(n: i64) -> Quantity {
    Quantity::whole(n)
}

/// The answer's allocation as (from the allowance, [(grant, amount)]).
fn taken(body: &Value) -> (i64, Vec<(String, String)>) {
    let a = &body["allocation"];
    assert_eq!(a["order_version"], 1, "{body}");
    let grants = a["from_grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["grant_id"].as_str().unwrap().to_owned(),
                g["amount"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (a["from_allowance"].as_i64().unwrap(), grants)
}

/// What `credit_spending` holds for the account's credits: the check's cache.
async fn cached_spent(pool: &PgPool, customer: &str) -> BTreeMap<String, Quantity> {
    let spent: Value = sqlx::query_scalar(
        "SELECT spent FROM credit_spending
         WHERE source = 'stripe' AND customer_id = $1 AND unit = 'credits'",
    )
    .bind(customer)
    .fetch_one(pool)
    .await
    .unwrap();
    spent
        .as_object()
        .unwrap()
        .iter()
        .map(|(grant, n)| (grant.clone(), Quantity::parse(&n.to_string()).unwrap()))
        .filter(|(_, n)| n.is_positive())
        .collect()
}

async fn derived(pool: &PgPool, customer: &str) -> Vec<credits::DebitAllocation> {
    let mut conn = pool.acquire().await.unwrap();
    let who = CustomerId::parse(customer).unwrap();
    usage::allocations(&mut conn, ("stripe", &who), ALLOWANCE_UNIT)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn sixty_four_concurrent_debits_spanning_the_allowance_and_two_packs_never_overshoot(
    pool: PgPool,
) {
    let app = on_pro_with_packs(&pool, "cus_Rush01").await;
    let yesterday = Utc::now() - Duration::days(1);
    // 300 spent first (priority 10), then 200.
    buy(
        &app,
        "cus_Rush01",
        "in_a",
        ("price_pack_first", 3),
        yesterday,
    )
    .await;
    buy(&app, "cus_Rush01", "in_b", ("price_pack", 2), yesterday).await;
    // 500 of allowance and 500 of packs: 58 debits of 17 fit (986), the 59th would not.
    let states: Vec<_> = (0..8).map(|_| api_state(&pool)).collect();
    let answers = futures::future::join_all((0..64).map(|i| {
        let state = &states[i % states.len()];
        async move {
            debit(
                state,
                "cus_Rush01",
                &format!("rush-{i}"),
                json!({"amount": 17}),
            )
            .await
        }
    }))
    .await;
    let accepted: Vec<&Value> = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .map(|a| &a.body)
        .collect();
    let refused = answers
        .iter()
        .filter(|a| a.status == StatusCode::CONFLICT && a.body["code"] == "allowance_exhausted")
        .count();
    assert_eq!((accepted.len(), refused), (58, 6));

    // Each answer adds up to its amount; all of them to what was there, never more.
    let mut from_allowance = 0;
    let mut from_grants: BTreeMap<String, Quantity> = BTreeMap::new();
    for body in &accepted {
        let (allowance, grants) = taken(body);
        let mut sum = q(allowance);
        from_allowance += allowance;
        for (grant, amount) in grants {
            let amount = Quantity::parse(&amount).unwrap();
            sum = sum + amount;
            *from_grants.entry(grant).or_default() =
                from_grants.get(&grant).copied().unwrap_or_default() + amount;
        }
        assert_eq!(sum, q(17), "{body}");
    }
    assert_eq!(from_allowance, 500);
    assert_eq!(
        from_grants,
        BTreeMap::from([
            ("pack:in_a:price_pack_first".to_string(), q(300)),
            ("pack:in_b:price_pack".to_string(), q(186)),
        ]),
        "the priority-10 pack first, then the other"
    );
    // A refusal says what remained of the allowance and of each grant.
    let refusal = answers
        .iter()
        .find(|a| a.status == StatusCode::CONFLICT)
        .unwrap();
    assert_eq!(refusal.body["remaining"], 0);
    assert_eq!(
        refusal.body["grants"],
        json!([{"grant_id": "pack:in_b:price_pack", "remaining": "14"}])
    );

    // The check's cache and the derivation agree, debit by debit and in sum.
    let derivation = derived(&pool, "cus_Rush01").await;
    assert_eq!(derivation.len(), 58);
    assert_eq!(credits::spent_by_grant(&derivation), from_grants);
    assert_eq!(cached_spent(&pool, "cus_Rush01").await, from_grants);
    let answered: BTreeMap<&str, &Value> = accepted
        .iter()
        .map(|b| (b["usage_id"].as_str().unwrap(), *b))
        .collect();
    for d in &derivation {
        let (allowance, grants) = taken(answered[d.usage_id.as_str()]);
        let grants: Vec<(String, Quantity)> = grants
            .into_iter()
            .map(|(g, n)| (g, Quantity::parse(&n).unwrap()))
            .collect();
        assert_eq!(
            (q(allowance), grants),
            (
                d.allocation.from_allowance,
                d.allocation.from_grants.clone()
            )
        );
        assert_eq!(d.unfunded, Quantity::ZERO);
    }
    let read = call(
        &states[0],
        "GET",
        "/v1/accounts/stripe/cus_Rush01",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        (read.body["used"].as_i64(), read.body["remaining"].as_i64()),
        (Some(986), Some(0)),
        "used counts every debit of the allowance's unit; the allowance has nothing left"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_debit_names_its_unit_and_the_same_key_in_another_unit_is_a_conflict(pool: PgPool) {
    let app = on_pro_with_packs(&pool, "cus_Unit01").await;
    let yesterday = Utc::now() - Duration::days(1);
    buy(&app, "cus_Unit01", "in_1", ("price_pack", 1), yesterday).await;
    let state = api_state(&pool);

    let spanning = debit(
        &state,
        "cus_Unit01",
        "k-1",
        json!({"amount": 550, "unit": "credits"}),
    )
    .await;
    assert_eq!(spanning.status, StatusCode::OK, "{}", spanning.body);
    assert_eq!(spanning.body["unit"], "credits");
    assert_eq!(
        taken(&spanning.body),
        (
            500,
            vec![("pack:in_1:price_pack".to_string(), "50".to_string())]
        )
    );
    // No unit named is the allowance's: the same request.
    let again = debit(&state, "cus_Unit01", "k-1", json!({"amount": 550})).await;
    assert!(again.replayed_header);
    assert_eq!(again.body["allocation"], spanning.body["allocation"]);
    // The same key in another unit is another request.
    let other = debit(
        &state,
        "cus_Unit01",
        "k-1",
        json!({"amount": 550, "unit": "usd"}),
    )
    .await;
    assert_eq!(
        (other.status, other.body["code"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("idempotency_conflict")
        )
    );
    // Another unit spends no allowance, and there is no grant of it.
    let usd = debit(
        &state,
        "cus_Unit01",
        "k-2",
        json!({"amount": 5, "unit": "usd"}),
    )
    .await;
    assert_eq!(
        (usd.status, usd.body["code"].as_str(), &usd.body["grants"]),
        (
            StatusCode::CONFLICT,
            Some("allowance_exhausted"),
            &json!([])
        )
    );
    for bad in [json!(""), json!("us d"), json!("crédits"), json!(7)] {
        let refused = debit(
            &state,
            "cus_Unit01",
            "k-3",
            json!({"amount": 1, "unit": bad}),
        )
        .await;
        assert_eq!(
            refused.status,
            StatusCode::BAD_REQUEST,
            "{bad}: {}",
            refused.body
        );
    }
    let listed = call(
        &state,
        "GET",
        "/v1/accounts/stripe/cus_Unit01/usage",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        listed.body["usage"][0]["unit"], "credits",
        "{}",
        listed.body
    );
    let null = debit(
        &state,
        "cus_Unit01",
        "k-3",
        json!({"amount": 1, "unit": null}),
    )
    .await;
    assert_eq!(null.body["code"], "null_field");
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM usage_debits WHERE idempotency_key = 'k-3'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, 0, "a refused request stores nothing under its key");
}

/// A Stripe Billing Credits grant of `cents` for `customer`, as Stripe sends its
/// `billing.credit_grant.created` (the corpus's, `testdata/providers/stripe/credits/`, for
/// metered prices): no expiry, Stripe's default priority, effective `from`.
fn stripe_grant(customer: &str, grant: &str, category: &str, cents: i64, from: i64) -> Value {
    let (_, mut created) = crate::corpus::corpus("stripe/credits")
        .into_iter()
        .find(|(n, _)| n.ends_with("billing.credit_grant.created"))
        .unwrap();
    created["id"] = json!(format!("evt_{grant}"));
    created["created"] = json!(from);
    let object = &mut created["data"]["object"];
    object["id"] = json!(grant);
    object["customer"] = json!(customer);
    object["category"] = json!(category);
    object["amount"]["monetary"]["value"] = json!(cents);
    object["priority"] = Value::Null;
    for at in ["created", "effective_at", "updated"] {
        object[at] = json!(from);
    }
    object["expires_at"] = Value::Null;
    created
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_debit_spends_only_grants_effective_and_not_ended_at_its_time_all_or_nothing(
    pool: PgPool,
) {
    let app = on_pro_with_packs(&pool, "cus_Time01").await;
    let now = Utc::now();
    // Spent before anything, but paid an hour from now (a provider's clock ahead) or ended
    // yesterday (paid ten days ago, lasting nine).
    buy(
        &app,
        "cus_Time01",
        "in_later",
        ("price_pack_top", 1),
        now + Duration::hours(1),
    )
    .await;
    buy(
        &app,
        "cus_Time01",
        "in_ended",
        ("price_pack_top", 1),
        now - Duration::days(10),
    )
    .await;
    // 40 that last a month, 40 for ever: the earlier expiry first.
    let yesterday = now - Duration::days(1);
    buy(
        &app,
        "cus_Time01",
        "in_month",
        ("price_pack_40_month", 1),
        yesterday,
    )
    .await;
    buy(
        &app,
        "cus_Time01",
        "in_paid",
        ("price_pack_40", 1),
        yesterday,
    )
    .await;
    let state = api_state(&pool);
    let too_much = debit(&state, "cus_Time01", "k-big", json!({"amount": 581})).await;
    assert_eq!(too_much.status, StatusCode::CONFLICT);
    assert_eq!(
        (&too_much.body["remaining"], &too_much.body["grants"]),
        (
            &json!(500),
            &json!([{"grant_id": "pack:in_month:price_pack_40_month", "remaining": "40"},
                    {"grant_id": "pack:in_paid:price_pack_40", "remaining": "40"}])
        ),
        "the earlier expiry first; the grant not yet effective and the ended one spend nothing"
    );
    let read = call(
        &state,
        "GET",
        "/v1/accounts/stripe/cus_Time01",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(read.body["remaining"], 500, "a refusal takes nothing");
    let fits = debit(&state, "cus_Time01", "k-fits", json!({"amount": 560})).await;
    assert_eq!(
        taken(&fits.body),
        (
            500,
            vec![
                (
                    "pack:in_month:price_pack_40_month".to_string(),
                    "40".to_string()
                ),
                ("pack:in_paid:price_pack_40".to_string(), "20".to_string())
            ]
        )
    );

    // Promotional before paid: a pack is always paid, so the pair is Stripe's, in cents, of
    // one priority and no expiry, delivered as Stripe sends them; no allowance in that unit.
    for (grant, category) in [("credgr_Paid01", "paid"), ("credgr_Promo01", "promotional")] {
        let created = stripe_grant("cus_Time01", grant, category, 40, yesterday.timestamp());
        let (status, answer) = app.post("stripe", &stripe_delivery(&created)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        app.run_worker().await;
    }
    let too_much = debit(
        &state,
        "cus_Time01",
        "k-usd-big",
        json!({"amount": 81, "unit": "usd"}),
    )
    .await;
    assert_eq!(
        (&too_much.body["remaining"], &too_much.body["grants"]),
        (
            &json!(0),
            &json!([{"grant_id": "credgr_Promo01", "remaining": "40"},
                    {"grant_id": "credgr_Paid01", "remaining": "40"}])
        ),
        "promotional before paid: {}",
        too_much.body
    );
    let fits = debit(
        &state,
        "cus_Time01",
        "k-usd-fits",
        json!({"amount": 60, "unit": "usd"}),
    )
    .await;
    assert_eq!(
        taken(&fits.body),
        (
            0,
            vec![
                ("credgr_Promo01".to_string(), "40".to_string()),
                ("credgr_Paid01".to_string(), "20".to_string())
            ]
        )
    );
}

async fn debit_at(
    conn: &mut PgConnection,
    customer: &CustomerId,
    key: &str,
    amount: i64,
    offset_secs: i64,
) -> Debit {
    sqlx::query("SELECT set_config('inbox.clock_offset_secs', $1, false)")
        .bind(offset_secs.to_string())
        .execute(&mut *conn)
        .await
        .unwrap();
    let request = DebitRequest {
        source: "stripe",
        customer,
        key,
        amount,
        period: DebitPeriod::Arrival(Period::current()),
        note: None,
        unit: ALLOWANCE_UNIT,
        effects: None,
        meter: None,
    };
    usage::debit(conn, &request).await.unwrap().debit
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_locked_check_agrees_with_the_derivation_after_a_late_grant_that_comes_first(
    pool: PgPool,
) {
    let app = on_pro_with_packs(&pool, "cus_Late01").await;
    let now = Utc::now();
    buy(
        &app,
        "cus_Late01",
        "in_paid",
        ("price_pack", 3),
        now - Duration::days(1),
    )
    .await;
    let who = CustomerId::parse("cus_Late01").unwrap();
    let mut conn = pool.acquire().await.unwrap();
    // 500 of allowance, then 100 of the paid pack.
    let first = debit_at(&mut conn, &who, "k-1", 600, 0).await;
    let Debit::Accepted {
        allocation: Some(first),
        ..
    } = first
    else {
        panic!("{first:?}")
    };
    assert_eq!(first.from_grants.len(), 1);
    assert_eq!(first.from_grants[0].grant_id, "pack:in_paid:price_pack");

    // Told after the debit (its payment's event came late): a pack of priority 10, paid 23
    // hours ago and lasting a day, so effective before the debit and ending within the hour.
    // By the burn order the debit spent it, not the other pack.
    let paid_at = now - Duration::hours(23);
    buy(
        &app,
        "cus_Late01",
        "in_first",
        ("price_pack_day", 2),
        paid_at,
    )
    .await;

    // Two hours on, the late pack has ended with 100 unspent; the other pack holds 300.
    let second = debit_at(&mut conn, &who, "k-2", 250, 7200).await;
    let Debit::Accepted {
        allocation: Some(second),
        ..
    } = second
    else {
        panic!("the paid pack holds 300 by the derivation: {second:?}")
    };
    assert_eq!(
        second
            .from_grants
            .iter()
            .map(|g| (g.grant_id.as_str(), g.amount.as_str()))
            .collect::<Vec<_>>(),
        [("pack:in_paid:price_pack", "250")]
    );
    let derivation = derived(&pool, "cus_Late01").await;
    let shape: Vec<Vec<(String, Quantity)>> = derivation
        .iter()
        .map(|d| d.allocation.from_grants.clone())
        .collect();
    assert_eq!(
        shape,
        [
            vec![("pack:in_first:price_pack_day".to_string(), q(100))],
            vec![("pack:in_paid:price_pack".to_string(), q(250))],
        ],
        "the first debit's allocation moved to the grant that comes first; its answer stays"
    );
    assert_eq!(
        cached_spent(&pool, "cus_Late01").await,
        credits::spent_by_grant(&derivation)
    );
    // 50 left in the paid pack, by the check and by the derivation.
    let over = debit_at(&mut conn, &who, "k-3", 51, 7200).await;
    assert!(matches!(over, Debit::Exhausted { .. }), "{over:?}");
    let rest = debit_at(&mut conn, &who, "k-4", 50, 7200).await;
    assert!(matches!(rest, Debit::Accepted { .. }), "{rest:?}");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_reversed_debit_gives_back_what_it_took_from_the_grants(pool: PgPool) {
    let app = on_pro_with_packs(&pool, "cus_Back01").await;
    buy(
        &app,
        "cus_Back01",
        "in_1",
        ("price_pack", 1),
        Utc::now() - Duration::days(1),
    )
    .await;
    let who = CustomerId::parse("cus_Back01").unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let Debit::Accepted { usage_id, .. } = debit_at(&mut conn, &who, "k-1", 600, 0).await else {
        panic!("500 of allowance and 100 of the pack")
    };
    assert!(matches!(
        debit_at(&mut conn, &who, "k-2", 1, 0).await,
        Debit::Exhausted { .. }
    ));
    let reversed = usage::reverse(
        &mut conn,
        ("stripe", &who),
        &usage_id,
        None,
        &Period::current(),
    )
    .await
    .unwrap();
    assert!(matches!(
        reversed.reversal,
        usage::Reversal::Reversed { .. }
    ));
    let again = debit_at(&mut conn, &who, "k-3", 600, 0).await;
    let Debit::Accepted {
        allocation: Some(again),
        ..
    } = again
    else {
        panic!("the reversal gave back the allowance and the pack: {again:?}")
    };
    assert_eq!((again.from_allowance, again.from_grants.len()), (500, 1));
    let derivation = derived(&pool, "cus_Back01").await;
    assert_eq!(
        derivation.len(),
        1,
        "a reversed debit counts in no allocation"
    );
    assert_eq!(
        cached_spent(&pool, "cus_Back01").await,
        credits::spent_by_grant(&derivation)
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn why_names_each_grant_a_debit_took_as_derived_not_as_answered(pool: PgPool) {
    let app = on_pro_with_packs(&pool, "cus_Why01").await;
    let now = Utc::now();
    let bought = buy(
        &app,
        "cus_Why01",
        "in_paid",
        ("price_pack", 3),
        now - Duration::days(1),
    )
    .await;
    let state = api_state(&pool);
    // Within the allowance: it takes no grant, so no balance names it.
    let small = debit(&state, "cus_Why01", "k-small", json!({"amount": 10})).await;
    assert_eq!(small.status, StatusCode::OK, "{}", small.body);
    // 490 of the allowance, then 110 of the only pack, as answered.
    let spanning = debit(&state, "cus_Why01", "k-span", json!({"amount": 600})).await;
    assert_eq!(
        taken(&spanning.body),
        (
            490,
            vec![("pack:in_paid:price_pack".to_string(), "110".to_string())]
        )
    );
    // A pack of priority 10 paid an hour ago, told after the debit: by the burn order the
    // debit took from it first.
    let late = buy(
        &app,
        "cus_Why01",
        "in_first",
        ("price_pack_first", 1),
        now - Duration::hours(1),
    )
    .await;
    let why = call(
        &state,
        "GET",
        "/v1/accounts/stripe/cus_Why01/why",
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(why.status, StatusCode::OK, "{}", why.body);
    let [balance] = why.body["credits"]
        .as_array()
        .unwrap()
        .clone()
        .try_into()
        .unwrap();
    assert_eq!(
        (&balance["unit"], &balance["used"], &balance["available"]),
        (&json!("credits"), &json!("110"), &json!("290"))
    );
    let [named] = balance["debits"]
        .as_array()
        .unwrap()
        .clone()
        .try_into()
        .unwrap();
    assert_eq!(named["usage_id"], spanning.body["usage_id"]);
    assert_eq!(
        (
            &named["amount"],
            &named["from_allowance"],
            &named["unfunded"]
        ),
        (&json!("600"), &json!("490"), &json!("0"))
    );
    assert_eq!(
        named["from_grants"],
        json!([
            {"grant_id": "pack:in_first:price_pack_first", "origin": "catalog_pack",
             "event_id": late, "amount": "100"},
            {"grant_id": "pack:in_paid:price_pack", "origin": "catalog_pack",
             "event_id": bought, "amount": "10"},
        ]),
        "each grant by its payment, and what the debit took of it as derived"
    );
    // The events behind the balance are the two payments.
    let events: Vec<i64> = balance["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_i64().unwrap())
        .collect();
    assert_eq!(events, [late, bought]);
    // Its answer stays as given.
    let again = debit(&state, "cus_Why01", "k-span", json!({"amount": 600})).await;
    assert_eq!(again.body["allocation"], spanning.body["allocation"]);
    // As of before the debits, no debit is named.
    let before = (now - Duration::minutes(30)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let cut = call(
        &state,
        "GET",
        &format!("/v1/accounts/stripe/cus_Why01/why?at={before}"),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(cut.status, StatusCode::OK, "{}", cut.body);
    assert_eq!(cut.body["credits"][0]["available"], "400");
    assert_eq!(cut.body["credits"][0]["debits"], json!([]));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn why_as_of_what_was_received_before_a_time_names_no_debit_accepted_after_it(pool: PgPool) {
    let app = on_pro_with_packs(&pool, "cus_Why02").await;
    buy(
        &app,
        "cus_Why02",
        "in_paid",
        ("price_pack", 3),
        Utc::now() - Duration::days(1),
    )
    .await;
    let state = api_state(&pool);
    // The allowance's 500, then 100 of the pack.
    let first = debit(&state, "cus_Why02", "k-first", json!({"amount": 600})).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    // The store's clock between the two debits: what it had received before then.
    let between: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&pool)
        .await
        .unwrap();
    // 50 more of the pack, accepted after that time.
    let after = debit(&state, "cus_Why02", "k-after", json!({"amount": 50})).await;
    assert_eq!(after.status, StatusCode::OK, "{}", after.body);
    let asked = between.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let why = call(
        &state,
        "GET",
        &format!(
            "/v1/accounts/stripe/cus_Why02/why?received_before={}",
            asked.replace('+', "%2B")
        ),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(why.status, StatusCode::OK, "{}", why.body);
    let balance = &why.body["credits"][0];
    let named: Vec<&Value> = balance["debits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["usage_id"])
        .collect();
    assert_eq!(
        named,
        [&first.body["usage_id"]],
        "only the debit the store had accepted before {asked}"
    );
    // Its balance counts what those debits took, as the store knew it then.
    assert_eq!(
        (&balance["used"], &balance["available"]),
        (&json!("100"), &json!("200"))
    );
    // Asked as of now, both are named.
    let now = call(
        &state,
        "GET",
        "/v1/accounts/stripe/cus_Why02/why",
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        now.body["credits"][0]["debits"].as_array().unwrap().len(),
        2
    );
    assert_eq!(now.body["credits"][0]["used"], "150");
}

/// A paid Stripe invoice of `quantity` of a catalog pack's price (the pre-basil corpus's
/// `invoice.paid`, its one line's price made the pack's), for `customer`, paid `at`.
pub fn pack_invoice(customer: &str, invoice: &str, price: &str, quantity: u32, at: i64) -> Value {
    let (_, mut paid) = crate::corpus::corpus("stripe/pre-basil")
        .into_iter()
        .find(|(n, _)| n == "invoice.paid")
        .unwrap();
    paid["id"] = json!(format!("evt_{invoice}"));
    paid["created"] = json!(at);
    let object = &mut paid["data"]["object"];
    object["id"] = json!(invoice);
    object["customer"] = json!(customer);
    object["created"] = json!(at);
    let line = &mut object["lines"]["data"][0];
    line["price"]["id"] = json!(price);
    line["quantity"] = json!(quantity);
    paid
}

/// The crossings written for an account, in the order written: (kind, crossed_at).
async fn crossings_of(pool: &PgPool, customer: &str) -> Vec<(String, Value)> {
    sqlx::query_as::<_, (String, Value)>(
        "SELECT kind, body FROM effects WHERE source = 'stripe' AND customer_id = $1
           AND kind IN ('billing.credits_low', 'billing.credits_depleted') ORDER BY sequence",
    )
    .bind(customer)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(kind, body)| (kind, body["data"]["crossed_at"].clone()))
    .collect()
}

/// A debit of `amount` credits with effects on, `offset_secs` from now on the store's clock;
/// its time in unix seconds, as the fold counts it.
async fn debit_told(
    conn: &mut PgConnection,
    catalog: &shared::domain::Catalog,
    customer: &CustomerId,
    key: &str,
    (amount, offset_secs): (i64, i64),
) -> i64 {
    sqlx::query("SELECT set_config('inbox.clock_offset_secs', $1, false)")
        .bind(offset_secs.to_string())
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut request = DebitRequest::checked(
        "stripe",
        customer,
        key,
        amount,
        None,
        None,
        None,
        &Period::current(),
    )
    .unwrap();
    request.effects = Some(catalog);
    let debited = usage::debit(conn, &request).await.unwrap();
    assert!(
        matches!(debited.debit, Debit::Accepted { .. }),
        "{:?}",
        debited.debit
    );
    sqlx::query_scalar(
        "SELECT inbox_secs(recorded_at) FROM usage_debits WHERE idempotency_key = $1",
    )
    .bind(key)
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_debit_crossing_the_low_level_tells_it_once_and_again_after_a_pack_rearms_it(
    pool: PgPool,
) {
    let mut app = TestApp::spawn(pool.clone()).await;
    let catalog = shared::domain::Catalog::parse(
        r#"{"price_1CwirePack01": {"credits": {"amount": 300}},
            "free": {"plan": "free", "monthly_allowance": 0, "credits_low": {"credits": 100}}}"#,
    )
    .unwrap();
    app.worker.catalog = catalog.clone();
    app.enable_effects().await;
    let customer = CustomerId::parse("cus_CwireLow01").unwrap();
    let now = Utc::now().timestamp();
    let deliver = |event: Value| {
        let app = &app;
        async move {
            let (status, answer) = app.post("stripe", &stripe_delivery(&event)).await;
            assert_eq!(status, StatusCode::OK, "{answer}");
            app.run_worker().await;
        }
    };
    deliver(pack_invoice(
        customer.as_str(),
        "in_1CwireA",
        "price_1CwirePack01",
        1,
        now - 3600,
    ))
    .await;
    let mut conn = pool.acquire().await.unwrap();
    // 300 → 50: below 100, told by the debit itself.
    let first = debit_told(&mut conn, &catalog, &customer, "low-1", (250, -1800)).await;
    let at = |secs: i64| {
        json!(DateTime::from_timestamp(secs, 0)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
    };
    assert_eq!(
        crossings_of(&pool, customer.as_str()).await,
        [("billing.credits_low".to_owned(), at(first))]
    );
    // The tick and a later event count the debit the same way: the same crossing, not again.
    shared::effects::credits::tick(&pool, &catalog, Utc::now())
        .await
        .unwrap();
    // A second pack brings 50 back to 350: re-armed, and its commit tells nothing new.
    deliver(pack_invoice(
        customer.as_str(),
        "in_1CwireB",
        "price_1CwirePack01",
        1,
        now - 1200,
    ))
    .await;
    assert_eq!(
        crossings_of(&pool, customer.as_str()).await,
        [("billing.credits_low".to_owned(), at(first))]
    );
    // 350 → 50 again: the next fall is told.
    let second = debit_told(&mut conn, &catalog, &customer, "low-2", (300, 0)).await;
    shared::effects::credits::tick(&pool, &catalog, Utc::now())
        .await
        .unwrap();
    assert_eq!(
        crossings_of(&pool, customer.as_str()).await,
        [
            ("billing.credits_low".to_owned(), at(first)),
            ("billing.credits_low".to_owned(), at(second)),
        ]
    );
}

/// A debit in another unit than the allowance's never counted in its period's `used`, so its
/// reversal gives nothing back to the allowance: the period's `used` stays what the
/// allowance's own debits spent.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn reversing_a_debit_of_another_unit_leaves_the_allowance_as_it_was(pool: PgPool) {
    let app = on_pro_with_packs(&pool, "cus_RevUsd01").await;
    let yesterday = Utc::now() - Duration::days(1);
    let created = stripe_grant(
        "cus_RevUsd01",
        "credgr_RevUsd01",
        "paid",
        40,
        yesterday.timestamp(),
    );
    let (status, answer) = app.post("stripe", &stripe_delivery(&created)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.run_worker().await;
    let state = api_state(&pool);

    let credits = debit(&state, "cus_RevUsd01", "k-credits", json!({"amount": 100})).await;
    assert_eq!(credits.status, StatusCode::OK, "{}", credits.body);
    let usd = debit(
        &state,
        "cus_RevUsd01",
        "k-usd",
        json!({"amount": 30, "unit": "usd"}),
    )
    .await;
    assert_eq!(usd.status, StatusCode::OK, "{}", usd.body);
    assert_eq!(usd.body["used"], 100, "a usd debit spends no allowance");

    let usage_id = usd.body["usage_id"].as_str().unwrap();
    let reversed = call(
        &state,
        "POST",
        &format!("/v1/accounts/stripe/cus_RevUsd01/usage/{usage_id}/reversal"),
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(reversed.status, StatusCode::OK, "{}", reversed.body);
    assert_eq!(
        (&reversed.body["used"], &reversed.body["remaining"]),
        (&json!(100), &json!(400)),
        "{}",
        reversed.body
    );
    let read = call(
        &state,
        "GET",
        "/v1/accounts/stripe/cus_RevUsd01",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        (&read.body["used"], &read.body["remaining"]),
        (&json!(100), &json!(400)),
        "{}",
        read.body
    );
    // The allowance holds 400, not 430: a debit of 401 is refused.
    let over = debit(&state, "cus_RevUsd01", "k-over", json!({"amount": 401})).await;
    assert_eq!(over.status, StatusCode::CONFLICT, "{}", over.body);
}
