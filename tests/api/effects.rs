//! Effects as the worker writes them (docs/design.md §11): one outbox row per change that
//! took effect, written in the event's transaction with an id from its cause, numbered per
//! account, and handed to the dispatcher's queue after the commit.

use std::collections::HashMap;

use serde_json::Value;
use shared::platform::sim::{with_interrupts, Fault, FaultAction, Point};
use sqlx::PgPool;

use crate::corpus::{corpus, CORPUS_PLANS};
use crate::helpers::*;

/// The Polar corpus's files by name, as Polar sends them.
fn polar(name: &str) -> Value {
    corpus("polar")
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("testdata/providers/polar/{name}.json"))
        .1
}

async fn polar_app(pool: PgPool) -> (TestApp, String) {
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = shared::domain::Catalog::parse(CORPUS_PLANS).unwrap();
    let effects_queue = app.enable_effects().await;
    (app, effects_queue)
}

/// Polar's `subscription.active` delivered (as `msg_active`) and worked.
async fn deliver_active(app: &TestApp) {
    app.post(
        "polar",
        &polar_delivery("msg_active", &polar("subscription.active")),
    )
    .await;
    app.run_worker().await;
}

fn kinds(effects: &[EffectRow]) -> Vec<&str> {
    effects.iter().map(|e| e.kind.as_str()).collect()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_subscription_delivered_three_times_and_replayed_three_times_is_told_once(pool: PgPool) {
    let (app, effects_queue) = polar_app(pool).await;
    let active = polar("subscription.active");
    for _ in 0..3 {
        app.post("polar", &polar_delivery("msg_active", &active))
            .await;
        app.run_worker().await;
    }
    let event_id = app.event_id("polar", "msg_active").await;
    for _ in 0..3 {
        shared::inbox::replay::replay(&app.pool, &app.state.queue, &[event_id])
            .await
            .unwrap();
        app.run_worker().await;
    }

    assert_eq!(app.count("SELECT count(*) FROM subscriptions").await, 1);
    let effects = app.effects().await;
    assert_eq!(
        kinds(&effects),
        [
            "billing.subscription_updated",
            "billing.plan_changed",
            "billing.allowance_granted"
        ],
        "one effect per change, the cause before its consequences"
    );
    let sequences: Vec<i64> = effects.iter().map(|e| e.sequence).collect();
    assert_eq!(sequences, [1, 2, 3]);
    assert!(
        effects.iter().all(|e| e.status == "pending"
            && e.source == "polar"
            && e.customer_id == "c1a124cb-d614-4eeb-91b9-1802cb91d276"),
        "pending until a dispatcher delivers them"
    );
    let subscription = &effects[0].body;
    assert_eq!(subscription["id"], effects[0].id.as_str());
    assert_eq!(subscription["type"], "billing.subscription_updated");
    // The subscription's own time: a new one has no `modified_at`, so its `created_at`, not
    // the envelope's later `timestamp` (docs/design.md §6.3).
    assert_eq!(subscription["occurred_at"], "2025-12-01T10:00:03.118Z");
    let data = &subscription["data"];
    assert_eq!(data["source"], "polar");
    assert_eq!(data["customer_id"], "c1a124cb-d614-4eeb-91b9-1802cb91d276");
    assert_eq!(data["sequence"], 1);
    assert_eq!(data["event_id"], event_id);
    assert_eq!(data["provider_event_id"], "msg_active");
    assert_eq!(data["subscription"]["status"], "active");
    assert_eq!(data["subscription"]["plan"], "pro");
    assert!(data["previous"].is_null(), "a new subscription: {data}");
    assert_eq!(data["account"]["plan"], "pro");
    assert_eq!(data["account"]["balance"], 500);
    assert_eq!(data["account"]["period"], "2025-12");
    assert_eq!(effects[1].body["data"]["previous_plan"], "free");
    assert_eq!(effects[2].body["data"]["grant"]["amount"], 500);

    let mut sent = app.drain(&effects_queue).await;
    sent.sort();
    let mut ids: Vec<String> = effects.iter().map(|e| e.id.clone()).collect();
    ids.sort();
    assert_eq!(sent, ids, "each effect handed to the dispatcher once");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_worker_crash_before_commit_writes_no_effect(pool: PgPool) {
    let (app, effects_queue) = polar_app(pool).await;
    let crash = Fault::new(Point::WorkerDecided, FaultAction::Fail(1));
    with_interrupts(crash, deliver_active(&app)).await;
    let event = app.event(app.event_id("polar", "msg_active").await).await;
    assert_eq!(event.status, "failed");
    assert!(
        app.effects().await.is_empty(),
        "rolled back with the change"
    );
    assert!(app.drain(&effects_queue).await.is_empty());
    assert_eq!(
        app.count("SELECT count(*) FROM accounts WHERE effect_seq > 0")
            .await,
        0,
        "no sequence number was taken"
    );

    // The retry applies the event, and its effects are written then, once.
    deliver_active(&app).await;
    let effects = app.effects().await;
    assert_eq!(effects.len(), 3);
    assert_eq!(effects[0].sequence, 1);
    assert_eq!(app.drain(&effects_queue).await.len(), 3);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_that_changes_nothing_writes_nothing(pool: PgPool) {
    let (app, _) = polar_app(pool).await;
    let active = polar("subscription.active");
    app.post("polar", &polar_delivery("msg_active", &active))
        .await;
    app.run_worker().await;
    let before = app.effects().await.len();
    // An older state of the same subscription, arriving later: superseded.
    let mut older = active.clone();
    older["type"] = "subscription.created".into();
    older["data"]["status"] = "incomplete".into();
    older["timestamp"] = "2025-12-01T09:00:00.000000Z".into();
    app.post("polar", &polar_delivery("msg_older", &older))
        .await;
    app.run_worker().await;
    let late = app.event(app.event_id("polar", "msg_older").await).await;
    assert_eq!(late.status, "ignored", "{:?}", late.reason);
    assert_eq!(app.effects().await.len(), before);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn without_inbox_effects_nothing_is_written(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = shared::domain::Catalog::parse(CORPUS_PLANS).unwrap();
    deliver_active(&app).await;
    let account = app
        .account("polar", "c1a124cb-d614-4eeb-91b9-1802cb91d276", "2025-12")
        .await;
    assert_eq!(account.plan, "pro");
    assert_eq!(app.count("SELECT count(*) FROM effects").await, 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_payment_its_refund_and_the_deletion_are_each_told_once(pool: PgPool) {
    let (app, _) = polar_app(pool).await;
    let customer = "c1a124cb-d614-4eeb-91b9-1802cb91d276";
    let mut deleted = polar("customer.deleted");
    // The corpus's deletion names another customer; this one is deleted here.
    deleted["data"]["id"] = customer.into();
    deleted["data"]["external_id"] = Value::Null;
    for (id, name, payload) in [
        (
            "msg_active",
            "subscription.active",
            polar("subscription.active"),
        ),
        ("msg_paid", "order.paid", polar("order.paid")),
        ("msg_refunded", "order.refunded", polar("order.refunded")),
        ("msg_paid_again", "order.paid", polar("order.paid")),
        ("msg_deleted", "customer.deleted", deleted),
    ] {
        let (status, answer) = app.post("polar", &polar_delivery(id, &payload)).await;
        assert_eq!(status, http::StatusCode::OK, "{name}: {answer}");
        app.run_worker().await;
    }
    let effects = app.effects().await;
    assert_eq!(
        kinds(&effects),
        [
            "billing.subscription_updated",
            "billing.plan_changed",
            "billing.allowance_granted",
            "billing.payment_succeeded",
            "billing.payment_refunded",
            "billing.customer_deleted",
            "billing.plan_changed",
        ]
    );
    let by_kind: HashMap<&str, &Value> = effects
        .iter()
        .map(|e| (e.kind.as_str(), &e.body["data"]))
        .collect();
    assert_eq!(
        by_kind["billing.payment_refunded"]["previous_status"],
        "paid"
    );
    assert_eq!(
        by_kind["billing.payment_refunded"]["payment"]["id"],
        "6ba7b106-d1ce-4c08-826f-cbb47601f6dd"
    );
    let last = &effects[6].body["data"];
    assert_eq!(
        (last["plan"].as_str(), last["previous_plan"].as_str()),
        (Some("free"), Some("pro")),
        "a deleted customer is on no plan"
    );
    assert_eq!(last["account"]["balance"], 0);
    let sequences: Vec<i64> = effects.iter().map(|e| e.sequence).collect();
    assert_eq!(sequences, (1..=7).collect::<Vec<i64>>());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn effects_the_queue_refused_are_enqueued_by_the_scheduler(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = shared::domain::Catalog::parse(CORPUS_PLANS).unwrap();
    app.worker.effects = Some(unreachable_queue().await);
    deliver_active(&app).await;
    let effects = app.effects().await;
    assert_eq!(effects.len(), 3);
    assert!(
        effects.iter().all(|e| e.enqueued_at.is_none()),
        "a refused send is unmarked for the rescue"
    );
    assert_eq!(
        app.event(app.event_id("polar", "msg_active").await)
            .await
            .status,
        "applied",
        "the billing change stands whatever the effects queue does"
    );

    let effects_queue = create_queue(&app.sqs).await;
    let scheduler = shared::handlers::scheduler::SchedulerState {
        effects: Some(shared::platform::queue::Queue::new(
            app.sqs.clone(),
            effects_queue.clone(),
        )),
        ..crate::scheduler::scheduler_for(&app, vec![])
    };
    let report = shared::handlers::scheduler::run(&scheduler).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let mut ids: Vec<String> = effects.iter().map(|e| e.id.clone()).collect();
    ids.sort();
    assert_eq!(report.rescued_effects, ids);
    assert_eq!(report.effect_alerts.pending, 3);
    let mut sent = app.drain(&effects_queue).await;
    sent.sort();
    assert_eq!(sent, ids);
    // Marked as enqueued now: the next run leaves them to the dispatcher.
    let again = shared::handlers::scheduler::run(&scheduler).await;
    assert!(again.rescued_effects.is_empty());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn sent_effects_are_purged_after_the_retention_and_the_others_kept(pool: PgPool) {
    let (app, _) = polar_app(pool).await;
    deliver_active(&app).await;
    let effects = app.effects().await;
    // One sent long ago, one dead long ago, one pending.
    sqlx::query(
        "UPDATE effects SET status = CASE WHEN sequence = 1 THEN 'sent' ELSE 'dead' END,
                sent_at = CASE WHEN sequence = 1 THEN now() - interval '40 days' END,
                created_at = now() - interval '40 days'
         WHERE sequence IN (1, 2)",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let report =
        shared::handlers::scheduler::run(&crate::scheduler::scheduler_for(&app, vec![])).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.purged_effects, 1);
    let left: Vec<String> = app.effects().await.into_iter().map(|e| e.id).collect();
    assert_eq!(left, [effects[1].id.clone(), effects[2].id.clone()]);
    assert_eq!(report.effect_alerts.dead, [effects[1].id.clone()]);
    assert_eq!(report.effect_alerts.dead_total, 1);
    assert_eq!(report.effect_alerts.pending, 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_app_is_told_once_however_often_the_provider_and_the_operator_repeat(pool: PgPool) {
    use shared::dev::listen::Listener;
    use shared::handlers::dispatcher::{self, DispatcherState};

    let (app, effects_queue) = polar_app(pool).await;
    // The app's endpoint: a real HTTP server that verifies each signature.
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let key = shared::signing::standard_webhooks::decode_secret(
        secret,
        shared::signing::standard_webhooks::SecretEncoding::Base64,
    )
    .unwrap();
    let endpoint = Listener::start(([127, 0, 0, 1], 0).into(), vec![key])
        .await
        .unwrap();
    let sinks = shared::platform::config::parse_sinks(
        &serde_json::json!([{"name": "app", "kind": "webhook", "url": endpoint.url(), "secret": secret}])
            .to_string(),
    )
    .unwrap();
    let dispatcher = DispatcherState::new(
        app.pool.clone(),
        shared::effects::sinks::Sinks::from_config(&sinks).unwrap(),
    );
    let dispatch = || async {
        loop {
            let report = shared::dev::lambda_triggers::pump_once(
                &app.sqs,
                &effects_queue,
                0,
                |event| async { Ok(dispatcher::handle_batch(&dispatcher, event).await) },
            )
            .await
            .unwrap();
            if report.received == 0 {
                return;
            }
        }
    };

    // The provider delivers the same webhook three times; an operator replays it three times.
    let active = polar("subscription.active");
    for _ in 0..3 {
        app.post("polar", &polar_delivery("msg_active", &active))
            .await;
        app.run_worker().await;
        dispatch().await;
    }
    let event_id = app.event_id("polar", "msg_active").await;
    for _ in 0..3 {
        shared::inbox::replay::replay(&app.pool, &app.state.queue, &[event_id])
            .await
            .unwrap();
        app.run_worker().await;
        dispatch().await;
    }

    assert_eq!(app.count("SELECT count(*) FROM subscriptions").await, 1);
    let effects = app.effects().await;
    let updates: Vec<&EffectRow> = effects
        .iter()
        .filter(|e| e.kind == "billing.subscription_updated")
        .collect();
    assert_eq!(updates.len(), 1);
    assert_eq!(
        endpoint.count(&updates[0].id),
        1,
        "received and verified once"
    );
    assert_eq!(endpoint.refused(), 0);
    assert_eq!(
        endpoint.received().len(),
        3,
        "one request per effect, no more"
    );
    assert!(effects.iter().all(|e| e.status == "sent"));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_second_deletion_stamped_earlier_tells_nothing_and_takes_no_number(pool: PgPool) {
    let (app, _) = polar_app(pool).await;
    let customer = "c1a124cb-d614-4eeb-91b9-1802cb91d276";
    deliver_active(&app).await;
    let deletion = |at: &str| {
        let mut deleted = polar("customer.deleted");
        deleted["data"]["id"] = customer.into();
        deleted["data"]["external_id"] = Value::Null;
        deleted["data"]["modified_at"] = at.into();
        deleted["timestamp"] = at.into();
        deleted
    };
    // The later deletion arrives first; the earlier one moves the tombstone back.
    for (id, at) in [
        ("msg_deleted_late", "2025-12-20T09:31:02.266170Z"),
        ("msg_deleted_early", "2025-12-10T08:00:00.000000Z"),
        ("msg_active_again", ""),
    ] {
        if id == "msg_active_again" {
            // A later write to the account: its number follows without a gap.
            let mut order = polar("order.paid");
            order["data"]["id"] = "ord_after".into();
            app.post("polar", &polar_delivery(id, &order)).await;
        } else {
            app.post("polar", &polar_delivery(id, &deletion(at))).await;
        }
        app.run_worker().await;
    }
    let early = app
        .event(app.event_id("polar", "msg_deleted_early").await)
        .await;
    assert_eq!(
        early.status, "applied",
        "the tombstone moved: {:?}",
        early.reason
    );
    let effects = app.effects().await;
    let deletions = effects
        .iter()
        .filter(|e| e.kind == "billing.customer_deleted")
        .count();
    assert_eq!(deletions, 1, "told once: {:?}", kinds(&effects));
    let sequences: Vec<i64> = effects.iter().map(|e| e.sequence).collect();
    let expected: Vec<i64> = (1..=effects.len() as i64).collect();
    assert_eq!(sequences, expected, "{:?}", kinds(&effects));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_rescue_buries_a_last_attempt_and_re_enqueues_expired_holds_and_due_retries(
    pool: PgPool,
) {
    let (app, effects_queue) = polar_app(pool).await;
    deliver_active(&app).await;
    app.drain(&effects_queue).await;
    let effects = app.effects().await;
    let (held, last, due) = (&effects[0].id, &effects[1].id, &effects[2].id);
    // A dispatcher died holding the first (attempt 2) and the second (its 6th and last
    // attempt); the third failed and its retry is due. Each was enqueued before that.
    sqlx::query(
        "UPDATE effects SET enqueued_at = now() - interval '2 minutes',
                locked_until = CASE WHEN id = ANY($1) THEN now() - interval '1 minute' END,
                attempts = CASE WHEN id = $2 THEN 6 ELSE 2 END,
                next_attempt_at = CASE WHEN id = $3 THEN now() - interval '1 second' END",
    )
    .bind(vec![held.clone(), last.clone()])
    .bind(last)
    .bind(due)
    .execute(&app.pool)
    .await
    .unwrap();
    // An operator's replay leaves an effect a dispatcher holds alone.
    sqlx::query("UPDATE effects SET locked_until = now() + interval '1 minute' WHERE id = $1")
        .bind(due)
        .execute(&app.pool)
        .await
        .unwrap();
    let queue = shared::platform::queue::Queue::new(app.sqs.clone(), effects_queue.clone());
    let replayed = shared::effects::outbox::replay(&app.pool, &queue, std::slice::from_ref(due))
        .await
        .unwrap();
    assert!(replayed.is_empty(), "held by a dispatcher");
    sqlx::query("UPDATE effects SET locked_until = NULL WHERE id = $1")
        .bind(due)
        .execute(&app.pool)
        .await
        .unwrap();

    let scheduler = shared::handlers::scheduler::SchedulerState {
        effects: Some(queue),
        ..crate::scheduler::scheduler_for(&app, vec![])
    };
    let report = shared::handlers::scheduler::run(&scheduler).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let mut rescued = vec![held.clone(), due.clone()];
    rescued.sort();
    assert_eq!(report.rescued_effects, rescued);
    assert_eq!(report.effect_alerts.dead, std::slice::from_ref(last));
    let mut sent = app.drain(&effects_queue).await;
    sent.sort();
    assert_eq!(sent, rescued);
    let buried = app
        .effects()
        .await
        .into_iter()
        .find(|e| &e.id == last)
        .unwrap();
    assert_eq!(
        buried.status, "dead",
        "a dispatcher that dies every time ends it"
    );
}
