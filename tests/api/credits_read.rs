//! The credits read (docs/api.md, docs/design.md §4.14): `GET …/credits` as of a time, the
//! account read's `credits` and `why`'s events behind each balance, through the real api
//! handler on real Postgres, every answer checked against docs/openapi.yaml by `call`.
//!
//! The grants arrive as Stripe delivers them (the `testdata/providers/stripe/credits/` corpus,
//! through intake and worker, which stores their register and ledger rows); a pack arrives as
//! the paid Stripe invoice that buys it.

use http::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::app_api::{api_state, call, APP_KEY, READER_KEY};
use crate::helpers::*;

const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/testdata/providers/stripe/credits"
);
const CUSTOMER: &str = "cus_CreditCust0001";
const GRANT: &str = "credgr_test_61CrdGrant01QxW3mR8tYb2Lp5";

/// The corpus's event file `name`, as Stripe sent it.
fn corpus_event(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{CORPUS}/{name}")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Delivers the corpus file `name` through intake and worker, which stores its register or
/// ledger row; returns the stored event's id.
async fn deliver(app: &TestApp, name: &str) -> i64 {
    let event = corpus_event(name);
    let (status, answer) = app.post("stripe", &stripe_delivery(&event)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.run_worker().await;
    answer["event_id"].as_i64().unwrap()
}

/// The corpus's grant (1000 usd for metered prices, expiring 2026-02-01), its
/// `credits_granted`, a later snapshot, 300 applied, and Stripe's expiry of the 700 left.
const WHOLE: [&str; 5] = [
    "1-billing.credit_grant.created.json",
    "2-billing.credit_balance_transaction.created.granted.json",
    "3-billing.credit_grant.updated.json",
    "4-billing.credit_balance_transaction.created.applied.json",
    "5-billing.credit_balance_transaction.created.expired.json",
];

fn credits_path(at: Option<&str>) -> String {
    match at {
        Some(at) => format!("/v1/accounts/stripe/{CUSTOMER}/credits?at={at}"),
        None => format!("/v1/accounts/stripe/{CUSTOMER}/credits"),
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_stripe_grant_reads_as_its_balance_as_of_each_time_asked(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    for name in WHOLE {
        deliver(&app, name).await;
    }
    let state = api_state(&pool);

    // Before the application: the whole grant, told by Stripe's own credits_granted.
    let read = call(
        &state,
        "GET",
        &credits_path(Some("2026-01-10T00:00:00Z")),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    assert_eq!(read.body["at"], "2026-01-10T00:00:00Z");
    assert_eq!(
        read.body["balances"],
        json!([{"unit": "usd", "scope": "price_type:metered", "available": "1000",
                "granted": "1000", "used": "0", "expired": "0"}])
    );
    let grant = &read.body["grants"][0];
    assert_eq!(grant["grant_id"], GRANT);
    assert_eq!(grant["origin"], "stripe_credit_grant");
    assert_eq!(
        (grant["amount"].as_str(), grant["remaining"].as_str()),
        (Some("1000"), Some("1000"))
    );
    assert_eq!(grant["expires_at"], "2026-02-01T00:00:00Z");
    assert_eq!(grant["provisional"], false);

    // After 300 applied on 2026-01-16.
    let read = call(
        &state,
        "GET",
        &credits_path(Some("2026-01-20T00:00:00Z")),
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(read.body["balances"][0]["available"], "700");
    assert_eq!(read.body["balances"][0]["used"], "300");
    assert_eq!(read.body["grants"][0]["remaining"], "700");

    // After the expiry, and by default (now): Stripe's credits_expired took the 700, once.
    for at in [Some("2026-02-02T00:00:00Z"), None] {
        let read = call(
            &state,
            "GET",
            &credits_path(at),
            Some(READER_KEY),
            &[],
            None,
        )
        .await;
        assert_eq!(
            read.body["balances"],
            json!([{"unit": "usd", "scope": "price_type:metered", "available": "0",
                    "granted": "1000", "used": "300", "expired": "700"}]),
            "{at:?}"
        );
        assert_eq!(read.body["grants"][0]["remaining"], "0");
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_grant_stripe_has_not_told_the_end_of_shows_its_provisional_expiry(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    // The grant and 300 applied; Stripe's own expiry is not stored yet.
    for name in &WHOLE[..4] {
        deliver(&app, name).await;
    }
    let state = api_state(&pool);
    let read = call(
        &state,
        "GET",
        &credits_path(Some("2026-03-01T00:00:00Z")),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(read.body["balances"][0]["expired"], "700");
    assert_eq!(read.body["balances"][0]["available"], "0");
    assert_eq!(read.body["grants"][0]["provisional"], true);
    // Stripe's word replaces the provisional expiry and never adds to it.
    deliver(&app, WHOLE[4]).await;
    let read = call(
        &state,
        "GET",
        &credits_path(Some("2026-03-01T00:00:00Z")),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(read.body["balances"][0]["expired"], "700");
    assert_eq!(read.body["grants"][0]["provisional"], false);
}

/// A pool on the same database whose store clock (`inbox_now()`) reads `at`.
fn clocked_at(pool: &PgPool, at: &str) -> PgPool {
    let offset = chrono::DateTime::parse_from_rfc3339(at)
        .unwrap()
        .timestamp()
        - chrono::Utc::now().timestamp();
    let options = pool
        .connect_options()
        .as_ref()
        .clone()
        .options([("inbox.clock_offset_secs", offset.to_string())]);
    sqlx::postgres::PgPoolOptions::new().connect_lazy_with(options)
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_account_read_carries_the_balances_of_the_credits_read_as_of_the_stores_clock(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    for name in &WHOLE[..4] {
        deliver(&app, name).await;
    }
    let account_path = format!("/v1/accounts/stripe/{CUSTOMER}");
    // Now (2026-12 or later): the grant ended on 2026-02-01.
    let state = api_state(&pool);
    let account = call(&state, "GET", &account_path, Some(READER_KEY), &[], None).await;
    assert_eq!(account.status, StatusCode::OK, "{}", account.body);
    let credits = call(
        &state,
        "GET",
        &credits_path(None),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(account.body["credits"], credits.body["balances"]);
    assert_eq!(
        account.body["credits"][0]["available"], "0",
        "expired by now"
    );
    // With the store's clock on 2026-01-20, both read the 700 left.
    let state = api_state(&clocked_at(&pool, "2026-01-20T00:00:00Z"));
    let account = call(&state, "GET", &account_path, Some(READER_KEY), &[], None).await;
    let credits = call(
        &state,
        "GET",
        &credits_path(None),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(account.body["credits"], credits.body["balances"]);
    assert_eq!(account.body["credits"][0]["available"], "700");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn why_names_the_event_behind_each_grant_and_each_transaction_counted(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let mut ids = Vec::new();
    for name in WHOLE {
        ids.push(deliver(&app, name).await);
    }
    let state = api_state(&pool);
    let why = call(
        &state,
        "GET",
        &format!("/v1/accounts/stripe/{CUSTOMER}/why?at=2026-01-20T00:00:00Z"),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(why.status, StatusCode::OK, "{}", why.body);
    let balance = &why.body["credits"][0];
    assert_eq!(
        (balance["unit"].as_str(), balance["available"].as_str()),
        (Some("usd"), Some("700"))
    );
    let named: Vec<(i64, Option<&str>)> = balance["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["event_id"].as_i64().unwrap(),
                e["transaction_id"].as_str(),
            )
        })
        .collect();
    // The register holds the later snapshot's event; the expiry after `at` is not counted.
    assert_eq!(
        named,
        vec![
            (ids[2], None),
            (ids[1], Some("cbtxn_test_61CrdTxn01Granted0001")),
            (ids[3], Some("cbtxn_test_61CrdTxn02Applied0001")),
        ]
    );
    assert_eq!(balance["events"][0]["type"], "billing.credit_grant.updated");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_unknown_account_and_a_bad_time_are_refused_as_the_other_reads_refuse_them(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    deliver(&app, WHOLE[0]).await;
    let state = api_state(&pool);
    let unknown = call(
        &state,
        "GET",
        "/v1/accounts/stripe/cus_nobody/credits",
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    let account = call(
        &state,
        "GET",
        "/v1/accounts/stripe/cus_nobody",
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(
        unknown.body, account.body,
        "the same 404 as the account read"
    );
    let bad = call(
        &state,
        "GET",
        &credits_path(Some("yesterday")),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.body["code"], "bad_time");
    let misspelt = call(
        &state,
        "GET",
        &format!("/v1/accounts/stripe/{CUSTOMER}/credits?as_of=2026-01-01T00:00:00Z"),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(misspelt.body["code"], "unknown_parameter");
    let nobody = call(&state, "GET", &credits_path(None), None, &[], None).await;
    assert_eq!(nobody.status, StatusCode::UNAUTHORIZED);
    let posted = call(
        &state,
        "POST",
        &credits_path(None),
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(posted.status, StatusCode::METHOD_NOT_ALLOWED);
    // An account with no grant has no balance, not an error.
    crate::app_api::on_pro(&app, "kc_nocredit").await;
    let none = call(
        &state,
        "GET",
        "/v1/accounts/kinde/kc_nocredit/credits",
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(none.status, StatusCode::OK);
    assert_eq!(none.body["balances"], json!([]));
    assert_eq!(none.body["grants"], json!([]));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_read_counts_what_the_apps_debits_took_from_a_pack(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    app.worker.catalog = shared::domain::Catalog::parse(
        r#"{"price_1ReadPack01": {"credits": {"amount": 300}},
            "free": {"plan": "free", "monthly_allowance": 0}}"#,
    )
    .unwrap();
    let customer = "cus_ReadPack01";
    let bought = chrono::Utc::now().timestamp() - 3600;
    let paid =
        crate::credits_debit::pack_invoice(customer, "in_1ReadA", "price_1ReadPack01", 1, bought);
    let (status, answer) = app.post("stripe", &stripe_delivery(&paid)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.run_worker().await;
    // 100 past the allowance (none): all of it from the pack.
    let id = shared::domain::CustomerId::parse(customer).unwrap();
    let request = shared::billing::usage::DebitRequest::checked(
        "stripe",
        &id,
        "read-1",
        100,
        None,
        None,
        None,
        &shared::domain::Period::current(),
    )
    .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let debited = shared::billing::usage::debit(&mut conn, &request)
        .await
        .unwrap();
    assert!(matches!(
        debited.debit,
        shared::billing::usage::Debit::Accepted { .. }
    ));
    let state = api_state(&pool);
    let path = format!("/v1/accounts/stripe/{customer}/credits");
    let read = call(&state, "GET", &path, Some(READER_KEY), &[], None).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    let balance = &read.body["balances"][0];
    assert_eq!(
        (&balance["granted"], &balance["used"], &balance["available"]),
        (&json!("300"), &json!("100"), &json!("200")),
        "{}",
        read.body
    );
    assert_eq!(read.body["grants"][0]["remaining"], "200");
    let account_path = format!("/v1/accounts/stripe/{customer}");
    let account = call(&state, "GET", &account_path, Some(READER_KEY), &[], None).await;
    assert_eq!(account.body["credits"], read.body["balances"]);
}

/// Debits `amount` of `customer`'s credits in `period`, under `key`; it must be accepted.
async fn debit_in(pool: &PgPool, customer: &str, key: &str, amount: i64, period: &str) {
    let id = shared::domain::CustomerId::parse(customer).unwrap();
    let request = shared::billing::usage::DebitRequest::checked(
        "stripe",
        &id,
        key,
        amount,
        Some(period),
        None,
        None,
        &shared::domain::Period::current(),
    )
    .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let debited = shared::billing::usage::debit(&mut conn, &request)
        .await
        .unwrap();
    assert!(
        matches!(
            debited.debit,
            shared::billing::usage::Debit::Accepted { .. }
        ),
        "{key}"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_read_of_many_debits_carries_only_those_that_reached_the_grants_and_stays_exact(
    pool: PgPool,
) {
    let mut app = TestApp::spawn(pool.clone()).await;
    // A price that gives a plan of 100 a month and a pack of 1000, and a pack that a debit
    // spends before it (priority 0).
    app.worker.catalog = shared::domain::Catalog::parse(
        r#"{"price_1ManyPlan": {"plan": "pro", "monthly_allowance": 100,
                                "credits": {"amount": 1000}},
            "price_1ManyFirst": {"credits": {"amount": 1000, "priority": 0}}}"#,
    )
    .unwrap();
    let customer = "cus_ManyDebits01";
    let bought = chrono::Utc::now().timestamp() - 7200;
    let paid =
        crate::credits_debit::pack_invoice(customer, "in_1ManyA", "price_1ManyPlan", 1, bought);
    let (status, answer) = app.post("stripe", &stripe_delivery(&paid)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.run_worker().await;
    let month =
        shared::domain::Period::of(chrono::DateTime::from_timestamp(bought, 0).unwrap().into());
    let (month, earlier) = (month.as_str(), "2020-01");
    // 300 debits of 1 to 3: every fifth in a month with no allowance (all of it past the
    // allowance), the others in the month of the plan's 100, whose debits reach the pack
    // once the 100 is spent (one of them part from the allowance, part from the pack).
    let mut reached = 0;
    let mut past = 0;
    let mut in_month = 0;
    for n in 0..300 {
        let amount = 1 + n % 3;
        let period = if n % 5 == 0 { earlier } else { month };
        debit_in(&pool, customer, &format!("many-{n}"), amount, period).await;
        let over = match period == month {
            true => {
                in_month += amount;
                (in_month - 100).max(0).min(amount)
            }
            false => amount,
        };
        past += over;
        reached += i64::from(over > 0);
    }
    assert!(reached < 300, "the allowance covered some debits");
    let state = api_state(&pool);
    let path = format!("/v1/accounts/stripe/{customer}/credits");
    let read = call(&state, "GET", &path, Some(READER_KEY), &[], None).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    let balance = &read.body["balances"][0];
    assert_eq!(
        (&balance["used"], &balance["available"]),
        (&json!(past.to_string()), &json!((1000 - past).to_string())),
        "{}",
        read.body
    );
    // The read's rows carry the debits that reached the grants, each with its part past the
    // allowance, and no other.
    let rows: Value = sqlx::query_scalar("SELECT inbox_account_credits('stripe', $1)")
        .bind(customer)
        .fetch_one(&pool)
        .await
        .unwrap();
    let debits = rows["debits"].as_array().unwrap();
    assert_eq!(debits.len() as i64, reached);
    let carried: i64 = debits.iter().map(|d| d["amount"].as_i64().unwrap()).sum();
    assert_eq!(carried, past);
    // A pack told late, bought before the debits and first in the burn order, takes every
    // one of them: the read shows it, as the whole derivation does.
    let first = crate::credits_debit::pack_invoice(
        customer,
        "in_1ManyB",
        "price_1ManyFirst",
        1,
        bought - 60,
    );
    let (status, answer) = app.post("stripe", &stripe_delivery(&first)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.run_worker().await;
    let read = call(&state, "GET", &path, Some(READER_KEY), &[], None).await;
    let remaining: Vec<(&str, &str)> = read.body["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["grant_id"].as_str().unwrap(),
                g["remaining"].as_str().unwrap(),
            )
        })
        .collect();
    let left = (1000 - past).to_string();
    assert_eq!(
        remaining,
        vec![
            ("pack:in_1ManyB:price_1ManyFirst", left.as_str()),
            ("pack:in_1ManyA:price_1ManyPlan", "1000"),
        ]
    );
    let id = shared::domain::CustomerId::parse(customer).unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let whole = shared::billing::usage::allocations(&mut conn, ("stripe", &id), "credits")
        .await
        .unwrap();
    let spent = shared::billing::credits::spent_by_grant(&whole);
    assert_eq!(
        spent
            .get("pack:in_1ManyB:price_1ManyFirst")
            .map(|q| q.to_string()),
        Some(past.to_string())
    );
    assert_eq!(spent.len(), 1);
    let account = call(
        &state,
        "GET",
        &format!("/v1/accounts/stripe/{customer}"),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(account.body["credits"], read.body["balances"]);
}
