//! Reversals of accepted debits (docs/design.md §4.10, §4.13): the app takes a debit back, its
//! amount returns to the period's allowance, once, and the provider's meter is withdrawn from
//! (the report never went out) or corrected (Stripe's meter event adjustment within its window,
//! a compensating report after it, Polar's compensating event) — against the fake provider
//! APIs of `meters`. Retries run with zero waits.

use http::StatusCode;
use serde_json::{json, Value};
use shared::billing::usage::{self, Reversal, Reversed};
use shared::domain::meter::{correction_identifier, identifier, MeterReport, TakeBack};
use shared::domain::{CustomerId, Period, SourceKind};
use shared::meters::outbox::ReportStatus;
use shared::meters::Reported;
use shared::providers::meter::Sent;
use shared::providers::{provider, Api};
use sqlx::PgPool;

use crate::app_api::{api_state, call, on_pro, APP_KEY};
use crate::helpers::*;
use crate::meters::{
    ask, customer, debit, metered, meters_of, polar_on_pro, report, reports, send, stripe_meters,
    stripe_on_pro,
};
use provider_fakes::stripe::{FakeStripe, Fault};
use provider_fakes::ProviderServer;

async fn reverse(pool: &PgPool, source: &str, who: &CustomerId, usage_id: &str) -> Reversed {
    let mut conn = pool.acquire().await.unwrap();
    usage::reverse(&mut conn, (source, who), usage_id, None, &Period::current())
        .await
        .unwrap()
}

/// A Stripe customer on pro, its meter a fake Stripe (`api_calls`).
struct StripeMetered {
    _app: TestApp,
    fake: FakeStripe,
    server: ProviderServer,
    meters: shared::meters::Meters,
    who: CustomerId,
}

async fn stripe_metered(pool: &PgPool, customer_id: &str) -> StripeMetered {
    let app = TestApp::spawn(pool.clone()).await;
    stripe_on_pro(&app, customer_id).await;
    let fake = FakeStripe::default();
    let server = fake.serve().await;
    let meters = stripe_meters(&server);
    StripeMetered {
        _app: app,
        fake,
        server,
        meters,
        who: customer(customer_id),
    }
}

impl StripeMetered {
    /// A debit of `value` under the app's `key`, its report sent and taken by Stripe.
    async fn sent(&self, pool: &PgPool, key: &str, value: i64) -> (usage::Debited, String) {
        let debited = debit(
            pool,
            &ask("stripe", &self.who, key, value, Some("api_calls")),
        )
        .await;
        let id = debited.reported.clone().unwrap();
        assert_eq!(send(pool, &self.meters, &id).await, Reported::Sent);
        (debited, id)
    }

    /// The correction the reversal of `debited` writes.
    async fn correction_of(&self, pool: &PgPool, debited: &usage::Debited) -> String {
        reverse(pool, "stripe", &self.who, &usage_id_of(debited))
            .await
            .correction
            .unwrap()
    }
}

/// The usage id of an accepted debit.
fn usage_id_of(debited: &usage::Debited) -> String {
    match &debited.debit {
        usage::Debit::Accepted { usage_id, .. } => usage_id.clone(),
        other => panic!("accepted, not {other:?}"),
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_reversed_debit_returns_its_amount_once_and_answers_the_same_when_asked_again(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_rev").await;
    let api = api_state(&pool);
    let debit_of = |key: &'static str, amount: i64| {
        let api = &api;
        async move {
            call(
                api,
                "POST",
                "/v1/accounts/kinde/kc_rev/usage",
                Some(APP_KEY),
                &[("idempotency-key", key)],
                Some(json!({"amount": amount})),
            )
            .await
        }
    };
    let kept = debit_of("req_kept", 100).await;
    let taken = debit_of("req_taken", 150).await;
    assert_eq!(taken.body["used"], 250, "{}", taken.body);
    let usage_id = taken.body["usage_id"].as_str().unwrap().to_owned();
    let before: Value = call(
        &api,
        "GET",
        "/v1/accounts/kinde/kc_rev",
        Some(APP_KEY),
        &[],
        None,
    )
    .await
    .body;

    let reversal_path = format!("/v1/accounts/kinde/kc_rev/usage/{usage_id}/reversal");
    let first = call(&api, "POST", &reversal_path, Some(APP_KEY), &[], None).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!(
        (
            &first.body["amount"],
            &first.body["used"],
            &first.body["remaining"],
            &first.body["replayed"]
        ),
        (&json!(150), &json!(100), &json!(400), &json!(false))
    );
    // Asked again (the answer lost): the same answer, replayed, and nothing moves twice.
    let again = call(&api, "POST", &reversal_path, Some(APP_KEY), &[], None).await;
    assert_eq!(again.status, StatusCode::OK);
    assert!(again.replayed_header);
    assert_eq!(again.body["replayed"], true);
    assert_eq!(again.body["reversed_at"], first.body["reversed_at"]);
    assert_eq!(again.body["used"], 100);
    let after: Value = call(
        &api,
        "GET",
        "/v1/accounts/kinde/kc_rev",
        Some(APP_KEY),
        &[],
        None,
    )
    .await
    .body;
    assert_eq!(
        (&after["used"], &after["remaining"]),
        (&json!(100), &json!(400))
    );
    assert_ne!(
        after["version"], before["version"],
        "a reversal moves the version"
    );

    // The usage list shows what counts: the debit kept.
    let listed = call(
        &api,
        "GET",
        "/v1/accounts/kinde/kc_rev/usage",
        Some(APP_KEY),
        &[],
        None,
    )
    .await
    .body;
    let listed_ids: Vec<&Value> = listed["usage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| &u["usage_id"])
        .collect();
    assert_eq!(listed_ids, vec![&kept.body["usage_id"]]);
    assert_eq!(listed["used"], 100);

    // The key of the reversed debit still answers as it first did: a debit is a stored fact.
    let retried = debit_of("req_taken", 150).await;
    assert_eq!(retried.body["usage_id"], usage_id.as_str());
    assert!(retried.replayed_header);

    // A refused debit spent nothing; an unknown id, or another account's, is not found.
    let refused = debit_of("req_refused", 10_000).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    let refused_id: String = sqlx::query_scalar(
        "SELECT usage_id FROM usage_debits WHERE idempotency_key = 'req_refused'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let not_accepted = call(
        &api,
        "POST",
        &format!("/v1/accounts/kinde/kc_rev/usage/{refused_id}/reversal"),
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        (not_accepted.status, not_accepted.body["code"].as_str()),
        (StatusCode::CONFLICT, Some("not_accepted"))
    );
    on_pro(&app, "kc_other").await;
    let elsewhere = call(
        &api,
        "POST",
        &format!("/v1/accounts/kinde/kc_other/usage/{usage_id}/reversal"),
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        elsewhere.status,
        StatusCode::NOT_FOUND,
        "{}",
        elsewhere.body
    );
    // A reader may not reverse; GET is not a reversal.
    let reader = call(
        &api,
        "POST",
        &reversal_path,
        Some(crate::app_api::READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(reader.status, StatusCode::FORBIDDEN);
    let get = call(&api, "GET", &reversal_path, Some(APP_KEY), &[], None).await;
    assert_eq!(get.status, StatusCode::METHOD_NOT_ALLOWED);

    // The audit's fold agrees with the stored used: the reversed debit does not count.
    let audit = app.audit().await;
    assert!(audit.divergent.is_empty(), "{:?}", audit.divergent);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn concurrent_reversals_of_one_debit_return_its_amount_once(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_race").await;
    let who = customer("kc_race");
    let usage_id = usage_id_of(&debit(&pool, &ask("kinde", &who, "req_race", 40, None)).await);
    let tries = (0..8).map(|_| {
        let pool = pool.clone();
        let (who, usage_id) = (who.clone(), usage_id.clone());
        tokio::spawn(async move { reverse(&pool, "kinde", &who, &usage_id).await })
    });
    let answers = futures::future::join_all(tries).await;
    let firsts = answers
        .iter()
        .filter(|a| {
            matches!(
                a.as_ref().unwrap().reversal,
                Reversal::Reversed {
                    replayed: false,
                    ..
                }
            )
        })
        .count();
    assert_eq!(firsts, 1, "one reversal; the others are its answer again");
    let used: i64 =
        sqlx::query_scalar("SELECT used FROM usage_periods WHERE customer_id = 'kc_race'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(used, 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_report_that_never_went_out_is_withdrawn_and_never_reaches_the_provider(pool: PgPool) {
    // The fake's server lives as long as its binding.
    let StripeMetered {
        fake,
        server: _server,
        meters,
        who,
        ..
    } = stripe_metered(&pool, "cus_withdrawn").await;
    let debited = debit(&pool, &ask("stripe", &who, "req_w", 4, Some("api_calls"))).await;
    let id = debited.reported.clone().unwrap();

    let reversed = reverse(&pool, "stripe", &who, &usage_id_of(&debited)).await;
    assert_eq!(reversed.correction, None, "nothing to correct");
    assert_eq!(report(&pool, &id).await.status, "withdrawn");
    // The queue's message for the report still comes: it finds nothing to send.
    assert_eq!(send(&pool, &meters, &id).await, Reported::Skipped);
    assert_eq!(fake.posts(), 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_report_stripe_holds_is_cancelled_by_an_adjustment_within_its_window(pool: PgPool) {
    let StripeMetered {
        fake,
        server,
        meters,
        who,
        ..
    } = stripe_metered(&pool, "cus_cancel").await;
    let debited = debit(&pool, &ask("stripe", &who, "req_c", 6, Some("api_calls"))).await;
    let id = debited.reported.clone().unwrap();
    assert_eq!(send(&pool, &meters, &id).await, Reported::Sent);
    let usage_id = usage_id_of(&debited);

    let correction = reverse(&pool, "stripe", &who, &usage_id)
        .await
        .correction
        .expect("a correction of the report Stripe holds");
    // Asked again, the reversal writes no second one.
    assert_eq!(
        reverse(&pool, "stripe", &who, &usage_id).await.correction,
        None
    );
    assert_eq!(send(&pool, &meters, &correction).await, Reported::Sent);
    // SQS delivers twice now and then: the second finds it sent.
    assert_eq!(send(&pool, &meters, &correction).await, Reported::Skipped);

    let adjustments = fake.adjustments();
    assert_eq!(adjustments.len(), 1, "{adjustments:?}");
    assert_eq!(adjustments[0]["event_name"], "api_calls");
    assert_eq!(adjustments[0]["type"], "cancel");
    assert_eq!(
        adjustments[0]["cancel[identifier]"],
        identifier("stripe", &who, "req_c")
    );
    let requests = server.received_requests().await.unwrap();
    let adjustment = requests
        .iter()
        .find(|r| r.url.path() == "/v1/billing/meter_event_adjustments")
        .unwrap();
    assert_eq!(
        adjustment.headers.get("idempotency-key").unwrap(),
        format!("{correction}-1").as_str(),
        "the attempt's own key"
    );
    let row = report(&pool, &correction).await;
    assert_eq!(
        (row.kind.as_str(), row.how.as_deref(), row.status.as_str()),
        ("correction", Some("cancel"), "sent")
    );
    assert_eq!(row.corrects.as_deref(), Some(id.as_str()));
    assert_eq!(fake.held().len(), 1, "no meter event but the report");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn past_stripes_window_a_correction_is_a_report_of_the_negative_value(pool: PgPool) {
    // The fake's server lives as long as its binding.
    let StripeMetered {
        fake,
        server: _server,
        meters,
        who,
        ..
    } = stripe_metered(&pool, "cus_late").await;
    let debited = debit(&pool, &ask("stripe", &who, "req_l", 9, Some("api_calls"))).await;
    let id = debited.reported.clone().unwrap();
    assert_eq!(send(&pool, &meters, &id).await, Reported::Sent);
    // Stripe took it two days ago: past the 24 hours in which an adjustment cancels it.
    sqlx::query(
        "UPDATE meter_reports SET first_sent_at = first_sent_at - interval '2 days' WHERE id = $1",
    )
    .bind(&id)
    .execute(&pool)
    .await
    .unwrap();

    let usage_id = usage_id_of(&debited);
    let correction = reverse(&pool, "stripe", &who, &usage_id)
        .await
        .correction
        .unwrap();
    assert_eq!(send(&pool, &meters, &correction).await, Reported::Sent);
    assert!(fake.adjustments().is_empty());
    let held = fake.held();
    let compensating = &held[&correction_identifier("stripe", &who, &usage_id)];
    assert_eq!(compensating["payload[value]"], "-9");
    assert_eq!(compensating["payload[stripe_customer_id]"], "cus_late");
    let original = &held[&identifier("stripe", &who, "req_l")];
    assert_eq!(
        compensating["timestamp"], original["timestamp"],
        "timed as the report it takes back: the same month at Stripe"
    );
    assert_eq!(
        report(&pool, &correction).await.how.as_deref(),
        Some("compensate")
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_correction_waits_for_its_report_and_is_withdrawn_with_one_the_provider_never_took(
    pool: PgPool,
) {
    // The fake's server lives as long as its binding.
    let StripeMetered {
        fake,
        server: _server,
        meters,
        who,
        ..
    } = stripe_metered(&pool, "cus_wait").await;

    // A report on its way (claimed, its send not recorded): reversed now, it is corrected
    // once it is settled, never before.
    let on_way = debit(
        &pool,
        &ask("stripe", &who, "req_on_way", 2, Some("api_calls")),
    )
    .await;
    let on_way_id = on_way.reported.clone().unwrap();
    let refusing = FakeStripe::failing(
        500,
        json!({"error": {"type": "api_error", "message": "try again"}}),
    );
    let refusing_server = refusing.serve().await;
    let first = send(&pool, &stripe_meters(&refusing_server), &on_way_id).await;
    assert!(
        matches!(
            first,
            Reported::Failed {
                status: ReportStatus::Pending,
                ..
            }
        ),
        "{first:?}"
    );
    let correction = reverse(&pool, "stripe", &who, &usage_id_of(&on_way))
        .await
        .correction
        .expect("the provider may hold it: a correction");
    let early = send(&pool, &meters, &correction).await;
    assert!(
        matches!(&early, Reported::Failed { status: ReportStatus::Pending, error } if error.contains("waits")),
        "{early:?}"
    );
    assert_eq!(fake.posts(), 0, "nothing sent before the report is settled");
    assert_eq!(send(&pool, &meters, &on_way_id).await, Reported::Sent);
    assert_eq!(send(&pool, &meters, &correction).await, Reported::Sent);
    assert_eq!(fake.adjustments().len(), 1);

    // A report that died refused (the provider never took it), reversed later: withdrawn, and
    // its correction with it, if one was written.
    let refused = debit(
        &pool,
        &ask("stripe", &who, "req_refused", 3, Some("api_calls")),
    )
    .await;
    let refused_id = refused.reported.clone().unwrap();
    let refusing = FakeStripe::failing(
        400,
        json!({"error": {"type": "invalid_request_error", "message": "No such customer"}}),
    );
    let refusing_server = refusing.serve().await;
    send(&pool, &stripe_meters(&refusing_server), &refused_id).await;
    assert_eq!(report(&pool, &refused_id).await.status, "dead");
    let reversed = reverse(&pool, "stripe", &who, &usage_id_of(&refused)).await;
    assert_eq!(reversed.correction, None);
    assert_eq!(report(&pool, &refused_id).await.status, "withdrawn");
    assert_eq!(fake.posts(), 2, "the on-way report and its adjustment");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_polar_correction_is_a_compensating_event_and_kinde_refuses_one_for_an_operator(
    pool: PgPool,
) {
    // Polar's ingest as the one fake Polar answers it (provider_fakes::polar, each behaviour
    // cited there); Kinde's refusal below makes no request of it.
    let polar = provider_fakes::FakePolar::default();
    let server = polar.serve().await;
    let app = TestApp::spawn(pool.clone()).await;
    let polar_customer = "992fae2a-2a17-4b7a-8d9e-e287cf90131b";
    polar_on_pro(&app, polar_customer).await;
    let who = customer(polar_customer);
    let meters = meters_of(&[metered(
        "polar",
        &server.uri(),
        json!({"event_name": "api_calls"}),
    )]);
    let debited = debit(&pool, &ask("polar", &who, "req_p", 5, Some("api_calls"))).await;
    assert_eq!(
        send(&pool, &meters, &debited.reported.clone().unwrap()).await,
        Reported::Sent
    );
    let usage_id = usage_id_of(&debited);
    let correction = reverse(&pool, "polar", &who, &usage_id)
        .await
        .correction
        .unwrap();
    assert_eq!(send(&pool, &meters, &correction).await, Reported::Sent);
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);
    let body: Value = serde_json::from_slice(&requests[1].body).unwrap();
    let event = &body["events"][0];
    assert_eq!(
        event["external_id"],
        correction_identifier("polar", &who, &usage_id).as_str()
    );
    assert_eq!(event["metadata"]["value"], -5);
    assert_eq!(event["name"], "api_calls");
    assert_eq!(
        report(&pool, &correction).await.how.as_deref(),
        Some("compensate")
    );

    // Kinde documents neither an adjustment nor a negative usage: its correction is refused
    // before any request, for an operator to make in Kinde.
    let kinde = metered("kinde", &server.uri(), json!({"feature_code": "api_calls"}));
    let http = reqwest::Client::new();
    let meter = provider(SourceKind::Kinde)
        .meter(Api::for_source(&kinde, &http).unwrap(), "api_calls")
        .unwrap();
    let correction = MeterReport {
        id: "mrp_00000000000000000000000000000002".into(),
        source: "kinde".into(),
        customer: customer("kc_1"),
        identifier: "bi_y".into(),
        meter: "api_calls".into(),
        value: 5,
        occurred_at: chrono::Utc::now(),
        first_sent_at: None,
        unanswered: false,
        take_back: Some(TakeBack::Compensate),
        send_key: None,
    };
    assert!(matches!(meter.send(&correction).await, Sent::Refused(e) if e.contains("Kinde")));
    assert_eq!(
        server.received_requests().await.unwrap().len(),
        2,
        "no request for it"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_reversal_tells_the_app_once_with_what_became_of_the_meter(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    let effects_url = app.enable_effects().await;
    stripe_on_pro(&app, "cus_told").await;
    let fake = FakeStripe::default();
    let server = fake.serve().await;
    let meters = stripe_meters(&server);
    let mut api = api_state(&pool);
    api.effects = Some(shared::platform::queue::Queue::new(
        app.sqs.clone(),
        effects_url.clone(),
    ));
    api.meters = std::collections::HashMap::from([("stripe".to_owned(), "api_calls".to_owned())]);
    let debited = call(
        &api,
        "POST",
        "/v1/accounts/stripe/cus_told/usage",
        Some(APP_KEY),
        &[("idempotency-key", "req_t")],
        Some(json!({"amount": 8})),
    )
    .await;
    let usage_id = debited.body["usage_id"].as_str().unwrap().to_owned();
    let report_id = reports(&pool).await[0].id.clone();
    assert_eq!(send(&pool, &meters, &report_id).await, Reported::Sent);
    let reversal_path = format!("/v1/accounts/stripe/cus_told/usage/{usage_id}/reversal");
    for _ in 0..2 {
        let answer = call(&api, "POST", &reversal_path, Some(APP_KEY), &[], None).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    }
    let told: Vec<EffectRow> = app
        .effects()
        .await
        .into_iter()
        .filter(|e| e.kind == "billing.usage_reversed")
        .collect();
    assert_eq!(told.len(), 1, "once, whatever the retries");
    let body = &told[0].body;
    assert_eq!(body["type"], "billing.usage_reversed");
    assert_eq!(body["data"]["usage"]["usage_id"], usage_id.as_str());
    assert_eq!(body["data"]["usage"]["amount"], 8);
    assert_eq!(body["data"]["account"]["used"], 0);
    assert_eq!(body["data"]["account"]["remaining"], 500);
    assert_eq!(body["data"]["account"]["plan"], "pro");
    assert_eq!(body["data"]["meter"]["report_id"], report_id.as_str());
    assert_eq!(body["data"]["meter"]["correction"], "correcting");
    assert!(body["data"]["meter"]["correction_id"]
        .as_str()
        .unwrap()
        .starts_with("mrp_"));
    assert!(body["data"]["sequence"].as_i64().unwrap() > 0);
    let queued = app.drain(&effects_url).await;
    assert!(
        queued.contains(&told[0].id),
        "handed to the dispatcher: {queued:?}"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_operator_sees_meter_reports_and_replays_a_dead_one_through_the_admin_api(pool: PgPool) {
    use crate::app_api::ADMIN_KEY;
    // The fake's server lives as long as its binding.
    let StripeMetered {
        fake,
        server: _server,
        meters,
        who,
        ..
    } = stripe_metered(&pool, "cus_ops").await;
    let admin_queue = {
        let app = TestApp::spawn(pool.clone()).await;
        let url = create_queue(&app.sqs).await;
        (app, url)
    };
    let mut api = api_state(&pool);
    api.outbox = Some(shared::platform::queue::Queue::new(
        admin_queue.0.sqs.clone(),
        admin_queue.1.clone(),
    ));
    // One report sent, one refused for good (dead), one withdrawn by its reversal.
    let sent = debit(&pool, &ask("stripe", &who, "req_ok", 2, Some("api_calls"))).await;
    assert_eq!(
        send(&pool, &meters, &sent.reported.clone().unwrap()).await,
        Reported::Sent
    );
    let refusing = FakeStripe::failing(
        400,
        json!({"error": {"type": "invalid_request_error", "message": "No such meter"}}),
    );
    let refusing_server = refusing.serve().await;
    let dead = debit(
        &pool,
        &ask("stripe", &who, "req_dead", 3, Some("api_calls")),
    )
    .await;
    let dead_id = dead.reported.clone().unwrap();
    send(&pool, &stripe_meters(&refusing_server), &dead_id).await;
    let gone = debit(
        &pool,
        &ask("stripe", &who, "req_gone", 1, Some("api_calls")),
    )
    .await;
    reverse(&pool, "stripe", &who, &usage_id_of(&gone)).await;

    let get = |path: &'static str| {
        let api = &api;
        async move { call(api, "GET", path, Some(ADMIN_KEY), &[], None).await }
    };
    let overview = get("/v1/admin/overview").await;
    assert_eq!(
        overview.body["meter_reports"],
        json!({"pending": 0, "dead": 1, "differences_open": 0})
    );
    let attention = overview.body["needs_attention"].as_array().unwrap();
    let dead_item = attention
        .iter()
        .find(|a| a["kind"] == "dead_meter_reports")
        .expect("a dead report needs a person");
    assert_eq!(dead_item["link"], "meters?status=dead");

    let all = get("/v1/admin/meter-reports").await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.body);
    let statuses: Vec<&str> = all.body["reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, vec!["withdrawn", "dead", "sent"], "newest first");
    let only_dead = get("/v1/admin/meter-reports?status=dead&source=stripe&customer=cus_ops").await;
    assert_eq!(only_dead.body["reports"].as_array().unwrap().len(), 1);
    assert_eq!(only_dead.body["reports"][0]["id"], dead_id.as_str());
    assert_eq!(
        get("/v1/admin/meter-reports?status=lost").await.body["code"],
        "bad_status"
    );
    assert_eq!(
        get("/v1/admin/meter-reports?customer=cus_ops").await.body["code"],
        "bad_customer"
    );

    // The operator fixed the meter at Stripe and replays the dead report: pending again,
    // handed to the dispatcher, written to the trail; then the dispatcher sends it.
    let replay_path = format!("/v1/admin/meter-reports/{dead_id}/replay");
    let replayed = call(&api, "POST", &replay_path, Some(ADMIN_KEY), &[], None).await;
    assert_eq!(
        replayed.body,
        json!({"report_id": dead_id, "status": "pending"})
    );
    assert_eq!(
        admin_queue.0.drain(&admin_queue.1).await,
        vec![dead_id.clone()]
    );
    assert_eq!(send(&pool, &meters, &dead_id).await, Reported::Sent);
    assert_eq!(fake.held().len(), 2);
    let trail = get("/v1/admin/audit-trail?limit=1").await;
    assert_eq!(trail.body["actions"][0]["action"], "meter_report.replay");
    assert_eq!(trail.body["actions"][0]["target"], dead_id.as_str());
    let unknown = call(
        &api,
        "POST",
        "/v1/admin/meter-reports/mrp_none/replay",
        Some(ADMIN_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    // An app's key is not an operator's.
    let app_key = call(
        &api,
        "GET",
        "/v1/admin/meter-reports",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(app_key.status, StatusCode::FORBIDDEN);
}

/// The deployed api function holds a pool of one connection (`ApiState::from_config`): a
/// meter report's replay that asked the pool for a second connection inside its transaction
/// waited for itself and answered 503 (found by the console's browser test).
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_meter_report_is_replayed_by_an_api_of_one_connection(pool: PgPool) {
    use crate::app_api::ADMIN_KEY;
    let StripeMetered {
        server: _server,
        who,
        ..
    } = stripe_metered(&pool, "cus_one").await;
    let refusing = FakeStripe::failing(
        400,
        json!({"error": {"type": "invalid_request_error", "message": "No such meter"}}),
    );
    let refusing_server = refusing.serve().await;
    let dead = debit(&pool, &ask("stripe", &who, "req_one", 2, Some("api_calls"))).await;
    let dead_id = dead.reported.clone().unwrap();
    send(&pool, &stripe_meters(&refusing_server), &dead_id).await;

    let mut api = api_state(&pool);
    api.pool = shared::platform::database::pool_options(1)
        .acquire_timeout(std::time::Duration::from_secs(3))
        .connect_lazy_with(pool.connect_options().as_ref().clone());
    let replayed = call(
        &api,
        "POST",
        &format!("/v1/admin/meter-reports/{dead_id}/replay"),
        Some(ADMIN_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(replayed.status, StatusCode::OK, "{}", replayed.body);
    assert_eq!(replayed.body["status"], "pending");
}

fn api_error() -> Value {
    json!({"error": {"type": "api_error", "message": "An unknown error occurred"}})
}

/// A correction taken while its report is still being retried waits, and waiting is not an
/// attempt: however long the report takes, the correction is sent once it is settled, and the
/// reversed debit is not billed.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_correction_waiting_for_its_report_spends_no_attempts_and_is_sent_once_it_settles(
    pool: PgPool,
) {
    let StripeMetered {
        fake,
        server: _server,
        meters,
        who,
        ..
    } = stripe_metered(&pool, "cus_patient").await;
    let debited = debit(&pool, &ask("stripe", &who, "req_p", 3, Some("api_calls"))).await;
    let id = debited.reported.clone().unwrap();
    // Stripe takes the report and answers 500: it may hold it, so its reversal corrects it.
    fake.then(Fault::TakesThenFails(500, api_error()));
    send(&pool, &meters, &id).await;
    let correction = reverse(&pool, "stripe", &who, &usage_id_of(&debited))
        .await
        .correction
        .expect("a correction");
    // The report is retried through an outage; the correction's message comes each time.
    for _ in 0..4 {
        let early = send(&pool, &meters, &correction).await;
        assert!(
            matches!(&early, Reported::Failed { status: ReportStatus::Pending, error } if error.contains("waits")),
            "{early:?}"
        );
        fake.then(Fault::Fails(503, api_error()));
        send(&pool, &meters, &id).await;
    }
    for _ in 0..4 {
        send(&pool, &meters, &correction).await;
    }
    assert_eq!(
        (
            report(&pool, &correction).await.status.as_str(),
            report(&pool, &correction).await.attempts
        ),
        ("pending", 0),
        "waiting spends no attempt"
    );
    assert_eq!(send(&pool, &meters, &id).await, Reported::Sent);
    assert_eq!(send(&pool, &meters, &correction).await, Reported::Sent);
    assert_eq!(
        fake.total("cus_patient"),
        0.0,
        "the reversed debit is not billed"
    );
}

/// A correction dies beside a report that died where Stripe may hold it; once an operator
/// replays the report and it is sent, the correction is armed again and takes it back.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_correction_that_died_beside_its_report_is_armed_again_when_the_report_is_sent(
    pool: PgPool,
) {
    let StripeMetered {
        fake,
        server: _server,
        meters,
        who,
        ..
    } = stripe_metered(&pool, "cus_rearmed").await;
    let debited = debit(&pool, &ask("stripe", &who, "req_r", 4, Some("api_calls"))).await;
    let id = debited.reported.clone().unwrap();
    fake.then(Fault::TakesThenFails(500, api_error()));
    for _ in 1..shared::domain::retry::RetryPolicy::MAX_ATTEMPTS {
        fake.then(Fault::Fails(503, api_error()));
    }
    for _ in 0..shared::domain::retry::RetryPolicy::MAX_ATTEMPTS {
        send(&pool, &meters, &id).await;
    }
    assert_eq!(report(&pool, &id).await.status, "dead");
    let correction = reverse(&pool, "stripe", &who, &usage_id_of(&debited))
        .await
        .correction
        .expect("Stripe may hold it: a correction");
    let refused = send(&pool, &meters, &correction).await;
    assert!(
        matches!(&refused, Reported::Failed { status: ReportStatus::Dead, error } if error.contains("may hold it")),
        "{refused:?}"
    );

    // The operator replays the report (not the correction): Stripe says it holds it.
    shared::meters::outbox::replay(&pool, None, std::slice::from_ref(&id), false)
        .await
        .unwrap();
    assert_eq!(send(&pool, &meters, &id).await, Reported::Sent);
    assert_eq!(report(&pool, &correction).await.status, "pending");
    assert_eq!(send(&pool, &meters, &correction).await, Reported::Sent);
    assert_eq!(
        fake.total("cus_rearmed"),
        0.0,
        "the reversed debit is not billed"
    );
}

/// A cancel that did not land (Stripe refused it for the rate, before taking it) while the
/// report was still within Stripe's 24 hours is, once those have passed, a compensating
/// report: the way is chosen at each attempt until one may have landed.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_cancel_that_did_not_land_within_stripes_window_becomes_a_compensating_report(
    pool: PgPool,
) {
    let metered = stripe_metered(&pool, "cus_window").await;
    let (fake, meters) = (&metered.fake, &metered.meters);
    let (debited, id) = metered.sent(&pool, "req_w", 6).await;
    let correction = metered.correction_of(&pool, &debited).await;
    // "Too many requests hit the API too quickly" (docs.stripe.com/api/errors): a 429 is
    // answered before anything executes.
    fake.then(Fault::Fails(
        429,
        json!({"error": {"type": "invalid_request_error", "code": "rate_limit",
                         "message": "Too many requests hit the API too quickly."}}),
    ));
    let first = send(&pool, meters, &correction).await;
    assert!(
        matches!(
            &first,
            Reported::Failed {
                status: ReportStatus::Pending,
                ..
            }
        ),
        "{first:?}"
    );
    assert_eq!(
        report(&pool, &correction).await.how.as_deref(),
        Some("cancel")
    );
    // A day later, Stripe no longer cancels the report.
    fake.age(chrono::Duration::hours(25));
    sqlx::query(
        "UPDATE meter_reports SET first_sent_at = first_sent_at - interval '25 hours',
                sent_at = sent_at - interval '25 hours' WHERE id = $1",
    )
    .bind(&id)
    .execute(&pool)
    .await
    .unwrap();
    // The pause a 429 asks for is over too (the correction waited it out, its attempt not
    // spent: docs/design.md §6.7).
    sqlx::query("UPDATE meter_reports SET next_attempt_at = inbox_now() WHERE id = $1")
        .bind(&correction)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(send(&pool, meters, &correction).await, Reported::Sent);
    assert_eq!(
        report(&pool, &correction).await.how.as_deref(),
        Some("compensate")
    );
    assert!(fake.adjustments().is_empty());
    assert_eq!(fake.total("cus_window"), 0.0, "6 and its compensation");
}

/// A cancel that may have landed (Stripe took it, then answered 500) is never followed by a
/// compensating report, which would take the value back twice: past Stripe's window it stops
/// for an operator.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_cancel_that_may_have_landed_is_never_followed_by_a_compensation(pool: PgPool) {
    let metered = stripe_metered(&pool, "cus_twice").await;
    let (fake, meters) = (&metered.fake, &metered.meters);
    let (debited, id) = metered.sent(&pool, "req_t", 5).await;
    let correction = metered.correction_of(&pool, &debited).await;
    fake.then(Fault::TakesThenFails(500, api_error()));
    let first = send(&pool, meters, &correction).await;
    assert!(
        matches!(
            &first,
            Reported::Failed {
                status: ReportStatus::Pending,
                ..
            }
        ),
        "{first:?}"
    );
    assert_eq!(fake.total("cus_twice"), 0.0, "Stripe cancelled it");
    // The report's 24 hours at Stripe pass before the next attempt.
    sqlx::query(
        "UPDATE meter_reports SET first_sent_at = first_sent_at - interval '25 hours' WHERE id = $1",
    )
    .bind(&id)
    .execute(&pool)
    .await
    .unwrap();
    let next = send(&pool, meters, &correction).await;
    assert!(
        matches!(&next, Reported::Failed { status: ReportStatus::Dead, error } if error.contains("went unanswered")),
        "{next:?}"
    );
    assert_eq!(fake.total("cus_twice"), 0.0, "not taken back twice");
    assert_eq!(fake.events().len(), 1, "no compensating report");
}

/// A cancel Stripe took and then answered 500 is sent again on the next attempt under a key of
/// its own, and taken: Stripe saved that 500 under the first attempt's key for 24 hours and
/// would give it to every later request with that key (docs.stripe.com/api/idempotent_requests),
/// while a second cancel of the same event takes nothing more back. Found by the simulator
/// against the faithful fake (seeds 13 and 24): the correction resent the first key until it
/// died, though Stripe had cancelled the report.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_cancel_answered_500_is_sent_again_under_a_new_key_not_the_saved_one(pool: PgPool) {
    let metered = stripe_metered(&pool, "cus_saved_cancel").await;
    let (fake, meters) = (&metered.fake, &metered.meters);
    let (debited, _) = metered.sent(&pool, "req_c", 4).await;
    let correction = metered.correction_of(&pool, &debited).await;
    fake.then(Fault::TakesThenFails(500, api_error()));
    let first = send(&pool, meters, &correction).await;
    assert!(
        matches!(
            &first,
            Reported::Failed {
                status: ReportStatus::Pending,
                ..
            }
        ),
        "{first:?}"
    );
    assert_eq!(fake.total("cus_saved_cancel"), 0.0, "Stripe cancelled it");
    // The retry's wait is over.
    sqlx::query("UPDATE meter_reports SET next_attempt_at = inbox_now() WHERE id = $1")
        .bind(&correction)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(send(&pool, meters, &correction).await, Reported::Sent);
    let keys: Vec<Option<String>> = fake
        .cancels()
        .into_iter()
        .map(|c| c.idempotency_key)
        .collect();
    assert_eq!(
        keys,
        [
            Some(format!("{correction}-1")),
            Some(format!("{correction}-2"))
        ],
        "each attempt under its own key"
    );
    assert_eq!(fake.total("cus_saved_cancel"), 0.0, "taken back once");
    assert_eq!(
        report(&pool, &correction).await.how.as_deref(),
        Some("cancel")
    );
}

/// The store's clock (`inbox_now()`, which a report's `first_sent_at` is written on) is the one
/// a correction reads Stripe's 24 hours on, not the machine's: a day after the report by the
/// store's time, and by Stripe's, a correction compensates, though the machine's clock has
/// barely moved (as in the simulator, whose time runs ahead of it).
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_correction_a_day_after_its_report_by_the_stores_clock_compensates(pool: PgPool) {
    let metered = stripe_metered(&pool, "cus_ahead").await;
    let (fake, meters) = (&metered.fake, &metered.meters);
    let (debited, _) = metered.sent(&pool, "req_ahead", 4).await;
    let correction = metered.correction_of(&pool, &debited).await;
    // A day and an hour on, for the store and for Stripe alike.
    let day = chrono::Duration::hours(25);
    fake.clock_from(chrono::Utc::now() + day);
    let ahead = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                sqlx::query("SELECT set_config('inbox.clock_offset_secs', '90000', false)")
                    .execute(conn)
                    .await
                    .map(|_| ())
            })
        })
        .connect_with(pool.connect_options().as_ref().clone())
        .await
        .unwrap();
    assert_eq!(send(&ahead, meters, &correction).await, Reported::Sent);
    assert_eq!(
        report(&ahead, &correction).await.how.as_deref(),
        Some("compensate"),
        "past Stripe's cancel window by the store's clock"
    );
    assert!(fake.adjustments().is_empty());
    assert_eq!(fake.total("cus_ahead"), 0.0, "4 and its compensation");
}
