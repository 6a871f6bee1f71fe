//! Paddle Billing's reconciliation (docs/design.md §6.4): `GET /notifications` of what Paddle
//! failed to deliver first, then `GET /events` walked newest first by `after`; reads are not
//! deliveries.

use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::{Duration, Utc};
use serde_json::{json, Value};
use shared::handlers::scheduler;
use shared::reconcile::LAG;
use sqlx::PgPool;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use provider_fakes::{ProviderServer, PADDLE};

use crate::helpers::*;
use crate::scheduler::{reconciler, scheduler_for};

/// Paddle's `/events` (every event, listed by id) and `/notifications` (the failed ones).
struct FakePaddle {
    events: Vec<Value>,
    failed: Vec<Value>,
    /// The requests for a page after the first.
    continued: AtomicUsize,
}

impl Respond for FakePaddle {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let query: Vec<(String, String)> = request.url.query_pairs().into_owned().collect();
        let get = |name: &str| {
            query
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let per_page: usize = get("per_page").and_then(|p| p.parse().ok()).unwrap_or(50);
        let (mut listed, id_of): (Vec<&Value>, fn(&Value) -> &str) =
            if request.url.path() == "/notifications" {
                assert_eq!(get("status").as_deref(), Some("failed,needs_retry"));
                assert!(get("from").is_some());
                (self.failed.iter().collect(), |n| n["id"].as_str().unwrap())
            } else {
                let types = get("event_type").unwrap_or_default();
                (
                    self.events
                        .iter()
                        .filter(|e| types.split(',').any(|t| e["event_type"] == t))
                        .collect(),
                    |e| e["event_id"].as_str().unwrap(),
                )
            };
        listed.sort_by_key(|e| id_of(e).to_owned());
        if get("order_by").as_deref() == Some("id[desc]") {
            listed.reverse();
        }
        if get("after").is_some() {
            self.continued.fetch_add(1, Ordering::SeqCst);
        }
        let start = match get("after") {
            Some(after) => listed
                .iter()
                .position(|e| id_of(e) == after)
                .map_or(listed.len(), |i| i + 1),
            None => 0,
        };
        let page: Vec<&Value> = listed.iter().skip(start).take(per_page).copied().collect();
        let has_more = start + page.len() < listed.len();
        ResponseTemplate::new(200).set_body_json(json!({
            "data": page,
            "meta": {"request_id": "req_1", "pagination": {"per_page": per_page,
                     "next": format!("{}?after={}", request.url.path(), page.last().map(|e| id_of(e)).unwrap_or_default()),
                     "has_more": has_more, "estimated_total": listed.len()}}
        }))
    }
}

async fn fake_paddle(
    events: Vec<Value>,
    failed: Vec<Value>,
) -> (ProviderServer, &'static FakePaddle) {
    let fake: &'static FakePaddle = Box::leak(Box::new(FakePaddle {
        events,
        failed,
        continued: AtomicUsize::new(0),
    }));
    let server = ProviderServer::start(&PADDLE).await;
    Mock::given(wiremock::matchers::method("GET"))
        .respond_with(Proxy(fake))
        .mount(&server)
        .await;
    (server, fake)
}

struct Proxy(&'static FakePaddle);

impl Respond for Proxy {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        self.0.respond(request)
    }
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
    let (server, _) = fake_paddle(Vec::new(), vec![failed, other]).await;
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
    let (server, fake) = fake_paddle(listed, Vec::new()).await;
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
        fake.continued.load(Ordering::SeqCst),
        0,
        "each window's walk ends on the page that reaches past its start"
    );
}
