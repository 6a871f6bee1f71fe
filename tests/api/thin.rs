//! Stripe's thin events (docs/design.md §6.2): signed and stored on arrival like any
//! delivery, then applied by the worker as the read of their related object, fetched from a
//! fake Stripe API (wiremock) with the source's key. The payloads and the objects are the
//! corpus files in `testdata/providers/stripe/thin/` (sources in `testdata/providers/README.md`).

use chrono::{DateTime, Datelike, Utc};
use serde_json::{json, Value};
use shared::handlers::worker::{process_event, Processed};
use sqlx::PgPool;
use wiremock::MockServer;

use crate::corpus::{corpus, CORPUS_PLANS};
use crate::helpers::*;
use crate::traffic::with_stripe_api;
use provider_fakes::stripe::On;
use provider_fakes::stripe::{FakeStripe, Fault};
use provider_fakes::ProviderServer;

const SUB: &str = "sub_1ThinSub0000001";
pub(crate) const CUSTOMER: &str = "cus_ThinCust00001";

/// The thin events of the corpus, in file order (created, updated, deleted).
pub(crate) fn thin_events() -> Vec<Value> {
    corpus("stripe/thin").into_iter().map(|(_, v)| v).collect()
}

/// A corpus file under `stripe/thin/objects/`: a fetched object or a snapshot twin.
fn object(name: &str) -> Value {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/providers/stripe/thin/objects")
        .join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
}

/// The fake Stripe (`provider_fakes::stripe`) served: its account, and its server.
pub(crate) struct StripeApi {
    pub(crate) fake: FakeStripe,
    pub(crate) server: ProviderServer,
}

impl StripeApi {
    pub(crate) async fn start() -> Self {
        let fake = FakeStripe::default();
        let server = fake.serve().await;
        Self { fake, server }
    }

    /// Forgets the requests received so far (the account keeps what it holds).
    pub(crate) async fn reset(&self) {
        self.server.reset().await;
        self.fake.mount(&self.server).await;
    }
}

impl std::ops::Deref for StripeApi {
    type Target = ProviderServer;

    fn deref(&self) -> &ProviderServer {
        &self.server
    }
}

/// A test app knowing the corpus's plans, its worker reading Stripe at a fresh fake API.
pub(crate) async fn app_with_api(pool: PgPool) -> (TestApp, StripeApi) {
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = shared::domain::Catalog::parse(CORPUS_PLANS).unwrap();
    let api = StripeApi::start().await;
    with_stripe_api(&mut app.worker, &api);
    (app, api)
}

/// The fake API shows the subscription as `name` (a file of `objects/`) from now on, and has
/// received nothing yet.
pub(crate) async fn shows(api: &StripeApi, name: &str) {
    api.reset().await;
    api.fake.holds(object(name));
}

/// Every read `api` received was made as the source's reads are: its key, and the API version
/// the reads are written against.
async fn read_as_the_source(api: &MockServer) {
    for read in api.received_requests().await.unwrap() {
        let header = |name: &str| {
            read.headers
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        assert_eq!(
            header("Stripe-Version").as_deref(),
            Some("2025-03-31.basil"),
            "{}",
            read.url
        );
        assert_eq!(
            header("Authorization").as_deref(),
            Some("Bearer sk_test_reads")
        );
    }
}

async fn deliver(app: &TestApp, event: &Value) {
    let (status, body) = app.post("stripe", &stripe_delivery(event)).await;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    app.run_worker().await;
}

pub(crate) async fn status_of(app: &TestApp, dedupe_key: &str) -> EventRow {
    app.event(app.event_id("stripe", dedupe_key).await).await
}

/// The period of the corpus's thin events: a read stands at its thin event's time, so its
/// grant falls in the month the thin event happened, whenever it is read.
pub(crate) fn period() -> String {
    "2026-10".to_owned()
}

/// The first instant of the month `at` is in.
fn month_start(at: DateTime<Utc>) -> DateTime<Utc> {
    let day = at.date_naive().with_day(1).unwrap();
    day.and_hms_opt(0, 0, 0).unwrap().and_utc()
}

/// The account's ledger, each period's balance.
pub(crate) async fn ledger(app: &TestApp, customer: &str) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT period, sum(delta)::bigint FROM ledger WHERE customer_id = $1
         GROUP BY period ORDER BY period",
    )
    .bind(customer)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

/// The requests the fake API served for the thin event `id` (Stripe's SDKs name the event in
/// `Stripe-Request-Trigger`); a same-second tie between two reads adds the tie's own read.
async fn reads_for(api: &MockServer, id: &str) -> usize {
    let trigger = format!("event={id}");
    api.received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| {
            r.headers
                .get("Stripe-Request-Trigger")
                .map(|v| v.as_bytes())
                == Some(trigger.as_bytes())
        })
        .count()
}

fn id_of(event: &Value) -> &str {
    event["id"].as_str().unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn thin_events_take_a_subscription_through_its_life_as_snapshots_do(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    let events = thin_events();
    let steps = [
        ("subscription.incomplete", "incomplete", "free"),
        ("subscription.active", "active", "pro"),
        ("subscription.canceled", "canceled", "free"),
    ];
    for (event, (shown, status, plan)) in events.iter().zip(steps) {
        shows(&api, shown).await;
        deliver(&app, event).await;
        let thin = status_of(&app, id_of(event)).await;
        assert_eq!(thin.status, "applied", "{:?}", thin.reason);
        assert_eq!(thin.event_type, event["type"].as_str().unwrap());
        let read = status_of(&app, &format!("read:{}", id_of(event))).await;
        assert_eq!(
            read.status, "applied",
            "the read is finished with its thin event"
        );
        assert_eq!(read.customer_key.as_deref(), Some(CUSTOMER));
        let account = app.account("stripe", CUSTOMER, &period()).await;
        assert_eq!(account.subscriptions[0].status, status);
        assert_eq!(account.plan, plan);
        assert_eq!(
            reads_for(&api, id_of(event)).await,
            1,
            "one read per thin event"
        );
        read_as_the_source(&api).await;
    }
    // The fold takes each read as the event (the thin event carries nothing): the status was
    // decided by the last read, a fetch, and the registers are what the reads give.
    let why = app.why("stripe", CUSTOMER, Cut::default()).await;
    let status = why
        .fields
        .iter()
        .find(|f| f.field.ends_with(":status") && f.field.starts_with("subscription:"))
        .unwrap();
    let by = status.decided_by.as_ref().unwrap();
    assert_eq!(by.via, shared::billing::fold::Via::Fetch);
    assert_eq!(status.beaten.len(), 2, "{:?}", status.beaten);
    assert_eq!(app.audit().await.divergent, []);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_unknown_thin_type_is_stored_under_its_id_and_ignored(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    let event = json!({
        "id": "evt_test_65TcZz0v2AccountUpd16T2Kfo4Q8lSA4GfMwNYbNqcAcC",
        "object": "v2.core.event", "type": "v2.core.account.updated", "livemode": false,
        "created": "2026-10-01T12:00:00.000Z", "context": null,
        "related_object": {"id": "acct_1Thin", "type": "v2.core.account", "url": "/v2/core/accounts/acct_1Thin"}
    });
    deliver(&app, &event).await;
    let row = status_of(&app, id_of(&event)).await;
    assert_eq!(row.dedupe_key, id_of(&event));
    assert_eq!(row.status, "ignored");
    assert_eq!(
        row.reason.as_deref(),
        Some("event type v2.core.account.updated is not a billing event")
    );
    assert!(api.received_requests().await.unwrap().is_empty());
}

/// The updated thin event and its snapshot twin, sent for a change made `at`, the thin one
/// first or second; returns the app and how many times the thin event's object was read.
async fn twin_pair(pool: PgPool, thin_first: bool, at: DateTime<Utc>) -> (TestApp, usize) {
    let (mut app, api) = app_with_api(pool).await;
    app.enable_effects().await;
    shows(&api, "subscription.active").await;
    let mut thin = thin_events().remove(1);
    let mut twin = object("twin.updated");
    assert_eq!(thin["snapshot_event"], twin["id"], "the corpus pairs them");
    // Stripe sends both for one change, within a second of each other.
    thin["created"] = json!(at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    twin["created"] = json!(at.timestamp());
    let (first, second) = if thin_first {
        (&thin, &twin)
    } else {
        (&twin, &thin)
    };
    deliver(&app, first).await;
    let after_first = app.account("stripe", CUSTOMER, &period()).await;
    let effects_first = app.effects().await.len();
    assert!(effects_first > 0, "the change is told");
    deliver(&app, second).await;
    let after_second = app.account("stripe", CUSTOMER, &period()).await;
    assert_eq!(after_second.plan, "pro");
    assert_eq!(after_second.plan, after_first.plan);
    assert_eq!(after_second.subscriptions.len(), 1);
    assert_eq!(after_second.subscriptions[0].status, "active");
    assert_eq!(
        app.effects().await.len(),
        effects_first,
        "the second tells nothing"
    );
    let second_row = status_of(&app, id_of(second)).await;
    assert_eq!(second_row.status, "ignored", "{:?}", second_row.reason);
    (app, reads_for(&api, id_of(&thin)).await)
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_thin_event_then_its_snapshot_twin_change_the_state_once(pool: PgPool) {
    // The twin shares the read's second: the tie's own read settles it (docs/design.md §4.2),
    // and the provider shows the state the read stored.
    let (app, reads) = twin_pair(pool, true, Utc::now()).await;
    assert_eq!(reads, 1);
    let twin = status_of(&app, "evt_1T0hNnR4tK8mWq2NTu02ThnB").await;
    println!("the twin: {:?}", twin.reason);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_snapshot_twin_then_its_thin_event_change_the_state_once(pool: PgPool) {
    let (app, reads) = twin_pair(pool, false, Utc::now()).await;
    assert_eq!(
        reads, 0,
        "the stored twin carries the change: nothing to read"
    );
    let thin = status_of(&app, id_of(&thin_events()[1])).await;
    let reason = thin.reason.unwrap();
    assert!(
        reason.starts_with("its snapshot event evt_1T0hNnR4tK8mWq2NTu02ThnB (event ")
            && reason.ends_with(") carries the change"),
        "{reason}"
    );
}

/// A change made 2 s before this month began, read after it began: its thin event and its
/// snapshot twin in one order. A read stands for its thin event, so in either order the ledger
/// holds the previous month's grant alone, as the twin alone would give. Stamped with the
/// clock, the read granted this month too when the thin event came first
/// (`[(previous month, 500), (this month, 500)]`, issue 37).
async fn the_ledger_at_the_month_boundary_is_the_changes_month(pool: PgPool, thin_first: bool) {
    let change = month_start(Utc::now()) - chrono::Duration::milliseconds(1_500);
    let (app, reads) = twin_pair(pool, thin_first, change).await;
    assert_eq!(reads, usize::from(thin_first));
    if thin_first {
        // The read's time is the thin event's, in whole seconds.
        let read = status_of(&app, &format!("read:{}", id_of(&thin_events()[1]))).await;
        assert_eq!(
            read.occurred_at.map(|t| t.timestamp()),
            Some(change.timestamp())
        );
    }
    let previous = (month_start(Utc::now()) - chrono::Duration::days(1))
        .format("%Y-%m")
        .to_string();
    assert_eq!(ledger(&app, CUSTOMER).await, [(previous, 500)]);
    assert_eq!(app.audit().await.divergent, []);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_thin_event_read_after_the_month_began_grants_its_changes_month(pool: PgPool) {
    the_ledger_at_the_month_boundary_is_the_changes_month(pool, true).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_snapshot_twin_before_its_thin_event_at_the_month_boundary_grants_the_same(pool: PgPool) {
    the_ledger_at_the_month_boundary_is_the_changes_month(pool, false).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_thin_event_of_a_source_without_an_api_key_is_unprocessable_and_counted(pool: PgPool) {
    // The test worker's sources have no API key.
    let app = TestApp::spawn(pool).await;
    let event = &thin_events()[1];
    deliver(&app, event).await;
    let row = status_of(&app, id_of(event)).await;
    assert_eq!(row.status, "unprocessable");
    let reason = row.reason.unwrap();
    assert!(
        reason.contains("source 'stripe' needs an API key (api_key or api_key_secret_id)"),
        "{reason}"
    );
    let line = shared::apply::thin_without_api_key_metric("stripe", chrono::Utc::now());
    assert_eq!(line["Source"], "stripe");
    assert_eq!(line["ThinEventsWithoutApiKey"], 1);
    assert_eq!(
        line["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
        json!([["Stack", "Source"]])
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_fetch_that_fails_is_retried_on_the_events_schedule_then_applied(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    api.fake.holds(object("subscription.active"));
    api.fake.read_fails(
        On::Path(format!("/v1/subscriptions/{SUB}")),
        Fault::Fails(
            500,
            json!({"error": {"type": "api_error", "message": "An unknown error occurred"}}),
        ),
        1,
    );
    let event = &thin_events()[1];
    let (status, _) = app.post("stripe", &stripe_delivery(event)).await;
    assert_eq!(status, http::StatusCode::OK);
    let id = app.event_id("stripe", id_of(event)).await;

    let first = process_event(&app.worker, id).await.unwrap();
    assert!(
        matches!(&first, Processed::Failed { status, error }
            if status.as_str() == "failed" && error.contains("500")),
        "{first:?}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM inbox_events WHERE dedupe_key LIKE 'read:%'")
            .await,
        0
    );
    // The test worker's retries are due at once.
    let second = process_event(&app.worker, id).await.unwrap();
    assert!(
        matches!(&second, Processed::Finished { status, .. } if status.as_str() == "applied"),
        "{second:?}"
    );
    assert_eq!(app.account("stripe", CUSTOMER, &period()).await.plan, "pro");
    assert_eq!(api.received_requests().await.unwrap().len(), 2);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_thin_event_whose_object_is_gone_is_ignored_with_the_reason(pool: PgPool) {
    // The account does not hold the subscription: Stripe's 404 `resource_missing`.
    let (app, api) = app_with_api(pool).await;
    let event = &thin_events()[1];
    deliver(&app, event).await;
    let row = status_of(&app, id_of(event)).await;
    assert_eq!(row.status, "ignored");
    assert!(
        row.reason
            .as_deref()
            .unwrap()
            .starts_with("the object no longer exists at the provider"),
        "{:?}",
        row.reason
    );
    assert_eq!(
        api.received_requests().await.unwrap().len(),
        1,
        "decided, not retried"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_connected_accounts_thin_event_reads_its_object_as_that_account(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    // Held by the connected account only: read as the platform, it is a 404.
    api.fake
        .holds_in(Some("acct_1ThinConnect01"), object("subscription.active"));
    let mut event = thin_events().remove(1);
    event["context"] = json!("acct_1ThinConnect01");
    deliver(&app, &event).await;
    let row = status_of(&app, id_of(&event)).await;
    assert_eq!(row.status, "applied", "{:?}", row.reason);
    let account = app
        .account(
            "stripe",
            &format!("acct_1ThinConnect01/{CUSTOMER}"),
            &period(),
        )
        .await;
    assert_eq!(account.plan, "pro");
    assert_eq!(
        reads_for(
            &api,
            "evt_test_65TcR1s3HZyaYmgzU16T2Kfo4Q8lSA4GfMwNYbNqcUvL"
        )
        .await,
        1
    );
}

/// A thin event about the subscription of a customer that is an Account: the read object names
/// `customer_account` (and `customer` null, docs/design.md §6.2), and the read is that
/// Account's: the platform's own with a `null` context, the connected account's customer
/// (`acct_…/acct_…`, read with `Stripe-Account`) with one.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_thin_events_read_of_a_customer_that_is_an_account_is_that_accounts(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    // Stripe's ids are unique across accounts: the connected account's subscription is another.
    const CONNECTED_SUB: &str = "sub_1ThinSubConn0001";
    for (id, account) in [(SUB, None), (CONNECTED_SUB, Some("acct_1ThinConnect01"))] {
        let mut active = object("subscription.active");
        active["id"] = json!(id);
        active["customer"] = Value::Null;
        active["customer_account"] = json!("acct_1ThinCustAcct1");
        api.fake.holds_in(account, active);
    }
    let own = thin_events().remove(1);
    let mut connected = own.clone();
    connected["id"] = json!("evt_test_65TcR1ThinCustAcctConnected0001");
    connected["context"] = json!("acct_1ThinConnect01");
    connected["related_object"]["id"] = json!(CONNECTED_SUB);
    connected["related_object"]["url"] = json!(format!("/v1/subscriptions/{CONNECTED_SUB}"));
    connected.as_object_mut().unwrap().remove("snapshot_event");
    for (event, key) in [
        (&own, "acct_1ThinCustAcct1".to_owned()),
        (
            &connected,
            "acct_1ThinConnect01/acct_1ThinCustAcct1".to_owned(),
        ),
    ] {
        deliver(&app, event).await;
        let row = status_of(&app, id_of(event)).await;
        assert_eq!(row.status, "applied", "{:?}", row.reason);
        let read = status_of(&app, &format!("read:{}", id_of(event))).await;
        assert_eq!(read.customer_key.as_deref(), Some(key.as_str()));
        let account = app.account("stripe", &key, &period()).await;
        assert_eq!(account.plan, "pro", "{key}");
    }
    let reads = api.received_requests().await.unwrap();
    let accounts: Vec<Option<&str>> = reads
        .iter()
        .map(|r| r.headers.get("Stripe-Account").map(|v| v.to_str().unwrap()))
        .collect();
    assert_eq!(accounts, [None, Some("acct_1ThinConnect01")]);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_replayed_thin_event_applies_its_stored_read_without_reading_again(pool: PgPool) {
    let (mut app, api) = app_with_api(pool).await;
    app.enable_effects().await;
    shows(&api, "subscription.active").await;
    let event = &thin_events()[1];
    deliver(&app, event).await;
    let effects = app.effects().await.len();
    // The provider's object moves on; a replay applies what was read, not what is there now.
    shows(&api, "subscription.canceled").await;
    let id = app.event_id("stripe", id_of(event)).await;
    for _ in 0..2 {
        shared::inbox::replay::replay(&app.pool, &app.state.queue, &[id])
            .await
            .unwrap();
        app.run_worker().await;
        assert_eq!(app.event(id).await.status, "applied");
    }
    assert!(
        api.received_requests().await.unwrap().is_empty(),
        "no read since the reset"
    );
    let account = app.account("stripe", CUSTOMER, &period()).await;
    assert_eq!(account.plan, "pro");
    assert_eq!(
        app.effects().await.len(),
        effects,
        "a replay tells nothing new"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM inbox_events WHERE dedupe_key LIKE 'read:%'")
            .await,
        1
    );
}

/// The corpus's thin events read late (the provider shows the subscription canceled already),
/// in file order or reversed.
async fn read_late(pool: PgPool, reverse: bool) {
    let (app, api) = app_with_api(pool).await;
    shows(&api, "subscription.canceled").await;
    let mut events = thin_events();
    if reverse {
        events.reverse();
    }
    for event in &events {
        deliver(&app, event).await;
        let row = status_of(&app, id_of(event)).await;
        assert!(
            row.status == "applied" || row.status == "ignored",
            "{}: {} {:?}",
            id_of(event),
            row.status,
            row.reason
        );
        assert_eq!(reads_for(&api, id_of(event)).await, 1);
    }
    let account = app.account("stripe", CUSTOMER, &period()).await;
    assert_eq!(account.subscriptions.len(), 1);
    assert_eq!(account.subscriptions[0].status, "canceled");
    assert_eq!(account.plan, "free");
    assert_eq!(account.balance, 0, "a canceled subscription grants nothing");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn thin_events_read_late_end_in_the_state_the_provider_shows(pool: PgPool) {
    read_late(pool, false).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn thin_events_read_late_in_reverse_end_in_the_state_the_provider_shows(pool: PgPool) {
    read_late(pool, true).await;
}

/// Ages every stored row past a 30-day retention and purges.
async fn purge_after_retention(app: &TestApp) -> u64 {
    sqlx::query("UPDATE inbox_events SET received_at = now() - interval '40 days'")
        .execute(&app.pool)
        .await
        .unwrap();
    let retention = std::time::Duration::from_secs(30 * 86_400);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    shared::inbox::purge::purge(&app.pool, retention, deadline)
        .await
        .unwrap()
}

/// Regression (issue 37): the registers name the thin event, not its read, so the purge kept
/// the thin event and took its read. The audit then found the subscription and its grant in
/// no kept event (five differences that never cleared), and a replay of the thin event read
/// the provider again and moved the account to what the provider showed that day. A read is
/// kept as long as the event it was made for.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_purge_keeps_a_thin_events_read_so_the_audit_holds_and_a_replay_reads_nothing(
    pool: PgPool,
) {
    let (app, api) = app_with_api(pool).await;
    shows(&api, "subscription.active").await;
    let event = &thin_events()[1];
    deliver(&app, event).await;
    assert_eq!(status_of(&app, id_of(event)).await.status, "applied");
    assert_eq!(app.audit().await.divergent, []);

    purge_after_retention(&app).await;
    let read_key = format!("read:{}", id_of(event));
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM inbox_events WHERE dedupe_key IN ('{}', '{read_key}')",
            id_of(event)
        ))
        .await,
        2,
        "the thin event the registers name, and its read"
    );
    let audit = app.audit().await;
    assert_eq!(
        (audit.checked, &audit.divergent[..]),
        (1, &[][..]),
        "{audit:?}"
    );

    // The provider's object moves on; a replay applies what was read.
    shows(&api, "subscription.canceled").await;
    let id = app.event_id("stripe", id_of(event)).await;
    shared::inbox::replay::replay(&app.pool, &app.state.queue, &[id])
        .await
        .unwrap();
    app.run_worker().await;
    assert_eq!(app.event(id).await.status, "applied");
    assert!(
        api.received_requests().await.unwrap().is_empty(),
        "no read since the object moved"
    );
    let account = app.account("stripe", CUSTOMER, &period()).await;
    assert_eq!(
        (
            account.plan.as_str(),
            account.subscriptions[0].status.as_str()
        ),
        ("pro", "active")
    );
    assert_eq!(app.audit().await.divergent, []);
}

/// A store whose purge took a thin event's read before reads were kept with their events: a
/// replay of the thin event reads nothing (the provider's state of today is not the thin
/// event's) and leaves the registers as they are, saying why.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_thin_event_whose_read_an_older_purge_took_is_not_read_again_by_a_replay(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    shows(&api, "subscription.active").await;
    let event = &thin_events()[1];
    deliver(&app, event).await;
    let read_key = format!("read:{}", id_of(event));
    sqlx::query("DELETE FROM inbox_events WHERE dedupe_key = $1")
        .bind(&read_key)
        .execute(&app.pool)
        .await
        .unwrap();

    shows(&api, "subscription.canceled").await;
    let id = app.event_id("stripe", id_of(event)).await;
    shared::inbox::replay::replay(&app.pool, &app.state.queue, &[id])
        .await
        .unwrap();
    app.run_worker().await;
    assert!(api.received_requests().await.unwrap().is_empty());
    let row = app.event(id).await;
    assert_eq!(row.status, "ignored");
    let reason = row.reason.unwrap();
    assert!(
        reason.contains(&format!("its read {read_key} is no longer stored")),
        "{reason}"
    );
    let account = app.account("stripe", CUSTOMER, &period()).await;
    assert_eq!(
        (
            account.plan.as_str(),
            account.subscriptions[0].status.as_str()
        ),
        ("pro", "active")
    );
}

/// A basil corpus file's event (testdata/providers/stripe/basil/).
fn basil(name: &str) -> Value {
    corpus("stripe/basil")
        .into_iter()
        .find(|(file, _)| file == name)
        .unwrap()
        .1
}

/// Regression: a thin `v1.invoice.paid` whose invoice names no known price reads its
/// subscription for the plan, and that read is made for a read (`read:read:evt_…:sub_…`).
/// The purge found a read's event by cutting its key at the first `:` after `read:`, here
/// `read`, found none, and purged the subscription read once the subscription's register had
/// moved on, while the thin event (the payment and the grant name it) and its invoice read were
/// kept: the audit found `allowance:2025-12` stored 500, folded nothing, for good. The read
/// names its event's row.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_thin_invoices_subscription_read_is_kept_across_a_purge_with_the_thin_event(
    pool: PgPool,
) {
    let (app, api) = app_with_api(pool).await;
    let paid = basil("invoice.paid");
    let mut invoice = paid["data"]["object"].clone();
    // A price the catalog does not know (retired from it): the plan is the subscription's.
    invoice["lines"]["data"][0]["pricing"]["price_details"]["price"] = json!("price_1Retired0001");
    let invoice_id = invoice["id"].as_str().unwrap().to_owned();
    let subscription = basil("customer.subscription.updated")["data"]["object"].clone();
    let sub = subscription["id"].as_str().unwrap().to_owned();
    let customer = subscription["customer"].as_str().unwrap().to_owned();
    api.fake.holds(invoice).holds(subscription);
    let thin_id = "evt_test_65ThinInvoicePaid0001";
    let thin = json!({
        "id": thin_id, "object": "v2.core.event", "type": "v1.invoice.paid",
        "livemode": false, "created": "2025-12-01T00:00:01.000Z", "context": null,
        "reason": null,
        "related_object": {"id": invoice_id, "type": "invoice",
                           "url": format!("/v1/invoices/{invoice_id}")}
    });
    deliver(&app, &thin).await;
    assert_eq!(status_of(&app, thin_id).await.status, "applied");
    let read_key = format!("read:read:{thin_id}:{sub}");
    let read = status_of(&app, &read_key).await;
    assert_eq!(read.status, "applied", "{:?}", read.reason);
    assert_eq!(ledger(&app, &customer).await, [("2025-12".to_owned(), 500)]);
    // The subscription's deletion (2026-02-01) takes its register from the read: nothing but
    // the event it was made for keeps the read now.
    deliver(&app, &basil("customer.subscription.deleted")).await;
    let read_id = app.event_id("stripe", &read_key).await;
    assert!(!crate::provider_reads::named_by_state(&app, read_id).await);
    assert_eq!(app.audit().await.divergent, []);

    purge_after_retention(&app).await;
    for key in [thin_id.to_owned(), format!("read:{thin_id}"), read_key] {
        assert_eq!(
            app.count(&format!(
                "SELECT count(*) FROM inbox_events WHERE dedupe_key = '{key}'"
            ))
            .await,
            1,
            "{key} is kept"
        );
    }
    let audit = app.audit().await;
    assert_eq!(audit.divergent, [], "{audit:?}");
    // `why` still names the grant's decider, and the read among what the deletion beat.
    let why = app
        .why("stripe", &customer, shared::audit::Cut::default())
        .await;
    assert!(why.divergent.is_empty(), "{:?}", why.divergent);
    let field = |name: &str| why.fields.iter().find(|f| f.field == name).unwrap();
    assert!(field("allowance:2025-12").decided_by.is_some());
    let status = field(&format!("subscription:{sub}:status"));
    assert!(
        status.beaten.iter().any(|b| b.event_id == read_id),
        "{status:?}"
    );
}

/// `inboxctl send stripe subscription --thin` (the dev stack on `inboxctl fakes`, docs/design.md
/// §6.6): the fake Stripe is told to hold the subscription the snapshot would have carried, the
/// thin event is delivered instead, and the worker's read finds it at the fake and applies it.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn send_thin_gives_the_fake_the_object_the_worker_then_reads(pool: PgPool) {
    let (app, api) = app_with_api(pool).await;
    provider_fakes::hold::Hold::Stripe(api.fake.clone())
        .mount(&api)
        .await;
    let app = std::sync::Arc::new(app);
    let intake = crate::cli::serve_intake(app.clone()).await;
    let mut sources: Value = serde_json::from_str(&crate::cli::dev_sources(None)).unwrap();
    for source in sources.as_array_mut().unwrap() {
        if source["name"] == "stripe" {
            source["api_base_url"] = json!(api.uri());
        }
    }
    let (status, stdout, stderr) = tokio::task::spawn_blocking(move || {
        let mut command = crate::cli::inboxctl();
        command
            .env_remove("INBOX_DEV_KINDE_KEY")
            .args([
                "send",
                "stripe",
                "subscription",
                "--thin",
                "--id",
                "evt_thin_send",
            ])
            .args(["--customer", "cus_thin_send", "--object", "sub_thin_send"])
            .args(["--intake-url", &intake])
            .env("INBOX_SOURCES", sources.to_string());
        let (output, stdout, stderr) = crate::cli::run(&mut command);
        (output.status.code(), stdout, stderr)
    })
    .await
    .unwrap();
    assert_eq!(status, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("v1.customer.subscription.updated -> 200"),
        "{stdout}"
    );
    app.run_worker().await;

    let thin = status_of(&app, "evt_thin_send").await;
    assert_eq!(thin.status, "applied", "{:?}", thin.reason);
    let read = status_of(&app, "read:evt_thin_send").await;
    assert_eq!(read.status, "applied", "{:?}", read.reason);
    assert_eq!(
        api.received_requests()
            .await
            .unwrap()
            .iter()
            .filter(|r| r.url.path() == "/v1/subscriptions/sub_thin_send")
            .count(),
        1,
        "the worker read the subscription from the fake"
    );
    let account = app
        .account(
            "stripe",
            "cus_thin_send",
            &Utc::now().format("%Y-%m").to_string(),
        )
        .await;
    assert_eq!(account.subscriptions[0].status, "active");
}
