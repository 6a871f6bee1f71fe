//! Paddle Billing's reconciliation (docs/design.md §6.4): `GET /notifications` of what Paddle
//! failed to deliver first, then `GET /events` walked newest first by `after`; reads are not
//! deliveries.

use chrono::{Duration, Utc};
use serde_json::{json, Value};
use shared::handlers::scheduler;
use shared::reconcile::LAG;
use sqlx::PgPool;
use wiremock::MockServer;

use provider_fakes::{FakePaddle, ProviderServer};

use crate::helpers::*;
use crate::scheduler::{reconciler, scheduler_for};

/// Paddle's `/events` (every event, listed by id) and `/notifications` (the failed ones), as
/// the fake Paddle serves them.
async fn fake_paddle(events: Vec<Value>, failed: Vec<Value>) -> (ProviderServer, FakePaddle) {
    let fake = FakePaddle::default();
    for event in events {
        fake.event(event);
    }
    for notification in failed {
        fake.notification(notification);
    }
    (fake.serve().await, fake)
}

/// The list requests for a page after the first.
async fn continued(server: &ProviderServer) -> usize {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|r| r.url.query_pairs().any(|(k, _)| k == "after"))
        .count()
}

/// A subscription event of `customer` as Paddle lists it (the development fixtures' shape),
/// `ago` before now.
fn event(id: &str, customer: &str, ago: Duration) -> Value {
    let spec = shared::providers::fixtures::Spec {
        kind: "subscription".into(),
        customer: customer.into(),
        at: Utc::now() - ago,
        event_id: Some(id.into()),
        object_id: Some(format!("sub_{id}")),
        ..Default::default()
    };
    let mut event = shared::providers::fixtures::payload(shared::domain::SourceKind::Paddle, &spec)
        .unwrap()
        .1;
    // Listed by the API, an event has no notification of its own.
    event.as_object_mut().unwrap().remove("notification_id");
    event
}

fn paddle_reconciler(server: &MockServer) -> shared::reconcile::Reconciler {
    reconciler(json!({"name": "paddle", "kind": "paddle",
        "secrets": [shared::providers::paddle::fixtures::DEV_SECRET],
        "livemode": false, "api_key": "pdl_sdbx_apikey_test", "api_base_url": server.uri()}))
}

fn lagged(extra_secs: i64) -> Duration {
    Duration::seconds(LAG.as_secs() as i64 + extra_secs)
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_paddle_failed_to_deliver_is_applied_and_counted_once(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // A minute old: the walk will not reach it for a while; the failed notifications have it.
    let mut missing = event("evt_01undelivered", "ctm_u", Duration::seconds(60));
    missing["notification_id"] = json!("ntf_01failed");
    let failed = json!({"id": "ntf_01failed", "type": "subscription.updated", "status": "failed",
        "payload": missing, "occurred_at": missing["occurred_at"], "delivered_at": null,
        "replayed_at": null, "origin": "event", "times_attempted": 3,
        "notification_setting_id": "ntfset_01test"});
    let other = json!({"id": "ntf_02other", "type": "business.updated", "status": "failed",
        "payload": {"event_id": "evt_02business", "event_type": "business.updated",
                    "occurred_at": missing["occurred_at"], "data": {"id": "biz_1"}}});
    // Delivered: Paddle lists it only to a request that does not ask for the failed ones.
    let mut on_time = event("evt_01delivered", "ctm_d", Duration::seconds(60));
    on_time["notification_id"] = json!("ntf_00delivered");
    let delivered = json!({"id": "ntf_00delivered", "type": "subscription.updated",
        "status": "delivered", "payload": on_time, "occurred_at": on_time["occurred_at"]});
    let (server, _) = fake_paddle(Vec::new(), vec![failed, other, delivered]).await;
    let scheduler = scheduler_for(&app, vec![paddle_reconciler(&server)]);

    let first = scheduler::run(&scheduler).await.reconciliation[0].clone();
    assert_eq!((first.stored_new, first.discrepancies), (1, 1), "{first:?}");
    app.run_worker().await;
    let id = app.event_id("paddle", "evt_01undelivered").await;
    assert_eq!(app.event(id).await.status, "applied");
    let account = app
        .account("paddle", "ctm_u", &Utc::now().format("%Y-%m").to_string())
        .await;
    assert_eq!(account.plan, "pro");

    let second = scheduler::run(&scheduler).await.reconciliation[0].clone();
    assert_eq!(
        (
            second.stored_new,
            second.discrepancies,
            second.already_present
        ),
        (0, 0, 1),
        "{second:?}"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn paddle_reads_are_not_deliveries_and_the_walk_stops_at_its_window(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let delivered = event("evt_05once", "ctm_once", lagged(600));
    let (_, body) = app.post("paddle", &paddle_delivery(&delivered)).await;
    let id = body["event_id"].as_i64().unwrap();
    app.run_worker().await;
    // Listed back: the same event without its notification id. Older events, a thousand of
    // them, are past the first window's start: the walk does not page through them.
    let mut listed = vec![event("evt_05once", "ctm_once", lagged(600))];
    listed[0]["data"] = delivered["data"].clone();
    listed[0]["occurred_at"] = delivered["occurred_at"].clone();
    for n in 0..1000 {
        listed.push(event(
            &format!("evt_00old{n:04}"),
            "ctm_old",
            Duration::days(20) + Duration::seconds(n),
        ));
    }
    let (server, _fake) = fake_paddle(listed, Vec::new()).await;
    let scheduler = scheduler_for(&app, vec![paddle_reconciler(&server)]);

    let mut present = 0;
    for _ in 0..3 {
        let report = scheduler::run(&scheduler).await.reconciliation[0].clone();
        assert_eq!(report.discrepancies, 0, "{report:?}");
        present += report.already_present;
    }
    assert!(present >= 1, "the read is counted as present");
    let row = app.event(id).await;
    assert_eq!(row.seen_count, 1);
    assert_eq!(
        app.verdicts(id).await,
        ["stored"],
        "one delivery, the webhook's"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM inbox_events WHERE dedupe_key LIKE 'evt_00old%'")
            .await,
        0,
        "older than the walk's windows"
    );
    assert_eq!(
        continued(&server).await,
        0,
        "each window's walk ends on the page that reaches past its start"
    );
}
