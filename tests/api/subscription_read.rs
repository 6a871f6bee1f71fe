//! An invoice whose lines name no known price, arriving before any event of its subscription
//! (docs/design.md §6.2): the worker reads the subscription from a fake Stripe API (wiremock)
//! with the source's key, stores the read as an event of its own, and grants the plan the
//! read shows. The invoice is the endive corpus's, its lines stripped of their price.

use serde_json::Value;
use shared::handlers::worker::{process_event, Processed};
use sqlx::PgPool;
use wiremock::MockServer;

use crate::corpus::{
    corpus, corpus_app, payments, renewal_without_price, send_one, ACCOUNT_CUSTOMER,
};
use crate::helpers::*;
use crate::thin::StripeApi;
use crate::traffic::with_stripe_api;
use provider_fakes::stripe::Fault;
use provider_fakes::stripe::On;

const SUB: &str = "sub_1EndiveSub00001";
const CUSTOMER: &str = "cus_EndiveCust001";
/// The renewal's event id (`renewal_without_price`).
const RENEWAL: &str = "evt_1Sk9Y5E6qL1xZc8Jr3Nw8Kp2";

/// The key the read of the renewal's subscription is stored under.
fn read_key() -> String {
    format!("read:{RENEWAL}:{SUB}")
}

/// The subscription as the endive corpus's `customer.subscription.updated` shows it: active,
/// on the pro price.
fn subscription() -> Value {
    let (_, event) = corpus("stripe/endive")
        .into_iter()
        .find(|(name, _)| name == "customer.subscription.updated")
        .unwrap();
    event["data"]["object"].clone()
}

/// A corpus app whose worker reads Stripe at a fresh fake API.
async fn app_with_api(pool: PgPool) -> (TestApp, StripeApi) {
    let mut app = corpus_app(pool).await;
    let api = StripeApi::start().await;
    with_stripe_api(&mut app.worker, &api);
    (app, api)
}

async fn requests(api: &MockServer) -> usize {
    api.received_requests().await.unwrap().len()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_invoice_before_its_subscription_reads_it_from_the_provider_and_grants_its_plan(
    pool: PgPool,
) {
    let (app, api) = app_with_api(pool).await;
    api.fake.holds(subscription());
    let reason = send_one(&app, "stripe", "renewal", &renewal_without_price(SUB)).await;
    // Read with the source's key, in the API version the reads are written against.
    let read = &api.received_requests().await.unwrap()[0];
    assert_eq!(read.headers["Stripe-Version"], "2025-03-31.basil");
    assert_eq!(read.headers["Authorization"], "Bearer sk_test_reads");
    assert!(
        reason.contains(&format!(
            "plan pro from subscription {SUB} as the provider shows it (read, event "
        )),
        "{reason}"
    );
    let account = app.account("stripe", CUSTOMER, "2026-01").await;
    assert_eq!(account.balance, 500, "the pro allowance for 2026-01");
    assert_eq!(payments(&account), vec![("in_1EndiveInv00003", "paid")]);
    assert_eq!(requests(&api).await, 1);

    // The read is an event of its own: the subscription's snapshot at the invoice's time, sent
    // after the invoice's commit and applied by the worker as the queue drained.
    let read_id = app.event_id("stripe", &read_key()).await;
    let read = app.event(read_id).await;
    assert_eq!(read.event_type, "customer.subscription.updated");
    assert_eq!(read.customer_key.as_deref(), Some(CUSTOMER));
    assert_eq!(
        read.occurred_at.map(|t| t.timestamp()),
        Some(1_767_225_601),
        "the invoice's time"
    );
    assert_eq!(read.status, "applied");

    // A replay of the invoice applies the stored read: no second request, nothing new.
    let invoice = app.event_id("stripe", RENEWAL).await;
    shared::inbox::replay::replay(&app.pool, &app.state.queue, &[invoice])
        .await
        .unwrap();
    app.run_worker().await;
    assert_eq!(requests(&api).await, 1, "the replay reads nothing");
    let account = app.account("stripe", CUSTOMER, "2026-01").await;
    assert_eq!(account.balance, 500, "granted once");

    // The read, applied, is the subscription's state.
    let account = app.account("stripe", CUSTOMER, "2026-01").await;
    assert_eq!(account.subscriptions.len(), 1);
    assert_eq!(account.subscriptions[0].status, "active");
    assert_eq!(requests(&api).await, 1);

    // The fold finds the invoice's stored read as the worker did: the grant is the invoice's,
    // the subscription the read's (a fetch), the replay said.
    let why = app.why("stripe", CUSTOMER, Cut::default()).await;
    assert!(why.divergent.is_empty(), "{:?}", why.divergent);
    let of = |name: &str| why.fields.iter().find(|f| f.field == name).unwrap();
    let grant = of("allowance:2026-01").decided_by.as_ref().unwrap();
    assert_eq!((grant.event_id, grant.replayed), (invoice, true));
    let status = of(&format!("subscription:{SUB}:status"));
    assert_eq!(
        status.decided_by.as_ref().unwrap().via,
        shared::billing::fold::Via::Fetch
    );
    assert_eq!(app.audit().await.divergent, []);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_invoice_before_its_subscription_without_an_api_key_grants_nothing_and_says_why(
    pool: PgPool,
) {
    // The test worker's sources have no API key.
    let app = corpus_app(pool).await;
    let reason = send_one(&app, "stripe", "renewal", &renewal_without_price(SUB)).await;
    let account = app.account("stripe", CUSTOMER, "2026-01").await;
    assert_eq!(account.balance, 0);
    assert_eq!(payments(&account), vec![("in_1EndiveInv00003", "paid")]);
    for said in [
        "no allowance granted",
        "the subscription register holds no known plan for sub_1EndiveSub00001",
        "the source has no API key to read it from the provider",
    ] {
        assert!(reason.contains(said), "{said:?} in {reason}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM inbox_events WHERE dedupe_key LIKE 'read:%'")
            .await,
        0
    );
    let line = shared::apply::payment_without_plan_metric("stripe", chrono::Utc::now());
    assert_eq!(line["PaymentsWithoutPlan"], 1);
    assert_eq!(line["Source"], "stripe");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_invoices_subscription_read_that_fails_is_retried_then_grants_its_plan(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    api.fake.holds(subscription());
    api.fake.read_fails(
        On::Path(format!("/v1/subscriptions/{SUB}")),
        Fault::Fails(500, serde_json::json!({"error": {"type": "api_error"}})),
        1,
    );
    let (status, _) = app
        .post("stripe", &stripe_delivery(&renewal_without_price(SUB)))
        .await;
    assert_eq!(status, http::StatusCode::OK);
    let id = app.event_id("stripe", RENEWAL).await;

    let first = process_event(&app.worker, id).await.unwrap();
    assert!(
        matches!(&first, Processed::Failed { status, error }
            if status.as_str() == "failed" && error.contains("500")),
        "{first:?}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM inbox_events WHERE dedupe_key LIKE 'read:%'")
            .await,
        0,
        "a failed read stores nothing"
    );
    // The test worker's retries are due at once.
    let second = process_event(&app.worker, id).await.unwrap();
    assert!(
        matches!(&second, Processed::Finished { status, .. } if status.as_str() == "applied"),
        "{second:?}"
    );
    assert_eq!(
        app.account("stripe", CUSTOMER, "2026-01").await.balance,
        500
    );
    assert_eq!(requests(&api).await, 2);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_invoices_subscription_the_provider_does_not_know_grants_nothing_and_says_so(
    pool: PgPool,
) {
    // The account does not hold it: Stripe's 404 `resource_missing`.
    let (app, api) = app_with_api(pool).await;
    let reason = send_one(&app, "stripe", "renewal", &renewal_without_price(SUB)).await;
    assert!(
        reason.contains(&format!("the provider does not know {SUB}")),
        "{reason}"
    );
    assert_eq!(app.account("stripe", CUSTOMER, "2026-01").await.balance, 0);
    assert_eq!(requests(&api).await, 1, "decided, not retried");
}

/// The register holds the subscription: no provider read, whatever the source can read.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_invoice_whose_subscription_the_register_holds_reads_nothing(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    for (name, body) in corpus("stripe/endive") {
        if name == "customer.subscription.updated" {
            send_one(&app, "stripe", &name, &body).await;
        }
    }
    let reason = send_one(&app, "stripe", "renewal", &renewal_without_price(SUB)).await;
    assert!(
        reason.contains(&format!("plan pro from subscription {SUB} (")),
        "{reason}"
    );
    assert_eq!(
        app.account("stripe", CUSTOMER, "2026-01").await.balance,
        500
    );
    assert_eq!(requests(&api).await, 0);
}

/// Regression (issue 37): the read was left `received` for the scheduler's rescue, so the
/// subscription's state from it landed only when the rescue took stuck rows, five minutes
/// later. It is sent after the invoice's commit, as every stored event is: the worker
/// draining the queue applies it, with no scheduler run.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_invoices_subscription_read_lands_when_the_worker_drains_the_queue(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    api.fake.holds(subscription());
    let (status, _) = app
        .post("stripe", &stripe_delivery(&renewal_without_price(SUB)))
        .await;
    assert_eq!(status, http::StatusCode::OK);
    assert_eq!(app.run_worker().await, 2, "the invoice, then its read");
    let read = app.event(app.event_id("stripe", &read_key()).await).await;
    assert_eq!(read.status, "applied", "{:?}", read.reason);
    let account = app.account("stripe", CUSTOMER, "2026-01").await;
    assert_eq!(account.subscriptions.len(), 1);
    assert_eq!(
        (
            account.subscriptions[0].status.as_str(),
            account.plan.as_str()
        ),
        ("active", "pro")
    );
    assert_eq!(app.audit().await.divergent, []);
}

/// The first instant of the month `at` is in.
fn month_start(at: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
    use chrono::Datelike;
    let day = at.date_naive().with_day(1).unwrap();
    day.and_hms_opt(0, 0, 0).unwrap().and_utc()
}

/// A renewal paid 2 s before this month began, its subscription read after it began, and the
/// subscription's own event of that second, in one order: the ledger.
async fn renewal_at_the_month_boundary(pool: PgPool, invoice_first: bool) -> Vec<(String, i64)> {
    let (app, api) = app_with_api(pool).await;
    api.fake.holds(subscription());
    let change = month_start(chrono::Utc::now()).timestamp() - 2;
    let mut renewal = renewal_without_price(SUB);
    renewal["created"] = change.into();
    let (_, mut updated) = corpus("stripe/endive")
        .into_iter()
        .find(|(name, _)| name == "customer.subscription.updated")
        .unwrap();
    updated["created"] = change.into();
    let (first, second) = match invoice_first {
        true => (("renewal", &renewal), ("updated", &updated)),
        false => (("updated", &updated), ("renewal", &renewal)),
    };
    for (name, body) in [first, second] {
        send_one(&app, "stripe", name, body).await;
    }
    // Whatever the queue did not bring, applied now: the read's own grant counts too.
    let waiting: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM inbox_events WHERE status = 'received'")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    for id in waiting {
        process_event(&app.worker, id).await.unwrap();
    }
    let reads = app
        .count("SELECT count(*) FROM inbox_events WHERE dedupe_key LIKE 'read:%'")
        .await;
    assert_eq!(
        reads,
        i64::from(invoice_first),
        "a read only when the invoice came first"
    );
    if invoice_first {
        let read = app.event(app.event_id("stripe", &read_key()).await).await;
        assert_eq!(read.occurred_at.map(|t| t.timestamp()), Some(change));
    }
    assert_eq!(app.audit().await.divergent, []);
    crate::thin::ledger(&app, CUSTOMER).await
}

/// Regression (issue 37): the read of an invoice's subscription was stamped with the clock,
/// so a renewal paid just before the month began, read after, granted the new month too. It
/// stands for the invoice: the ledger is the invoice's month alone, in either order.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_invoices_subscription_read_after_the_month_began_grants_the_invoices_month(
    pool: PgPool,
) {
    let previous = (month_start(chrono::Utc::now()) - chrono::Duration::days(1))
        .format("%Y-%m")
        .to_string();
    assert_eq!(
        renewal_at_the_month_boundary(pool, true).await,
        [(previous, 500)]
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_subscription_event_before_its_invoice_at_the_month_boundary_grants_the_same(
    pool: PgPool,
) {
    let previous = (month_start(chrono::Utc::now()) - chrono::Duration::days(1))
        .format("%Y-%m")
        .to_string();
    assert_eq!(
        renewal_at_the_month_boundary(pool, false).await,
        [(previous, 500)]
    );
}

/// The renewal of a customer that is an Account (`customer_account`, `customer` null): the
/// endive renewal without a price, as the accounts-v2 corpus names its customer, from the
/// connected account `connected` if named.
fn account_renewal(connected: Option<&str>) -> Value {
    let mut renewal = renewal_without_price(SUB);
    renewal["data"]["object"]["customer"] = Value::Null;
    renewal["data"]["object"]["customer_account"] = ACCOUNT_CUSTOMER.into();
    if let Some(connected) = connected {
        renewal["account"] = connected.into();
    }
    renewal
}

/// An invoice of a customer that is an Account, before its subscription (docs/design.md
/// §6.2): the subscription is read as the account the customer lives in (no `Stripe-Account`
/// for the platform's own, the connected account's for a Connect endpoint's), the read names
/// the same Account (`customer_account`), and the invoice grants its plan.
async fn account_customers_invoice_reads_its_subscription(pool: PgPool, connected: Option<&str>) {
    let (app, api) = app_with_api(pool).await;
    let mut shown = subscription();
    shown["customer"] = Value::Null;
    shown["customer_account"] = ACCOUNT_CUSTOMER.into();
    // Held in the account the customer lives in: read as another, it is a 404.
    api.fake.holds_in(connected, shown);
    let reason = send_one(&app, "stripe", "renewal", &account_renewal(connected)).await;
    let key = match connected {
        Some(connected) => format!("{connected}/{ACCOUNT_CUSTOMER}"),
        None => ACCOUNT_CUSTOMER.to_owned(),
    };
    assert!(
        reason.contains(&format!(
            "plan pro from subscription {SUB} as the provider shows it"
        )),
        "{key}: {reason}"
    );
    let account = app.account("stripe", &key, "2026-01").await;
    assert_eq!(account.balance, 500, "{key}");
    let read = app.event(app.event_id("stripe", &read_key()).await).await;
    assert_eq!(read.customer_key.as_deref(), Some(key.as_str()));
    let sent: Vec<Option<String>> = api
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| {
            r.headers
                .get("Stripe-Account")
                .map(|v| v.to_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(sent, [connected.map(str::to_owned)], "{key}");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_account_customers_invoice_reads_its_subscription_as_the_platform(pool: PgPool) {
    account_customers_invoice_reads_its_subscription(pool, None).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_account_customers_invoice_reads_its_subscription_as_its_connected_account(
    pool: PgPool,
) {
    account_customers_invoice_reads_its_subscription(pool, Some("acct_1SubReadConn01")).await;
}
