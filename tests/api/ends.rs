//! A subscription's end is state (docs/design.md §4.4): an event that only schedules or
//! withdraws a cancellation is applied, the register and `inboxctl account --json` show it,
//! the app is told `billing.subscription_updated` with the previous ends, and a late older
//! event does not overwrite them. Deliveries are the corpus's (testdata/providers/), changed
//! the way the provider changes the object.

use serde_json::{json, Value};
use sqlx::PgPool;

use crate::cli::{database_url, inboxctl, run};
use crate::corpus::{corpus, CORPUS_PLANS};
use crate::helpers::*;

/// The corpus file `name` of `dir`.
fn file(dir: &str, name: &str) -> Value {
    corpus(dir)
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("testdata/providers/{dir}/{name}.json"))
        .1
}

async fn app_with_effects(pool: PgPool) -> TestApp {
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = shared::domain::Catalog::parse(CORPUS_PLANS).unwrap();
    app.enable_effects().await;
    app
}

/// The corpus's `customer.subscription.updated` of a Stripe API generation: the subscription
/// active, its first period ending 2026-01-01, nothing scheduled.
fn stripe_active(generation: &str) -> Value {
    file(
        &format!("stripe/{generation}"),
        "customer.subscription.updated",
    )
}

/// The same subscription `secs` later, as Stripe sends it when the customer schedules the
/// cancellation at period end (`true`) or withdraws it (`false`): `cancel_at` is the period
/// end while it is scheduled, `canceled_at` the time of the request, and
/// `previous_attributes` what the change replaced.
fn stripe_cancel_at_period_end(base: &Value, id: &str, secs: i64, cancel: bool) -> Value {
    let mut event = base.clone();
    let created = base["created"].as_i64().unwrap() + secs;
    event["id"] = json!(id);
    event["created"] = json!(created);
    let period_end = json!(1_767_225_600);
    let object = &mut event["data"]["object"];
    let (now, before) = match cancel {
        true => (
            json!({"cancel_at": period_end, "cancel_at_period_end": true, "canceled_at": created,
                   "reason": "cancellation_requested"}),
            json!({"cancel_at": null, "cancel_at_period_end": false, "canceled_at": null,
                   "cancellation_details": {"reason": null}}),
        ),
        false => (
            json!({"cancel_at": null, "cancel_at_period_end": false, "canceled_at": null,
                   "reason": null}),
            json!({"cancel_at": period_end, "cancel_at_period_end": true,
                   "canceled_at": created - 3600,
                   "cancellation_details": {"reason": "cancellation_requested"}}),
        ),
    };
    for field in ["cancel_at", "cancel_at_period_end", "canceled_at"] {
        object[field] = now[field].clone();
    }
    object["cancellation_details"]["reason"] = now["reason"].clone();
    event["data"]["previous_attributes"] = before;
    event
}

/// Posts a Stripe event and applies it; its stored row.
async fn deliver_stripe(app: &TestApp, event: &Value) -> EventRow {
    let (status, body) = app.post("stripe", &stripe_delivery(event)).await;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    app.run_worker().await;
    app.event(body["event_id"].as_i64().unwrap()).await
}

/// The subscription's ends as its register holds them.
async fn register(app: &TestApp, id: &str) -> Value {
    sqlx::query_scalar(
        "SELECT jsonb_build_object('status', status, 'current_period_end', current_period_end,
                                   'cancel_at_period_end', cancel_at_period_end,
                                   'cancel_at', cancel_at, 'trial_end', trial_end,
                                   'ended_at', ended_at)
         FROM subscriptions WHERE subscription_id = $1",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

/// The `billing.subscription_updated` effects, in sequence order: (now, previous).
async fn told(app: &TestApp) -> Vec<(Value, Value)> {
    app.effects()
        .await
        .into_iter()
        .filter(|e| e.kind == "billing.subscription_updated")
        .map(|e| {
            let data = &e.body["data"];
            (data["subscription"].clone(), data["previous"].clone())
        })
        .collect()
}

/// `inboxctl account <customer> --json`: its subscriptions list.
async fn account_json(app: &TestApp, source: &str, customer: &str) -> Vec<Value> {
    let url = database_url(&app.pool).await;
    let (output, stdout, stderr) = run(inboxctl()
        .args(["account", customer, "--source", source, "--json"])
        .env("INBOX_PLANS", CORPUS_PLANS)
        .env("DATABASE_URL", &url));
    assert!(output.status.success(), "{stderr}");
    let account: Value = serde_json::from_str(&stdout).unwrap();
    account["subscriptions"].as_array().unwrap().clone()
}

/// `inboxctl account <customer>` as text.
async fn account_text(app: &TestApp, source: &str, customer: &str) -> String {
    let url = database_url(&app.pool).await;
    let (output, stdout, stderr) = run(inboxctl()
        .args(["account", customer, "--source", source])
        .env("INBOX_PLANS", CORPUS_PLANS)
        .env("DATABASE_URL", &url));
    assert!(output.status.success(), "{stderr}");
    stdout
}

/// Schedules the cancellation and withdraws it, in both Stripe API generations.
async fn stripe_schedule_and_withdraw(pool: PgPool, generation: &str) {
    let app = app_with_effects(pool).await;
    let active = stripe_active(generation);
    let sub = active["data"]["object"]["id"].as_str().unwrap().to_owned();
    let customer = active["data"]["object"]["customer"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(deliver_stripe(&app, &active).await.status, "applied");

    let scheduled = stripe_cancel_at_period_end(&active, "evt_1SchedCancel0001", 3600, true);
    let row = deliver_stripe(&app, &scheduled).await;
    assert_eq!(row.status, "applied", "{generation}: {:?}", row.reason);
    assert_eq!(
        row.reason.as_deref(),
        Some(format!("subscription {sub} is active; cancels at period end; the pro allowance for 2025-12 is already granted").as_str())
    );
    assert_eq!(
        register(&app, &sub).await,
        json!({"status": "active", "current_period_end": "2026-01-01T00:00:00+00:00",
               "cancel_at_period_end": true, "cancel_at": "2026-01-01T00:00:00+00:00",
               "trial_end": null, "ended_at": null}),
        "{generation}"
    );
    let listed = account_json(&app, "stripe", &customer).await;
    assert_eq!(listed[0]["cancel_at_period_end"], true, "{generation}");
    let text = account_text(&app, "stripe", &customer).await;
    assert!(
        text.lines().any(|l| l.contains(&sub)
            && l.contains("pro")
            && l.contains("until 2026-01-01, cancels at period end")),
        "{generation}: {text}"
    );
    assert_eq!(listed[0]["current_period_end"], "2026-01-01T00:00:00Z");
    assert_eq!(listed[0]["cancel_at"], "2026-01-01T00:00:00Z");
    let (now, previous) = told(&app).await.pop().unwrap();
    assert_eq!(
        now,
        json!({"id": sub, "status": "active", "plan": "pro",
               "current_period_end": "2026-01-01T00:00:00.000Z", "cancel_at_period_end": true,
               "cancel_at": "2026-01-01T00:00:00.000Z", "trial_end": null, "ended_at": null}),
        "{generation}"
    );
    assert_eq!(
        previous,
        json!({"status": "active", "plan": "pro",
               "current_period_end": "2026-01-01T00:00:00.000Z", "cancel_at_period_end": false,
               "cancel_at": null, "trial_end": null, "ended_at": null}),
        "{generation}: the app is told what it was"
    );

    let withdrawn = stripe_cancel_at_period_end(&active, "evt_1WithdrawCancel1", 7200, false);
    let row = deliver_stripe(&app, &withdrawn).await;
    assert_eq!(row.status, "applied", "{generation}: {:?}", row.reason);
    assert_eq!(
        row.reason.as_deref(),
        Some(format!("subscription {sub} is active; no longer cancels at period end; the pro allowance for 2025-12 is already granted").as_str())
    );
    assert_eq!(register(&app, &sub).await["cancel_at_period_end"], false);
    assert_eq!(register(&app, &sub).await["cancel_at"], Value::Null);
    let (now, previous) = told(&app).await.pop().unwrap();
    assert_eq!(now["cancel_at_period_end"], false);
    assert_eq!(previous["cancel_at_period_end"], true);
    assert_eq!(previous["cancel_at"], "2026-01-01T00:00:00.000Z");
    assert_eq!(
        told(&app).await.len(),
        3,
        "{generation}: created, scheduled, withdrawn"
    );
    assert_eq!(
        account_json(&app, "stripe", &customer).await[0]["cancel_at_period_end"],
        false
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_cancellation_scheduled_and_withdrawn_is_applied_and_told_before_basil(pool: PgPool) {
    stripe_schedule_and_withdraw(pool, "pre-basil").await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_cancellation_scheduled_and_withdrawn_is_applied_and_told_from_basil_on(pool: PgPool) {
    stripe_schedule_and_withdraw(pool, "basil").await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_late_older_event_does_not_overwrite_the_ends(pool: PgPool) {
    let app = app_with_effects(pool).await;
    for generation in ["pre-basil", "basil"] {
        let active = stripe_active(generation);
        let sub = active["data"]["object"]["id"].as_str().unwrap().to_owned();
        let scheduled = stripe_cancel_at_period_end(
            &active,
            &format!("evt_1LateSched{generation}"),
            3600,
            true,
        );
        let withdrawn = stripe_cancel_at_period_end(
            &active,
            &format!("evt_1LateWithdr{generation}"),
            7200,
            false,
        );
        // The withdrawal arrives first; the request it withdrew, an hour older, and the
        // subscription's first state land after it.
        assert_eq!(deliver_stripe(&app, &withdrawn).await.status, "applied");
        for late in [&scheduled, &active] {
            let late = deliver_stripe(&app, late).await;
            assert_eq!(late.status, "ignored", "{generation}");
            assert!(
                late.reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with(&format!(
                        "a newer state of subscription {sub} is already stored"
                    ))),
                "{generation}: {:?}",
                late.reason
            );
        }
        let held = register(&app, &sub).await;
        assert_eq!(held["cancel_at_period_end"], false, "{generation}");
        assert_eq!(held["cancel_at"], Value::Null, "{generation}");
    }
    assert_eq!(
        told(&app).await.len(),
        2,
        "each subscription's state once; the late events tell nothing"
    );
}

/// Posts a Polar body under message id `id` and applies it; its stored row.
async fn deliver_polar(app: &TestApp, id: &str, body: &Value) -> EventRow {
    let (status, answer) = app.post("polar", &polar_delivery(id, body)).await;
    assert_eq!(status, http::StatusCode::OK, "{answer}");
    app.run_worker().await;
    app.event(answer["event_id"].as_i64().unwrap()).await
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn polar_cancel_and_uncancel_are_applied_told_and_a_late_cancel_is_ignored(pool: PgPool) {
    let app = app_with_effects(pool).await;
    let updated = file("polar", "subscription.updated");
    let canceled = file("polar", "subscription.canceled");
    let uncanceled = file("polar", "subscription.uncanceled");
    let sub = updated["data"]["id"].as_str().unwrap().to_owned();
    let customer = updated["data"]["customer_id"].as_str().unwrap().to_owned();
    assert_eq!(
        deliver_polar(&app, "msg_upd", &updated).await.status,
        "applied"
    );

    let row = deliver_polar(&app, "msg_cancel", &canceled).await;
    assert_eq!(row.status, "applied", "{:?}", row.reason);
    assert_eq!(
        row.reason.as_deref(),
        Some(format!("subscription {sub} is active; cancels at period end; the pro allowance for 2025-12 is already granted").as_str())
    );
    let held = register(&app, &sub).await;
    assert_eq!(held["cancel_at_period_end"], true);
    assert_eq!(
        held["cancel_at"], "2026-01-01T10:00:03.118204+00:00",
        "Polar's ends_at"
    );
    let listed = account_json(&app, "polar", &customer).await;
    assert_eq!(listed[0]["cancel_at_period_end"], true);
    assert_eq!(listed[0]["cancel_at"], "2026-01-01T10:00:03.118204Z");
    let (now, previous) = told(&app).await.pop().unwrap();
    assert_eq!(now["cancel_at_period_end"], true);
    assert_eq!(now["cancel_at"], "2026-01-01T10:00:03.118Z");
    assert_eq!(previous["cancel_at_period_end"], false);
    assert_eq!(previous["cancel_at"], Value::Null);

    let row = deliver_polar(&app, "msg_uncancel", &uncanceled).await;
    assert_eq!(row.status, "applied", "{:?}", row.reason);
    assert_eq!(register(&app, &sub).await["cancel_at_period_end"], false);
    let (now, previous) = told(&app).await.pop().unwrap();
    assert_eq!(
        (
            now["cancel_at_period_end"].clone(),
            previous["cancel_at_period_end"].clone()
        ),
        (json!(false), json!(true))
    );

    // The cancel again, under another message id: older than the uncancel, it is ignored.
    let late = deliver_polar(&app, "msg_cancel_again", &canceled).await;
    assert_eq!(late.status, "ignored");
    assert_eq!(register(&app, &sub).await["cancel_at_period_end"], false);
    assert_eq!(told(&app).await.len(), 3);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_provider_read_settles_a_same_second_tie_that_differs_only_in_the_ends(pool: PgPool) {
    let mut app = app_with_effects(pool).await;
    let api = crate::thin::StripeApi::start().await;
    let active = stripe_active("basil");
    // Scheduled and withdrawn within one second; the provider shows it withdrawn. The
    // scheduling event's id sorts last, so the dedupe key alone would keep it.
    let pair = |n: usize| {
        let mut base = active.clone();
        base["data"]["object"]["id"] = json!(format!("sub_1BasilTie{n}"));
        base["data"]["object"]["customer"] = json!(format!("cus_BasilTie{n}"));
        let scheduled = stripe_cancel_at_period_end(&base, &format!("evt_1Z{n}"), 60, true);
        let withdrawn = stripe_cancel_at_period_end(&base, &format!("evt_1A{n}"), 60, false);
        (base, scheduled, withdrawn)
    };
    for n in 0..2 {
        let (_, _, withdrawn) = pair(n);
        api.fake.holds(withdrawn["data"]["object"].clone());
    }
    crate::traffic::with_stripe_api(&mut app.worker, &api);
    for n in 0..2 {
        let (_, scheduled, withdrawn) = pair(n);
        let order = match n {
            0 => [&scheduled, &withdrawn],
            _ => [&withdrawn, &scheduled],
        };
        let mut reasons = Vec::new();
        for event in order {
            reasons.push(deliver_stripe(&app, event).await.reason.unwrap_or_default());
        }
        let held = register(&app, &format!("sub_1BasilTie{n}")).await;
        assert_eq!(
            held["cancel_at_period_end"], false,
            "order {n}: the state the provider shows: {reasons:?}"
        );
        assert!(
            reasons[1].ends_with(&format!(
                "resolved by a provider read: sub_1BasilTie{n} is active (until 2026-01-01)"
            )),
            "order {n}: {reasons:?}"
        );
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn polars_sweep_corrects_a_cancellation_the_webhooks_never_brought(pool: PgPool) {
    use crate::scheduler::{polar_api_returns, polar_reconciler, scheduler_for};

    let app = TestApp::spawn(pool).await;
    let subscription = |cancel: bool, at: &str| {
        let ends_at = cancel.then_some("2026-03-01T00:00:00Z");
        json!({"id": "sub_sweep", "customer_id": "pc_sweep", "status": "active",
               "product_id": "prod_pro", "modified_at": at, "created_at": "2026-01-01T00:00:00Z",
               "current_period_start": "2026-02-01T00:00:00Z",
               "current_period_end": "2026-03-01T00:00:00Z", "cancel_at_period_end": cancel,
               "canceled_at": cancel.then_some(at), "ends_at": ends_at, "ended_at": null,
               "trial_end": null})
    };
    let webhook = json!({"type": "subscription.updated", "timestamp": "2026-02-01T00:00:00Z",
                         "data": subscription(false, "2026-02-01T00:00:00Z")});
    app.post("polar", &polar_delivery("msg_sweep", &webhook))
        .await;
    app.run_worker().await;
    let polar = provider_fakes::FakePolar::default();
    let server = polar.serve().await;
    let scheduler = scheduler_for(&app, vec![polar_reconciler(&server)]);

    // Same status and product, a cancellation scheduled since: a correction applies it.
    polar_api_returns(&polar, subscription(true, "2026-02-10T00:00:00Z"));
    let report = shared::handlers::scheduler::run(&scheduler).await;
    assert_eq!(report.reconciliation[0].discrepancies, 1, "{report:?}");
    app.run_worker().await;
    let held = register(&app, "sub_sweep").await;
    assert_eq!(held["cancel_at_period_end"], true);
    assert_eq!(held["cancel_at"], "2026-03-01T00:00:00+00:00");

    // Read again: local and remote agree.
    let report = shared::handlers::scheduler::run(&scheduler).await;
    assert_eq!(report.reconciliation[0].discrepancies, 0);
}
