//! Kinde reconciliation (docs/design.md §6.1): the customers with recent Kinde events, each
//! one's plan and entitlements read from a fake Kinde Management API (an M2M token by client
//! credentials, then `GET /api/v1/billing/entitlements?customer_id=…&expand=plans`, answered
//! as Kinde documents it, paged by `starting_after`: the fake Kinde of provider-fakes) and
//! compared with its plan register and its Kinde entitlements register; each difference
//! becomes one corrective event.

use chrono::{Duration, Utc};
use serde_json::{json, Value};
use shared::handlers::scheduler;
use sqlx::PgPool;
use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use provider_fakes::traffic::Fault;
use provider_fakes::{FakeKinde, Metered, ProviderServer};

use crate::helpers::*;
use crate::scheduler::{reconcile_runs, reconciler, scheduler_for};

fn kinde_reconciler(server: &MockServer) -> shared::reconcile::Reconciler {
    reconciler(json!({
        "name": "kinde", "kind": "kinde",
        "jwks_url": format!("{}/.well-known/jwks", server.uri()),
        "api_key": "m2m_client_secret", "api_client_id": "m2m_client_id",
        "api_base_url": server.uri()
    }))
}

/// Kinde, its M2M application the reconciler's client.
async fn fake_kinde() -> (FakeKinde, ProviderServer) {
    let kinde = FakeKinde::new("m2m_client_id", "m2m_client_secret");
    let server = kinde.serve().await;
    (kinde, server)
}

/// Fails the test, as it ends, unless Kinde issued so many tokens.
struct Tokens(FakeKinde, usize);

impl Drop for Tokens {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert_eq!(self.0.tokens_issued(), self.1, "access tokens issued");
        }
    }
}

/// `customer` at Kinde, on `plans` (`[{code, subscribed_on}]`), with no entitlements: these
/// tests are about the plan.
fn entitlements(kinde: &FakeKinde, customer: &str, plans: Value) {
    billing_customer(kinde, customer, plans, json!([]));
}

/// `customer` at Kinde: `plans` and `listed` (`[{id, feature_code, entitlement_limit_max, …}]`).
fn billing_customer(kinde: &FakeKinde, customer: &str, plans: Value, listed: Value) {
    kinde
        .customer(customer, plans)
        .entitlements(customer, listed);
}

/// An entitlement as Kinde lists it (`GetBillingEntitlementsResponse.entitlements[]`): the
/// feature `code`, its maximum (`null`: none).
fn entitlement(id: &str, code: &str, max: Value) -> Value {
    json!({
        "id": id, "fixed_charge": null, "price_name": code, "unit_amount": null,
        "feature_code": code, "feature_name": code,
        "entitlement_limit_max": max, "entitlement_limit_min": null
    })
}

/// A Kinde plan event for `customer` at `at`, delivered and applied.
async fn plan_event(app: &TestApp, id: &str, customer: &str, plan: &str, at: &str) {
    let claims = json!({"type": "customer.plan_changed", "event_id": id, "event_timestamp": at,
                        "source": "admin", "data": {"customer_id": customer, "plan": {"code": plan}}});
    let (status, _) = app.post("kinde", &kinde_delivery(id, &claims)).await;
    assert_eq!(status, 200);
    app.run_worker().await;
}

fn days_ago(days: i64) -> String {
    (Utc::now() - Duration::days(days)).to_rfc3339()
}

fn this_period() -> String {
    Utc::now().format("%Y-%m").to_string()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_kinde_plan_the_webhooks_missed_is_corrected_once_with_one_token(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (kinde, server) = fake_kinde().await;
    let _tokens = Tokens(kinde.clone(), 1);
    // kc_up upgraded to pro, kc_gone cancelled, kc_same agrees: no webhook said the first two.
    plan_event(&app, "evt_up", "kc_up", "basic", &days_ago(2)).await;
    plan_event(&app, "evt_gone", "kc_gone", "pro", &days_ago(2)).await;
    plan_event(&app, "evt_same", "kc_same", "pro", &days_ago(2)).await;
    entitlements(
        &kinde,
        "kc_up",
        json!([{"code": "pro", "subscribed_on": days_ago(1)}]),
    );
    entitlements(&kinde, "kc_gone", json!([]));
    entitlements(
        &kinde,
        "kc_same",
        json!([{"code": "pro", "subscribed_on": days_ago(40)}]),
    );
    let scheduler = scheduler_for(&app, vec![kinde_reconciler(&server)]);

    let mut runs = Vec::new();
    for r in reconcile_runs(&app, &scheduler, 3).await {
        assert_eq!(r.error, None);
        runs.push((r.read, r.discrepancies, r.already_present));
    }
    assert_eq!(
        runs,
        [(3, 2, 1), (3, 0, 3), (3, 0, 3)],
        "two corrections on the first run, then the registers match"
    );
    let period = this_period();
    assert_eq!(app.account("kinde", "kc_up", &period).await.plan, "pro");
    assert_eq!(app.account("kinde", "kc_gone", &period).await.plan, "free");
    assert_eq!(app.account("kinde", "kc_same", &period).await.plan, "pro");
    let id = app
        .event_id("kinde", &reconcile_key(&app, "kc_up").await)
        .await;
    let corrective = app.event(id).await;
    assert_eq!(corrective.status, "applied");
    assert_eq!(corrective.event_type, "customer.plan_changed");
    assert_eq!(
        app.verdicts(id).await,
        ["stored"],
        "recorded once, by the read that stored it; later reads are not deliveries"
    );
    assert_eq!(corrective.seen_count, 1);
}

/// The dedupe key of the one corrective event stored for `customer`.
async fn reconcile_key(app: &TestApp, customer: &str) -> String {
    sqlx::query_scalar(
        "SELECT dedupe_key FROM inbox_events WHERE customer_key = $1 AND dedupe_key LIKE 'reconcile:%'",
    )
    .bind(customer)
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_kinde_plan_not_in_the_catalog_is_reported_once_and_a_later_webhook_still_wins(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let (kinde, server) = fake_kinde().await;
    let _tokens = Tokens(kinde.clone(), 1);
    plan_event(&app, "evt_g1", "kc_gold", "pro", &days_ago(3)).await;
    entitlements(
        &kinde,
        "kc_gold",
        json!([{"code": "gold", "subscribed_on": days_ago(1)}]),
    );
    let scheduler = scheduler_for(&app, vec![kinde_reconciler(&server)]);

    let found: Vec<i32> = reconcile_runs(&app, &scheduler, 3)
        .await
        .iter()
        .map(|r| r.discrepancies)
        .collect();
    assert_eq!(found, [1, 0, 0]);
    let period = this_period();
    assert_eq!(
        app.account("kinde", "kc_gold", &period).await.plan,
        "free",
        "a plan not in the catalog entitles nothing"
    );

    // A webhook after the read still moves the register: the correction took the read's time.
    plan_event(&app, "evt_g2", "kc_gold", "pro", &Utc::now().to_rfc3339()).await;
    assert_eq!(app.account("kinde", "kc_gold", &period).await.plan, "pro");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_refused_token_is_the_run_error_and_names_no_secret(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // Kinde's application has another secret than the source's: `invalid_client`.
    let kinde = FakeKinde::new("m2m_client_id", "rotated_client_secret");
    let server = kinde.serve().await;
    plan_event(&app, "evt_t1", "kc_t", "pro", &days_ago(1)).await;
    let scheduler = scheduler_for(&app, vec![kinde_reconciler(&server)]);

    let report = scheduler::run(&scheduler).await;
    let error = report.reconciliation[0]
        .error
        .clone()
        .expect("the run failed");
    assert!(error.contains("401"), "{error}");
    assert!(error.contains("api_client_id"), "{error}");
    assert!(!error.contains("m2m_client_secret"), "{error}");
    let recorded: Option<String> =
        sqlx::query_scalar("SELECT error FROM reconcile_runs WHERE source = 'kinde'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(recorded.as_deref(), Some(error.as_str()));
    assert_eq!(
        app.account("kinde", "kc_t", &this_period()).await.plan,
        "pro"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_customer_kinde_does_not_know_is_left_alone(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (kinde, server) = fake_kinde().await;
    let _tokens = Tokens(kinde.clone(), 1);
    // Kinde bills no kc_gone_at_kinde: its entitlements read answers 404.
    plan_event(&app, "evt_k404", "kc_gone_at_kinde", "pro", &days_ago(2)).await;
    let scheduler = scheduler_for(&app, vec![kinde_reconciler(&server)]);

    let reports = reconcile_runs(&app, &scheduler, 1).await;
    assert_eq!(reports[0].error, None);
    assert_eq!(
        (reports[0].read, reports[0].discrepancies),
        (1, 0),
        "read, and nothing corrected"
    );
    let period = this_period();
    assert_eq!(
        app.account("kinde", "kc_gone_at_kinde", &period).await.plan,
        "pro"
    );
}

/// Kinde refuses the entitlements read of `customer` (a 400, as its Management API answers a
/// request it will not serve).
async fn refused_read(server: &MockServer, customer: &str) {
    Mock::given(method("GET"))
        .and(path("/api/v1/billing/entitlements"))
        .and(query_param("customer_id", customer))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({
            "errors": [{"code": "INVALID_REQUEST", "message": "Invalid request"}]
        })))
        .mount(server)
        .await;
}

/// The entitlements reads Kinde received for `customer`.
async fn reads_of(server: &MockServer, customer: &str) -> usize {
    let wanted = format!("customer_id={customer}&");
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|r| r.url.path() == "/api/v1/billing/entitlements")
        .filter(|r| format!("{}&", r.url.query().unwrap_or("")).contains(&wanted))
        .count()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_customer_whose_read_fails_is_tried_three_runs_then_skipped_and_the_sweep_goes_past_it(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let (kinde, server) = fake_kinde().await;
    let _tokens = Tokens(kinde.clone(), 1);
    plan_event(&app, "evt_fa", "kc_a", "pro", &days_ago(2)).await;
    plan_event(&app, "evt_fb", "kc_b", "pro", &days_ago(2)).await;
    plan_event(&app, "evt_fc", "kc_c", "basic", &days_ago(2)).await;
    entitlements(
        &kinde,
        "kc_a",
        json!([{"code": "pro", "subscribed_on": days_ago(40)}]),
    );
    refused_read(&server, "kc_b").await;
    entitlements(
        &kinde,
        "kc_c",
        json!([{"code": "pro", "subscribed_on": days_ago(1)}]),
    );
    let scheduler = scheduler_for(&app, vec![kinde_reconciler(&server)]);

    let mut reports = Vec::new();
    for _ in 0..4 {
        reports.push(scheduler::run(&scheduler).await);
        app.run_worker().await;
    }

    let period = this_period();
    assert_eq!(
        app.account("kinde", "kc_c", &period).await.plan,
        "pro",
        "the customer after the failing one is read and corrected"
    );
    assert_eq!(
        reads_of(&server, "kc_b").await,
        3,
        "one read a run, three runs, then skipped"
    );
    let kinde: Vec<_> = reports.iter().map(|r| &r.reconciliation[0]).collect();
    assert_eq!(kinde[0].discrepancies, 1, "kc_c corrected by the first run");
    let failed: Vec<Vec<(String, i32)>> = kinde
        .iter()
        .map(|r| {
            r.failed
                .iter()
                .map(|f| (f.customer.clone(), f.failures))
                .collect()
        })
        .collect();
    let b = |n| vec![("kc_b".to_owned(), n)];
    assert_eq!(failed, [b(1), b(2), b(3), vec![]]);
    assert!(kinde[0].failed[0].error.contains("400"), "{:?}", kinde[0]);
    let skipped: Vec<&[String]> = kinde.iter().map(|r| r.skipped.as_slice()).collect();
    assert_eq!(skipped, [&[][..], &[], &[], &["kc_b".to_owned()]]);
    for r in &kinde {
        assert_eq!(r.error, None, "one customer's failure is not the source's");
    }
    let metrics: Vec<(f64, f64)> = reports
        .iter()
        .map(|r| {
            let m = scheduler::emf(r, Utc::now());
            (
                m["ReconcileFailedReads"].as_f64().unwrap(),
                m["ReconcileSkippedCustomers"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(metrics, [(1.0, 0.0), (1.0, 0.0), (1.0, 0.0), (0.0, 1.0)]);
    let recorded: Vec<(i32, i32)> =
        sqlx::query_as("SELECT failed_reads, skipped FROM reconcile_runs ORDER BY id")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(recorded, [(1, 0), (1, 0), (1, 0), (0, 1)]);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_kinde_api_that_answers_no_read_fails_the_run_and_counts_against_no_customer(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let (kinde, server) = fake_kinde().await;
    let _tokens = Tokens(kinde.clone(), 1);
    for n in 0..5 {
        let customer = format!("kc_down_{n}");
        plan_event(
            &app,
            &format!("evt_down_{n}"),
            &customer,
            "pro",
            &days_ago(2),
        )
        .await;
        refused_read(&server, &customer).await;
    }
    let scheduler = scheduler_for(&app, vec![kinde_reconciler(&server)]);

    let reports = reconcile_runs(&app, &scheduler, 4).await;

    for r in &reports {
        let error = r.error.as_deref().expect("the run failed");
        assert!(error.contains("400"), "{error}");
        assert!(r.failed.is_empty() && r.skipped.is_empty(), "{r:?}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM reconcile_failures").await,
        0,
        "an outage is nobody's failure"
    );
    let reads = server
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|r| r.url.path() == "/api/v1/billing/entitlements")
        .count();
    assert_eq!(shared::reconcile::OUTAGE_READS, 3);
    assert_eq!(
        reads,
        3 + 2 + 3 + 2,
        "each run stops after three failed reads, the next goes on after them"
    );
}

/// The account's features as the app reads them, and where each comes from.
async fn features_of(app: &TestApp, customer: &str) -> (Value, Vec<(String, &'static str)>) {
    let mut conn = app.pool.acquire().await.unwrap();
    let customer = shared::domain::CustomerId::parse(customer).unwrap();
    let period = shared::domain::Period::parse(&this_period()).unwrap();
    let snapshot = shared::billing::account::snapshot(
        &mut conn,
        "kinde",
        &customer,
        &period,
        &app.worker.catalog,
    )
    .await
    .unwrap()
    .expect("the account exists");
    let origins = snapshot
        .feature_origins
        .iter()
        .map(|(key, origin)| (key.clone(), origin.source))
        .collect();
    (json!(snapshot.features), origins)
}

/// The `billing.features_changed` effects of `customer`: (added, removed, changed).
async fn features_changed(app: &TestApp, customer: &str) -> Vec<Value> {
    app.effects()
        .await
        .into_iter()
        .filter(|e| e.customer_id == customer && e.kind == "billing.features_changed")
        .map(|e| {
            let d = &e.body["data"];
            json!([d["added"], d["removed"], d["changed"]])
        })
        .collect()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn kindes_entitlements_the_account_lacks_are_read_into_its_features_once(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    app.enable_effects().await;
    // The catalog's pro plan gives 5 seats and CSV export; Kinde's plan says 10 seats and SSO.
    app.worker.catalog = shared::domain::Catalog::parse(
        r#"{"pro": {"plan": "pro", "monthly_allowance": 500,
                    "features": {"seats": 5, "export": "csv"}}}"#,
    )
    .unwrap();
    let (kinde, server) = fake_kinde().await;
    let _tokens = Tokens(kinde.clone(), 1);
    plan_event(&app, "evt_ent", "kc_ent", "pro", &days_ago(2)).await;
    billing_customer(
        &kinde,
        "kc_ent",
        json!([{"code": "pro", "subscribed_on": days_ago(40)}]),
        json!([
            entitlement(
                "entitlement_0195ac80a14e8d71f42b98e75d3c61ad",
                "seats",
                json!(10)
            ),
            entitlement(
                "entitlement_0195ac80a14e8d71f42b98e75d3c61ae",
                "sso",
                Value::Null
            ),
        ]),
    );
    let scheduler = scheduler_for(&app, vec![kinde_reconciler(&server)]);

    let runs: Vec<(i32, i32, i32)> = reconcile_runs(&app, &scheduler, 3)
        .await
        .iter()
        .map(|r| (r.read, r.discrepancies, r.already_present))
        .collect();
    assert_eq!(
        runs,
        [(1, 1, 0), (1, 0, 1), (1, 0, 1)],
        "the plan agrees; the entitlements are stored once, then the register agrees"
    );
    let (features, origins) = features_of(&app, "kc_ent").await;
    assert_eq!(features, json!({"export": "csv", "seats": 10, "sso": true}));
    assert_eq!(
        origins,
        [
            ("export".to_owned(), "catalog"),
            ("seats".to_owned(), "provider"),
            ("sso".to_owned(), "provider")
        ],
        "the larger of the catalog's 5 seats and Kinde's 10 is Kinde's"
    );
    let key = sqlx::query_scalar::<_, String>(
        "SELECT dedupe_key FROM inbox_events WHERE type = 'customer.entitlements_read'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(key.starts_with("reconcile:kc_ent:entitlements:"), "{key}");
    let read = app.event(app.event_id("kinde", &key).await).await;
    assert_eq!(read.status, "applied");
    assert_eq!(read.seen_count, 1);
    assert_eq!(
        features_changed(&app, "kc_ent").await,
        [
            json!([["export", "seats"], [], []]),
            json!([["sso"], [], [{"key": "seats", "from": 5, "to": 10}]])
        ],
        "the plan's features with its event, then Kinde's with the read"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_change_at_kinde_moves_the_features_and_an_emptied_list_takes_them_away(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    app.enable_effects().await;
    let (kinde, server) = fake_kinde().await;
    let _tokens = Tokens(kinde.clone(), 1);
    plan_event(&app, "evt_mv", "kc_mv", "pro", &days_ago(2)).await;
    let plans = json!([{"code": "pro", "subscribed_on": days_ago(40)}]);
    let seats = |max: i64| json!([entitlement("entitlement_seats", "seats", json!(max))]);
    billing_customer(&kinde, "kc_mv", plans.clone(), seats(10));
    let scheduler = scheduler_for(&app, vec![kinde_reconciler(&server)]);

    let mut seen = Vec::new();
    reconcile_runs(&app, &scheduler, 1).await;
    seen.push(features_of(&app, "kc_mv").await.0);
    // Kinde's plan now gives 25 seats, later none at all. The token is still good.
    for listed in [seats(25), json!([])] {
        billing_customer(&kinde, "kc_mv", plans.clone(), listed);
        let runs = reconcile_runs(&app, &scheduler, 2).await;
        assert_eq!(
            runs.iter().map(|r| r.discrepancies).collect::<Vec<_>>(),
            [1, 0],
            "corrected once"
        );
        seen.push(features_of(&app, "kc_mv").await.0);
    }
    assert_eq!(
        seen,
        [json!({"seats": 10}), json!({"seats": 25}), json!({})]
    );
    assert_eq!(
        features_changed(&app, "kc_mv").await,
        [
            json!([["seats"], [], []]),
            json!([[], [], [{"key": "seats", "from": 10, "to": 25}]]),
            json!([[], ["seats"], []])
        ]
    );
    assert_eq!(
        app.count("SELECT count(*) FROM inbox_events WHERE type = 'customer.entitlements_read'")
            .await,
        3,
        "one read event a finding"
    );
}

/// Eleven entitlements of `customer`: seats (10) first, `sso` last, on a page of its own.
fn eleven(customer: &str) -> Value {
    let id = |n: usize| format!("entitlement_{customer}_{n:02}");
    let mut listed = vec![entitlement(&id(1), "seats", json!(10))];
    for n in 2..=10 {
        listed.push(entitlement(&id(n), &format!("feature_{n:02}"), Value::Null));
    }
    listed.push(entitlement(&id(11), "sso", Value::Null));
    json!(listed)
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_paged_list_of_kindes_entitlements_is_read_to_its_end_and_never_stored_in_part(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let (kinde, server) = fake_kinde().await;
    let _tokens = Tokens(kinde.clone(), 1);
    let plans = json!([{"code": "pro", "subscribed_on": days_ago(40)}]);
    // Eleven entitlements each: Kinde's page is ten. kc_pages: two pages; kc_part: the second
    // page is refused.
    for customer in ["kc_pages", "kc_part"] {
        plan_event(
            &app,
            &format!("evt_{customer}"),
            customer,
            "pro",
            &days_ago(2),
        )
        .await;
        billing_customer(&kinde, customer, plans.clone(), eleven(customer));
    }
    Mock::given(method("GET"))
        .and(path("/api/v1/billing/entitlements"))
        .and(query_param("customer_id", "kc_part"))
        .and(query_param("starting_after", "entitlement_kc_part_10"))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({
            "errors": [{"code": "INVALID_REQUEST", "message": "Invalid request"}]
        })))
        .mount(&server)
        .await;
    let scheduler = scheduler_for(&app, vec![kinde_reconciler(&server)]);

    let report = &reconcile_runs(&app, &scheduler, 1).await[0];
    assert_eq!(report.error, None);
    assert_eq!(report.discrepancies, 1, "kc_pages only");
    assert_eq!(
        report
            .failed
            .iter()
            .map(|f| f.customer.as_str())
            .collect::<Vec<_>>(),
        ["kc_part"],
        "a list that cannot be read to its end is a failed read"
    );
    assert!(
        report.failed[0].error.contains("400"),
        "{:?}",
        report.failed
    );
    assert_eq!(reads_of(&server, "kc_pages").await, 2);
    let mut both = json!({"seats": 10, "sso": true});
    for n in 2..=10 {
        both[format!("feature_{n:02}")] = json!(true);
    }
    assert_eq!(features_of(&app, "kc_pages").await.0, both, "both pages");
    assert_eq!(
        features_of(&app, "kc_part").await.0,
        json!({}),
        "nothing of the first page alone"
    );
    assert_eq!(
        app.count(
            "SELECT count(*) FROM inbox_events WHERE customer_key = 'kc_part' \
             AND type = 'customer.entitlements_read'"
        )
        .await,
        0
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_read_kinde_refuses_for_the_rate_stops_the_sweep_and_counts_against_no_customer(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let (kinde, server) = fake_kinde().await;
    let _tokens = Tokens(kinde.clone(), 1);
    plan_event(&app, "evt_ra", "kc_ra", "pro", &days_ago(2)).await;
    plan_event(&app, "evt_rb", "kc_rb", "pro", &days_ago(2)).await;
    // Kinde's limiter refuses the first read (a 429 with `RateLimit-Reset`): the limit was
    // reached by traffic this test does not make.
    kinde.then(Some("/api/v1/billing/entitlements"), Fault::RateLimited(20));
    for customer in ["kc_ra", "kc_rb"] {
        entitlements(
            &kinde,
            customer,
            json!([{"code": "pro", "subscribed_on": days_ago(40)}]),
        );
    }
    let scheduler = scheduler_for(&app, vec![kinde_reconciler(&server)]);

    let runs = reconcile_runs(&app, &scheduler, 2).await;
    let first = &runs[0];
    assert_eq!(first.error, None, "{first:?}");
    assert!(first.stopped_early, "{first:?}");
    assert!(
        first.failed.is_empty(),
        "not the customer's failure: {first:?}"
    );
    assert_eq!(
        reads_of(&server, "kc_rb").await,
        1,
        "the sweep stopped at kc_ra"
    );
    let failures: i64 = sqlx::query_scalar("SELECT count(*) FROM reconcile_failures")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(failures, 0);
    // The next run starts with the customer it stopped at.
    assert_eq!(runs[1].error, None);
    assert_eq!(reads_of(&server, "kc_ra").await, 2);
}
