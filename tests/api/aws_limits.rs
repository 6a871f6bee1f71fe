//! AWS's documented limits held against what the code sends (docs/design.md §1.5). The
//! local SQS server and moto take more than AWS does (an 11-entry batch is refused by both,
//! but a 300 KiB message, a batch of 1 MiB, a body holding U+0001, a `PutEvents` entry of
//! 300 KB, a `Detail` that is a JSON array, a 129-character `DetailType` or a `Source`
//! under `aws.` are taken), so passing against them proves little. The checking layer here is
//! an SDK interceptor on the clients the tests build ([`checked_sqs_client`],
//! [`checked_eventbridge_client`]): it records every SQS and EventBridge request the code
//! makes, as the SDK is about to serialize it, and checks it against the rule of
//! `shared::platform::aws_limits` that AWS's page states (each constant there names its
//! page). A request over a limit panics the test that made it, naming the rule; the tests
//! below push the code to each limit and read what was sent.

use std::sync::{Arc, Mutex};

use aws_sdk_eventbridge::operation::put_events::PutEventsInput;
use aws_sdk_sqs::operation::change_message_visibility::ChangeMessageVisibilityInput;
use aws_sdk_sqs::operation::delete_message_batch::DeleteMessageBatchInput;
use aws_sdk_sqs::operation::receive_message::ReceiveMessageInput;
use aws_sdk_sqs::operation::send_message::SendMessageInput;
use aws_sdk_sqs::operation::send_message_batch::SendMessageBatchInput;
use serde_json::{json, Value};
use shared::platform::aws_limits::*;
use shared::platform::queue::{parse_message_body, Queue};

use shared::effects::sinks::Sinks;
use shared::handlers::dispatcher::{self, Dispatched, DispatcherState};
use shared::platform::config::parse_sinks;
use sqlx::PgPool;

use crate::effects_dispatch::write_effect_for;
use crate::helpers::{create_queue, stripe_delivery, stripe_event, TestApp};

/// One request as the code made it: enough of it to check each documented limit.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    SendMessage {
        body: String,
    },
    /// Each entry's `Id` and body, in order.
    SendMessageBatch {
        entries: Vec<(String, String)>,
    },
    ReceiveMessage {
        max: Option<i32>,
        wait: Option<i32>,
        visibility: Option<i32>,
    },
    ChangeMessageVisibility {
        timeout: Option<i32>,
    },
    DeleteMessageBatch {
        ids: Vec<String>,
    },
    /// Each entry's `Source`, `DetailType` and `Detail`, in order.
    PutEvents {
        entries: Vec<(String, String, String)>,
    },
}

impl Call {
    /// The documented limits this request breaks, each named with its rule.
    pub fn violations(&self) -> Vec<String> {
        let mut broken = Vec::new();
        let mut check = |ok: bool, rule: String| {
            if !ok {
                broken.push(rule)
            }
        };
        match self {
            Call::SendMessage { body } => {
                if let Some(problem) = message_problem(body) {
                    check(false, format!("SendMessage: {problem}"));
                }
            }
            Call::SendMessageBatch { entries } => {
                check(
                    (1..=SQS_MAX_BATCH_ENTRIES).contains(&entries.len()),
                    format!("SendMessageBatch: {} entries, not 1 to 10", entries.len()),
                );
                let total: usize = entries.iter().map(|(_, body)| body.len()).sum();
                check(
                    total <= SQS_MAX_MESSAGE_BYTES,
                    format!("SendMessageBatch: {total} bytes of bodies, over 262,144"),
                );
                check_batch_ids(
                    entries.iter().map(|(id, _)| id),
                    "SendMessageBatch",
                    &mut check,
                );
                for (id, body) in entries {
                    if let Some(problem) = message_problem(body) {
                        check(false, format!("SendMessageBatch entry {id}: {problem}"));
                    }
                }
            }
            Call::ReceiveMessage {
                max,
                wait,
                visibility,
            } => {
                check(
                    max.is_none_or(|m| (1..=SQS_MAX_RECEIVE).contains(&m)),
                    format!("ReceiveMessage: MaxNumberOfMessages {max:?}, not 1 to 10"),
                );
                check(
                    wait.is_none_or(|w| (0..=SQS_MAX_WAIT_TIME_SECS).contains(&w)),
                    format!("ReceiveMessage: WaitTimeSeconds {wait:?}, not 0 to 20"),
                );
                check(
                    visibility.is_none_or(|v| (0..=SQS_MAX_VISIBILITY_TIMEOUT_SECS).contains(&v)),
                    format!("ReceiveMessage: VisibilityTimeout {visibility:?}, not 0 to 43,200"),
                );
            }
            Call::ChangeMessageVisibility { timeout } => check(
                timeout.is_some_and(|v| (0..=SQS_MAX_VISIBILITY_TIMEOUT_SECS).contains(&v)),
                format!("ChangeMessageVisibility: VisibilityTimeout {timeout:?}, not 0 to 43,200"),
            ),
            Call::DeleteMessageBatch { ids } => {
                check(
                    (1..=SQS_MAX_BATCH_ENTRIES).contains(&ids.len()),
                    format!("DeleteMessageBatch: {} entries, not 1 to 10", ids.len()),
                );
                check_batch_ids(ids.iter(), "DeleteMessageBatch", &mut check);
            }
            Call::PutEvents { entries } => {
                check(
                    (1..=PUT_EVENTS_MAX_ENTRIES).contains(&entries.len()),
                    format!("PutEvents: {} entries, not 1 to 10", entries.len()),
                );
                let total: usize = entries
                    .iter()
                    .map(|(s, t, d)| put_events_entry_size(s, t, Some(d), &[], false))
                    .sum();
                check(
                    total < PUT_EVENTS_MAX_BYTES,
                    format!("PutEvents: {total} bytes of entries, not less than 256 KB"),
                );
                for (source, detail_type, detail) in entries {
                    if let Some(problem) = put_events_entry_problem(source, detail_type, detail) {
                        check(false, format!("PutEvents entry: {problem}"));
                    }
                }
            }
        }
        broken
    }
}

/// A batch's entry ids: each of the documented form, none repeated.
fn check_batch_ids<'a>(
    ids: impl Iterator<Item = &'a String>,
    call: &str,
    check: &mut impl FnMut(bool, String),
) {
    let mut seen = std::collections::BTreeSet::new();
    for id in ids {
        check(
            is_batch_entry_id(id),
            format!("{call}: entry id '{id}' is not 1 to 80 letters, digits, '-' or '_'"),
        );
        check(
            seen.insert(id),
            format!("{call}: entry id '{id}' is repeated"),
        );
    }
}

/// The requests a checked client made, in order.
#[derive(Debug, Clone, Default)]
pub struct Sent(Arc<Mutex<Vec<Call>>>);

impl Sent {
    pub fn calls(&self) -> Vec<Call> {
        self.0.lock().unwrap().clone()
    }

    fn record(&self, call: Call) {
        let broken = call.violations();
        self.0.lock().unwrap().push(call);
        // A request AWS would refuse fails the test here, whatever the local server says.
        assert!(
            broken.is_empty(),
            "a request over AWS's documented limits: {}",
            broken.join("; ")
        );
    }
}

/// One interceptor for both clients: the SDKs share the trait (`aws_smithy_runtime_api`'s).
impl aws_sdk_sqs::config::Intercept for Sent {
    fn name(&self) -> &'static str {
        "aws-limits"
    }

    fn read_before_execution(
        &self,
        context: &aws_sdk_sqs::config::interceptors::BeforeSerializationInterceptorContextRef<'_>,
        _cfg: &mut aws_sdk_sqs::config::ConfigBag,
    ) -> Result<(), aws_sdk_sqs::error::BoxError> {
        let input = context.input();
        let call = if let Some(i) = input.downcast_ref::<SendMessageInput>() {
            Call::SendMessage {
                body: i.message_body().unwrap_or_default().to_owned(),
            }
        } else if let Some(i) = input.downcast_ref::<SendMessageBatchInput>() {
            Call::SendMessageBatch {
                entries: i
                    .entries()
                    .iter()
                    .map(|e| (e.id().to_owned(), e.message_body().to_owned()))
                    .collect(),
            }
        } else if let Some(i) = input.downcast_ref::<ReceiveMessageInput>() {
            Call::ReceiveMessage {
                max: i.max_number_of_messages(),
                wait: i.wait_time_seconds(),
                visibility: i.visibility_timeout(),
            }
        } else if let Some(i) = input.downcast_ref::<ChangeMessageVisibilityInput>() {
            Call::ChangeMessageVisibility {
                timeout: i.visibility_timeout(),
            }
        } else if let Some(i) = input.downcast_ref::<DeleteMessageBatchInput>() {
            Call::DeleteMessageBatch {
                ids: i.entries().iter().map(|e| e.id().to_owned()).collect(),
            }
        } else if let Some(i) = input.downcast_ref::<PutEventsInput>() {
            let field = |v: Option<&str>| v.unwrap_or_default().to_owned();
            Call::PutEvents {
                entries: i
                    .entries()
                    .iter()
                    .map(|e| (field(e.source()), field(e.detail_type()), field(e.detail())))
                    .collect(),
            }
        } else {
            return Ok(());
        };
        self.record(call);
        Ok(())
    }
}

/// An SQS client of the local server whose every request is checked and recorded.
pub async fn checked_sqs_client() -> (aws_sdk_sqs::Client, Sent) {
    let sent = Sent::default();
    let config = aws_sdk_sqs::config::Builder::from(&shared::platform::queue::sdk_config().await)
        .interceptor(sent.clone())
        .build();
    (aws_sdk_sqs::Client::from_conf(config), sent)
}

/// An EventBridge client of the local AWS server (moto) whose every request is checked and
/// recorded.
pub async fn checked_eventbridge_client() -> (aws_sdk_eventbridge::Client, Sent) {
    let sent = Sent::default();
    let config =
        aws_sdk_eventbridge::config::Builder::from(&shared::platform::queue::sdk_config().await)
            .interceptor(sent.clone())
            .build();
    (aws_sdk_eventbridge::Client::from_conf(config), sent)
}

/// Every message on the queue, received until it is empty (each receive within the limits).
async fn drain(sqs: &aws_sdk_sqs::Client, url: &str) -> Vec<String> {
    let mut bodies = Vec::new();
    loop {
        let messages = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(SQS_MAX_RECEIVE)
            .wait_time_seconds(0)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        if messages.is_empty() {
            return bodies;
        }
        bodies.extend(messages.iter().filter_map(|m| m.body().map(str::to_owned)));
    }
}

fn batch_sizes(calls: &[Call]) -> Vec<usize> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::SendMessageBatch { entries } => Some(entries.len()),
            _ => None,
        })
        .collect()
}

#[test]
fn the_checking_layer_refuses_what_aws_refuses_and_the_local_servers_take() {
    // Each case was seen taken by local-aws-sqs or moto (docs/design.md §1.5).
    let batch = |n: usize, body: &str| Call::SendMessageBatch {
        entries: (0..n).map(|i| (format!("m{i}"), body.to_owned())).collect(),
    };
    let refused = [
        batch(11, "1"),
        batch(10, &"x".repeat(30 * 1024)),
        Call::SendMessage {
            body: "x".repeat(300 * 1024),
        },
        Call::SendMessage {
            body: "a\u{1}b".into(),
        },
        Call::SendMessageBatch {
            entries: vec![("a".into(), "1".into()), ("a".into(), "2".into())],
        },
        Call::SendMessageBatch {
            entries: vec![("eff.1".into(), "1".into())],
        },
        Call::ReceiveMessage {
            max: Some(11),
            wait: Some(0),
            visibility: None,
        },
        Call::ReceiveMessage {
            max: Some(10),
            wait: Some(21),
            visibility: None,
        },
        Call::ChangeMessageVisibility { timeout: Some(-1) },
        Call::ChangeMessageVisibility {
            timeout: Some(43_201),
        },
        Call::PutEvents {
            entries: vec![("billing-inbox".into(), "t".into(), "{}".into()); 11],
        },
        Call::PutEvents {
            entries: vec![(
                "billing-inbox".into(),
                "t".into(),
                json!({"x": "y".repeat(300_000)}).to_string(),
            )],
        },
        Call::PutEvents {
            entries: vec![
                (
                    "billing-inbox".into(),
                    "t".into(),
                    json!({"x": "y".repeat(30_000)}).to_string()
                );
                10
            ],
        },
        Call::PutEvents {
            entries: vec![("billing-inbox".into(), "t".into(), "[1,2]".into())],
        },
        Call::PutEvents {
            entries: vec![("billing-inbox".into(), "t".repeat(129), "{}".into())],
        },
        Call::PutEvents {
            entries: vec![("aws.billing".into(), "t".into(), "{}".into())],
        },
    ];
    for call in refused {
        assert!(!call.violations().is_empty(), "{call:?}");
    }
    let taken = [
        batch(10, &"x".repeat(25 * 1024)),
        Call::ReceiveMessage {
            max: Some(10),
            wait: Some(20),
            visibility: Some(43_200),
        },
        Call::ChangeMessageVisibility { timeout: Some(0) },
        Call::PutEvents {
            entries: vec![("billing-inbox".into(), "t".repeat(128), "{}".into()); 10],
        },
    ];
    for call in taken {
        assert_eq!(call.violations(), Vec::<String>::new(), "{call:?}");
    }
}

#[tokio::test]
async fn twenty_five_event_ids_go_in_batches_of_ten_each_once() {
    let (sqs, sent) = checked_sqs_client().await;
    let url = create_queue(&sqs).await;
    let queue = Queue::new(sqs.clone(), url.clone());
    let ids: Vec<i64> = (1_000..1_025).collect();

    let unsent = queue.send_events(&ids).await;

    assert!(unsent.is_empty(), "{unsent:?}");
    assert_eq!(batch_sizes(&sent.calls()), [10, 10, 5]);
    let mut received: Vec<i64> = drain(&sqs, &url)
        .await
        .iter()
        .map(|b| parse_message_body(b).unwrap())
        .collect();
    received.sort_unstable();
    assert_eq!(received, ids);
}

#[tokio::test]
async fn bodies_over_256_kib_together_are_split_and_one_sqs_refuses_is_not_sent() {
    let (sqs, sent) = checked_sqs_client().await;
    let url = create_queue(&sqs).await;
    let queue = Queue::new(sqs.clone(), url.clone());
    // Ten bodies of 30 KiB (300 KiB together, which the local server takes in one request),
    // then one of 300 KiB and one holding U+0001 (both taken by the local server).
    let mut bodies: Vec<String> = (0..10)
        .map(|i| format!("{i}{}", "x".repeat(30 * 1024)))
        .collect();
    let too_big = "y".repeat(300 * 1024);
    let control = "a\u{1}b".to_owned();
    bodies.push(too_big.clone());
    bodies.push(control.clone());

    let unsent = queue.send_bodies(&bodies).await;

    assert_eq!(
        unsent,
        [too_big, control],
        "given back to the caller, unsent"
    );
    assert_eq!(batch_sizes(&sent.calls()), [8, 2]);
    let mut received = drain(&sqs, &url).await;
    received.sort();
    assert_eq!(received, bodies[..10]);
}

/// A dispatcher whose one sink is a fresh bus on the local AWS server, reached through a
/// checked client.
async fn bus_dispatcher(pool: &PgPool) -> (DispatcherState, Sent) {
    let (events, sent) = checked_eventbridge_client().await;
    let bus = format!("billing-{}", uuid::Uuid::new_v4().simple());
    events.create_event_bus().name(&bus).send().await.unwrap();
    let configs = json!([{"name": "bus", "kind": "eventbridge", "bus": bus}]).to_string();
    let sinks = Sinks::from_config(&parse_sinks(&configs).unwrap())
        .unwrap()
        .with_eventbridge_client(events);
    (DispatcherState::new(pool.clone(), sinks), sent)
}

fn put_events(calls: &[Call]) -> Vec<&Vec<(String, String, String)>> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::PutEvents { entries } => Some(entries),
            _ => None,
        })
        .collect()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn many_effects_reach_the_bus_each_in_an_entry_eventbridge_takes(pool: PgPool) {
    let (state, sent) = bus_dispatcher(&pool).await;
    let mut ids = Vec::new();
    for n in 0..12 {
        ids.push(write_effect_for(&pool, "cus_bus_many", &format!("evt_{n}")).await);
    }

    for id in &ids {
        assert_eq!(
            dispatcher::dispatch(&state, id).await.unwrap(),
            Dispatched::Sent
        );
    }

    // Every request was checked as it left (at most 10 entries, under 256 KB, a JSON object
    // for a detail); each effect went once, as its own entry.
    let calls = sent.calls();
    let entries: Vec<_> = put_events(&calls).into_iter().flatten().collect();
    assert_eq!(entries.len(), ids.len());
    for ((source, detail_type, detail), id) in entries.iter().zip(&ids) {
        assert_eq!(source, "billing-inbox");
        assert_eq!(detail_type, "billing.plan_changed");
        assert_eq!(
            serde_json::from_str::<Value>(detail).unwrap()["id"],
            id.as_str()
        );
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_effect_too_large_for_eventbridge_is_not_put_and_the_error_says_why(pool: PgPool) {
    let (state, sent) = bus_dispatcher(&pool).await;
    let id = write_effect_for(&pool, "cus_bus_large", "evt_large").await;
    // A body of 300 KB (moto takes it; EventBridge refuses an entry of 256 KB or more).
    pad_effect(&pool, &id, 300_000).await;

    let dispatched = dispatcher::dispatch(&state, &id).await.unwrap();

    let Dispatched::Failed { status, error } = dispatched else {
        panic!("{dispatched:?}");
    };
    assert_eq!(
        status.as_str(),
        "pending",
        "retried on the outbox's schedule, then dead"
    );
    assert!(
        error.starts_with("sink 'bus': not put on the bus: the entry is 300"),
        "{error}"
    );
    assert!(error.contains("262144"), "{error}");
    assert!(put_events(&sent.calls()).is_empty(), "no request was made");
}

/// Pads an effect's body with `bytes` of text, as a large catalog's features would.
async fn pad_effect(pool: &PgPool, id: &str, bytes: usize) {
    sqlx::query(
        "UPDATE effects SET body = jsonb_set(body, '{data,note}', to_jsonb($2::text)) WHERE id = $1",
    )
    .bind(id)
    .bind("n".repeat(bytes))
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_near_the_intakes_1_mib_limit_is_enqueued_as_its_id_alone(pool: PgPool) {
    let (sqs, sent) = checked_sqs_client().await;
    let url = create_queue(&sqs).await;
    let queue = Queue::new(sqs.clone(), url.clone());
    let app = TestApp::with_parts(pool.clone(), pool, sqs.clone(), url.clone(), queue).await;
    let mut event = stripe_event("evt_large", "cus_large", chrono::Utc::now().timestamp());
    // 900 KB of metadata: under the intake's 1 MiB, over SQS's 256 KiB.
    event["data"]["object"]["metadata"] = json!({"note": "m".repeat(900_000)});

    let (status, body) = app.post("stripe", &stripe_delivery(&event)).await;

    assert_eq!(status, 200, "{body}");
    let event_id = body["event_id"].as_i64().unwrap();
    assert_eq!(
        sent.calls(),
        [Call::SendMessage {
            body: event_id.to_string()
        }],
        "the message names the stored row; the row is the fact"
    );
    assert_eq!(drain(&sqs, &url).await, [event_id.to_string()]);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_effect_of_300_kb_is_enqueued_as_its_id_alone(pool: PgPool) {
    let (sqs, sent) = checked_sqs_client().await;
    let url = create_queue(&sqs).await;
    let queue = Queue::new(sqs.clone(), url.clone());
    let id = write_effect_for(&pool, "cus_large_effect", "evt_1").await;
    pad_effect(&pool, &id, 300_000).await;

    let unsent = shared::platform::queued::enqueue_or_unmark::<shared::effects::outbox::Effects>(
        &pool,
        &queue,
        std::slice::from_ref(&id),
    )
    .await
    .unwrap();

    assert!(unsent.is_empty());
    assert_eq!(
        sent.calls(),
        [Call::SendMessageBatch {
            entries: vec![("m0".into(), id.clone())]
        }]
    );
    assert_eq!(drain(&sqs, &url).await, [id]);
}

#[tokio::test]
async fn the_bridge_drains_a_backlog_receiving_and_deleting_ten_at_most() {
    let (sqs, sent) = checked_sqs_client().await;
    let url = create_queue(&sqs).await;
    let ids: Vec<i64> = (1..=25).collect();
    assert!(Queue::new(sqs.clone(), url.clone())
        .send_events(&ids)
        .await
        .is_empty());

    let mut handled = Vec::new();
    // As `inboxctl dev` (no wait) and `inboxctl bench` (a 1 s long poll) pump.
    for wait in [0, 1].into_iter().cycle() {
        let report = shared::dev::lambda_triggers::pump_once(&sqs, &url, wait, |event| {
            handled.extend(event.records.iter().filter_map(|r| r.body.clone()));
            async { Ok(Default::default()) }
        })
        .await
        .unwrap();
        if report.received == 0 {
            break;
        }
        assert_eq!(
            report.deleted, report.received,
            "each handled message acknowledged"
        );
    }

    handled.sort_by_key(|b| parse_message_body(b));
    assert_eq!(handled, ids.iter().map(i64::to_string).collect::<Vec<_>>());
    let calls = sent.calls();
    let deletes: Vec<usize> = calls
        .iter()
        .filter_map(|c| match c {
            Call::DeleteMessageBatch { ids } => Some(ids.len()),
            _ => None,
        })
        .collect();
    assert_eq!(deletes.iter().sum::<usize>(), 25);
    assert!(calls.iter().any(|c| matches!(
        c,
        Call::ReceiveMessage {
            max: Some(10),
            wait: Some(1),
            ..
        }
    )));
}
