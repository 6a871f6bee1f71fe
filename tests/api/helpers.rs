//! Test harness: a fresh database and queue per test, signed deliveries, and readers for
//! what the pipeline stored.

use std::time::Duration;

use aws_sdk_sqs::Client as SqsClient;
use chrono::Utc;
use http::StatusCode;
use lambda_http::Body;
use serde_json::{json, Value};
pub use shared::audit::{Cut, Why};
use shared::domain::retry::RetryPolicy;
use shared::handlers::intake::{self, IntakeState};
use shared::handlers::worker::WorkerState;
use shared::platform::config::{parse_sources, SourceConfig};
use shared::platform::queue::Queue;
use shared::providers::{fixtures, kinde, lemonsqueezy, standard_webhooks, stripe, Sources};
use sqlx::PgPool;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// The test sources are the development sources (`fixtures::dev_sources`), with their secrets;
/// Kinde's tokens are signed with the test key below and verified with a mocked JWKS.
pub const STRIPE_SECRET: &str = stripe::fixtures::DEV_SECRET;
pub const POLAR_SECRET: &str = standard_webhooks::fixtures::DEV_SECRET;
pub const LEMONSQUEEZY_SECRET: &str = lemonsqueezy::fixtures::DEV_SECRET;
pub const KINDE_KEY: &[u8] = include_bytes!("../../testdata/kinde_test_key_a.pem");
pub const KINDE_KID: &str = "test-key-a";
const JWKS: &str = include_str!("../../testdata/jwks_a.json");

pub struct TestApp {
    pub pool: PgPool,
    pub state: IntakeState,
    pub worker: WorkerState,
    pub sqs: SqsClient,
    pub queue_url: String,
    _jwks: MockServer,
}

/// A delivery as a provider would send it: headers and body.
pub struct Delivery {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// The tests' SQS client: every request it sends is checked against AWS's documented limits
/// (`crate::aws_limits`), which the local server does not all hold.
pub async fn sqs_client() -> SqsClient {
    crate::aws_limits::checked_sqs_client().await.0
}

/// A queue whose server is gone: every send fails at once (connection refused).
pub async fn unreachable_queue() -> Queue {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead_sqs = SqsClient::from_conf(
        aws_sdk_sqs::config::Builder::from(&shared::platform::queue::sdk_config().await)
            .endpoint_url(format!("http://127.0.0.1:{port}"))
            .build(),
    );
    Queue::new(
        dead_sqs,
        format!("http://127.0.0.1:{port}/000000000000/gone"),
    )
}

/// A fresh queue on the SQS-compatible server.
pub async fn create_queue(sqs: &SqsClient) -> String {
    let name = format!("test-{}", uuid::Uuid::new_v4());
    sqs.create_queue()
        .queue_name(name)
        .send()
        .await
        .expect("the SQS server is reachable (scripts/test starts it)")
        .queue_url
        .expect("CreateQueue returns the queue URL")
}

impl TestApp {
    pub async fn spawn(pool: PgPool) -> Self {
        let sqs = sqs_client().await;
        let queue_url = create_queue(&sqs).await;
        let queue = Queue::new(sqs.clone(), queue_url.clone());
        Self::with_parts(pool.clone(), pool, sqs, queue_url, queue).await
    }

    /// An app whose intake talks to `intake_pool` and `queue`, while the test reads `pool`.
    pub async fn with_parts(
        pool: PgPool,
        intake_pool: PgPool,
        sqs: SqsClient,
        queue_url: String,
        queue: Queue,
    ) -> Self {
        let jwks = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/.well-known/jwks"))
            .respond_with(ResponseTemplate::new(200).set_body_raw(JWKS, "application/json"))
            .mount(&jwks)
            .await;
        let sources = test_sources(&format!("{}/.well-known/jwks", jwks.uri()));
        let sources = Sources::build(&sources, Duration::from_secs(300), reqwest_client()).unwrap();
        let mut worker = test_worker(pool.clone());
        // What the worker stores (a provider read) goes to the intake's queue after its commit.
        worker.events = Some(queue.clone());
        let state = IntakeState::new(intake_pool, queue, sources);
        Self {
            pool,
            state,
            worker,
            sqs,
            queue_url,
            _jwks: jwks,
        }
    }

    /// Delivers Stripe event `id` about `customer`, created at `created`, and returns the
    /// stored event's id.
    pub async fn store_stripe_event(&self, id: &str, customer: &str, created: i64) -> i64 {
        let delivery = stripe_delivery(&stripe_event(id, customer, created));
        let (_, answer) = self.post("stripe", &delivery).await;
        answer["event_id"].as_i64().expect("stored")
    }

    /// POSTs a delivery to `/webhooks/{source}` through the intake handler.
    pub async fn post(&self, source: &str, delivery: &Delivery) -> (StatusCode, Value) {
        let mut builder = http::Request::builder()
            .method("POST")
            .uri(format!("https://example.test/webhooks/{source}"));
        for (name, value) in &delivery.headers {
            builder = builder.header(name, value);
        }
        let request = builder.body(Body::from(delivery.body.clone())).unwrap();
        self.send(request).await
    }

    pub async fn send(&self, request: lambda_http::Request) -> (StatusCode, Value) {
        let response = intake::handle(&self.state, request).await;
        let status = response.status();
        let body = match response.body() {
            Body::Text(t) => serde_json::from_str(t).unwrap(),
            Body::Binary(b) => serde_json::from_slice(b).unwrap(),
            _ => Value::Null,
        };
        (status, body)
    }

    /// Every event id waiting on the queue, in no particular order; the messages are deleted.
    pub async fn drain_queue(&self) -> Vec<i64> {
        self.drain(&self.queue_url)
            .await
            .iter()
            .map(|body| shared::platform::queue::parse_message_body(body).unwrap())
            .collect()
    }

    /// Every message body waiting on a queue, in no particular order; the messages are deleted.
    pub async fn drain(&self, queue_url: &str) -> Vec<String> {
        let mut bodies = Vec::new();
        loop {
            let received = self
                .sqs
                .receive_message()
                .queue_url(queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(0)
                .send()
                .await
                .unwrap();
            let messages = received.messages.unwrap_or_default();
            if messages.is_empty() {
                return bodies;
            }
            for message in messages {
                bodies.push(message.body().unwrap().to_owned());
                self.sqs
                    .delete_message()
                    .queue_url(queue_url)
                    .receipt_handle(message.receipt_handle().unwrap())
                    .send()
                    .await
                    .unwrap();
            }
        }
    }

    /// Turns effects on: the worker writes them and sends their ids to a fresh queue, whose
    /// URL this returns.
    pub async fn enable_effects(&mut self) -> String {
        let url = create_queue(&self.sqs).await;
        self.worker.effects = Some(Queue::new(self.sqs.clone(), url.clone()));
        url
    }

    /// Every effect written, by account and sequence.
    pub async fn effects(&self) -> Vec<EffectRow> {
        sqlx::query_as::<_, EffectRow>(
            "SELECT id, kind, source, customer_id, sequence, event_id, status, enqueued_at, body
             FROM effects ORDER BY source, customer_id, sequence",
        )
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    pub async fn count(&self, table_sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(table_sql)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    pub async fn event(&self, id: i64) -> EventRow {
        sqlx::query_as::<_, EventRow>(
            "SELECT source, dedupe_key, type, status, seen_count, customer_key, occurred_at,
                    enqueued_at, reason, inbox_payload(payload, raw_body, body_is_payload) AS payload
             FROM inbox_events WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    pub async fn verdicts(&self, event_id: i64) -> Vec<String> {
        sqlx::query_scalar("SELECT verdict FROM deliveries WHERE event_id = $1 ORDER BY id")
            .bind(event_id)
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }
}

#[derive(Debug, sqlx::FromRow)]
pub struct EventRow {
    pub source: String,
    pub dedupe_key: String,
    #[sqlx(rename = "type")]
    pub event_type: String,
    pub status: String,
    pub seen_count: i32,
    pub customer_key: Option<String>,
    pub occurred_at: Option<chrono::DateTime<Utc>>,
    pub enqueued_at: Option<chrono::DateTime<Utc>>,
    pub reason: Option<String>,
    pub payload: Option<Value>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EffectRow {
    pub id: String,
    pub kind: String,
    pub source: String,
    pub customer_id: String,
    pub sequence: i64,
    /// `None` for an effect a debit told.
    pub event_id: Option<i64>,
    pub status: String,
    pub enqueued_at: Option<chrono::DateTime<Utc>>,
    pub body: Value,
}

/// The plan catalog the tests configure.
pub const PLANS: &str = r#"{
    "free": {"plan": "free", "monthly_allowance": 10},
    "pro": {"plan": "pro", "monthly_allowance": 500},
    "price_pro": {"plan": "pro", "monthly_allowance": 500},
    "prod_pro": {"plan": "pro", "monthly_allowance": 500},
    "team": {"plan": "team", "monthly_allowance": 2000},
    "price_team": {"plan": "team", "monthly_allowance": 2000},
    "prod_team": {"plan": "team", "monthly_allowance": 2000},
    "pri_01gsz8x8sawmvhz1pv30nge1ke": {"plan": "pro", "monthly_allowance": 500},
    "pri_01h84cdy3xatsp16afda2gekzy": {"plan": "team", "monthly_allowance": 2000},
    "101": {"plan": "pro", "monthly_allowance": 500},
    "102": {"plan": "team", "monthly_allowance": 2000}
}"#;

/// The test sources: the development source of every registered provider, Kinde's verified
/// with the JWKS at `jwks_url`.
pub fn test_sources(jwks_url: &str) -> Vec<SourceConfig> {
    let local = fixtures::Local { jwks_url };
    parse_sources(&fixtures::dev_sources(&local).to_string()).unwrap()
}

/// A worker's sources as the fold knows them.
pub fn audit_sources(worker: &WorkerState) -> shared::audit::Sources {
    worker
        .sources
        .iter()
        .map(|(name, source)| (name.clone(), source.into()))
        .collect()
}

/// The audit a test scheduler runs: the test sources and catalog, the production bound.
pub fn test_audit() -> shared::handlers::scheduler::Audit {
    shared::handlers::scheduler::Audit::new(
        shared::audit::sources_of(&test_sources("http://127.0.0.1:9/unused")),
        shared::domain::Catalog::parse(PLANS).unwrap(),
    )
}

/// A worker on `pool` with the test sources and catalog, retrying at once (no waits) so
/// tests can drive retries without sleeping.
pub fn test_worker(pool: PgPool) -> WorkerState {
    // the worker verifies nothing: only the sources' names and kinds count here
    let sources = test_sources("http://127.0.0.1:9/unused")
        .into_iter()
        .map(|source| (source.name, source.kind.into()))
        .collect();
    let mut worker = WorkerState::new(
        pool,
        sources,
        shared::domain::Catalog::parse(PLANS).unwrap(),
    );
    worker.retry = RetryPolicy::new([Duration::ZERO; 5]);
    worker
}

impl TestApp {
    /// Plays the event source mapping with the real bridge until the queue has nothing
    /// visible: each batch goes to this app's worker in process; what it reports as failed
    /// stays on the queue for redelivery after the visibility timeout.
    /// Returns how many messages were handed over.
    pub async fn run_worker(&self) -> usize {
        let mut handed = 0;
        loop {
            let report = shared::dev::lambda_triggers::pump_once(
                &self.sqs,
                &self.queue_url,
                0,
                |event| async {
                    Ok(shared::handlers::worker::handle_batch(&self.worker, event).await)
                },
            )
            .await
            .unwrap();
            handed += report.received;
            if report.received == 0 {
                return handed;
            }
        }
    }

    /// The worker's sources as the fold knows them.
    pub fn audit_sources(&self) -> shared::audit::Sources {
        audit_sources(&self.worker)
    }

    /// `inboxctl why` of an account, as of `cut`.
    pub async fn why(&self, source: &str, customer: &str, cut: Cut) -> Why {
        let mut conn = self.pool.acquire().await.unwrap();
        let customer = shared::domain::CustomerId::parse(customer).unwrap();
        let sources = self.audit_sources();
        let account = (source, &customer);
        shared::audit::why(&mut conn, &sources, &self.worker.catalog, account, cut)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("account {source}/{customer} exists"))
    }

    /// `inboxctl audit --all`.
    pub async fn audit(&self) -> shared::audit::AuditReport {
        let sources = self.audit_sources();
        shared::audit::audit_all(&self.pool, &sources, &self.worker.catalog, None, None)
            .await
            .unwrap()
    }

    /// The account as `inboxctl account` shows it, for `period`.
    pub async fn account(
        &self,
        source: &str,
        customer: &str,
        period: &str,
    ) -> shared::billing::account::AccountView {
        let mut conn = self.pool.acquire().await.unwrap();
        let customer = shared::domain::CustomerId::parse(customer).unwrap();
        let period = shared::domain::Period::parse(period).unwrap();
        shared::billing::account::load(&mut conn, source, &customer, &period, &self.worker.catalog)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("account {source}/{customer} exists"))
    }

    pub async fn event_id(&self, source: &str, dedupe_key: &str) -> i64 {
        sqlx::query_scalar("SELECT id FROM inbox_events WHERE source = $1 AND dedupe_key = $2")
            .bind(source)
            .bind(dedupe_key)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

/// A migrated database of its own, for a test that cannot use `#[sqlx::test]` (one that
/// drives its own runtime, like a property test).
pub async fn fresh_database() -> (PgPool, String) {
    use sqlx::Executor;
    let server = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for the tests");
    let admin = PgPool::connect(&server).await.unwrap();
    let name = format!("test_{}", uuid::Uuid::new_v4().simple());
    admin
        .execute(format!(r#"CREATE DATABASE "{name}""#).as_str())
        .await
        .unwrap();
    let mut options: sqlx::postgres::PgConnectOptions = server.parse().unwrap();
    options = options.database(&name);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    shared::MIGRATOR.run(&pool).await.unwrap();
    (pool, name)
}

/// Another pool on the same database: a second process, as far as Postgres can tell.
pub async fn second_pool(pool: &PgPool) -> PgPool {
    let options = pool.connect_options().as_ref().clone();
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap()
}

pub async fn drop_database(pool: PgPool, name: &str) {
    use sqlx::Executor;
    pool.close().await;
    let server = std::env::var("DATABASE_URL").unwrap();
    let admin = PgPool::connect(&server).await.unwrap();
    let _ = admin
        .execute(format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#).as_str())
        .await;
}

fn reqwest_client() -> reqwest::Client {
    reqwest::Client::new()
}

/// A Stripe subscription event as Stripe sends it.
pub fn stripe_event(id: &str, customer: &str, created: i64) -> Value {
    json!({
        "id": id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": created,
        "livemode": false,
        "pending_webhooks": 1,
        "request": {"id": null, "idempotency_key": null},
        "type": "customer.subscription.updated",
        "data": {"object": {
            "id": "sub_1", "object": "subscription", "customer": customer, "status": "active",
            "items": {"object": "list", "data": [{"price": {"id": "price_pro"}}]}
        }}
    })
}

/// Signs a Stripe event, sent now.
pub fn stripe_delivery(event: &Value) -> Delivery {
    stripe_delivery_at(event, Utc::now().timestamp())
}

pub fn stripe_delivery_at(event: &Value, sent_at: i64) -> Delivery {
    let body = serde_json::to_vec(event).unwrap();
    Delivery {
        headers: vec![
            ("content-type".into(), "application/json".into()),
            (
                "user-agent".into(),
                "Stripe/1.0 (+https://stripe.com/docs/webhooks)".into(),
            ),
            (
                "stripe-signature".into(),
                stripe::fixtures::signature(STRIPE_SECRET.as_bytes(), sent_at, &body),
            ),
        ],
        body,
    }
}

/// A Polar (Standard Webhooks) delivery of `payload` under message id `id`, sent now.
pub fn polar_delivery(id: &str, payload: &Value) -> Delivery {
    let body = serde_json::to_vec(payload).unwrap();
    let now = Utc::now().timestamp();
    Delivery {
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("webhook-id".into(), id.into()),
            ("webhook-timestamp".into(), now.to_string()),
            (
                "webhook-signature".into(),
                shared::signing::standard_webhooks::signature(
                    POLAR_SECRET.as_bytes(),
                    id,
                    now,
                    &body,
                ),
            ),
        ],
        body,
    }
}

/// A Lemon Squeezy delivery: the body, `X-Event-Name` and `X-Signature` (hex HMAC-SHA256 of
/// the body with the development secret).
pub fn lemonsqueezy_delivery(payload: &Value) -> Delivery {
    let body = serde_json::to_vec(payload).unwrap();
    let signature = hex::encode(fixtures::hmac_sha256(LEMONSQUEEZY_SECRET.as_bytes(), &body));
    Delivery {
        headers: vec![
            ("content-type".into(), "application/json".into()),
            (
                "x-event-name".into(),
                payload["meta"]["event_name"]
                    .as_str()
                    .unwrap_or_default()
                    .into(),
            ),
            ("x-signature".into(), signature),
        ],
        body,
    }
}

/// A Paddle Billing delivery of `event`, signed now with the development destination's secret.
pub fn paddle_delivery(event: &Value) -> Delivery {
    let body = serde_json::to_vec(event).unwrap();
    let signature = shared::providers::paddle::fixtures::signature(
        shared::providers::paddle::fixtures::DEV_SECRET.as_bytes(),
        Utc::now().timestamp(),
        &body,
    );
    Delivery {
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("paddle-signature".into(), signature),
        ],
        body,
    }
}

/// A Kinde delivery: a JWT of `claims` (with `timestamp` set to now) under `webhook-id`.
pub fn kinde_delivery(webhook_id: &str, claims: &Value) -> Delivery {
    let mut claims = claims.clone();
    claims["timestamp"] = json!(Utc::now().to_rfc3339());
    let token = kinde::fixtures::token(KINDE_KEY, KINDE_KID, &claims).unwrap();
    Delivery {
        headers: vec![
            ("content-type".into(), "application/jwt".into()),
            ("webhook-id".into(), webhook_id.into()),
        ],
        body: token.into_bytes(),
    }
}

/// An SQS batch naming `ids`, one message each (message id `m{id}`).
pub fn sqs_batch(ids: &[i64]) -> aws_lambda_events::event::sqs::SqsEvent {
    let mut event = aws_lambda_events::event::sqs::SqsEvent::default();
    for id in ids {
        let mut record = aws_lambda_events::event::sqs::SqsMessage::default();
        record.message_id = Some(format!("m{id}"));
        record.body = Some(shared::platform::queue::message_body(*id));
        event.records.push(record);
    }
    event
}
