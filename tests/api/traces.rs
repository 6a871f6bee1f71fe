//! One delivery followed by its id (docs/operating.md "Following one event"): the spans of
//! the intake, the worker and the dispatcher, exported through the same OpenTelemetry layer
//! the functions install (`platform::telemetry`), into memory, form one trace, each span
//! carrying the source, the event id and the account. The trace context crosses the two
//! queues as a real SQS message attribute.

use opentelemetry::trace::TraceId;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;
use shared::dev::lambda_triggers::pump_once;
use shared::dev::listen::Listener;
use shared::effects::sinks::Sinks;
use shared::handlers::dispatcher::{self, DispatcherState};
use shared::platform::config::parse_sinks;
use sqlx::PgPool;
use tracing_subscriber::layer::SubscriberExt;

use crate::helpers::{stripe_delivery, stripe_event, TestApp};

/// The value of a span's attribute, as text.
fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// The finished spans named `name`.
fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn one_delivery_is_one_trace_from_intake_to_its_effects(pool: PgPool) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber =
        tracing_subscriber::registry().with(shared::platform::telemetry::layer(&provider, "tests"));
    let _traced = tracing::subscriber::set_default(subscriber);

    let mut app = TestApp::spawn(pool.clone()).await;
    let effects_url = app.enable_effects().await;
    let key = b"traced-effects-signing-key-32-by".to_vec();
    let secret = format!(
        "whsec_{}",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &key)
    );
    let receiver = Listener::start(([127, 0, 0, 1], 0).into(), vec![key])
        .await
        .unwrap();
    let sinks =
        json!([{"name": "app", "kind": "webhook", "url": receiver.url(), "secret": secret}]);
    let sinks = Sinks::from_config(&parse_sinks(&sinks.to_string()).unwrap()).unwrap();
    let dispatcher = DispatcherState::new(pool.clone(), sinks);

    let created = chrono::Utc::now().timestamp();
    let delivery = stripe_delivery(&stripe_event("evt_traced", "cus_traced", created));
    let (_, answer) = app.post("stripe", &delivery).await;
    let event_id = answer["event_id"].as_i64().expect("stored");
    app.run_worker().await;
    loop {
        let report = pump_once(&app.sqs, &effects_url, 0, |batch| async {
            Ok(dispatcher::handle_batch(&dispatcher, batch).await)
        })
        .await
        .unwrap();
        if report.received == 0 {
            break;
        }
    }
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();

    let intake = named(&spans, "intake");
    let worker = named(&spans, "worker");
    let dispatched = named(&spans, "dispatch");
    assert_eq!(intake.len(), 1, "one intake span");
    assert_eq!(worker.len(), 1, "one worker span");
    assert!(
        !dispatched.is_empty() && dispatched.len() == receiver.received().len(),
        "a dispatch span for each effect delivered"
    );
    let trace: TraceId = intake[0].span_context.trace_id();
    for span in intake.iter().chain(&worker).chain(&dispatched) {
        assert_eq!(
            span.span_context.trace_id(),
            trace,
            "{} is part of the delivery's trace",
            span.name
        );
        assert_eq!(attribute(span, "source").as_deref(), Some("stripe"));
        assert_eq!(
            attribute(span, "event_id"),
            Some(event_id.to_string()),
            "{} names the event",
            span.name
        );
        assert_eq!(attribute(span, "account").as_deref(), Some("cus_traced"));
    }
    assert_eq!(
        attribute(intake[0], "dedupe_key"),
        attribute(worker[0], "dedupe_key")
    );
}
