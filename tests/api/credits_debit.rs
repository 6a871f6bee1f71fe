//! The app's debits burn the period's allowance, then credit grants in the burn order
//! (docs/design.md §4.10, §4.14): all or nothing, never past what is there under concurrency,
//! each answer naming what it took, and the check under the lock agreeing with the
//! derivation (`usage::allocations`) even after a grant told late that comes first.
//!
//! The grants are written by `grant_as_the_worker_stores_it`: the `credit_grants` row the
//! worker's commit writes for a catalog pack's paid payment (`credits::pack_grant`), until the
//! worker stores credits events.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use http::StatusCode;
use serde_json::{json, Value};
use shared::billing::credits::{self, Quantity, ALLOWANCE_UNIT};
use shared::billing::usage::{self, Debit, DebitPeriod, DebitRequest};
use shared::domain::{CustomerId, Period};
use sqlx::{PgConnection, PgPool};

use crate::app_api::{api_state, call, debit, on_pro, APP_KEY};
use crate::helpers::*;

/// A pack's grant as the worker stores it when the pack's payment is applied: the
/// `credit_grants` row of `credits::pack_grant` (origin `catalog_pack`, paid, scope `all`),
/// held by the account's latest event.
struct Pack {
    id: &'static str,
    amount: i64,
    priority: Option<i16>,
    category: &'static str,
    effective_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
}

impl Pack {
    fn paid(id: &'static str, amount: i64, priority: Option<i16>) -> Pack {
        Pack {
            id,
            amount,
            priority,
            category: "paid",
            effective_at: Utc::now() - Duration::days(1),
            expires_at: None,
        }
    }
}

async fn grant_as_the_worker_stores_it(pool: &PgPool, customer: &str, pack: &Pack) {
    sqlx::query(
        "INSERT INTO credit_grants (source, customer_id, grant_id, origin, unit, scope, amount,
                                    category, priority, created_at, effective_at, expires_at,
                                    version_at, version_key, event_id)
         SELECT 'kinde', $1, $2, 'catalog_pack', 'credits', 'all', $3, $4, $5, $6, $6, $7, $6,
                'evt_' || $2, (SELECT max(id) FROM inbox_events)",
    )
    .bind(customer)
    .bind(pack.id)
    .bind(pack.amount)
    .bind(pack.category)
    .bind(pack.priority)
    .bind(pack.effective_at)
    .bind(pack.expires_at)
    .execute(pool)
    .await
    .unwrap();
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
         WHERE source = 'kinde' AND customer_id = $1 AND unit = 'credits'",
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
    usage::allocations(&mut conn, ("kinde", &who), ALLOWANCE_UNIT)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn sixty_four_concurrent_debits_spanning_the_allowance_and_two_packs_never_overshoot(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_rush").await;
    grant_as_the_worker_stores_it(
        &pool,
        "kc_rush",
        &Pack::paid("pack:in_a:price_pack", 300, Some(10)),
    )
    .await;
    grant_as_the_worker_stores_it(
        &pool,
        "kc_rush",
        &Pack::paid("pack:in_b:price_pack", 200, None),
    )
    .await;
    // 500 of allowance and 500 of packs: 58 debits of 17 fit (986), the 59th would not.
    let states: Vec<_> = (0..8).map(|_| api_state(&pool)).collect();
    let answers = futures::future::join_all((0..64).map(|i| {
        let state = &states[i % states.len()];
        async move {
            debit(
                state,
                "kc_rush",
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
            ("pack:in_a:price_pack".to_string(), q(300)),
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
    let derivation = derived(&pool, "kc_rush").await;
    assert_eq!(derivation.len(), 58);
    assert_eq!(credits::spent_by_grant(&derivation), from_grants);
    assert_eq!(cached_spent(&pool, "kc_rush").await, from_grants);
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
        "/v1/accounts/kinde/kc_rush",
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
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_unit").await;
    grant_as_the_worker_stores_it(
        &pool,
        "kc_unit",
        &Pack::paid("pack:in_1:price_pack", 100, None),
    )
    .await;
    let state = api_state(&pool);

    let spanning = debit(
        &state,
        "kc_unit",
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
    let again = debit(&state, "kc_unit", "k-1", json!({"amount": 550})).await;
    assert!(again.replayed_header);
    assert_eq!(again.body["allocation"], spanning.body["allocation"]);
    // The same key in another unit is another request.
    let other = debit(
        &state,
        "kc_unit",
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
        "kc_unit",
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
        let refused = debit(&state, "kc_unit", "k-3", json!({"amount": 1, "unit": bad})).await;
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
        "/v1/accounts/kinde/kc_unit/usage",
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
    let null = debit(&state, "kc_unit", "k-3", json!({"amount": 1, "unit": null})).await;
    assert_eq!(null.body["code"], "null_field");
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM usage_debits WHERE idempotency_key = 'k-3'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, 0, "a refused request stores nothing under its key");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_debit_spends_only_grants_effective_and_not_ended_at_its_time_all_or_nothing(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_time").await;
    let now = Utc::now();
    let mut later = Pack::paid("pack:in_later:price_pack", 1000, Some(0));
    later.effective_at = now + Duration::days(1);
    let mut ended = Pack::paid("pack:in_ended:price_pack", 1000, Some(0));
    ended.effective_at = now - Duration::days(10);
    ended.expires_at = Some(now - Duration::days(1));
    let mut promo = Pack::paid("pack:in_promo:price_pack", 40, None);
    promo.category = "promotional";
    for pack in [
        later,
        ended,
        promo,
        Pack::paid("pack:in_paid:price_pack", 40, None),
    ] {
        grant_as_the_worker_stores_it(&pool, "kc_time", &pack).await;
    }
    let state = api_state(&pool);
    let too_much = debit(&state, "kc_time", "k-big", json!({"amount": 581})).await;
    assert_eq!(too_much.status, StatusCode::CONFLICT);
    assert_eq!(
        (&too_much.body["remaining"], &too_much.body["grants"]),
        (
            &json!(500),
            &json!([{"grant_id": "pack:in_promo:price_pack", "remaining": "40"},
                    {"grant_id": "pack:in_paid:price_pack", "remaining": "40"}])
        ),
        "promotional before paid; the grant not yet effective and the ended one spend nothing"
    );
    let read = call(
        &state,
        "GET",
        "/v1/accounts/kinde/kc_time",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(read.body["remaining"], 500, "a refusal takes nothing");
    let fits = debit(&state, "kc_time", "k-fits", json!({"amount": 560})).await;
    assert_eq!(
        taken(&fits.body),
        (
            500,
            vec![
                ("pack:in_promo:price_pack".to_string(), "40".to_string()),
                ("pack:in_paid:price_pack".to_string(), "20".to_string())
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
        source: "kinde",
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
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_late").await;
    grant_as_the_worker_stores_it(
        &pool,
        "kc_late",
        &Pack::paid("pack:in_paid:price_pack", 300, None),
    )
    .await;
    let who = CustomerId::parse("kc_late").unwrap();
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

    // Told after the debit: a promotional grant of priority 10, effective before the debit,
    // expiring within the hour. By the burn order the debit spent it, not the paid pack.
    let mut promo = Pack::paid("pack:in_promo:price_pack", 200, Some(10));
    promo.category = "promotional";
    promo.expires_at = Some(Utc::now() + Duration::hours(1));
    grant_as_the_worker_stores_it(&pool, "kc_late", &promo).await;

    // Two hours on, the promotional grant has ended with 100 unspent; the paid pack holds 300.
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
    let derivation = derived(&pool, "kc_late").await;
    let shape: Vec<Vec<(String, Quantity)>> = derivation
        .iter()
        .map(|d| d.allocation.from_grants.clone())
        .collect();
    assert_eq!(
        shape,
        [
            vec![("pack:in_promo:price_pack".to_string(), q(100))],
            vec![("pack:in_paid:price_pack".to_string(), q(250))],
        ],
        "the first debit's allocation moved to the grant that comes first; its answer stays"
    );
    assert_eq!(
        cached_spent(&pool, "kc_late").await,
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
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_back").await;
    grant_as_the_worker_stores_it(
        &pool,
        "kc_back",
        &Pack::paid("pack:in_1:price_pack", 100, None),
    )
    .await;
    let who = CustomerId::parse("kc_back").unwrap();
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
        ("kinde", &who),
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
    let derivation = derived(&pool, "kc_back").await;
    assert_eq!(
        derivation.len(),
        1,
        "a reversed debit counts in no allocation"
    );
    assert_eq!(
        cached_spent(&pool, "kc_back").await,
        credits::spent_by_grant(&derivation)
    );
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
