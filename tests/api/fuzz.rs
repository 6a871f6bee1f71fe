//! The intake under arbitrary input: any header map and body, for every source kind, signed
//! or not, never panics, always answers one of 200/401/404/413/503, and answers in bounded
//! time. Bounded in cases (`INBOX_FUZZ_CASES`, default 64) and in time per request.

use std::time::Duration;

use chrono::Utc;
use http::StatusCode;
use lambda_http::Body;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::json;
use shared::providers::{kinde, stripe};
use shared::signing::standard_webhooks;

use crate::helpers::*;

/// How long one request may take before the test calls it unbounded.
const PER_REQUEST: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
enum BodyKind {
    Bytes(Vec<u8>),
    /// Deeply nested JSON.
    Nested(usize),
    /// Just over the limit.
    Huge,
    /// A signed JSON object with arbitrary fields and values.
    Json(serde_json::Value),
}

#[derive(Debug, Clone)]
struct Input {
    source: &'static str,
    headers: Vec<(String, String)>,
    body: BodyKind,
    /// Sign the body as the source's provider would (so parsing is reached).
    sign: bool,
}

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("stripe-signature".to_owned()),
        Just("webhook-id".to_owned()),
        Just("webhook-timestamp".to_owned()),
        Just("webhook-signature".to_owned()),
        Just("svix-signature".to_owned()),
        Just("content-type".to_owned()),
        "[a-z][a-z0-9-]{0,20}",
    ]
}

fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,64}",
        Just("t=1,v1=".to_owned()),
        Just(format!(
            "t={},{}",
            Utc::now().timestamp(),
            "v1=,".repeat(500)
        )),
        Just("v1, v1, v1,".to_owned()),
        Just("application/jwt".to_owned()),
        Just("text/plain; charset=utf-8".to_owned()),
        (0i64..4_000_000_000).prop_map(|n| n.to_string()),
    ]
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        "[\\PC\u{0}]{0,16}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            proptest::collection::hash_map(
                prop_oneof![
                    Just("id".to_owned()),
                    Just("type".to_owned()),
                    Just("created".to_owned()),
                    Just("data".to_owned()),
                    Just("object".to_owned()),
                    Just("customer".to_owned()),
                    Just("event_id".to_owned()),
                    Just("timestamp".to_owned()),
                    "[a-z_]{1,8}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn input() -> impl Strategy<Value = Input> {
    let body = prop_oneof![
        4 => proptest::collection::vec(any::<u8>(), 0..2048).prop_map(BodyKind::Bytes),
        1 => (100usize..20_000).prop_map(BodyKind::Nested),
        1 => Just(BodyKind::Huge),
        4 => json_value().prop_map(BodyKind::Json),
    ];
    (
        prop_oneof![Just("stripe"), Just("polar"), Just("kinde"), Just("nope")],
        proptest::collection::vec((header_name(), header_value()), 0..6),
        body,
        any::<bool>(),
    )
        .prop_map(|(source, headers, body, sign)| Input {
            source,
            headers,
            body,
            sign,
        })
}

fn body_bytes(body: &BodyKind) -> Vec<u8> {
    match body {
        BodyKind::Bytes(b) => b.clone(),
        BodyKind::Nested(depth) => format!("{}{}", "[".repeat(*depth), "]".repeat(*depth)).into(),
        BodyKind::Huge => vec![b'{'; 1_048_577],
        BodyKind::Json(v) => serde_json::to_vec(v).unwrap(),
    }
}

/// The request the input describes; a signed one carries its provider's valid signature.
fn request(input: &Input) -> lambda_http::Request {
    let mut body = body_bytes(&input.body);
    let mut headers = input.headers.clone();
    if input.sign {
        let now = Utc::now().timestamp();
        match input.source {
            "stripe" => headers.push((
                "stripe-signature".into(),
                stripe::fixtures::signature(STRIPE_SECRET.as_bytes(), now, &body),
            )),
            "polar" => headers.extend([
                ("webhook-id".into(), "msg_fuzz".into()),
                ("webhook-timestamp".into(), now.to_string()),
                (
                    "webhook-signature".into(),
                    standard_webhooks::signature(POLAR_SECRET.as_bytes(), "msg_fuzz", now, &body),
                ),
            ]),
            "kinde" if !matches!(input.body, BodyKind::Huge) => {
                let mut claims = match &input.body {
                    BodyKind::Json(v @ serde_json::Value::Object(_)) => v.clone(),
                    _ => json!({"type": "customer.plan_changed"}),
                };
                claims["timestamp"] = json!(Utc::now().to_rfc3339());
                body = kinde::fixtures::token(KINDE_KEY, KINDE_KID, &claims)
                    .unwrap()
                    .into_bytes();
            }
            _ => {}
        }
    }
    let mut builder = http::Request::builder()
        .method("POST")
        .uri(format!("https://example.test/webhooks/{}", input.source));
    for (name, value) in &headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) {
            builder = builder.header(name, value);
        }
    }
    builder.body(Body::Binary(body)).unwrap()
}

/// How many inputs were stored (200): the signed path must be reached, not only refusals.
static STORED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

async fn check(app: &TestApp, input: &Input) -> Result<(), TestCaseError> {
    let answered = tokio::time::timeout(PER_REQUEST, app.send(request(input))).await;
    let Ok((status, body)) = answered else {
        return Err(TestCaseError::fail(format!(
            "no answer within {PER_REQUEST:?}"
        )));
    };
    prop_assert!(
        [
            StatusCode::OK,
            StatusCode::UNAUTHORIZED,
            StatusCode::NOT_FOUND,
            StatusCode::PAYLOAD_TOO_LARGE,
            StatusCode::SERVICE_UNAVAILABLE
        ]
        .contains(&status),
        "answered {status}: {body}"
    );
    if status == StatusCode::OK {
        STORED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    if input.source == "nope" {
        prop_assert_eq!(status, StatusCode::NOT_FOUND);
    }
    if matches!(input.body, BodyKind::Huge) && input.source != "nope" {
        prop_assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    }
    Ok(())
}

#[test]
fn the_intake_answers_every_input_without_panicking_in_bounded_time() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (pool, database) = runtime.block_on(fresh_database());
    let app = runtime.block_on(TestApp::spawn(pool.clone()));
    let cases = std::env::var("INBOX_FUZZ_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&input(), |input| runtime.block_on(check(&app, &input)));
    drop(app);
    runtime.block_on(drop_database(pool, &database));
    if let Err(failure) = result {
        panic!("{failure}");
    }
    let stored = STORED.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        cases < 32 || stored > 0,
        "no signed input was stored in {cases} cases"
    );
}
