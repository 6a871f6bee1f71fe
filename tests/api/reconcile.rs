//! Reconciliation and rescue at real volume (docs/design.md §1.4, §6.2): a fake Stripe API
//! that lists events as Stripe does (newest first, `created[gte]`/`created[lt]`, `types[]`,
//! `starting_after`, `delivery_success=false`), thousands of events, runs that stop on their
//! budget or fail midway, reads that are not deliveries, and marks that are never stranded.

use chrono::Utc;
use serde_json::{json, Value};
use shared::handlers::scheduler;
use shared::inbox::rescue::{mark_lost, rescue};
use shared::inbox::Events;
use shared::platform::queued::send_in_tens;
use shared::reconcile::{LAG, MAX_PAGES};
use sqlx::PgPool;
use wiremock::MockServer;

use crate::helpers::*;
use crate::scheduler::{
    exec, polar_api_returns, polar_reconciler, reconcile_runs, scheduler_for, soon, status_of,
    stored_unapplied, stripe_api_event, stripe_reconciler,
};
use provider_fakes::stripe::On;
use provider_fakes::stripe::{FakeStripe, Fault};
use provider_fakes::{FakePolar, Metered, ProviderServer};

/// The fake Stripe's account holding `events`, each delivered (`/v1/events` lists them as
/// Stripe does: newest first, `created[…]`, `types[]`, `starting_after`, 30 days).
pub(crate) fn stripe_with_events(events: Vec<Value>) -> FakeStripe {
    let fake = FakeStripe::default();
    for event in events {
        fake.has_event(event);
    }
    fake
}

pub(crate) async fn fake_stripe(fake: FakeStripe) -> ProviderServer {
    fake.serve().await
}

/// A scheduler for thousands of events: a generous time budget, so that the page budget is
/// what ends a run, and a queue whose sends fail at once (no retry). The local SQS server
/// slows down as thousands of messages pile up (a batch takes seconds), which says nothing
/// of reconciliation: what it stores but cannot send is unmarked for the rescue, whose
/// sends are tested on their own.
async fn volume_scheduler(app: &TestApp, server: &MockServer) -> scheduler::SchedulerState {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let refused = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(&shared::platform::queue::sdk_config().await)
            .endpoint_url(format!("http://127.0.0.1:{port}"))
            .retry_config(aws_sdk_sqs::config::retry::RetryConfig::disabled())
            .build(),
    );
    scheduler::SchedulerState {
        budget: std::time::Duration::from_secs(300),
        queue: shared::platform::queue::Queue::new(
            refused,
            format!("http://127.0.0.1:{port}/000000000000/gone"),
        ),
        ..scheduler_for(app, vec![stripe_reconciler(server)])
    }
}

/// `count` subscription events spread over the two days before the lag, one customer each
/// in ten; and a few of a type the walk does not ask for.
fn many_events(count: usize) -> Vec<Value> {
    let newest = Utc::now().timestamp() - LAG.as_secs() as i64 - 60;
    let span = 2 * 86_400;
    let mut events: Vec<Value> = (0..count)
        .map(|n| {
            let created = newest - (span * n as i64) / count as i64;
            let mut e =
                stripe_api_event(&format!("evt_{n:05}"), &format!("cus_{}", n % 10), created);
            e["data"]["object"]["id"] = json!(format!("sub_{n:05}"));
            e
        })
        .collect();
    for n in 0..3 {
        let mut other = stripe_api_event(&format!("evt_balance_{n}"), "cus_0", newest - n);
        other["type"] = json!("balance.available");
        events.push(other);
    }
    events
}

async fn cursor_of(app: &TestApp) -> chrono::DateTime<Utc> {
    sqlx::query_scalar("SELECT cursor_at FROM reconcile_cursors WHERE source = 'stripe'")
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_reconciliation_completes_any_volume_in_bounded_runs(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let events = many_events(5_000);
    let newest = events
        .iter()
        .map(|e| e["created"].as_i64().unwrap())
        .max()
        .unwrap();
    let server = fake_stripe(stripe_with_events(events)).await;
    let scheduler = volume_scheduler(&app, &server).await;
    let per_run = MAX_PAGES as usize * 100;
    let runs = 5_000usize.div_ceil(per_run) + 1;

    let mut reports = Vec::new();
    for _ in 0..runs {
        let report = scheduler::run(&scheduler).await;
        reports.push(report.reconciliation[0].clone());
    }

    let stored = app.count("SELECT count(*) FROM inbox_events").await;
    assert_eq!(
        stored, 5_000,
        "every handled event, once; none of the other type"
    );
    let repeats: i32 = reports.iter().map(|r| r.already_present).sum();
    assert_eq!(repeats, 0, "no event read twice: {reports:?}");
    assert!(
        reports[0].stopped_early,
        "the first run stops on its budget"
    );
    let last = reports.last().unwrap();
    assert!(!last.stopped_early && last.error.is_none(), "{last:?}");
    assert!(
        cursor_of(&app).await.timestamp() > newest,
        "the cursor is past the newest"
    );
    assert!(last.behind_secs.unwrap() <= (LAG.as_secs() + 60) as f64);
    let metrics = scheduler::emf(
        &scheduler::RunReport {
            reconciliation: vec![reports[0].clone()],
            ..Default::default()
        },
        Utc::now(),
    );
    assert_eq!(metrics["ReconcileStoppedEarly"], 1.0);
    assert!(metrics["ReconcileBehindSeconds"].as_f64().unwrap() > 3_600.0);
    let recorded: i64 = app
        .count("SELECT count(*) FROM reconcile_runs WHERE stopped_early")
        .await;
    assert!(recorded >= 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_run_that_fails_midway_is_resumed_without_gaps_or_repeats(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let fake = stripe_with_events(many_events(1_500));
    fake.read_fails(
        On::Nth(9),
        Fault::Fails(
            500,
            json!({"error": {"type": "api_error", "message": "An unknown error occurred"}}),
        ),
        1,
    );
    let server = fake_stripe(fake).await;
    let scheduler = volume_scheduler(&app, &server).await;

    let first = scheduler::run(&scheduler).await.reconciliation[0].clone();
    assert!(first.error.as_deref().unwrap().contains("500"), "{first:?}");
    let mut repeats = first.already_present;
    for _ in 0..3 {
        let report = scheduler::run(&scheduler).await.reconciliation[0].clone();
        assert!(report.error.is_none(), "{report:?}");
        repeats += report.already_present;
    }
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 1_500);
    assert_eq!(repeats, 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_stripe_failed_to_deliver_is_applied_and_counted_once(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // Created a minute ago: the walk will not reach it for a while; the undelivered list has it.
    let fake = FakeStripe::default();
    let mut missing = stripe_api_event("evt_undelivered", "cus_u", Utc::now().timestamp() - 60);
    missing["data"]["object"]["id"] = json!("sub_u");
    fake.has_undelivered_event(missing);
    let server = fake_stripe(fake).await;
    let scheduler = scheduler_for(&app, vec![stripe_reconciler(&server)]);

    let first = scheduler::run(&scheduler).await.reconciliation[0].clone();
    assert_eq!((first.stored_new, first.discrepancies), (1, 1), "{first:?}");
    app.run_worker().await;
    let id = app.event_id("stripe", "evt_undelivered").await;
    assert_eq!(status_of(&app, id).await, "applied");
    let why = app.why("stripe", "cus_u", Cut::default()).await;
    let status = why
        .fields
        .iter()
        .find(|f| f.field == "subscription:sub_u:status");
    let by = status.and_then(|f| f.decided_by.as_ref()).unwrap();
    assert_eq!(
        (by.event_id, by.via),
        (id, shared::billing::fold::Via::Reconciliation)
    );

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

/// Reconciliation reads the events list, whose objects name a customer that is an Account by
/// `customer_account` (`customer` null, docs/design.md §6.2): a listed event of one is that
/// Account's, the platform's own or a connected account's customer (the event's `account`).
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_listed_event_of_a_customer_that_is_an_account_is_that_accounts(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let created = Utc::now().timestamp() - 60;
    let account_event = |id: &str, subscription: &str, connected: Option<&str>| {
        let mut event = stripe_api_event(id, "unused", created);
        event["data"]["object"]["id"] = json!(subscription);
        event["data"]["object"]["customer"] = Value::Null;
        event["data"]["object"]["customer_account"] = json!("acct_1RecCust");
        if let Some(connected) = connected {
            event["account"] = json!(connected);
        }
        event
    };
    let fake = FakeStripe::default();
    fake.has_undelivered_event(account_event("evt_rec_acct_own", "sub_rec_own", None));
    fake.has_undelivered_event(account_event(
        "evt_rec_acct_conn",
        "sub_rec_conn",
        Some("acct_1RecConn"),
    ));
    let server = fake_stripe(fake).await;
    let scheduler = scheduler_for(&app, vec![stripe_reconciler(&server)]);
    let run = scheduler::run(&scheduler).await.reconciliation[0].clone();
    assert_eq!((run.stored_new, run.discrepancies), (2, 2), "{run:?}");
    app.run_worker().await;
    for (id, customer, subscription) in [
        ("evt_rec_acct_own", "acct_1RecCust", "sub_rec_own"),
        (
            "evt_rec_acct_conn",
            "acct_1RecConn/acct_1RecCust",
            "sub_rec_conn",
        ),
    ] {
        let event = app.event(app.event_id("stripe", id).await).await;
        assert_eq!(event.status, "applied", "{id}: {:?}", event.reason);
        assert_eq!(event.customer_key.as_deref(), Some(customer), "{id}");
        let why = app.why("stripe", customer, Cut::default()).await;
        let status = why
            .fields
            .iter()
            .find(|f| f.field == format!("subscription:{subscription}:status"));
        let by = status.and_then(|f| f.decided_by.as_ref()).unwrap();
        assert_eq!(by.via, shared::billing::fold::Via::Reconciliation, "{id}");
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_purged_event_stripe_still_lists_as_undelivered_is_not_stored_again(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // Delivered a week ago and applied; Stripe never saw a 2xx (the endpoint timed out, say),
    // so for 30 days it lists the event among those it failed to deliver.
    let created = Utc::now().timestamp() - 7 * 86_400;
    // Incomplete: it grants nothing, so once a later state holds the register nothing names
    // it and the purge may take it (docs/design.md §3.9).
    let mut delivered = stripe_event("evt_purged", "cus_purged", created);
    delivered["data"]["object"]["status"] = json!("incomplete");
    let (_, body) = app.post("stripe", &stripe_delivery(&delivered)).await;
    let id = body["event_id"].as_i64().unwrap();
    app.run_worker().await;
    assert_eq!(status_of(&app, id).await, "applied");
    // A later state of the subscription holds the register.
    let newer = stripe_event("evt_newer", "cus_purged", created + 60);
    app.post("stripe", &stripe_delivery(&newer)).await;
    app.run_worker().await;
    sqlx::query("UPDATE inbox_events SET received_at = to_timestamp($1) WHERE id = $2")
        .bind(created as f64)
        .bind(id)
        .execute(&app.pool)
        .await
        .unwrap();
    let fake = FakeStripe::default();
    let mut listed = stripe_api_event("evt_purged", "cus_purged", created);
    listed["data"]["object"]["status"] = json!("incomplete");
    fake.has_undelivered_event(listed);
    let server = fake_stripe(fake).await;
    let scheduler = scheduler::SchedulerState {
        sources: vec![],
        retention: std::time::Duration::from_secs(6 * 86_400),
        ..scheduler_for(&app, vec![stripe_reconciler(&server)])
    };

    let mut purged = 0;
    for _ in 0..3 {
        let report = scheduler::run(&scheduler).await;
        app.run_worker().await;
        purged += report.purged;
        let stripe = &report.reconciliation[0];
        assert_eq!(
            (stripe.stored_new, stripe.discrepancies),
            (0, 0),
            "{stripe:?}"
        );
        assert_eq!(
            scheduler::emf(&report, Utc::now())["ReconcileDiscrepancies"],
            0.0
        );
    }

    assert_eq!(purged, 1, "the event went with the retention");
    assert_eq!(
        app.count("SELECT count(*) FROM inbox_events WHERE dedupe_key = 'evt_purged'")
            .await,
        0,
        "and was not stored again"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn provider_reads_are_not_deliveries(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let created = Utc::now().timestamp() - LAG.as_secs() as i64 - 600;
    let delivered = stripe_event("evt_once", "cus_once", created);
    let (_, body) = app.post("stripe", &stripe_delivery(&delivered)).await;
    let id = body["event_id"].as_i64().unwrap();
    app.run_worker().await;
    // Listed by the walk's first window, and still in the undelivered list every run.
    // Stripe lists an event it failed to deliver among all the others too.
    let fake = FakeStripe::default();
    fake.has_undelivered_event(stripe_api_event("evt_once", "cus_once", created));
    let server = fake_stripe(fake).await;
    let scheduler = scheduler_for(&app, vec![stripe_reconciler(&server)]);

    let mut present = 0;
    for _ in 0..3 {
        let report = scheduler::run(&scheduler).await.reconciliation[0].clone();
        assert_eq!(report.discrepancies, 0, "{report:?}");
        present += report.already_present;
    }

    assert!(present >= 3, "each read is counted as present");
    let row = app.event(id).await;
    assert_eq!(row.seen_count, 1);
    assert_eq!(
        app.verdicts(id).await,
        ["stored"],
        "one delivery, the webhook's"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_polar_subscription_on_an_unknown_product_is_reported_once(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let polar = FakePolar::default();
    let server = polar.serve().await;
    polar_api_returns(
        &polar,
        json!({"id": "sub_unknown", "customer_id": "pc_unknown", "status": "active",
               "product_id": "prod_not_in_catalog", "modified_at": "2026-03-01T00:00:00Z",
               "created_at": "2026-01-01T00:00:00Z"}),
    );
    let scheduler = scheduler_for(&app, vec![polar_reconciler(&server)]);

    let found: Vec<i32> = reconcile_runs(&app, &scheduler, 3)
        .await
        .iter()
        .map(|r| r.discrepancies)
        .collect();
    assert_eq!(found, [1, 0, 0]);
    let account = app.account("polar", "pc_unknown", "2026-03").await;
    assert_eq!(account.subscriptions[0].status, "active");
    assert_eq!(
        account.plan, "free",
        "a product not in the catalog is no plan"
    );
}

/// Polar pages its subscriptions by `page` and `limit` up to `pagination.max_page`: a sweep of
/// 150 subscriptions reads two pages of 100, every one of them, within Polar's limit.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_polar_sweep_reads_every_page_polar_lists_and_no_more(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let polar = FakePolar::sandbox();
    for n in 0..150 {
        polar.subscription(json!({
            "id": format!("sub_page_{n:03}"), "customer_id": format!("pc_page_{n:03}"),
            "status": "active", "product_id": "prod_pro",
            "started_at": format!("2026-01-01T00:{:02}:{:02}Z", n / 60, n % 60),
            "modified_at": "2026-03-01T00:00:00Z", "created_at": "2026-01-01T00:00:00Z"}));
    }
    let server = polar.serve().await;
    let scheduler = scheduler_for(&app, vec![polar_reconciler(&server)]);

    let report = &reconcile_runs(&app, &scheduler, 1).await[0];
    assert_eq!(report.error, None);
    assert_eq!(
        report.discrepancies, 150,
        "every subscription of both pages: {report:?}"
    );
    let pages: Vec<String> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.url.path() == "/v1/subscriptions/")
        .filter_map(|r| r.url.query_pairs().find(|(k, _)| k == "page"))
        .map(|(_, v)| v.into_owned())
        .collect();
    assert_eq!(pages, ["1", "2"], "up to max_page, not past it");
    assert_eq!((polar.over_limit(), polar.peak_per_minute()), (0, 2));
    app.run_worker().await;
    assert_eq!(
        app.account("polar", "pc_page_149", "2026-03").await.plan,
        "pro"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_run_that_dies_between_mark_and_send_strands_nothing(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let mut ids = Vec::new();
    for n in 0..25 {
        ids.push(stored_unapplied(&app, &format!("evt_strand_{n}")).await);
    }
    exec(&app, "UPDATE inbox_events SET status = 'failed', attempts = 1, enqueued_at = now() - interval '10 seconds', next_attempt_at = now() - interval '1 second'").await;
    let scheduler = scheduler_for(&app, vec![]);

    // A run marks them all, sends ten, and dies.
    let marked = mark_lost(&app.pool).await.unwrap();
    assert_eq!(marked, ids);
    let sent = send_in_tens::<Events>(&app.pool, &scheduler.queue, &marked[..10], soon())
        .await
        .unwrap();
    assert_eq!(sent, marked[..10]);
    // The next run, at once: the fresh marks may still be in flight.
    assert!(rescue(&app.pool, &scheduler.queue, soon())
        .await
        .unwrap()
        .is_empty());
    // Once the marks are old, whatever wrote them, the rows are sent again.
    exec(
        &app,
        "UPDATE inbox_events SET enqueued_at = now() - interval '6 minutes'",
    )
    .await;
    let resent = rescue(&app.pool, &scheduler.queue, soon()).await.unwrap();
    assert_eq!(
        resent, ids,
        "every row, the ten sent too (a copy is harmless)"
    );
    app.run_worker().await;
    for id in ids {
        // One subscription's same state 25 times: the first applies, the rest change nothing.
        let status = status_of(&app, id).await;
        assert!(status == "applied" || status == "ignored", "{id}: {status}");
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_send_out_of_time_is_unmarked_for_the_next_run(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let id = stored_unapplied(&app, "evt_late_send").await;
    exec(&app, "UPDATE inbox_events SET status = 'failed', attempts = 1, enqueued_at = now() - interval '10 seconds', next_attempt_at = now() - interval '1 second'").await;
    let scheduler = scheduler_for(&app, vec![]);

    let past = std::time::Instant::now() - std::time::Duration::from_secs(1);
    assert!(rescue(&app.pool, &scheduler.queue, past)
        .await
        .unwrap()
        .is_empty());
    assert!(app.event(id).await.enqueued_at.is_none(), "unmarked");
    assert_eq!(
        rescue(&app.pool, &scheduler.queue, soon()).await.unwrap(),
        [id]
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_reconciliation_read_of_a_due_row_leaves_it_rescuable(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let created = Utc::now().timestamp() - LAG.as_secs() as i64 - 600;
    let id = app
        .store_stripe_event("evt_due_read", "cus_d", created)
        .await;
    app.drain_queue().await;
    exec(&app, "UPDATE inbox_events SET status = 'failed', attempts = 1, enqueued_at = now() - interval '10 seconds', next_attempt_at = now() - interval '5 seconds'").await;
    let fake = stripe_with_events(vec![stripe_api_event("evt_due_read", "cus_d", created)]);
    let server = fake_stripe(fake).await;
    let scheduler = scheduler_for(&app, vec![stripe_reconciler(&server)]);

    // The read first (in a run, reconciliation follows the rescue; a crash can reorder them).
    let read = shared::reconcile::run(
        &scheduler.reconcilers[0],
        &app.pool,
        &scheduler.queue,
        shared::inbox::purge::kept_since(scheduler.retention, Utc::now()),
        soon(),
    )
    .await;
    assert_eq!(read.already_present, 1, "{read:?}");
    assert_eq!(
        rescue(&app.pool, &scheduler.queue, soon()).await.unwrap(),
        [id]
    );
    app.run_worker().await;
    assert_eq!(status_of(&app, id).await, "applied");
}
