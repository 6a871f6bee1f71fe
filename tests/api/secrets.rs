//! Sources' secrets from Secrets Manager (docs/design.md §5.3), through the real SDK against
//! the local SQS-compatible server, which serves Secrets Manager too: the intake verifies with
//! the secret's signing secrets, the scheduler and worker take only its API key, and no error
//! repeats a secret.

use http::StatusCode;
use serde_json::json;
use shared::config::{parse_sources, FromEnv, IntakeConfig};
use shared::handlers::intake::IntakeState;
use shared::secrets::{resolve, Needs};
use sqlx::PgPool;

use crate::helpers::*;

/// A new secret holding `value`; its name.
async fn secret(value: &serde_json::Value) -> String {
    let name = format!("billing-inbox/test/{}", uuid::Uuid::new_v4().simple());
    shared::secrets::client()
        .await
        .create_secret()
        .name(&name)
        .secret_string(value.to_string())
        .send()
        .await
        .expect("the local server serves Secrets Manager (scripts/test starts it)");
    name
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_intake_verifies_with_the_signing_secrets_of_its_secret(pool: PgPool) {
    let id = secret(&json!({"secrets": ["whsec_old_sm", STRIPE_SECRET], "api_key": "sk_sm"})).await;
    let sources = json!([{"name": "stripe", "kind": "stripe", "secret_id": id}]).to_string();
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
async fn each_function_takes_only_what_it_uses() {
    let id = secret(&json!({"secrets": ["whsec_sm"], "api_key": "sk_sm"})).await;
    let sources =
        parse_sources(&json!([{"name": "s", "kind": "stripe", "secret_id": id}]).to_string())
            .unwrap();
    let intake = resolve(&sources, Needs::Signing, false).await.unwrap();
    assert_eq!(intake[0].secrets, ["whsec_sm"]);
    assert_eq!(
        intake[0].api_key, None,
        "the intake never holds the API key"
    );
    let worker = resolve(&sources, Needs::ApiKey, true).await.unwrap();
    assert_eq!(worker[0].api_key.as_deref(), Some("sk_sm"));
    assert!(
        worker[0].secrets.is_empty(),
        "nor the worker the signing secrets"
    );
}

#[tokio::test]
async fn a_secret_that_cannot_be_read_is_named_never_shown() {
    let sources = parse_sources(
        &json!([{"name": "s", "kind": "stripe", "secret_id": "billing-inbox/test/missing"}])
            .to_string(),
    )
    .unwrap();
    let error = resolve(&sources, Needs::Signing, false).await.unwrap_err();
    assert_eq!(error.var, "INBOX_SOURCES");
    assert_eq!(error.field.as_deref(), Some("source 's': secret_id"));
    assert!(
        error.detail.contains("billing-inbox/test/missing"),
        "{error}"
    );
    // The scheduler and the worker go on without the API key.
    let lenient = resolve(&sources, Needs::ApiKey, true).await.unwrap();
    assert_eq!(lenient[0].api_key, None);

    let malformed = secret(&json!({"secret": "whsec_leaky_value"})).await;
    let sources = parse_sources(
        &json!([{"name": "s", "kind": "stripe", "secret_id": malformed}]).to_string(),
    )
    .unwrap();
    let error = resolve(&sources, Needs::Signing, false).await.unwrap_err();
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
