//! Sources' secrets from Secrets Manager (docs/design.md §5.3), through the real SDK against
//! the local moto server: the intake verifies with the `secret_id` secret's signing secrets
//! and never reads the API key's secret; the scheduler and the worker read only the
//! `api_key_secret_id` secret; the combined layout of before still works, with a warning; a
//! key in two places is refused; and no error repeats a secret. (A secret these tests never
//! create stands for one the function's role may not read: moto does not enforce IAM.)

use std::sync::{Arc, Mutex};

use http::StatusCode;
use serde_json::json;
use shared::handlers::intake::IntakeState;
use shared::platform::config::{parse_sources, FromEnv, IntakeConfig};
use shared::platform::secrets::{resolve, Needs, OnFailure};
use sqlx::PgPool;

use crate::helpers::*;
use crate::scheduler::scheduler_for;
use provider_fakes::stripe::FakeStripe;

/// A new secret holding `value`; its name.
async fn secret(value: &serde_json::Value) -> String {
    let name = unique_name();
    secret_named(&name, value).await;
    name
}

/// A secret's name no other test uses; not created unless a test creates it.
fn unique_name() -> String {
    format!("billing-inbox/test/{}", uuid::Uuid::new_v4().simple())
}

/// Creates the secret `name` holding `value`.
async fn secret_named(name: &str, value: &serde_json::Value) {
    secret_text(name, &value.to_string()).await;
}

/// Creates the secret `name` holding the text `value`.
async fn secret_text(name: &str, value: &str) {
    shared::platform::secrets::client()
        .await
        .create_secret()
        .name(name)
        .secret_string(value)
        .send()
        .await
        .expect("the local server serves Secrets Manager (scripts/test starts it)");
}

/// What the code logs on this thread while the guard lives (the tests' runtime runs on one
/// thread), as text.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let writer = self.clone();
        tracing::subscriber::set_default(
            tracing_subscriber::fmt()
                .with_writer(move || writer.clone())
                .with_ansi(false)
                .finish(),
        )
    }

    /// The lines that hold `text`, emptied.
    fn take_lines(&self, text: &str) -> Vec<String> {
        let bytes = std::mem::take(&mut *self.0.lock().unwrap());
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|l| l.contains(text))
            .map(str::to_owned)
            .collect()
    }
}

const COMBINED_WARNING: &str = "the combined layout";

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_intake_verifies_with_its_signing_secret_alone_and_never_reads_the_api_key_secret(
    pool: PgPool,
) {
    let id = secret(&json!({"secrets": ["whsec_old_sm", STRIPE_SECRET]})).await;
    // The API key's secret is not there to read: the intake's role may not read it.
    let sources = json!([{"name": "stripe", "kind": "stripe", "secret_id": id,
                          "api_key_secret_id": unique_name()}])
    .to_string();
    let config = IntakeConfig::from_lookup(|var| match var {
        "DATABASE_URL" => Some("postgres://unused@127.0.0.1:1/none".into()),
        "QUEUE_URL" => Some("http://127.0.0.1:1/000000000000/none".into()),
        "INBOX_SOURCES" => Some(sources.clone()),
        _ => None,
    })
    .unwrap();
    let built = IntakeState::from_config(&config).await.unwrap();
    let mut app = TestApp::spawn(pool).await;
    app.state.sources = built.sources;

    let event = stripe_event("evt_sm", "cus_sm", chrono::Utc::now().timestamp());
    let (status, body) = app.post("stripe", &stripe_delivery(&event)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "stored");
    let mut forged = stripe_delivery(&event);
    forged
        .headers
        .retain(|(name, _)| name != "stripe-signature");
    forged.headers.push((
        "stripe-signature".into(),
        shared::providers::stripe::fixtures::signature(
            b"whsec_not_ours",
            chrono::Utc::now().timestamp(),
            &forged.body,
        ),
    ));
    let (status, _) = app.post("stripe", &forged).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn each_function_reads_only_the_secret_it_uses() {
    let signing = secret(&json!({"secrets": ["whsec_sm"]})).await;
    let key = secret(&json!({"api_key": "sk_own"})).await;
    let both = |signing: &str, key: &str| {
        parse_sources(
            &json!([{"name": "s", "kind": "stripe", "secret_id": signing, "api_key_secret_id": key}])
                .to_string(),
        )
        .unwrap()
    };
    // Each with the other's secret out of reach.
    let intake = resolve(
        &both(&signing, &unique_name()),
        Needs::Signing,
        OnFailure::Stop,
    )
    .await
    .unwrap();
    assert_eq!(intake[0].secrets, ["whsec_sm"]);
    assert_eq!(
        intake[0].api_key, None,
        "the intake never holds the API key"
    );
    let worker = resolve(
        &both(&unique_name(), &key),
        Needs::ApiKey,
        OnFailure::RetryOnUse("worker"),
    )
    .await
    .unwrap();
    assert_eq!(worker[0].api_key.as_deref(), Some("sk_own"));
    assert!(worker[0].api_key_read.is_none(), "read at cold start");
    assert!(
        worker[0].secrets.is_empty(),
        "nor the worker the signing secrets"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_scheduler_reconciles_with_the_key_from_api_key_secret_id(pool: PgPool) {
    use shared::handlers::scheduler;
    // A Stripe account with no events: the walk lists nothing.
    let api = FakeStripe::default().serve().await;
    let key = secret(&json!({"api_key": "sk_own_secret"})).await;
    // The signing secret is not there to read: the scheduler's role may not read it.
    let sources = parse_sources(
        &json!([{"name": "stripe", "kind": "stripe", "secret_id": unique_name(),
                 "api_key_secret_id": key, "api_base_url": api.uri()}])
        .to_string(),
    )
    .unwrap();
    let resolved = resolve(&sources, Needs::ApiKey, OnFailure::RetryOnUse("scheduler"))
        .await
        .unwrap();
    assert!(resolved[0].api_key_read.is_none(), "read at cold start");
    let http = reqwest::Client::new();
    let app = TestApp::spawn(pool).await;
    let scheduler = scheduler_for(&app, shared::reconcile::reconcilers(&resolved, &http));
    assert_eq!(scheduler.reconcilers.len(), 1);

    let report = scheduler::run(&scheduler).await;
    assert_eq!(report.reconciliation[0].error, None);
    let reads = api.received_requests().await.unwrap();
    assert!(
        reads.iter().any(|r| r.url.path() == "/v1/events"),
        "{reads:?}"
    );
    assert!(
        reads
            .iter()
            .all(|r| r.headers["authorization"] == "Bearer sk_own_secret"),
        "read with the key from the secret"
    );
}

#[tokio::test]
async fn the_combined_layout_still_works_with_one_warning_at_each_cold_start() {
    let logs = Logs::default();
    let _capture = logs.capture();
    let id = secret(&json!({"secrets": ["whsec_sm"], "api_key": "sk_combined_value"})).await;
    let sources =
        parse_sources(&json!([{"name": "s", "kind": "stripe", "secret_id": id}]).to_string())
            .unwrap();

    let intake = resolve(&sources, Needs::Signing, OnFailure::Stop)
        .await
        .unwrap();
    assert_eq!(intake[0].secrets, ["whsec_sm"]);
    assert_eq!(intake[0].api_key, None);
    let warned = logs.take_lines(COMBINED_WARNING);
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("api_key_secret_id"), "{warned:?}");
    assert!(warned[0].contains("source=\"s\""), "{warned:?}");

    // The scheduler and the worker whose role may read it keep reconciling with it.
    for function in ["scheduler", "worker"] {
        let resolved = resolve(&sources, Needs::ApiKey, OnFailure::RetryOnUse(function))
            .await
            .unwrap();
        assert_eq!(resolved[0].api_key.as_deref(), Some("sk_combined_value"));
        assert!(resolved[0].secrets.is_empty());
        let warned = logs.take_lines(COMBINED_WARNING);
        assert_eq!(warned.len(), 1, "{function}: {warned:?}");
        assert!(!warned[0].contains("sk_combined_value"), "{warned:?}");
    }

    // A source of the new layout gets no such warning.
    let key = secret(&json!({"api_key": "sk_own"})).await;
    let signing = secret(&json!({"secrets": ["whsec_sm"]})).await;
    let split = parse_sources(
        &json!([{"name": "s", "kind": "stripe", "secret_id": signing, "api_key_secret_id": key}])
            .to_string(),
    )
    .unwrap();
    resolve(&split, Needs::Signing, OnFailure::Stop)
        .await
        .unwrap();
    resolve(&split, Needs::ApiKey, OnFailure::RetryOnUse("scheduler"))
        .await
        .unwrap();
    assert_eq!(logs.take_lines(COMBINED_WARNING), Vec::<String>::new());
}

/// A Secrets Manager that refuses every read as IAM does a role that may not read the secret
/// (moto does not enforce IAM): the client, and the server.
async fn refusing_secrets_manager() -> (aws_sdk_secretsmanager::Client, wiremock::MockServer) {
    use wiremock::{matchers::method, Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(400)
                .insert_header("content-type", "application/x-amz-json-1.1")
                .set_body_json(json!({"__type": "AccessDeniedException",
                    "Message": "User is not authorized to perform: secretsmanager:GetSecretValue"})),
        )
        .mount(&server)
        .await;
    let config =
        aws_sdk_secretsmanager::config::Builder::from(&shared::platform::queue::sdk_config().await)
            .endpoint_url(server.uri())
            .build();
    (aws_sdk_secretsmanager::Client::from_conf(config), server)
}

#[tokio::test]
async fn a_combined_secret_the_role_may_not_read_leaves_the_source_without_a_key_and_says_so() {
    let logs = Logs::default();
    let _capture = logs.capture();
    let (client, server) = refusing_secrets_manager().await;
    let sources = parse_sources(
        &json!([{"name": "s", "kind": "stripe", "secret_id": "billing-inbox/stripe"}]).to_string(),
    )
    .unwrap();
    // The split template's scheduler: it may not read the signing secret.
    let scheduler = shared::platform::secrets::resolve_with(
        &client,
        &sources,
        Needs::ApiKey,
        OnFailure::RetryOnUse("scheduler"),
    )
    .await
    .unwrap();
    assert_eq!(scheduler[0].api_key, None);
    assert!(
        scheduler[0].api_key_read.is_none(),
        "not read again: it is what the role grants"
    );
    let warned = logs.take_lines("may not read its secret_id secret");
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains("api_key_secret_id") && warned[0].contains("source=s"),
        "{warned:?}"
    );
    assert_eq!(server.received_requests().await.unwrap().len(), 1);

    // A refused API key secret is a failed read like any other: read again on use, counted.
    let split = parse_sources(
        &json!([{"name": "s", "kind": "stripe", "secret_id": "billing-inbox/stripe",
                 "api_key_secret_id": "billing-inbox/stripe-api-key"}])
        .to_string(),
    )
    .unwrap();
    let scheduler = shared::platform::secrets::resolve_with(
        &client,
        &split,
        Needs::ApiKey,
        OnFailure::RetryOnUse("scheduler"),
    )
    .await
    .unwrap();
    let read = scheduler[0].api_key_read.as_ref().expect("read on use");
    assert_eq!(read.failures(), 1);
    // The intake stops: it cannot verify without its signing secrets.
    let error =
        shared::platform::secrets::resolve_with(&client, &split, Needs::Signing, OnFailure::Stop)
            .await
            .unwrap_err();
    assert_eq!(
        error.to_string(),
        "INBOX_SOURCES: source 's': secret_id: the secret 'billing-inbox/stripe' could not be read (AccessDeniedException)"
    );
}

#[tokio::test]
async fn a_key_in_two_places_is_refused_naming_the_source_never_the_key() {
    let combined = secret(&json!({"secrets": ["whsec_sm"], "api_key": "sk_twice_value"})).await;
    let key = secret(&json!({"api_key": "sk_twice_value"})).await;
    for (source, elsewhere) in [
        (
            json!({"name": "s", "kind": "stripe", "secret_id": combined, "api_key_secret_id": key}),
            "in api_key_secret_id",
        ),
        (
            json!({"name": "s", "kind": "stripe", "secret_id": combined, "api_key": "sk_twice_value"}),
            "inline (api_key)",
        ),
    ] {
        let sources = parse_sources(&json!([source]).to_string()).unwrap();
        let error = resolve(&sources, Needs::Signing, OnFailure::Stop)
            .await
            .unwrap_err();
        assert_eq!(error.field.as_deref(), Some("source 's': secret_id"));
        assert_eq!(
            error.detail,
            format!(
                "the secret '{combined}' holds an api_key, and the source has its API key \
                 {elsewhere} too: a key is kept in one place; remove api_key from the secret \
                 '{combined}'"
            )
        );
        assert!(!error.to_string().contains("sk_twice"), "{error}");
    }
    // Inline and in its own secret: refused before any read, by every function.
    let error = parse_sources(
        &json!([{"name": "s", "kind": "stripe", "api_key": "sk_twice_value", "api_key_secret_id": key}])
            .to_string(),
    )
    .unwrap_err();
    assert_eq!(error.field.as_deref(), Some("source 's': api_key"));
    assert!(!error.to_string().contains("sk_twice"), "{error}");
}

#[tokio::test]
async fn an_api_key_secret_of_another_shape_is_refused_by_name_never_shown() {
    let bare = unique_name();
    secret_text(&bare, "sk_bare_value").await;
    let quoted = unique_name();
    secret_text(&quoted, "\"sk_quoted_value\"").await;
    let signing = unique_name();
    secret_text(
        &signing,
        r#"{"secrets": ["whsec_leaky_value"], "api_key": "sk_leaky_value"}"#,
    )
    .await;
    let cases = [
        (bare, "holds a bare string: store the key as JSON, {\"api_key\": \"...\"}".to_owned()),
        (
            quoted,
            "holds a bare string: store the key as JSON, {\"api_key\": \"...\"}".to_owned(),
        ),
        (
            signing,
            "is not {\"api_key\": \"...\"}: unknown field `secrets`, expected `api_key` (line 1, column 10)"
                .to_owned(),
        ),
        (
            secret(&json!({"api_key": ""})).await,
            "holds an empty api_key".to_owned(),
        ),
        (
            secret(&json!({"api_key": ["sk_leaky_value"]})).await,
            "is not {\"api_key\": \"...\"}: a value has the wrong type (line 1, column 11)"
                .to_owned(),
        ),
    ];
    for (id, detail) in cases {
        let sources = parse_sources(
            &json!([{"name": "s", "kind": "stripe", "api_key_secret_id": id}]).to_string(),
        )
        .unwrap();
        let error = resolve(&sources, Needs::ApiKey, OnFailure::Stop)
            .await
            .unwrap_err();
        assert_eq!(
            error.field.as_deref(),
            Some("source 's': api_key_secret_id")
        );
        assert_eq!(error.detail, format!("the secret '{id}' {detail}"));
        assert!(!error.to_string().contains("_value"), "{error}");
        // The scheduler and the worker go on, and read it again on use.
        let lenient = resolve(&sources, Needs::ApiKey, OnFailure::RetryOnUse("scheduler"))
            .await
            .unwrap();
        assert!(lenient[0].api_key_read.is_some(), "{id}");
    }
}

#[tokio::test]
async fn a_secret_that_cannot_be_read_is_named_never_shown() {
    let sources = parse_sources(
        &json!([{"name": "s", "kind": "stripe", "secret_id": "billing-inbox/test/missing"}])
            .to_string(),
    )
    .unwrap();
    let error = resolve(&sources, Needs::Signing, OnFailure::Stop)
        .await
        .unwrap_err();
    assert_eq!(error.var, "INBOX_SOURCES");
    assert_eq!(error.field.as_deref(), Some("source 's': secret_id"));
    assert!(
        error.detail.contains("billing-inbox/test/missing"),
        "{error}"
    );
    // The scheduler and the worker go on without the API key, and read it again on use.
    let lenient = resolve(&sources, Needs::ApiKey, OnFailure::RetryOnUse("worker"))
        .await
        .unwrap();
    assert_eq!(lenient[0].api_key, None);
    let read = lenient[0].api_key_read.as_ref().expect("a read on use");
    assert!(!format!("{read:?}").contains("sk_"), "{read:?}");

    let malformed = secret(&json!({"secret": "whsec_leaky_value"})).await;
    let sources = parse_sources(
        &json!([{"name": "s", "kind": "stripe", "secret_id": malformed}]).to_string(),
    )
    .unwrap();
    let error = resolve(&sources, Needs::Signing, OnFailure::Stop)
        .await
        .unwrap_err();
    assert!(!error.to_string().contains("whsec_leaky_value"), "{error}");
}

#[test]
fn a_malformed_sources_variable_never_quotes_a_secret() {
    for raw in [
        r#"[{"name":"s","kind":"stripe","secrets":"whsec_leaky_value"}]"#,
        r#"[{"name":"s","kind":"stripe","secrets":["whsec_leaky_value"],"livemode":"whsec_leaky_value"}]"#,
        r#"[{"name":"s","kind":"stripe","secrets":["whsec_leaky_value"],"api_key":7}]"#,
    ] {
        let error = parse_sources(raw).unwrap_err().to_string();
        assert!(!error.contains("leaky"), "{error}");
        assert!(
            error.starts_with("INBOX_SOURCES: not a valid list of sources"),
            "{error}"
        );
    }
    let unknown = parse_sources(r#"[{"name":"s","kind":"stripe","secretz":["x"]}]"#)
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("unknown field `secretz`"), "{unknown}");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_api_key_whose_secret_was_missing_at_cold_start_is_read_on_a_later_use_after_the_backoff(
    pool: PgPool,
) {
    use shared::handlers::{scheduler, worker::WorkerSource};
    // The API key's secret does not exist yet when the worker and the scheduler start (nor
    // is the signing secret there: they never read it).
    let name = unique_name();
    let fake = FakeStripe::default();
    let api = fake.serve().await;
    let sub = |status: &str| {
        json!({"id": "sub_late", "object": "subscription", "customer": "cus_late", "status": status,
               "items": {"object": "list", "data": [{"id": "si_late", "object": "subscription_item",
                         "price": {"id": "price_pro", "object": "price"}}]}})
    };
    fake.holds(sub("active"));
    let sources = parse_sources(
        &json!([{"name": "stripe", "kind": "stripe", "secret_id": unique_name(),
                 "api_key_secret_id": name, "api_base_url": api.uri()}])
        .to_string(),
    )
    .unwrap();
    let http = reqwest::Client::new();
    let worker_sources = resolve(&sources, Needs::ApiKey, OnFailure::RetryOnUse("worker"))
        .await
        .unwrap();
    let scheduler_sources = resolve(&sources, Needs::ApiKey, OnFailure::RetryOnUse("scheduler"))
        .await
        .unwrap();
    let worker_read = worker_sources[0].api_key_read.clone().expect("read on use");
    let scheduler_read = scheduler_sources[0]
        .api_key_read
        .clone()
        .expect("read on use");
    assert_eq!((worker_read.failures(), scheduler_read.failures()), (1, 1));

    let mut app = TestApp::spawn(pool).await;
    app.worker.sources.insert(
        "stripe".into(),
        WorkerSource::from_config(&worker_sources[0], &http),
    );
    let scheduler = scheduler_for(
        &app,
        shared::reconcile::reconcilers(&scheduler_sources, &http),
    );
    assert_eq!(
        scheduler.reconcilers.len(),
        1,
        "the source is still to be reconciled"
    );

    // A same-second tie within the backoff: no read of the secret, none of the provider;
    // the status rank settles it, and the log line says why the read did not happen.
    let tie = |tag: &str, id: &str, status: &str| {
        let mut event = stripe_event(id, "cus_late", 1_773_144_000);
        event["type"] = json!("customer.subscription.updated");
        let mut object = sub(status);
        object["id"] = json!(format!("sub_{tag}"));
        event["data"]["object"] = object;
        event
    };
    for event in [
        tie("early", "evt_early_pd", "past_due"),
        tie("early", "evt_early_ac", "active"),
    ] {
        let (status, body) = app.post("stripe", &stripe_delivery(&event)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        app.run_worker().await;
    }
    let report = scheduler::run(&scheduler).await;
    let error = report.reconciliation[0].error.clone().unwrap_or_default();
    assert!(error.contains("is not read"), "{error}");
    assert!(!error.contains("sk_"), "{error}");
    assert_eq!(
        (worker_read.failures(), scheduler_read.failures()),
        (1, 1),
        "no read of the secret before the backoff is over"
    );
    assert!(api.received_requests().await.unwrap().is_empty());
    let early = app.account("stripe", "cus_late", "2026-03").await;
    let reasons: Vec<&str> = early.log.iter().map(|l| l.reason.as_str()).collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("the provider read failed") && r.contains("is not read")),
        "{reasons:?}"
    );

    // The secret is created; the first use after the backoff reads it, and the provider
    // reads happen.
    secret_named(&name, &json!({"api_key": "sk_late"})).await;
    tokio::time::sleep(
        shared::platform::secrets::RETRY_FIRST + std::time::Duration::from_millis(200),
    )
    .await;
    for event in [
        tie("late", "evt_late_pd", "past_due"),
        tie("late", "evt_late_ac", "active"),
    ] {
        let (status, body) = app.post("stripe", &stripe_delivery(&event)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        app.run_worker().await;
    }
    let report = scheduler::run(&scheduler).await;
    assert_eq!(report.reconciliation[0].error, None);
    assert_eq!((worker_read.failures(), scheduler_read.failures()), (1, 1));
    let reads = api.received_requests().await.unwrap();
    assert!(reads
        .iter()
        .any(|r| r.url.path() == "/v1/subscriptions/sub_late"));
    assert!(reads.iter().any(|r| r.url.path() == "/v1/events"));
    assert!(
        reads
            .iter()
            .all(|r| r.headers["authorization"] == "Bearer sk_late"),
        "every read with the key read late"
    );
    let late = app.account("stripe", "cus_late", "2026-03").await;
    let settled = late
        .subscriptions
        .iter()
        .find(|s| s.id == "sub_late")
        .expect("sub_late");
    assert_eq!(settled.status, "active", "settled by the provider read");
}

#[test]
fn a_failed_secret_read_is_counted_by_source_and_function() {
    let line = shared::platform::secrets::secret_read_failure_metric(
        "stripe",
        "worker",
        chrono::Utc::now(),
    );
    let directive = &line["_aws"]["CloudWatchMetrics"][0];
    assert_eq!(directive["Namespace"], "BillingInbox");
    assert_eq!(
        directive["Dimensions"],
        json!([["Stack", "Source", "Function"]])
    );
    assert_eq!(directive["Metrics"][0]["Name"], "SecretReadFailures");
    assert_eq!(
        (
            &line["Source"],
            &line["Function"],
            &line["SecretReadFailures"]
        ),
        (&json!("stripe"), &json!("worker"), &json!(1))
    );
}

/// With `WorkerProviderReads` false the worker's role may read no API key secret, and the
/// template says so to the worker (`INBOX_PROVIDER_READS=false`): it reads none, so no read
/// is refused at each cold start and tried again on every use (`SecretReadFailures`), and its
/// sources make no provider read. With provider reads on, the same configuration's missing
/// secret is a read to try again on use.
#[sqlx::test]
async fn a_worker_without_provider_reads_reads_no_api_key_secret(pool: PgPool) {
    use shared::handlers::worker::WorkerState;
    use shared::platform::config::WorkerConfig;

    let url = crate::cli::database_url(&pool).await;
    let sources = json!([{"name": "stripe", "kind": "stripe", "secret_id": unique_name(),
                          "api_key_secret_id": unique_name()}])
    .to_string();
    let worker = |reads: Option<&'static str>| {
        WorkerConfig::from_lookup(|var| match var {
            "DATABASE_URL" => Some(url.clone()),
            "INBOX_SOURCES" => Some(sources.clone()),
            "INBOX_PLANS" => Some(PLANS.to_owned()),
            "INBOX_PROVIDER_READS" => reads.map(str::to_owned),
            _ => None,
        })
        .unwrap()
    };

    let off = WorkerState::from_config(&worker(Some("false")), 1)
        .await
        .unwrap();
    let on = WorkerState::from_config(&worker(None), 1).await.unwrap();

    assert!(
        off.sources["stripe"].reads.is_none(),
        "no API key, no read of its secret, no provider read"
    );
    assert!(
        on.sources["stripe"].reads.is_some(),
        "with provider reads on, the missing secret is read again on use"
    );
    let read = worker(Some("false")).sources_read();
    assert_eq!(
        (
            read[0].api_key_secret_id.as_deref(),
            read[0].secret_id.as_deref()
        ),
        (None, None)
    );
}
