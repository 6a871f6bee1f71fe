//! The migrate function as CloudFormation drives it (docs/design.md §7.1): custom resource
//! requests shaped as AWS sends them, answered by a PUT to a real HTTP server standing for the
//! presigned S3 URL, against a fresh database (`migrations = false`: empty, as a new stack's).

use std::time::Duration;

use serde_json::{json, Value};
use shared::handlers::migrate::{self, MigrateState, PHYSICAL_ID};
use shared::platform::config::{DatabaseConfig, DatabaseSource};
use shared::platform::database::{Database, AWS_DATABASE_ROOTS};
use sqlx::migrate::Migrate;
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::{Connection, PgPool};
use tokio::time::Instant;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

const STACK_ID: &str =
    "arn:aws:cloudformation:eu-west-1:123456789012:stack/billing-inbox/5b1e3c70-b0f1-11ee-9a4c-0a1b2c3d4e5f";
const SERVICE_TOKEN: &str =
    "arn:aws:lambda:eu-west-1:123456789012:function:billing-inbox-MigrateFunction-x1";

/// `ResourceProperties` as the template sets them: the published version's ARN (new on
/// every build) and the configuration's revision.
fn properties(version: u32) -> Value {
    json!({
        "ServiceToken": SERVICE_TOKEN,
        "CodeVersion": format!("{SERVICE_TOKEN}:{version}"),
        "ConfigRevision": "1",
    })
}

/// A request as CloudFormation sends it (docs.aws.amazon.com, "Custom resource request
/// objects"): the fields every type has, and Update's and Delete's own.
fn request(server: &MockServer, kind: &str, version: u32) -> Value {
    let request_id = uuid::Uuid::new_v4().to_string();
    let mut request = json!({
        "RequestType": kind,
        "ServiceToken": SERVICE_TOKEN,
        // A presigned URL's shape: the signature is in the query string.
        "ResponseURL": format!(
            "{}/arn%3Aaws%3Acloudformation/{request_id}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Date=20261202T011200Z&X-Amz-Expires=7200&X-Amz-Signature=0123abcd",
            server.uri()
        ),
        "StackId": STACK_ID,
        "RequestId": request_id,
        "LogicalResourceId": "SchemaMigrations",
        "ResourceType": "Custom::SchemaMigrations",
        "ResourceProperties": properties(version),
    });
    if kind != "Create" {
        request["PhysicalResourceId"] = json!(PHYSICAL_ID);
    }
    if kind == "Update" {
        request["OldResourceProperties"] = properties(version - 1);
    }
    request
}

async fn response_server() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("PUT"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    server
}

fn state_on(pool: &PgPool) -> MigrateState {
    let mut state = MigrateState::on(Database::fixed(pool.connect_options().as_ref().clone()));
    state.retry_delays = vec![Duration::from_millis(10); 3];
    state
}

/// Handles `request` and returns the body PUT to its ResponseURL (the last one, if several),
/// checking what every answer must be: a PUT with an empty Content-Type, the request echoed.
async fn answer(state: &MigrateState, server: &MockServer, request: Value) -> Value {
    migrate::handle(state, request.clone(), None).await.unwrap();
    let received = server.received_requests().await.unwrap();
    let put = received.last().expect("an answer was PUT");
    assert_eq!(put.method, http::Method::PUT);
    assert_eq!(
        put.headers.get("content-type").map(|v| v.as_bytes()),
        Some(&b""[..])
    );
    let body: Value = serde_json::from_slice(&put.body).unwrap();
    assert!(put.body.len() < migrate::MAX_BODY_BYTES);
    assert_eq!(body["StackId"], request["StackId"]);
    assert_eq!(body["RequestId"], request["RequestId"]);
    assert_eq!(body["LogicalResourceId"], "SchemaMigrations");
    assert_eq!(body["PhysicalResourceId"], PHYSICAL_ID);
    body
}

fn release_versions() -> Vec<i64> {
    shared::MIGRATOR.iter().map(|m| m.version).collect()
}

async fn applied_versions(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn table_exists(pool: &PgPool, table: &str) -> bool {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn create_on_an_empty_database_applies_every_migration_and_names_the_latest(pool: PgPool) {
    let server = response_server().await;
    let state = state_on(&pool);

    let body = answer(&state, &server, request(&server, "Create", 1)).await;

    assert_eq!(body["Status"], "SUCCESS", "{body}");
    assert_eq!(body["Reason"], Value::Null);
    let all = release_versions();
    let latest = shared::MIGRATOR.iter().last().unwrap();
    assert_eq!(
        body["Data"],
        json!({
            "Applied": all.len().to_string(),
            "Total": all.len().to_string(),
            "LatestVersion": latest.version.to_string(),
            "LatestDescription": latest.description,
        })
    );
    assert_eq!(applied_versions(&pool).await, all);
    for table in ["inbox_events", "accounts", "effects", "usage_periods"] {
        assert!(table_exists(&pool, table).await, "{table}");
    }
}

#[sqlx::test(migrations = false)]
async fn a_second_create_and_an_update_apply_nothing_and_succeed(pool: PgPool) {
    let server = response_server().await;
    let state = state_on(&pool);
    let first = answer(&state, &server, request(&server, "Create", 1)).await;
    assert_eq!(first["Status"], "SUCCESS", "{first}");

    let again = answer(&state, &server, request(&server, "Create", 1)).await;
    let update = answer(&state, &server, request(&server, "Update", 2)).await;

    let total = release_versions().len().to_string();
    for body in [again, update] {
        assert_eq!(body["Status"], "SUCCESS", "{body}");
        assert_eq!(body["Data"]["Applied"], "0");
        assert_eq!(body["Data"]["Total"], total);
        assert_eq!(
            body["Data"]["LatestVersion"],
            first["Data"]["LatestVersion"]
        );
    }
    assert_eq!(applied_versions(&pool).await, release_versions());
}

#[sqlx::test(migrations = false)]
async fn delete_succeeds_and_leaves_the_schema_and_its_rows(pool: PgPool) {
    let server = response_server().await;
    let state = state_on(&pool);
    answer(&state, &server, request(&server, "Create", 1)).await;
    sqlx::query("INSERT INTO inbox_events (source, dedupe_key, type, raw_body, payload_hash) VALUES ('stripe', 'evt_1', 'customer.subscription.created', '\\x00', decode(repeat('00', 32), 'hex'))")
        .execute(&pool)
        .await
        .unwrap();

    let body = answer(&state, &server, request(&server, "Delete", 1)).await;

    assert_eq!(body["Status"], "SUCCESS", "{body}");
    assert_eq!(applied_versions(&pool).await, release_versions());
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

/// Delete does not even connect: a stack whose database is gone (or unreachable) deletes.
#[tokio::test]
async fn delete_succeeds_without_reaching_the_database() {
    let server = response_server().await;
    let state = MigrateState::on(Database::fixed(unreachable()));

    let body = answer(&state, &server, request(&server, "Delete", 1)).await;

    assert_eq!(body["Status"], "SUCCESS", "{body}");
}

#[sqlx::test(migrations = false)]
async fn a_failing_migration_fails_the_deploy_naming_it_and_quoting_postgres(pool: PgPool) {
    // A table of the first migration's name, of another shape, is there already.
    sqlx::query("CREATE TABLE inbox_events (id text PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    let server = response_server().await;
    let state = state_on(&pool);

    let body = answer(&state, &server, request(&server, "Create", 1)).await;

    assert_eq!(body["Status"], "FAILED");
    let first = shared::MIGRATOR.iter().next().unwrap();
    assert_eq!(
        body["Reason"],
        format!(
            "migration {} ({}) failed and was rolled back: relation \"inbox_events\" already exists (SQLSTATE 42P07)",
            first.version, first.description
        )
    );
    assert_eq!(body["Data"], json!({}));
    // Rolled back: nothing of the first migration, nothing after it.
    assert!(applied_versions(&pool).await.is_empty());
    assert!(!table_exists(&pool, "accounts").await);
}

#[sqlx::test(migrations = false)]
async fn an_applied_migration_whose_content_changed_fails_the_deploy(pool: PgPool) {
    shared::MIGRATOR.run(&pool).await.unwrap();
    let edited = shared::MIGRATOR.iter().nth(3).unwrap();
    sqlx::query("UPDATE _sqlx_migrations SET checksum = '\\x00' WHERE version = $1")
        .bind(edited.version)
        .execute(&pool)
        .await
        .unwrap();
    let server = response_server().await;
    let state = state_on(&pool);

    let body = answer(&state, &server, request(&server, "Update", 2)).await;

    assert_eq!(body["Status"], "FAILED");
    let reason = body["Reason"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!(
            "migration {} ({}) is applied with other content than this release's",
            edited.version, edited.description
        )),
        "{reason}"
    );
}

/// A port of this test run's range where nothing listens.
fn unreachable() -> PgConnectOptions {
    let port: u16 = std::env::var("INBOX_PG_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .map_or(1, |p: u16| p + 19);
    PgConnectOptions::new()
        .host("127.0.0.1")
        .port(port)
        .username("inbox")
        .password("s3cret-password")
        .database("billing")
}

#[tokio::test]
async fn an_unreachable_database_fails_the_deploy_saying_where_and_why() {
    let server = response_server().await;
    let options = unreachable();
    let mut state = MigrateState::on(Database::fixed(options.clone()));
    state.connect_timeout = Duration::from_secs(2);

    let body = answer(&state, &server, request(&server, "Create", 1)).await;

    assert_eq!(body["Status"], "FAILED");
    let reason = body["Reason"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!(
            "cannot connect to the database at 127.0.0.1:{}: ",
            options.get_port()
        )),
        "{reason}"
    );
    assert!(!reason.contains("s3cret-password"), "{reason}");
}

/// A server whose certificate chains to none of the roots (here the local CA's, checked
/// against the carried AWS roots) fails the deploy naming the issuer its chain ends at, so
/// that the missing root can be found: "invalid peer certificate: UnknownIssuer" alone names
/// none.
#[tokio::test]
async fn a_server_no_root_signed_fails_the_deploy_naming_its_issuer() {
    let server = response_server().await;
    let port: u16 = std::env::var("INBOX_PG_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(61320);
    let options = PgConnectOptions::new()
        .host("localhost")
        .port(port)
        .username("postgres")
        .database("postgres")
        .ssl_mode(PgSslMode::VerifyFull)
        .ssl_root_cert_from_pem(AWS_DATABASE_ROOTS.to_vec());
    let state = MigrateState::on(Database::fixed(options));

    let body = answer(&state, &server, request(&server, "Create", 1)).await;

    assert_eq!(body["Status"], "FAILED");
    let reason = body["Reason"].as_str().unwrap();
    assert!(reason.contains("invalid peer certificate"), "{reason}");
    assert!(
        reason.contains("chains to 'CN=billing-inbox local CA'"),
        "the issuer is named: {reason}"
    );
}

#[sqlx::test(migrations = false)]
async fn an_answer_the_response_url_refuses_once_is_delivered_again(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("PUT"))
        .respond_with(ResponseTemplate::new(500))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let state = state_on(&pool);

    let body = answer(&state, &server, request(&server, "Create", 1)).await;

    assert_eq!(body["Status"], "SUCCESS", "{body}");
    let puts = server.received_requests().await.unwrap();
    assert_eq!(puts.len(), 2);
    assert_eq!(puts[0].body, puts[1].body);
}

#[sqlx::test(migrations = false)]
async fn an_answer_that_cannot_be_delivered_is_the_invocations_error(pool: PgPool) {
    let server = MockServer::start().await;
    Mock::given(method("PUT"))
        .respond_with(ResponseTemplate::new(503))
        .mount(&server)
        .await;
    let state = state_on(&pool);
    let request = request(&server, "Delete", 1);

    let error = migrate::handle(&state, request, None).await.unwrap_err();

    // One attempt and one per retry delay; the error shows the URL without its signature.
    assert_eq!(server.received_requests().await.unwrap().len(), 4);
    let error = error.to_string();
    assert!(error.contains("answered 503"), "{error}");
    assert!(!error.contains("X-Amz-Signature"), "{error}");
}

/// A run still going at the deadline less the margin (here: waiting for another runner's
/// advisory lock) is answered FAILED in time and cancelled in the database; the next
/// deploy's run applies everything.
#[sqlx::test(migrations = false)]
async fn a_run_still_going_at_the_deadline_fails_in_time_and_the_next_applies(pool: PgPool) {
    let server = response_server().await;
    let mut state = state_on(&pool);
    state.margin = Duration::from_secs(1);
    let mut other = sqlx::PgConnection::connect_with(pool.connect_options().as_ref())
        .await
        .unwrap();
    other.lock().await.unwrap();
    let request = request(&server, "Create", 1);

    migrate::handle(
        &state,
        request.clone(),
        Some(Instant::now() + Duration::from_secs(3)),
    )
    .await
    .unwrap();

    let puts = server.received_requests().await.unwrap();
    let body: Value = serde_json::from_slice(&puts[0].body).unwrap();
    assert_eq!(body["Status"], "FAILED");
    let reason = body["Reason"].as_str().unwrap();
    assert!(reason.starts_with("timed out after "), "{reason}");
    let first = shared::MIGRATOR.iter().next().unwrap();
    assert!(
        reason.contains(&format!(
            "migration {} ({}), which it was running or waiting for, was cancelled and rolled back; ",
            first.version, first.description
        )),
        "{reason}"
    );
    // The abandoned session waits for the lock no more.
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(waiting, 0);

    other.unlock().await.unwrap();
    let next = answer(&state, &server, request_again(&request)).await;
    assert_eq!(next["Status"], "SUCCESS", "{next}");
    assert_eq!(applied_versions(&pool).await, release_versions());
}

fn request_again(request: &Value) -> Value {
    let mut again = request.clone();
    again["RequestId"] = json!(uuid::Uuid::new_v4().to_string());
    again
}

#[sqlx::test(migrations = false)]
async fn a_rollback_to_an_older_release_leaves_the_schema_as_it_is(pool: PgPool) {
    let server = response_server().await;
    let state = state_on(&pool);
    let mut rollback = request(&server, "Update", 7);
    rollback["ResourceProperties"] = properties(6);
    rollback["OldResourceProperties"] = properties(7);

    let body = answer(&state, &server, rollback).await;

    assert_eq!(body["Status"], "SUCCESS", "{body}");
    assert_eq!(body["Data"]["Skipped"], "rollback to an older release");
    assert!(!table_exists(&pool, "_sqlx_migrations").await);
}

#[tokio::test]
async fn a_request_of_an_unknown_type_is_answered_failed() {
    let server = response_server().await;
    let state = MigrateState::on(Database::fixed(unreachable()));
    let mut request = request(&server, "Update", 2);
    request["RequestType"] = json!("Import");

    let body = answer(&state, &server, request).await;

    assert_eq!(body["Status"], "FAILED");
    assert!(
        body["Reason"]
            .as_str()
            .unwrap()
            .starts_with("the request could not be read: "),
        "{body}"
    );
}

#[tokio::test]
async fn a_function_without_its_database_settings_fails_the_deploy_naming_the_variable() {
    let server = response_server().await;
    let state = MigrateState::new(DatabaseConfig::read(|_| None));

    let body = answer(&state, &server, request(&server, "Create", 1)).await;

    assert_eq!(body["Status"], "FAILED");
    assert_eq!(
        body["Reason"],
        "the database's settings: DATABASE_SECRET_ID: is not set (nor DATABASE_URL): name the database's secret"
    );
}

/// The secret is read at the first request, not at cold start, and read again at the next
/// request after a failed read: the deploy that follows the fix finds it.
#[sqlx::test(migrations = false)]
async fn a_secret_that_cannot_be_read_fails_the_deploy_and_the_next_request_reads_it(pool: PgPool) {
    let server = response_server().await;
    let name = format!("billing-inbox/test/db/{}", uuid::Uuid::new_v4().simple());
    let mut config = DatabaseConfig::url("");
    config.source = DatabaseSource::Secret(name.clone());
    // Verified as a deployed function's is, against the local CA here (tests/api/database.rs).
    config.ca_file =
        Some(std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".dev/pg/tls/ca.crt"));
    let state = MigrateState::new(Ok(config));

    let body = answer(&state, &server, request(&server, "Create", 1)).await;

    assert_eq!(body["Status"], "FAILED");
    assert_eq!(
        body["Reason"],
        format!("the database's settings: DATABASE_SECRET_ID: the secret '{name}' could not be read (ResourceNotFoundException)")
    );

    let options = pool.connect_options();
    let url = format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap()
    );
    shared::platform::secrets::client()
        .await
        .create_secret()
        .name(&name)
        .secret_string(url)
        .send()
        .await
        .expect("the local server serves Secrets Manager (scripts/test starts it)");
    let body = answer(&state, &server, request(&server, "Create", 1)).await;

    assert_eq!(body["Status"], "SUCCESS", "{body}");
    assert_eq!(applied_versions(&pool).await, release_versions());
}
