//! A payment whose plan is its subscription's, arriving before any event of that subscription,
//! for Paddle (a transaction whose items name no known price) and Lemon Squeezy (every
//! subscription invoice: it names its subscription, not its variant), docs/design.md §6.2,
//! §6.4, §6.5: the worker reads the subscription from the provider's fake (provider-fakes) with the source's
//! key, stores the read as an event of its own at the payment's time, and grants the plan the
//! read shows. The payments and the API answers are the corpus's (testdata/providers/).

use chrono::{DateTime, Utc};
use serde_json::Value;
use shared::apply::WorkerSource;
use shared::audit::Cut;
use shared::domain::SourceKind;
use shared::handlers::worker::{process_event, Processed};
use shared::providers::{self, Api};
use sqlx::PgPool;
use wiremock::MockServer;

use provider_fakes::traffic::Fault;
use provider_fakes::{FakeLemonSqueezy, FakePaddle, Metered, ProviderServer};

use crate::corpus::{corpus, corpus_app, payments, send_one};
use crate::helpers::*;

/// Gives the worker's `source` (of `kind`) its provider's API at `server`, with a key.
fn with_api(app: &mut TestApp, source: &str, kind: SourceKind, server: &MockServer, key: &str) {
    let api = Api {
        base_url: server.uri(),
        key: key.into(),
        client_id: None,
        http: reqwest::Client::new(),
        budget: None,
    };
    app.worker.sources.insert(
        source.into(),
        WorkerSource {
            kind,
            livemode: None,
            reads: providers::provider(kind).reads(api),
        },
    );
}

fn file(path: &str) -> Value {
    let file = format!("{}/testdata/providers/{path}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
}

fn corpus_file(dir: &str, name: &str) -> Value {
    corpus(dir)
        .into_iter()
        .find(|(file, _)| file == name)
        .unwrap()
        .1
}

async fn requests(api: &MockServer) -> usize {
    api.received_requests().await.unwrap().len()
}

/// Whether every request `api` received carried `header` as `value`.
async fn all_carry(api: &MockServer, header: &str, value: &str) -> bool {
    api.received_requests()
        .await
        .unwrap()
        .iter()
        .all(|r| r.headers.get(header).is_some_and(|v| v == value))
}

/// What the fold says of `customer` agrees with the registers, and the grant of `period` is
/// the payment's or its read's (`granted_by`: the two stand at one time; the first by key
/// decides).
async fn fold_agrees(app: &TestApp, source: &str, customer: &str, period: &str, granted_by: i64) {
    let why = app.why(source, customer, Cut::default()).await;
    assert!(why.divergent.is_empty(), "{:?}", why.divergent);
    let of = |name: &str| why.fields.iter().find(|f| f.field == name).unwrap();
    let grant = of(&format!("allowance:{period}"))
        .decided_by
        .as_ref()
        .unwrap();
    assert_eq!(grant.event_id, granted_by);
    assert_eq!(app.audit().await.divergent, []);
}

// --- Paddle ---------------------------------------------------------------------------------

/// The subscription of the python SDK's `GET /subscriptions/{id}` answer.
const PADDLE_SUB: &str = "sub_01hp463gxfvndqjjyqn2n7tkth";
const PADDLE_CUSTOMER: &str = "ctm_01hp462x4578nc20acj9g956yy";

/// The node SDK's `transaction.completed`, as the renewal of that subscription, its items on a
/// price the catalog does not know (one retired from it): its event id and its body.
fn paddle_renewal() -> (String, Value) {
    let mut event = corpus_file("paddle", "transaction.completed");
    event["data"]["subscription_id"] = PADDLE_SUB.into();
    event["data"]["customer_id"] = PADDLE_CUSTOMER.into();
    for item in event["data"]["items"].as_array_mut().unwrap() {
        item["price"]["id"] = "pri_01retiredfromcatalog0000".into();
        item["price_id"] = "pri_01retiredfromcatalog0000".into();
    }
    (event["event_id"].as_str().unwrap().to_owned(), event)
}

async fn paddle_app(pool: PgPool) -> (TestApp, ProviderServer, FakePaddle) {
    let mut app = corpus_app(pool).await;
    let fake = FakePaddle::default();
    let api = fake.serve().await;
    with_api(
        &mut app,
        "paddle",
        SourceKind::Paddle,
        &api,
        "pdl_sdbx_apikey_reads",
    );
    (app, api, fake)
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_paddle_renewal_of_an_unknown_price_before_its_subscription_reads_it_and_grants_its_plan(
    pool: PgPool,
) {
    let (app, api, paddle) = paddle_app(pool).await;
    paddle.subscription(file("paddle/api/subscription.get.json")["data"].clone());
    let (event_id, renewal) = paddle_renewal();
    let reason = send_one(&app, "paddle", "renewal", &renewal).await;
    assert!(
        reason.contains(&format!(
            "plan pro from subscription {PADDLE_SUB} as the provider shows it (read, event "
        )),
        "{reason}"
    );
    let account = app.account("paddle", PADDLE_CUSTOMER, "2023-08").await;
    assert_eq!(account.balance, 500, "the pro allowance for 2023-08");
    assert_eq!(
        payments(&account),
        vec![("txn_01h8dzxgkvdwemdhbpcapj2tbj", "paid")]
    );
    assert_eq!(requests(&api).await, 1);
    assert!(all_carry(&api, "authorization", "Bearer pdl_sdbx_apikey_reads").await);

    // The read is an event of its own: Paddle's subscription.updated at the transaction's
    // time, applied as the queue drained.
    let read = app
        .event(
            app.event_id("paddle", &format!("read:{event_id}:{PADDLE_SUB}"))
                .await,
        )
        .await;
    assert_eq!(read.event_type, "subscription.updated");
    assert_eq!(read.customer_key.as_deref(), Some(PADDLE_CUSTOMER));
    assert_eq!(
        read.occurred_at,
        Some(at("2023-08-22T07:15:45.366122Z")),
        "the transaction's time"
    );
    assert_eq!(read.status, "applied");
    assert_eq!(account.subscriptions.len(), 1);
    assert_eq!(account.subscriptions[0].status, "active");

    // Sent again, the renewal finds its read stored: nothing is read twice.
    let renewal_id = app.event_id("paddle", &event_id).await;
    shared::inbox::replay::replay(&app.pool, &app.state.queue, &[renewal_id])
        .await
        .unwrap();
    app.run_worker().await;
    assert_eq!(requests(&api).await, 1, "the replay reads nothing");
    let account = app.account("paddle", PADDLE_CUSTOMER, "2023-08").await;
    assert_eq!(account.balance, 500, "granted once");
    fold_agrees(&app, "paddle", PADDLE_CUSTOMER, "2023-08", renewal_id).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_paddle_renewal_whose_subscription_paddle_does_not_know_grants_nothing_and_says_so(
    pool: PgPool,
) {
    // Paddle holds no such subscription: its 404 `not_found`.
    let (app, api, _paddle) = paddle_app(pool).await;
    let reason = send_one(&app, "paddle", "renewal", &paddle_renewal().1).await;
    assert!(
        reason.contains(&format!("the provider does not know {PADDLE_SUB}")),
        "{reason}"
    );
    assert_eq!(requests(&api).await, 1, "decided, not retried");
    let account = app.account("paddle", PADDLE_CUSTOMER, "2023-08").await;
    assert_eq!(account.balance, 0);
    assert_eq!(
        payments(&account),
        vec![("txn_01h8dzxgkvdwemdhbpcapj2tbj", "paid")]
    );
}

// --- Lemon Squeezy --------------------------------------------------------------------------

/// The Lemon Squeezy store's fake API, holding the corpus's subscription 1.
async fn lemonsqueezy_app(pool: PgPool) -> (TestApp, ProviderServer, FakeLemonSqueezy) {
    let mut app = corpus_app(pool).await;
    let fake = FakeLemonSqueezy::default();
    fake.subscription(file("lemonsqueezy/api/subscription.get.json")["data"].clone());
    let api = fake.serve().await;
    with_api(
        &mut app,
        "lemonsqueezy",
        SourceKind::LemonSqueezy,
        &api,
        "ls_test_reads",
    );
    (app, api, fake)
}

fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_lemonsqueezy_payment_before_its_subscription_reads_it_and_grants_its_plan(pool: PgPool) {
    let (app, api, _store) = lemonsqueezy_app(pool).await;
    let payment = corpus_file("lemonsqueezy", "subscription_payment_success");
    let reason = send_one(&app, "lemonsqueezy", "payment", &payment).await;
    assert!(
        reason.contains("plan pro from subscription 1 as the provider shows it (read, event "),
        "{reason}"
    );
    let account = app.account("lemonsqueezy", "1", "2025-11").await;
    assert_eq!(account.balance, 500, "the pro allowance for 2025-11");
    assert_eq!(
        payments(&account),
        vec![("subscription-invoices/1", "paid")]
    );
    assert_eq!(requests(&api).await, 1);
    assert!(all_carry(&api, "authorization", "Bearer ls_test_reads").await);
    assert!(all_carry(&api, "accept", "application/vnd.api+json").await);

    // The read is an event of its own: a subscription_updated at the payment's time (not the
    // object's updated_at), applied as the queue drained.
    let payment_key = shared::providers::lemonsqueezy::dedupe_key(&payment).unwrap();
    let read = app
        .event(
            app.event_id("lemonsqueezy", &format!("read:{}:1", payment_key.as_str()))
                .await,
        )
        .await;
    assert_eq!(read.event_type, "subscription_updated");
    assert_eq!(read.customer_key.as_deref(), Some("1"));
    assert_eq!(read.occurred_at, Some(at("2025-11-01T10:00:02Z")));
    assert_eq!(read.status, "applied");
    assert_eq!(account.subscriptions.len(), 1);
    assert_eq!(account.subscriptions[0].status, "active");

    // The read's key (`read:…`) sorts before the payment's (`subscription_payment_success:…`).
    let read_id = app
        .event_id("lemonsqueezy", &format!("read:{}:1", payment_key.as_str()))
        .await;
    fold_agrees(&app, "lemonsqueezy", "1", "2025-11", read_id).await;

    // The subscription's own event, arriving after, grants nothing more.
    let created = corpus_file("lemonsqueezy", "subscription_created");
    send_one(&app, "lemonsqueezy", "created", &created).await;
    let account = app.account("lemonsqueezy", "1", "2025-11").await;
    assert_eq!(account.balance, 500, "granted once");
    assert_eq!(requests(&api).await, 1);
    assert_eq!(app.audit().await.divergent, []);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_lemonsqueezy_payment_before_its_subscription_without_an_api_key_grants_nothing_and_says_why(
    pool: PgPool,
) {
    // The test worker's sources have no API key.
    let app = corpus_app(pool).await;
    let payment = corpus_file("lemonsqueezy", "subscription_payment_success");
    let reason = send_one(&app, "lemonsqueezy", "payment", &payment).await;
    for said in [
        "no allowance granted",
        "the subscription register holds no known plan for 1",
        "the source has no API key to read it from the provider",
    ] {
        assert!(reason.contains(said), "{said:?} in {reason}");
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_lemonsqueezy_subscription_read_that_fails_is_retried_then_grants_its_plan(pool: PgPool) {
    let (app, api, store) = lemonsqueezy_app(pool).await;
    store.then(Some("/v1/subscriptions/1"), Fault::Fails(500));
    let payment = corpus_file("lemonsqueezy", "subscription_payment_success");
    let (status, _) = app
        .post("lemonsqueezy", &lemonsqueezy_delivery(&payment))
        .await;
    assert_eq!(status, http::StatusCode::OK);
    let key = shared::providers::lemonsqueezy::dedupe_key(&payment).unwrap();
    let id = app.event_id("lemonsqueezy", key.as_str()).await;

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
        app.account("lemonsqueezy", "1", "2025-11").await.balance,
        500
    );
    assert_eq!(requests(&api).await, 2);
}

/// Ages every stored row past a 30-day retention and purges, as the scheduler does.
pub(crate) async fn purge_after_retention(app: &TestApp) -> u64 {
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

/// Whether a register, a grant, an intent or a tombstone names the event `id` (what the purge
/// keeps for itself, docs/design.md §3.9).
pub(crate) async fn named_by_state(app: &TestApp, id: i64) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM subscriptions WHERE event_id = $1)
             OR EXISTS (SELECT 1 FROM payments WHERE event_id = $1)
             OR EXISTS (SELECT 1 FROM ledger WHERE event_id = $1)
             OR EXISTS (SELECT 1 FROM customer_plans WHERE event_id = $1)
             OR EXISTS (SELECT 1 FROM customer_standing WHERE event_id = $1)",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

/// Regression: the purge found a read's event by parsing the read's key (`read:<key>:<object>`
/// cut at its first `:`), and a Lemon Squeezy key holds `:` itself. Once the subscription's
/// register moved on, the read that decided the payment's plan was purged while the payment
/// (its grant names it) was kept: `why` lost the grant's decider and the audit found
/// `allowance:2025-11` stored 500, folded nothing, for good. The read names its event's row.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_lemonsqueezy_payments_subscription_read_is_kept_across_a_purge_with_the_payment(
    pool: PgPool,
) {
    let (app, _api, _store) = lemonsqueezy_app(pool).await;
    let payment = corpus_file("lemonsqueezy", "subscription_payment_success");
    send_one(&app, "lemonsqueezy", "payment", &payment).await;
    let payment_key = shared::providers::lemonsqueezy::dedupe_key(&payment).unwrap();
    let payment_id = app.event_id("lemonsqueezy", payment_key.as_str()).await;
    let read_key = format!("read:{}:1", payment_key.as_str());
    let read_id = app.event_id("lemonsqueezy", &read_key).await;
    assert_eq!(app.event(read_id).await.status, "applied");
    // The subscription's own later change (past due, 2025-12-01) takes its register from the
    // read: nothing but the payment it was made for keeps the read now.
    let updated = corpus_file("lemonsqueezy", "subscription_updated");
    send_one(&app, "lemonsqueezy", "updated", &updated).await;
    assert!(!named_by_state(&app, read_id).await);
    assert!(named_by_state(&app, payment_id).await);
    fold_agrees(&app, "lemonsqueezy", "1", "2025-11", read_id).await;

    purge_after_retention(&app).await;
    let kept: Vec<String> =
        sqlx::query_scalar("SELECT dedupe_key FROM inbox_events WHERE id = ANY($1) ORDER BY id")
            .bind([payment_id, read_id])
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(
        kept,
        vec![payment_key.as_str().to_owned(), read_key],
        "the payment its grant names, and the read made for it"
    );
    // `why` still names the read as the grant's decider, and the audit holds.
    fold_agrees(&app, "lemonsqueezy", "1", "2025-11", read_id).await;
}

/// A store from before reads named their event: the migration that adds the column finds each
/// read's event by its key, the key without `read:`, else without its last `:<object>` too, so
/// that a Lemon Squeezy payment's read, a thin invoice's subscription read and a sweep's read
/// name their event as a thin event's read does; a read whose event is gone names none.
#[sqlx::test(migrations = false)]
async fn the_reads_stored_before_name_their_event_once_migrated(pool: PgPool) {
    const MADE_FOR: i64 = 20261214110001;
    for migration in shared::MIGRATOR.iter().filter(|m| m.version < MADE_FOR) {
        sqlx::raw_sql(&migration.sql).execute(&pool).await.unwrap();
    }
    let ls =
        "subscription_payment_success:subscription-invoices:1:2025-11-01T10:00:02.000000Z:bd82";
    let rows = [
        ("lemonsqueezy", ls.to_owned()),
        ("lemonsqueezy", format!("read:{ls}:1")),
        ("stripe", "evt_thin".to_owned()),
        ("stripe", "read:evt_thin".to_owned()),
        ("stripe", "read:read:evt_thin:sub_1".to_owned()),
        ("stripe", "evt_notice".to_owned()),
        ("stripe", "read:evt_notice:sub_2".to_owned()),
        ("stripe", "read:evt_purged:sub_3".to_owned()),
    ];
    for (source, key) in &rows {
        sqlx::query(
            "INSERT INTO inbox_events (source, dedupe_key, type, raw_body, payload_hash)
             VALUES ($1, $2, 'test', '', sha256($2::bytea))",
        )
        .bind(source)
        .bind(key)
        .execute(&pool)
        .await
        .unwrap();
    }
    let migration = shared::MIGRATOR
        .iter()
        .find(|m| m.version == MADE_FOR)
        .unwrap();
    sqlx::raw_sql(&migration.sql).execute(&pool).await.unwrap();
    let named: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT r.dedupe_key, m.dedupe_key FROM inbox_events r
         LEFT JOIN inbox_events m ON m.id = r.made_for
         WHERE r.dedupe_key LIKE 'read:%' ORDER BY r.id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let of = |key: &str| Some(key.to_owned());
    assert_eq!(
        named,
        vec![
            (format!("read:{ls}:1"), of(ls)),
            ("read:evt_thin".to_owned(), of("evt_thin")),
            ("read:read:evt_thin:sub_1".to_owned(), of("read:evt_thin")),
            ("read:evt_notice:sub_2".to_owned(), of("evt_notice")),
            ("read:evt_purged:sub_3".to_owned(), None),
        ]
    );
}
