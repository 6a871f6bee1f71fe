//! One budget of provider API calls per source (docs/design.md §6.7): taken from Postgres by
//! every instance, so that two instances together never take more than it holds; a meter
//! report's share that reads never take; and a provider's 429, which puts the item off for
//! the time the provider said without spending its attempt. The buckets here refill at one
//! call in a thousand seconds, so what a test takes is decided by counts, never by the clock.

use std::time::Duration;

use chrono::Utc;
use serde_json::{json, Value};
use shared::handlers::worker::WorkerSource;
use shared::handlers::worker::{process_event, Processed};
use shared::meters::{Meters, Reported};
use shared::platform::budget::{Budgets, Endpoints, Lane, Limit, Pause, Throttled};
use shared::platform::config::{parse_sources, SourceConfig};
use shared::providers::{Api, ApiClient};
use sqlx::PgPool;

use crate::helpers::*;
use crate::meters::{
    ask, customer, debit, metered_entry, report, send, stripe_meters, stripe_on_pro, FakeStripe,
    Fault,
};
use crate::thin::{app_with_api, status_of, thin_events};
use provider_fakes::stripe::On;
use provider_fakes::Metered;

/// A bucket that does not refill within a test: `burst` calls, `reserved` of them kept for
/// meter reports.
fn bucket(burst: u32, reserved: u32) -> Limit {
    Limit {
        per_second: 0.001,
        burst,
        reserved,
        window: shared::platform::budget::PER_SECOND,
    }
}

/// The source `stripe` of the test sources, its API at `base`, metered on `api_calls`, with
/// `budget` as its `api_budget`; both modes taken (as the thin corpus's worker reads them).
fn stripe_source(base: &str, budget: Value) -> SourceConfig {
    let mut entry = metered_entry("stripe", base, json!({"event_name": "api_calls"}));
    entry["api_budget"] = budget;
    entry.as_object_mut().unwrap().remove("livemode");
    parse_sources(&json!([entry]).to_string())
        .unwrap()
        .remove(0)
}

/// What `source`'s calls go through in one instance on `pool`, for `lane`, never waiting for a
/// token.
fn client(pool: &PgPool, lane: Lane) -> ApiClient {
    let budgets = Budgets::new(pool.clone()).waiting(Duration::ZERO);
    ApiClient::budgeted(&reqwest::Client::new(), budgets, lane)
}

/// A corpus file under `stripe/thin/objects/`.
fn object(name: &str) -> Value {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/providers/stripe/thin/objects")
        .join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
}

/// A meter report's attempts, status, and its next attempt's time less the database's now
/// in seconds.
async fn report_attempts(pool: &PgPool, id: &str) -> (i32, String, Option<f64>) {
    sqlx::query_as(
        "SELECT attempts, status, extract(epoch FROM next_attempt_at - inbox_now())::float8
         FROM meter_reports WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// An event's attempt count, its next attempt's time less the database's now in seconds, and
/// its last error.
async fn attempts_of(pool: &PgPool, id: i64) -> (i32, Option<f64>, String) {
    sqlx::query_as(
        "SELECT attempts, extract(epoch FROM next_attempt_at - inbox_now())::float8,
                coalesce(last_error, '')
         FROM inbox_events WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Makes an event (and any pause its source's provider asked for) due now: the time it was
/// told to wait has passed.
async fn time_passes(pool: &PgPool) {
    sqlx::query("UPDATE inbox_events SET next_attempt_at = inbox_now() WHERE status = 'failed'")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("UPDATE meter_reports SET next_attempt_at = inbox_now() WHERE status = 'pending'")
        .execute(pool)
        .await
        .unwrap();
    // The next run comes a minute later: every bucket, the endpoints' too, has refilled.
    sqlx::query(
        "UPDATE api_budgets SET held_until = inbox_now(), refilled_at = refilled_at - interval '1 minute'",
    )
        .execute(pool)
        .await
        .unwrap();
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn two_instances_together_never_take_more_than_the_sources_budget(pool: PgPool) {
    // Two Lambda instances: two pools on one database, each with its own budget handle.
    let other = second_pool(&pool).await;
    let limit = bucket(10, 0);
    let one = Budgets::new(pool.clone())
        .waiting(Duration::ZERO)
        .of("stripe", limit, Lane::Reads);
    let two = Budgets::new(other.clone())
        .waiting(Duration::ZERO)
        .of("stripe", limit, Lane::Reads);
    let takes = (0..20).flat_map(|_| [one.take(), two.take()]);
    let results = futures::future::join_all(takes).await;
    let taken = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(taken, 10, "the burst, and not one call more");
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        let throttled = Throttled::find(refused).expect("refused for the rate");
        assert!(
            throttled.until > Utc::now() + chrono::Duration::seconds(500),
            "a token comes back only as the bucket refills: {throttled}"
        );
    }
    let (row_taken, row_refused): (i64, i64) =
        sqlx::query_as("SELECT taken, refused FROM api_budgets WHERE source = 'stripe'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((row_taken, row_refused), (10, 30));
    // Another source's budget is its own.
    let kinde = Budgets::new(other)
        .waiting(Duration::ZERO)
        .of("kinde", limit, Lane::Reads);
    kinde.take().await.unwrap();
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn reads_never_take_the_share_kept_for_meter_reports(pool: PgPool) {
    let budgets = Budgets::new(pool.clone()).waiting(Duration::ZERO);
    let limit = bucket(6, 2);
    let reads = budgets.of("stripe", limit, Lane::Reads);
    let meter = budgets.of("stripe", limit, Lane::Meter);
    let mut read = 0;
    while reads.take().await.is_ok() {
        read += 1;
    }
    assert_eq!(read, 4, "reads stop at the meter reports' share");
    meter.take().await.unwrap();
    meter.take().await.unwrap();
    assert!(meter.take().await.is_err(), "the share is two calls");
    assert!(reads.take().await.is_err());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_thin_read_stripe_refuses_for_the_rate_waits_the_time_said_without_spending_an_attempt(
    pool: PgPool,
) {
    let (app, api) = app_with_api(pool.clone()).await;
    // Stripe's 429, and a `Retry-After` (read by Stripe's own SDKs, stripe-php #755).
    api.fake
        .read_fails(On::Any, Fault::RateLimited(Some(60)), 1);
    let event = &thin_events()[0];
    let (status, body) = app.post("stripe", &stripe_delivery(event)).await;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    app.run_worker().await;
    let id = app.event_id("stripe", event["id"].as_str().unwrap()).await;
    let row = app.event(id).await;
    assert_eq!(row.status, "failed");
    let (attempts, due_in, error) = attempts_of(&pool, id).await;
    assert_eq!(attempts, 0, "not an attempt: {error}");
    let due_in = due_in.unwrap();
    assert!(
        (50.0..=61.0).contains(&due_in),
        "due again when Stripe said, not after the retry schedule's wait: {due_in} s ({error})"
    );
    assert!(error.contains("429"), "{error}");
    // Not before then: the claim leaves it, and Stripe is not asked again.
    assert!(matches!(
        process_event(&app.worker, id).await.unwrap(),
        Processed::Skipped
    ));
    assert_eq!(api.received_requests().await.unwrap().len(), 1);

    // Once the time said has passed, the read is made and the event applied, on its first
    // counted attempt.
    api.reset().await;
    crate::thin::shows(&api, "subscription.incomplete").await;
    time_passes(&pool).await;
    assert!(matches!(
        process_event(&app.worker, id).await.unwrap(),
        Processed::Finished { .. }
    ));
    let thin = status_of(&app, event["id"].as_str().unwrap()).await;
    assert_eq!(thin.status, "applied", "{:?}", thin.reason);
    assert_eq!(attempts_of(&pool, id).await.0, 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_pause_stripe_asked_of_one_instance_holds_every_instance_off(pool: PgPool) {
    let stripe = FakeStripe::default();
    stripe.holds(object("subscription.active")).read_fails(
        On::Any,
        Fault::RateLimited(Some(30)),
        1,
    );
    let api = stripe.serve().await;
    let source = stripe_source(&api.uri(), json!({"per_second": 10, "burst": 10}));
    let other = second_pool(&pool).await;
    let one = Api::for_source(&source, client(&pool, Lane::Reads)).unwrap();
    let two = Api::for_source(&source, client(&other, Lane::Reads)).unwrap();
    let path = "/v1/subscriptions/sub_1ThinSub0000001";

    let asked = one.get_found(path, &[], &[]).await.unwrap_err();
    let asked = Throttled::find(&asked).expect("a 429 is a pause").clone();
    assert!(asked.why.contains("429"), "{asked}");
    // The other instance does not ask Stripe at all until the pause is over.
    let held = two.get_found(path, &[], &[]).await.unwrap_err();
    let held = Throttled::find(&held).expect("held off").clone();
    assert_eq!(
        held.until, asked.until,
        "the pause Stripe asked for, to the microsecond"
    );
    assert_eq!(api.received_requests().await.unwrap().len(), 1);

    time_passes(&pool).await;
    assert!(two.get_found(path, &[], &[]).await.unwrap().is_some());
    assert_eq!(api.received_requests().await.unwrap().len(), 2);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_meter_report_stripe_refuses_for_the_rate_is_sent_later_without_spending_an_attempt(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, "cus_busy").await;
    let stripe = FakeStripe::default();
    // Stripe's SDKs wait as long as a `Retry-After` says (stripe-php #755).
    stripe.then(Fault::RateLimited(Some(60)));
    let server = stripe.serve().await;
    let meters = stripe_meters(&server);
    let who = customer("cus_busy");
    let id = debit(
        &pool,
        &ask("stripe", &who, "req_busy", 2, Some("api_calls")),
    )
    .await
    .reported
    .unwrap();

    assert!(matches!(
        send(&pool, &meters, &id).await,
        Reported::Failed { .. }
    ));
    let (attempts, status, due_in) = report_attempts(&pool, &id).await;
    assert_eq!(
        (attempts, status.as_str()),
        (0, "pending"),
        "not an attempt"
    );
    let due_in = due_in.unwrap();
    assert!(
        (50.0..=61.0).contains(&due_in),
        "due when Stripe's pause is over: {due_in} s"
    );
    assert!(
        report(&pool, &id).await.last_error.unwrap().contains("429"),
        "the reason is kept"
    );
    assert!(stripe.held().is_empty(), "Stripe took nothing");
    assert_eq!(
        send(&pool, &meters, &id).await,
        Reported::Skipped,
        "not before the pause is over"
    );

    time_passes(&pool).await;
    assert_eq!(send(&pool, &meters, &id).await, Reported::Sent);
    assert_eq!(report_attempts(&pool, &id).await.0, 1);
    assert_eq!(stripe.held().len(), 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_burst_of_thin_events_leaves_meter_reports_their_share_of_the_budget(pool: PgPool) {
    let (mut app, api) = app_with_api(pool.clone()).await;
    // The test plans, which price the meter's customer's plan.
    app.worker.catalog = shared::domain::Catalog::parse(PLANS).unwrap();
    api.fake.holds(object("subscription.active"));
    // Three calls at once, one of them kept for meter reports, and no refill in the test.
    let budget = json!({"per_second": 0.001, "burst": 3, "reserved": 1});
    let reads = stripe_source(&api.uri(), budget.clone());
    app.worker.sources.insert(
        "stripe".into(),
        WorkerSource::from_config(&reads, client(&pool, Lane::Reads)),
    );
    stripe_on_pro(&app, "cus_metered").await;

    // The thin events' reads take what reads may, and the last waits for the bucket.
    for event in thin_events() {
        let (status, body) = app.post("stripe", &stripe_delivery(&event)).await;
        assert_eq!(status, http::StatusCode::OK, "{body}");
    }
    app.run_worker().await;
    let mut waiting = Vec::new();
    for event in thin_events() {
        let id = app.event_id("stripe", event["id"].as_str().unwrap()).await;
        let (attempts, due_in, error) = attempts_of(&pool, id).await;
        if app.event(id).await.status == "failed" {
            assert_eq!(attempts, 0, "{error}");
            let due_in = due_in.unwrap();
            assert!(
                due_in > 500.0,
                "when the bucket holds a token again: {due_in} s"
            );
            assert!(error.contains("budget is spent"), "{error}");
            waiting.push(id);
        }
    }
    assert_eq!(waiting.len(), 1, "two reads, then the meter reports' share");
    assert_eq!(api.received_requests().await.unwrap().len(), 2);

    // The meter report still goes out, from the share reads left it; the next finds the
    // bucket empty and waits, its attempt not spent.
    let stripe = FakeStripe::default();
    let server = stripe.serve().await;
    let metered = stripe_source(&server.uri(), budget);
    let meters = Meters::build(std::slice::from_ref(&metered), client(&pool, Lane::Meter));
    let who = customer("cus_metered");
    let first = debit(&pool, &ask("stripe", &who, "req_1", 1, Some("api_calls")))
        .await
        .reported
        .unwrap();
    assert_eq!(send(&pool, &meters, &first).await, Reported::Sent);
    let second = debit(&pool, &ask("stripe", &who, "req_2", 1, Some("api_calls")))
        .await
        .reported
        .unwrap();
    assert!(matches!(
        send(&pool, &meters, &second).await,
        Reported::Failed { .. }
    ));
    let (attempts, status, due_in) = report_attempts(&pool, &second).await;
    assert_eq!((attempts, status.as_str()), (0, "pending"));
    let due_in = due_in.unwrap();
    assert!(due_in > 500.0, "{due_in} s");
    assert_eq!(stripe.posts(), 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_reconciliation_stripe_refuses_for_the_rate_stops_early_and_goes_on_next_run(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    // In the walk's first window (its first six hours, three days back): Stripe lists an event
    // only in a window of `created` that holds it.
    let created =
        Utc::now().timestamp() - shared::reconcile::FIRST_LOOKBACK.as_secs() as i64 + 3_600;
    let listed = crate::scheduler::stripe_api_event("evt_listed_late", "cus_listed", created);
    let stripe = FakeStripe::default();
    stripe
        .has_event(listed)
        .read_fails(On::Any, Fault::RateLimited(Some(30)), 1);
    let api = stripe.serve().await;
    let source = stripe_source(&api.uri(), json!({"per_second": 10, "burst": 10}));
    let reconciler =
        shared::reconcile::Reconciler::for_source(&source, client(&pool, Lane::Reads)).unwrap();
    let queue = crate::scheduler::scheduler_for(&app, vec![]).queue;
    let run = || {
        shared::reconcile::run(
            &reconciler,
            &pool,
            &queue,
            Utc::now() - chrono::Duration::days(30),
            crate::scheduler::soon(),
        )
    };

    let first = run().await;
    assert!(first.error.is_none(), "not a failure of the run: {first:?}");
    assert!(first.stopped_early, "{first:?}");
    assert_eq!(first.stored_new, 0);
    assert_eq!(api.received_requests().await.unwrap().len(), 1);

    time_passes(&pool).await;
    let next = run().await;
    assert!(next.error.is_none(), "{next:?}");
    assert_eq!(next.stored_new, 1, "{next:?}");
}

/// Lemon Squeezy counts its limit per minute and its 429 names no pause
/// (docs.lemonsqueezy.com/api/getting-started, Rate limiting): a source it refused waits for
/// the rest of that minute, not a second that would draw a 429 again at every try.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_lemonsqueezy_429_naming_no_pause_holds_the_source_off_for_its_minute(pool: PgPool) {
    let store = provider_fakes::FakeLemonSqueezy::default();
    store.subscription(json!({"type": "subscriptions", "id": "1", "attributes": {}}));
    store.rate_limit(1);
    let api = store.serve().await;
    let mut entry = metered_entry(
        "lemonsqueezy",
        &api.uri(),
        json!({"event_name": "api_calls"}),
    );
    entry.as_object_mut().unwrap().remove("meter");
    let source = parse_sources(&json!([entry]).to_string())
        .unwrap()
        .remove(0);
    let reads = Api::for_source(&source, client(&pool, Lane::Reads)).unwrap();
    let path = "/v1/subscriptions/1";
    assert!(reads.get_found(path, &[], &[]).await.unwrap().is_some());

    let before = Utc::now();
    let refused = reads.get_found(path, &[], &[]).await.unwrap_err();
    let refused = Throttled::find(&refused).expect("a 429 is a pause").clone();
    assert_eq!(store.over_limit(), 1);
    assert!(
        refused.until >= before + chrono::Duration::seconds(59),
        "held off until {}, {} s after the refusal: Lemon Squeezy's limit is per minute",
        refused.until,
        (refused.until - before).num_milliseconds() as f64 / 1000.0
    );
    // Until then no instance asks again.
    assert!(reads.get_found(path, &[], &[]).await.is_err());
    assert_eq!(store.requests(), 2);
}

/// Stripe limits each endpoint apart inside its global limit ("individual API endpoints: 25
/// requests per second", docs.stripe.com/rate-limits), and in live mode the global 100 is
/// above it: a burst of one kind of read (every thin event's subscription) must stop at the
/// endpoint's budget, whatever the source's holds, while another endpoint keeps its own.
/// Stripe's clock is held, so every request here counts in one of its seconds.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_burst_of_reads_of_one_stripe_endpoint_stays_under_its_limit_from_every_instance(
    pool: PgPool,
) {
    let stripe = FakeStripe::default();
    stripe
        .clock_at(Utc::now())
        .holds(object("subscription.active"));
    let api = stripe.serve().await;
    // The source's own bucket holds 60 at once, well over the endpoint's 25.
    let mut source = stripe_source(&api.uri(), json!({"per_second": 0.001, "burst": 60}));
    source.api_key = Some("sk_live_endpoints".into());
    let other = second_pool(&pool).await;
    let one = Api::for_source(&source, client(&pool, Lane::Reads)).unwrap();
    let two = Api::for_source(&source, client(&other, Lane::Reads)).unwrap();
    let path = "/v1/subscriptions/sub_1ThinSub0000001";

    let reads =
        (0..20).flat_map(|_| [one.get_found(path, &[], &[]), two.get_found(path, &[], &[])]);
    let results = futures::future::join_all(reads).await;
    let seen = stripe.rate_seen();
    assert_eq!(
        seen.over_limit, 0,
        "no request over Stripe's limits: {seen:?}"
    );
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        let throttled = Throttled::find(refused).expect("refused by the budget, not sent");
        assert!(throttled.why.contains("endpoint"), "{throttled}");
    }
    let sent = results.iter().filter(|r| r.is_ok()).count();
    assert!(
        sent >= 1 && sent as u32 == seen.requests,
        "{sent} sent, {seen:?}"
    );

    // Another endpoint's budget is its own: the list is read at once.
    assert!(one
        .get_found("/v1/subscriptions", &[("limit", "1".into())], &[])
        .await
        .is_ok());
}

/// Endpoints named as Stripe's are, each bucket holding `burst` and not refilling in a test.
fn endpoints(burst: u32) -> Endpoints {
    fn of(method: &http::Method, path: &str) -> Option<String> {
        Some(format!(
            "{method} {}",
            path.trim_end_matches(char::is_numeric)
        ))
    }
    Endpoints {
        of,
        limit: bucket(burst, 0),
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn two_instances_together_never_take_more_than_an_endpoints_budget_and_another_keeps_its_own(
    pool: PgPool,
) {
    let other = second_pool(&pool).await;
    let budget = |pool: &PgPool| {
        Budgets::new(pool.clone())
            .waiting(Duration::ZERO)
            .of("stripe", bucket(100, 0), Lane::Reads)
            .by_endpoint(Some(endpoints(3)))
    };
    let (one, two) = (budget(&pool), budget(&other));
    let get = http::Method::GET;
    let paths: Vec<String> = (0..10).map(|i| format!("/v1/subscriptions/{i}")).collect();
    let takes = paths
        .iter()
        .flat_map(|path| [one.take_for(&get, path), two.take_for(&get, path)]);
    let results = futures::future::join_all(takes).await;
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        3,
        "the endpoint's burst, though the source's holds 100"
    );
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        let throttled = Throttled::find(refused).expect("refused for the rate");
        assert!(throttled.why.contains("endpoint"), "{throttled}");
    }
    two.take_for(&get, "/v1/invoices/1").await.unwrap();
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT endpoint, taken, refused FROM api_budgets WHERE source = 'stripe' ORDER BY endpoint",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            (String::new(), 4, 0),
            ("GET /v1/invoices/".into(), 1, 0),
            ("GET /v1/subscriptions/".into(), 3, 17),
        ],
        "a refused take takes from neither row, and is counted on the one that refused"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_429_stripe_names_an_endpoints_pauses_that_endpoint_alone(pool: PgPool) {
    let budget = Budgets::new(pool.clone())
        .waiting(Duration::ZERO)
        .of("stripe", bucket(100, 0), Lane::Reads)
        .by_endpoint(Some(endpoints(10)));
    let get = http::Method::GET;
    let pause = |endpoint| Pause {
        wait: Duration::from_secs(600),
        endpoint,
    };
    budget
        .hold_off(pause(true), &get, "/v1/subscriptions/1")
        .await
        .unwrap();
    let held = budget
        .take_for(&get, "/v1/subscriptions/2")
        .await
        .unwrap_err();
    assert!(
        Throttled::find(&held).unwrap().why.contains("429"),
        "{held:#}"
    );
    budget.take_for(&get, "/v1/invoices/1").await.unwrap();

    // A 429 of the global limit holds the whole source.
    budget
        .hold_off(pause(false), &get, "/v1/subscriptions/1")
        .await
        .unwrap();
    assert!(budget.take_for(&get, "/v1/invoices/1").await.is_err());
}
