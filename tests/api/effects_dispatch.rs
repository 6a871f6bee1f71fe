//! The dispatcher (docs/design.md §11): effects written by the outbox, named on a
//! real SQS-compatible queue, delivered by `handle_batch` to a real HTTP receiver that
//! verifies each Standard Webhooks signature (`shared::dev::listen`), and to an EventBridge
//! bus on the local AWS server. Retries run with zero waits, so nothing sleeps.

use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use shared::dev::lambda_triggers::{pump_once, PumpReport};
use shared::dev::listen::Listener;
use shared::domain::effect::{effect_id, Kind};
use shared::domain::retry::RetryPolicy;
use shared::effects::outbox;
use shared::effects::sinks::Sinks;
use shared::handlers::dispatcher::{self, DispatcherState, FaultPoint};
use shared::platform::config::{parse_sinks, DispatcherConfig, FromEnv};
use shared::platform::queue::Queue;
use shared::signing::standard_webhooks::{decode_secret, SecretEncoding};
use sqlx::PgPool;

use crate::helpers::{create_queue, sqs_client};

/// A fresh `whsec_` signing secret and the key it stands for.
fn new_secret() -> (String, Vec<u8>) {
    let key: Vec<u8> = uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .chain(uuid::Uuid::new_v4().as_bytes())
        .copied()
        .collect();
    let secret = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(&key)
    );
    (secret, key)
}

/// The app's endpoint: a real receiver verifying with `key`.
async fn receiver(key: &[u8]) -> Listener {
    Listener::start(([127, 0, 0, 1], 0).into(), vec![key.to_vec()])
        .await
        .unwrap()
}

/// A dispatcher over `sinks` (an `INBOX_EFFECTS` value) fed by a queue of its own, retrying
/// at once and taking a held effect back as soon as its attempt ended.
struct Dispatch {
    pool: PgPool,
    state: DispatcherState,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    queue: Queue,
}

impl Dispatch {
    async fn new(pool: PgPool, sinks: &Value) -> Self {
        let sinks = Sinks::from_config(&parse_sinks(&sinks.to_string()).unwrap()).unwrap();
        let mut state = DispatcherState::new(pool.clone(), sinks);
        state.retry = RetryPolicy::new([Duration::ZERO; 5]);
        // A crashed attempt's hold ends at once, so the next message finds the effect.
        state.lease = Duration::ZERO;
        let sqs = sqs_client().await;
        let queue_url = create_queue(&sqs).await;
        let queue = Queue::new(sqs.clone(), queue_url.clone());
        Self {
            pool,
            state,
            sqs,
            queue_url,
            queue,
        }
    }

    /// Sends the effect's id to the queue (as the worker or the rescue does) and plays the
    /// event source mapping until the queue has nothing visible.
    async fn nudge(&self, id: &str) -> PumpReport {
        assert!(self.queue.send_bodies(&[id.to_owned()]).await.is_empty());
        let mut total = PumpReport::default();
        loop {
            let report = pump_once(&self.sqs, &self.queue_url, 0, |event| async {
                Ok(dispatcher::handle_batch(&self.state, event).await)
            })
            .await
            .unwrap();
            if report.received == 0 {
                return total;
            }
            total.received += report.received;
            total.deleted += report.deleted;
            total.failed += report.failed;
        }
    }

    async fn row(&self, id: &str) -> outbox::EffectDetail {
        let mut conn = self.pool.acquire().await.unwrap();
        outbox::detail(&mut conn, id).await.unwrap().unwrap()
    }
}

/// Writes one `billing.plan_changed` effect for `customer` as the worker's statement does
/// (the account, then the outbox row with the account's first sequence number, marked
/// enqueued); its id.
async fn write_effect(pool: &PgPool, customer: &str) -> String {
    write_effect_for(pool, customer, "evt_1").await
}

/// [`write_effect`] for the event `cause` (one effect per cause: several for one customer
/// take its next sequence numbers).
pub(crate) async fn write_effect_for(pool: &PgPool, customer: &str, cause: &str) -> String {
    let what = format!("plan of stripe/{customer} at {cause}");
    let id = effect_id(Kind::PlanChanged, &what);
    let occurred_at = chrono::Utc::now();
    let body = json!({
        "id": id, "type": "billing.plan_changed",
        "occurred_at": occurred_at.to_rfc3339(),
        "data": {"source": "stripe", "customer_id": customer, "event_id": 1,
                 "plan": "pro", "previous_plan": "free"},
    });
    sqlx::query(
        "WITH account AS (
             INSERT INTO accounts AS a (source, customer_id, effect_seq) VALUES ('stripe', $2, 1)
             ON CONFLICT (source, customer_id) DO UPDATE SET effect_seq = a.effect_seq + 1
             RETURNING effect_seq
         )
         INSERT INTO effects (id, kind, cause, source, customer_id, sequence, event_id,
                              occurred_at, body, enqueued_at)
         SELECT $1, $3, $4, 'stripe', $2, effect_seq, 1, $5,
                jsonb_set($6, '{data,sequence}', to_jsonb(effect_seq)), inbox_now()
         FROM account",
    )
    .bind(&id)
    .bind(customer)
    .bind(Kind::PlanChanged.as_str())
    .bind(&what)
    .bind(occurred_at)
    .bind(&body)
    .execute(pool)
    .await
    .unwrap();
    id
}

fn webhook(name: &str, url: &str, secret: &str) -> Value {
    json!({"name": name, "kind": "webhook", "url": url, "secret": secret})
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_effect_is_delivered_once_signed_with_its_id_as_webhook_id(pool: PgPool) {
    let (secret, key) = new_secret();
    let app = receiver(&key).await;
    let dispatch = Dispatch::new(pool.clone(), &json!([webhook("app", &app.url(), &secret)])).await;
    let id = write_effect(&pool, "cus_once").await;

    let report = dispatch.nudge(&id).await;

    assert_eq!((report.received, report.failed), (1, 0));
    assert_eq!(app.count(&id), 1, "the receiver verified it once");
    assert_eq!(app.refused(), 0, "no request failed its signature");
    let received = &app.received()[0];
    let row = dispatch.row(&id).await;
    assert_eq!(
        received.body, row.body,
        "the body as stored, sequence included"
    );
    assert_eq!(received.body["id"], id.as_str());
    assert_eq!(received.body["data"]["sequence"], 1);
    assert_eq!(row.status, "sent");
    assert_eq!(row.sent_to, ["app"]);
    assert_eq!(row.attempts, 1);
    assert!(row.sent_at.is_some() && row.last_error.is_none());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_second_message_for_a_sent_effect_sends_nothing(pool: PgPool) {
    let (secret, key) = new_secret();
    let app = receiver(&key).await;
    let dispatch = Dispatch::new(pool.clone(), &json!([webhook("app", &app.url(), &secret)])).await;
    let id = write_effect(&pool, "cus_copy").await;
    dispatch.nudge(&id).await;

    let report = dispatch.nudge(&id).await;
    let again = dispatcher::dispatch(&dispatch.state, &id).await.unwrap();

    assert_eq!(
        (report.received, report.failed),
        (1, 0),
        "acked, not retried"
    );
    assert_eq!(again, dispatcher::Dispatched::Skipped);
    assert_eq!(app.count(&id), 1);
    assert_eq!(dispatch.row(&id).await.attempts, 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_crash_between_send_and_record_delivers_twice_with_the_same_webhook_id(pool: PgPool) {
    let (secret, key) = new_secret();
    let app = receiver(&key).await;
    let dispatch = Dispatch::new(pool.clone(), &json!([webhook("app", &app.url(), &secret)])).await;
    let id = write_effect(&pool, "cus_crash").await;
    dispatch
        .state
        .faults
        .crash(FaultPoint::AfterSendBeforeRecord, 1);

    let crashed = dispatch.nudge(&id).await;
    let after_crash = dispatch.row(&id).await;
    dispatch.nudge(&id).await;
    dispatch.nudge(&id).await;

    assert_eq!(
        crashed.failed, 1,
        "a crashed attempt's message goes back to SQS"
    );
    assert_eq!(after_crash.status, "pending", "the send was not recorded");
    assert!(after_crash.sent_to.is_empty());
    assert_eq!(
        app.count(&id),
        2,
        "delivered again after the crash, then never"
    );
    let ids: Vec<String> = app.received().into_iter().map(|r| r.webhook_id).collect();
    assert_eq!(
        ids,
        [id.clone(), id.clone()],
        "the same webhook-id both times"
    );
    let row = dispatch.row(&id).await;
    assert_eq!(row.status, "sent");
    assert_eq!(row.attempts, 2);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_endpoint_that_fails_is_retried_then_dead_and_nothing_is_lost(pool: PgPool) {
    let (secret, key) = new_secret();
    let app = receiver(&key).await;
    app.answer_with(Some(http::StatusCode::INTERNAL_SERVER_ERROR));
    let dispatch = Dispatch::new(pool.clone(), &json!([webhook("app", &app.url(), &secret)])).await;
    let id = write_effect(&pool, "cus_down").await;

    let first = dispatch.nudge(&id).await;
    let pending = dispatch.row(&id).await;
    for _ in 1..6 {
        dispatch.nudge(&id).await;
    }
    let dead = dispatch.row(&id).await;
    dispatch.nudge(&id).await;

    assert_eq!(
        first.failed, 0,
        "a delivery failure is the outbox's to retry, not SQS's"
    );
    assert_eq!(pending.status, "pending");
    assert!(
        pending.next_attempt_at.is_some(),
        "a next attempt is scheduled"
    );
    let error = pending.last_error.unwrap();
    assert_eq!(
        error,
        "sink 'app': the endpoint answered 500 Internal Server Error"
    );
    assert_eq!(dead.status, "dead");
    assert_eq!(dead.attempts, 6, "the 6th failed attempt is the last");
    assert!(dead.next_attempt_at.is_none());
    assert_eq!(
        dispatch.row(&id).await.attempts,
        6,
        "a dead effect is not tried again"
    );
    assert_eq!(app.count(&id), 0);

    // Nothing lost: the operator fixes the endpoint and replays.
    app.answer_with(None);
    let replayed = outbox::replay(&pool, &dispatch.queue, std::slice::from_ref(&id))
        .await
        .unwrap();
    assert_eq!(replayed, std::slice::from_ref(&id));
    let mut report = PumpReport::default();
    while report.received == 0 {
        report = pump_once(&dispatch.sqs, &dispatch.queue_url, 1, |event| async {
            Ok(dispatcher::handle_batch(&dispatch.state, event).await)
        })
        .await
        .unwrap();
    }
    assert_eq!(app.count(&id), 1);
    assert_eq!(dispatch.row(&id).await.status, "sent");
}

/// A message whose whole budget (a read-back and a send) is no longer left before the
/// invocation's end is given back to the queue untouched: no attempt is spent on it and no
/// hold is left to expire.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_message_without_its_budget_before_the_deadline_is_given_back_untouched(pool: PgPool) {
    let (secret, key) = new_secret();
    let app = receiver(&key).await;
    let dispatch = Dispatch::new(pool.clone(), &json!([webhook("app", &app.url(), &secret)])).await;
    let id = write_effect(&pool, "cus_deadline").await;
    let mut event = aws_lambda_events::event::sqs::SqsEvent::default();
    let mut record = aws_lambda_events::event::sqs::SqsMessage::default();
    record.message_id = Some("m-late".into());
    record.body = Some(id.clone());
    event.records.push(record);
    let until = tokio::time::Instant::now() + dispatcher::ITEM_BUDGET / 2;

    let response =
        dispatcher::handle_batch_until(&dispatch.state, event.clone(), Some(until)).await;

    let given_back: Vec<_> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect();
    assert_eq!(given_back, ["m-late"]);
    let row = dispatch.row(&id).await;
    assert_eq!((row.status.as_str(), row.attempts), ("pending", 0));
    assert_eq!(app.count(&id), 0);

    // With its budget left, the same message is sent.
    let until = tokio::time::Instant::now() + dispatcher::ITEM_BUDGET * 2;
    let response = dispatcher::handle_batch_until(&dispatch.state, event, Some(until)).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(dispatch.row(&id).await.status, "sent");
    assert_eq!(app.count(&id), 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_endpoint_that_is_not_listening_leaves_the_effect_pending_with_the_sink_named(
    pool: PgPool,
) {
    let (secret, _) = new_secret();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{closed}/billing-events");
    let dispatch = Dispatch::new(pool.clone(), &json!([webhook("app", &url, &secret)])).await;
    let id = write_effect(&pool, "cus_closed").await;

    dispatch.nudge(&id).await;

    let row = dispatch.row(&id).await;
    assert_eq!(row.status, "pending");
    assert!(row.next_attempt_at.is_some());
    let error = row.last_error.unwrap();
    assert!(
        error.starts_with("sink 'app': could not connect"),
        "{error}"
    );
    assert!(
        !error.contains(&secret) && !error.contains("plan"),
        "{error}"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_sink_that_has_the_effect_is_not_sent_it_again_when_another_is_retried(pool: PgPool) {
    let (secret, key) = new_secret();
    let app = receiver(&key).await;
    let backup = receiver(&key).await;
    backup.answer_with(Some(http::StatusCode::SERVICE_UNAVAILABLE));
    let sinks = json!([
        webhook("app", &app.url(), &secret),
        webhook("backup", &backup.url(), &secret)
    ]);
    let dispatch = Dispatch::new(pool.clone(), &sinks).await;
    let id = write_effect(&pool, "cus_two").await;

    dispatch.nudge(&id).await;
    let half = dispatch.row(&id).await;
    backup.answer_with(None);
    dispatch.nudge(&id).await;

    assert_eq!(half.status, "pending");
    assert_eq!(half.sent_to, ["app"]);
    let error = half.last_error.unwrap();
    assert_eq!(
        error,
        "sink 'backup': the endpoint answered 503 Service Unavailable"
    );
    assert_eq!(
        app.count(&id),
        1,
        "the sink that had it was not sent it again"
    );
    assert_eq!(backup.count(&id), 1);
    let row = dispatch.row(&id).await;
    assert_eq!(row.status, "sent");
    assert_eq!(row.sent_to, ["app", "backup"]);
    assert!(row.last_error.is_none());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_database_that_cannot_be_reached_is_reported_back_to_sqs(pool: PgPool) {
    let (secret, key) = new_secret();
    let app = receiver(&key).await;
    let mut dispatch =
        Dispatch::new(pool.clone(), &json!([webhook("app", &app.url(), &secret)])).await;
    let id = write_effect(&pool, "cus_nodb").await;
    dispatch.state.pool =
        shared::platform::db::lazy_pool("postgres://nobody@127.0.0.1:1/none", 1).unwrap();

    let report = dispatch.nudge(&id).await;

    assert_eq!(report.failed, 1);
    assert_eq!(app.count(&id), 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_sink_secret_is_read_from_secrets_manager_once_and_signs(pool: PgPool) {
    let (secret, key) = new_secret();
    let app = receiver(&key).await;
    let name = format!("billing-inbox/test/{}", uuid::Uuid::new_v4().simple());
    shared::platform::secrets::client()
        .await
        .create_secret()
        .name(&name)
        .secret_string(json!({ "secret": secret }).to_string())
        .send()
        .await
        .expect("the local server serves Secrets Manager (scripts/test starts it)");
    let sinks = json!([{"name": "app", "kind": "webhook", "url": app.url(), "secret_id": name}]);
    let config = DispatcherConfig::from_lookup(|var| match var {
        "DATABASE_URL" => Some("postgres://unused@127.0.0.1:1/none".into()),
        "INBOX_EFFECTS" => Some(sinks.to_string()),
        "EFFECTS_QUEUE_URL" => Some("http://127.0.0.1:1/000000000000/none".into()),
        _ => None,
    })
    .unwrap();
    let mut state = DispatcherState::from_config(&config, 1).await.unwrap();
    state.pool = pool.clone();
    let id = write_effect(&pool, "cus_sm").await;

    let outcome = dispatcher::dispatch(&state, &id).await.unwrap();

    assert_eq!(outcome, dispatcher::Dispatched::Sent);
    assert_eq!(app.count(&id), 1);

    // A secret that is not a signing secret: the error names the sink, never the value.
    let bad = format!("billing-inbox/test/{}", uuid::Uuid::new_v4().simple());
    shared::platform::secrets::client()
        .await
        .create_secret()
        .name(&bad)
        .secret_string(json!({"secret": "whsec_!!not-base64-topsecret"}).to_string())
        .send()
        .await
        .unwrap();
    let sinks = parse_sinks(
        &json!([{"name": "app", "kind": "webhook", "url": app.url(), "secret_id": bad}])
            .to_string(),
    )
    .unwrap();
    let error = Sinks::resolve(&sinks).await.err().unwrap().to_string();
    assert!(
        error.starts_with("INBOX_EFFECTS: sink 'app': secret_id: "),
        "{error}"
    );
    assert!(!error.contains("topsecret"), "{error}");
    assert!(decode_secret(&secret, SecretEncoding::Base64).unwrap() == key);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_effect_reaches_an_eventbridge_bus_and_a_rule_routes_it(pool: PgPool) {
    let config = shared::platform::queue::sdk_config().await;
    let events = aws_sdk_eventbridge::Client::new(&config);
    // The rule's target queue lives on the AWS server (moto), beside the bus.
    let aws_endpoint = std::env::var("AWS_ENDPOINT_URL").expect("AWS_ENDPOINT_URL is set");
    let moto_sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(&config)
            .endpoint_url(aws_endpoint)
            .build(),
    );
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let bus = format!("billing-{suffix}");
    events
        .create_event_bus()
        .name(&bus)
        .send()
        .await
        .expect("the local AWS server serves EventBridge");
    let queue_name = format!("events-{suffix}");
    let target_url = moto_sqs
        .create_queue()
        .queue_name(&queue_name)
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let target_arn = moto_sqs
        .get_queue_attributes()
        .queue_url(&target_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap()[&aws_sdk_sqs::types::QueueAttributeName::QueueArn]
        .clone();
    events
        .put_rule()
        .name(format!("effects-{suffix}"))
        .event_bus_name(&bus)
        .event_pattern(json!({"source": ["billing-inbox"]}).to_string())
        .send()
        .await
        .unwrap();
    events
        .put_targets()
        .rule(format!("effects-{suffix}"))
        .event_bus_name(&bus)
        .targets(
            aws_sdk_eventbridge::types::Target::builder()
                .id("queue")
                .arn(&target_arn)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let dispatch = Dispatch::new(
        pool.clone(),
        &json!([{"name": "bus", "kind": "eventbridge", "bus": bus}]),
    )
    .await;
    let id = write_effect(&pool, "cus_bus").await;

    dispatch.nudge(&id).await;

    let row = dispatch.row(&id).await;
    assert_eq!(row.status, "sent", "{:?}", row.last_error);
    assert_eq!(row.sent_to, ["bus"]);
    let routed = moto_sqs
        .receive_message()
        .queue_url(&target_url)
        .max_number_of_messages(10)
        .wait_time_seconds(2)
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default();
    assert_eq!(routed.len(), 1, "the rule routed the event once");
    let event: Value = serde_json::from_str(routed[0].body().unwrap()).unwrap();
    assert_eq!(event["source"], "billing-inbox");
    assert_eq!(event["detail-type"], "billing.plan_changed");
    assert_eq!(event["detail"], row.body, "the detail is the effect's body");
}

/// Kinde plan changes for `customer`, applied by the worker with effects on: each writes
/// `billing.plan_changed` and `billing.allowance_granted`.
async fn plan_changes(pool: &PgPool, customer: &str, plans: &[(&str, &str)]) {
    let mut app = crate::helpers::TestApp::spawn(pool.clone()).await;
    app.enable_effects().await;
    for (i, (plan, at)) in plans.iter().enumerate() {
        let claims = json!({"type": "customer.plan_changed", "event_id": format!("evt_plan{i}"),
            "event_timestamp": at, "data": {"customer_id": customer, "plan": {"key": plan}}});
        app.post(
            "kinde",
            &crate::helpers::kinde_delivery(&format!("wh_plan{i}"), &claims),
        )
        .await;
        app.run_worker().await;
    }
}

/// The account's effects in sequence order: (id, type, sequence).
async fn effects_in_order(pool: &PgPool) -> Vec<(String, String, i64)> {
    sqlx::query_as("SELECT id, kind, sequence FROM effects ORDER BY sequence")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_grant_retried_after_a_later_effect_is_applied_by_an_app_that_follows_the_contract(
    pool: PgPool,
) {
    plan_changes(
        &pool,
        "kc_late_grant",
        &[
            ("pro", "2026-03-01T00:00:00Z"),
            ("team", "2026-03-05T00:00:00Z"),
        ],
    )
    .await;
    let effects = effects_in_order(&pool).await;
    let kinds: Vec<(&str, i64)> = effects.iter().map(|(_, k, s)| (k.as_str(), *s)).collect();
    assert_eq!(
        kinds,
        [
            ("billing.plan_changed", 1),
            ("billing.allowance_granted", 2),
            ("billing.plan_changed", 3),
            ("billing.allowance_granted", 4)
        ]
    );
    let id = |sequence: i64| effects[sequence as usize - 1].0.clone();
    let (secret, key) = new_secret();
    let app = receiver(&key).await;
    let dispatch = Dispatch::new(pool.clone(), &json!([webhook("app", &app.url(), &secret)])).await;

    // The pro grant's first delivery fails; the later effects are delivered meanwhile, and
    // then the grant's retry.
    app.fail_once(&id(2), http::StatusCode::SERVICE_UNAVAILABLE);
    dispatch.nudge(&id(2)).await;
    assert_eq!(dispatch.row(&id(2)).await.status, "pending");
    for sequence in [1, 3, 4] {
        dispatch.nudge(&id(sequence)).await;
    }
    dispatch.nudge(&id(2)).await;
    assert_eq!(dispatch.row(&id(2)).await.status, "sent");

    let arrived: Vec<i64> = app
        .received()
        .iter()
        .map(|r| r.body["data"]["sequence"].as_i64().unwrap())
        .collect();
    assert_eq!(
        arrived,
        [1, 3, 4, 2],
        "the retried grant arrives after a higher sequence: a keep-the-highest rule would drop it"
    );
    let held = app.app();
    let mut grants: Vec<i64> = held
        .facts
        .values()
        .map(|body| body["data"]["grant"]["amount"].as_i64().unwrap())
        .collect();
    grants.sort();
    assert_eq!(grants, [500, 1500], "both grants are applied, once each");
    assert_eq!(
        held.accounts["kinde/kc_late_grant"],
        (
            4,
            json!({"plan": "team", "features": {}, "balance": 2000, "used": 0,
                   "remaining": 2000, "period": "2026-03"})
        ),
        "the account's state is the newest"
    );
    assert!(
        held.older.is_empty(),
        "no state arrived older than one held"
    );
}
