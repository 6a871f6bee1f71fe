//! The database's secret (docs/design.md §5.3), through the real SDK against the local
//! Secrets Manager and a Postgres that checks passwords (scripts/stack.sh: members of
//! `password_users` log in with SCRAM) and offers TLS with a local CA: a URL secret and the
//! RDS JSON both connect, a password rotated under a running intake is read again once, a
//! wrong secret is named without its password, and `verify-full` takes the CA it is given. A
//! secret's connections are verified in full by default, against the AWS roots the library
//! carries, which did not sign the local server: the tests name the local CA
//! (`DATABASE_CA_FILE`) as a deployment names RDS's, or relax `DATABASE_TLS`.

use std::path::PathBuf;

use http::StatusCode;
use serde_json::json;
use shared::handlers::intake::IntakeState;
use shared::handlers::scheduler::SchedulerState;
use shared::handlers::worker::{handle_batch, WorkerState};
use shared::platform::config::DatabaseConfig;
use shared::platform::config::{FromEnv, IntakeConfig, SchedulerConfig, WorkerConfig};
use shared::platform::database::Database;
use shared::platform::db::Held;
use sqlx::{Executor, PgPool};

use crate::helpers::*;

/// What a generated password may hold: each of these breaks a URL it is pasted into.
const AWKWARD: &str = "Xy#1%2?3@4/5:6";

/// A login role that must give its password (a member of `password_users`), with `password`.
async fn password_role(pool: &PgPool, password: &str) -> String {
    let role = format!("inbox_{}", uuid::Uuid::new_v4().simple());
    // A superuser, so that it needs no grants on the test's tables; the password is still
    // asked for: pg_hba.conf matches the group before any trust line.
    pool.execute(
        format!(
            r#"CREATE ROLE "{role}" LOGIN SUPERUSER IN ROLE password_users PASSWORD '{password}'"#
        )
        .as_str(),
    )
    .await
    .unwrap();
    role
}

async fn new_password(pool: &PgPool, role: &str, password: &str) {
    pool.execute(format!(r#"ALTER ROLE "{role}" PASSWORD '{password}'"#).as_str())
        .await
        .unwrap();
}

/// Closes the role's sessions, as a restarted database or a dropped network does.
async fn close_sessions(pool: &PgPool, role: &str) {
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1")
        .bind(role)
        .execute(pool)
        .await
        .unwrap();
}

async fn sessions_of(pool: &PgPool, role: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE usename = $1")
        .bind(role)
        .fetch_one(pool)
        .await
        .unwrap()
}

fn port(pool: &PgPool) -> u16 {
    pool.connect_options().get_port()
}

fn database_name(pool: &PgPool) -> String {
    pool.connect_options()
        .get_database()
        .expect("the test's database")
        .to_owned()
}

/// The secret RDS rotation keeps, as Secrets Manager documents it for PostgreSQL (`port` a
/// number; https://docs.aws.amazon.com/secretsmanager/latest/userguide/reference_secret_json_structure.html).
fn rds_secret(pool: &PgPool, host: &str, role: &str, password: &str) -> serde_json::Value {
    json!({
        "engine": "postgres",
        "host": host,
        "username": role,
        "password": password,
        "dbname": database_name(pool),
        "port": port(pool),
    })
}

async fn create_secret(value: &str) -> String {
    let name = format!("billing-inbox/test/db/{}", uuid::Uuid::new_v4().simple());
    shared::platform::secrets::client()
        .await
        .create_secret()
        .name(&name)
        .secret_string(value)
        .send()
        .await
        .expect("the local server serves Secrets Manager (scripts/test starts it)");
    name
}

async fn put_secret(name: &str, value: &str) {
    shared::platform::secrets::client()
        .await
        .put_secret_value()
        .secret_id(name)
        .secret_string(value)
        .send()
        .await
        .unwrap();
}

/// The intake's configuration, its database named by `vars`; verified against the local CA
/// unless `vars` say how (`DATABASE_CA_FILE` or `DATABASE_TLS`).
fn intake_config(queue_url: &str, vars: &[(&str, String)]) -> IntakeConfig {
    let sources = json!([{"name": "stripe", "kind": "stripe", "secrets": [STRIPE_SECRET]}]);
    let mut vars = vars.to_vec();
    if !vars
        .iter()
        .any(|(k, _)| *k == "DATABASE_CA_FILE" || *k == "DATABASE_TLS")
    {
        vars.push(("DATABASE_CA_FILE", local_ca()));
    }
    let queue_url = queue_url.to_owned();
    IntakeConfig::from_lookup(move |var| match var {
        "QUEUE_URL" => Some(queue_url.clone()),
        "INBOX_SOURCES" => Some(sources.to_string()),
        _ => vars.iter().find(|(k, _)| *k == var).map(|(_, v)| v.clone()),
    })
    .unwrap()
}

/// The local CA's certificate, and one of a CA that signed nothing here (scripts/stack.sh).
fn ca(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!(".dev/pg/tls/{name}"))
}

/// The local CA's path, as `DATABASE_CA_FILE` takes it.
fn local_ca() -> String {
    ca("ca.crt").display().to_string()
}

/// Whether each of the role's sessions is over TLS (`pg_stat_ssl`), and how many there are.
async fn ssl_of(pool: &PgPool, role: &str) -> Vec<bool> {
    sqlx::query_scalar(
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.usename = $1",
    )
    .bind(role)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn deliver(app: &TestApp, id: &str) -> (StatusCode, serde_json::Value) {
    let event = stripe_event(id, "cus_db", chrono::Utc::now().timestamp());
    app.post("stripe", &stripe_delivery(&event)).await
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_url_secret_the_rds_json_and_the_secret_rds_manages_all_connect(pool: PgPool) {
    let role = password_role(&pool, AWKWARD).await;
    let encoded: String = url::form_urlencoded::byte_serialize(AWKWARD.as_bytes()).collect();
    let url = format!(
        "postgres://{role}:{encoded}@127.0.0.1:{}/{}",
        port(&pool),
        database_name(&pool)
    );
    let rds = rds_secret(&pool, "127.0.0.1", &role, AWKWARD).to_string();
    // The secret RDS manages for a master user: the endpoint comes beside it.
    let managed = json!({"username": role, "password": AWKWARD}).to_string();
    // A secret attached to an Aurora cluster, as the console writes it: the rotation shape
    // with the cluster's identifier, and `masterarn` for alternating users.
    let mut attached = rds_secret(&pool, "127.0.0.1", &role, AWKWARD);
    attached["dbClusterIdentifier"] = json!("billing");
    attached["masterarn"] =
        json!("arn:aws:secretsmanager:us-east-1:123456789012:secret:billing-master-AbCdEf");
    let endpoint = vec![
        ("DATABASE_HOST", "127.0.0.1".to_owned()),
        ("DATABASE_PORT", port(&pool).to_string()),
        ("DATABASE_NAME", database_name(&pool)),
    ];
    let mut app = TestApp::spawn(pool.clone()).await;
    let shapes = [
        (url, vec![]),
        (rds, vec![]),
        (managed, endpoint),
        (attached.to_string(), vec![]),
    ];
    for (n, (text, mut vars)) in shapes.into_iter().enumerate() {
        vars.push(("DATABASE_SECRET_ID", create_secret(&text).await));
        let config = intake_config(&app.queue_url, &vars);
        app.state = IntakeState::from_config(&config).await.unwrap();

        let (status, body) = deliver(&app, &format!("evt_db_{n}")).await;

        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["status"], "stored");
        assert!(
            sessions_of(&pool, &role).await >= 1,
            "the secret's role is the one logged in"
        );
        close_sessions(&pool, &role).await;
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_password_rotated_under_a_running_intake_is_read_again_once(pool: PgPool) {
    let role = password_role(&pool, "before-Rotation#1").await;
    let id = create_secret(&rds_secret(&pool, "127.0.0.1", &role, "before-Rotation#1").to_string())
        .await;
    let mut app = TestApp::spawn(pool.clone()).await;
    let config = intake_config(&app.queue_url, &[("DATABASE_SECRET_ID", id.clone())]);
    app.state = IntakeState::from_config(&config).await.unwrap();
    let (status, _) = deliver(&app, "evt_before").await;
    assert_eq!(status, StatusCode::OK);

    // The rotation: a new password in the database and in the secret; the instance's
    // connection is gone (a new one must log in).
    new_password(&pool, &role, AWKWARD).await;
    put_secret(
        &id,
        &rds_secret(&pool, "127.0.0.1", &role, AWKWARD).to_string(),
    )
    .await;
    close_sessions(&pool, &role).await;
    let (status, body) = deliver(&app, "evt_after").await;

    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "stored");
    let database = app.state.conn.database();
    assert_eq!(database.generation(), 1, "the secret was read again once");
    // The pool took the new options too.
    let mut conn = app.state.pool.acquire().await.unwrap();
    let user: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(user, role);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_wrong_database_secret_is_named_never_its_password(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let error = IntakeState::from_config(&intake_config(
        &app.queue_url,
        &[("DATABASE_SECRET_ID", "billing-inbox/test/db/none".into())],
    ))
    .await
    .err()
    .unwrap()
    .to_string();
    assert_eq!(
        error,
        "DATABASE_SECRET_ID: the secret 'billing-inbox/test/db/none' could not be read (ResourceNotFoundException)"
    );
    let no_host =
        create_secret(&json!({"username": "u", "password": "hunter2#"}).to_string()).await;
    let error = IntakeState::from_config(&intake_config(
        &app.queue_url,
        &[("DATABASE_SECRET_ID", no_host.clone())],
    ))
    .await
    .err()
    .unwrap()
    .to_string();
    assert_eq!(
        error,
        format!(
            "DATABASE_SECRET_ID: the secret '{no_host}' has no host, and DATABASE_HOST is not set"
        )
    );
    let error = IntakeConfig::from_lookup(|var| match var {
        "DATABASE_SECRET_ID" => Some(no_host.clone()),
        "DATABASE_URL" => Some("postgres://u:hunter2@h/d".into()),
        _ => None,
    })
    .unwrap_err()
    .to_string();
    assert!(
        error.starts_with("DATABASE_SECRET_ID: is set beside DATABASE_URL"),
        "{error}"
    );
    assert!(!error.contains("hunter2"), "{error}");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_wrong_password_is_read_again_once_then_not_before_the_interval(pool: PgPool) {
    let role = password_role(&pool, "the-right-one").await;
    let id = create_secret(&rds_secret(&pool, "127.0.0.1", &role, "a-wrong-one").to_string()).await;
    let mut app = TestApp::spawn(pool.clone()).await;
    let config = intake_config(&app.queue_url, &[("DATABASE_SECRET_ID", id)]);
    app.state = IntakeState::from_config(&config).await.unwrap();

    let (first, body) = deliver(&app, "evt_wrong_1").await;
    let (second, _) = deliver(&app, "evt_wrong_2").await;

    assert_eq!(first, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!body.to_string().contains("a-wrong-one"), "{body}");
    assert_eq!(second, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        app.state.conn.database().generation(),
        1,
        "one read again after the first refusal, none after the second"
    );
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 0);
}

/// A held connection to the server's `postgres` database at `host`, verify-full against `ca`.
async fn verified(host: &str, ca: PathBuf) -> Result<bool, sqlx::Error> {
    let port = std::env::var("INBOX_PG_PORT").unwrap_or_else(|_| "61320".into());
    let mut config = DatabaseConfig::url(format!("postgres://postgres@{host}:{port}/postgres"));
    config.ca_file = Some(ca);
    let held = Held::on(Database::open(&config).await.unwrap());
    let mut conn = held.lock().await;
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(conn.get().await?)
        .await
}

#[tokio::test]
async fn verify_full_takes_the_ca_it_is_given_and_refuses_another() {
    assert!(verified("localhost", ca("ca.crt")).await.unwrap());
    assert!(verified("127.0.0.1", ca("ca.crt")).await.unwrap());
    let refused = verified("localhost", ca("other-ca.crt")).await.unwrap_err();
    assert!(
        refused.to_string().contains("invalid peer certificate"),
        "a server the CA did not sign is refused: {refused}"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_rds_json_over_verify_full_with_the_packaged_ca(pool: PgPool) {
    let role = password_role(&pool, AWKWARD).await;
    let id = create_secret(&rds_secret(&pool, "localhost", &role, AWKWARD).to_string()).await;
    let mut app = TestApp::spawn(pool.clone()).await;
    // As in Lambda: a path inside the package, taken from LAMBDA_TASK_ROOT.
    let config = intake_config(
        &app.queue_url,
        &[
            ("DATABASE_SECRET_ID", id),
            ("DATABASE_CA_FILE", ".dev/pg/tls/ca.crt".into()),
            ("LAMBDA_TASK_ROOT", env!("CARGO_MANIFEST_DIR").into()),
        ],
    );
    app.state = IntakeState::from_config(&config).await.unwrap();

    let (status, body) = deliver(&app, "evt_tls").await;

    assert_eq!(status, StatusCode::OK, "{body}");
    let ssl = ssl_of(&pool, &role).await;
    assert!(!ssl.is_empty() && ssl.iter().all(|s| *s), "{ssl:?}");
    let missing = IntakeState::from_config(&intake_config(
        &app.queue_url,
        &[
            (
                "DATABASE_URL",
                "postgres://postgres@localhost/postgres".into(),
            ),
            ("DATABASE_CA_FILE", "/nowhere/global-bundle.pem".into()),
        ],
    ))
    .await
    .err()
    .unwrap();
    assert_eq!(
        missing.to_string(),
        "DATABASE_CA_FILE: '/nowhere/global-bundle.pem' is not a file (the CA bundle must be packaged with the function)"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_worker_whose_password_was_rotated_applies_the_event_when_it_comes_again(pool: PgPool) {
    let role = password_role(&pool, "before-Rotation#1").await;
    let id = create_secret(&rds_secret(&pool, "127.0.0.1", &role, "before-Rotation#1").to_string())
        .await;
    let app = TestApp::spawn(pool.clone()).await;
    let event_id = app
        .store_stripe_event("evt_worker_db", "cus_db", chrono::Utc::now().timestamp())
        .await;
    let sources = json!([{"name": "stripe", "kind": "stripe"}]).to_string();
    let config = WorkerConfig::from_lookup(|var| match var {
        "DATABASE_SECRET_ID" => Some(id.clone()),
        "DATABASE_CA_FILE" => Some(local_ca()),
        "INBOX_SOURCES" => Some(sources.clone()),
        "INBOX_PLANS" => Some(PLANS.to_owned()),
        _ => None,
    })
    .unwrap();
    let worker = WorkerState::from_config(&config, 2).await.unwrap();
    // Rotated after the cold start, before the pool's first connection.
    new_password(&pool, &role, AWKWARD).await;
    put_secret(
        &id,
        &rds_secret(&pool, "127.0.0.1", &role, AWKWARD).to_string(),
    )
    .await;

    let first = handle_batch(&worker, sqs_batch(&[event_id])).await;
    let again = handle_batch(&worker, sqs_batch(&[event_id])).await;

    assert_eq!(
        first.batch_item_failures.len(),
        1,
        "refused, delivered again"
    );
    assert!(again.batch_item_failures.is_empty());
    assert_ne!(app.event(event_id).await.status, "received");
    assert_eq!(worker.database.as_ref().unwrap().generation(), 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_scheduler_whose_password_was_rotated_connects_on_its_next_run(pool: PgPool) {
    let role = password_role(&pool, "before-Rotation#1").await;
    let id = create_secret(&rds_secret(&pool, "127.0.0.1", &role, "before-Rotation#1").to_string())
        .await;
    let app = TestApp::spawn(pool.clone()).await;
    let sources = json!([{"name": "stripe", "kind": "stripe"}]).to_string();
    let config = SchedulerConfig::from_lookup(|var| match var {
        "DATABASE_SECRET_ID" => Some(id.clone()),
        "DATABASE_CA_FILE" => Some(local_ca()),
        "QUEUE_URL" => Some(app.queue_url.clone()),
        "INBOX_SOURCES" => Some(sources.clone()),
        "INBOX_PLANS" => Some(PLANS.to_owned()),
        _ => None,
    })
    .unwrap();
    let scheduler = SchedulerState::from_config(&config).await.unwrap();
    new_password(&pool, &role, AWKWARD).await;
    put_secret(
        &id,
        &rds_secret(&pool, "127.0.0.1", &role, AWKWARD).to_string(),
    )
    .await;

    let refused = shared::handlers::scheduler::run(&scheduler).await;
    let next = shared::handlers::scheduler::run(&scheduler).await;

    assert!(!refused.errors.is_empty());
    assert!(next.errors.is_empty(), "{:?}", next.errors);
    assert_eq!(scheduler.database.as_ref().unwrap().generation(), 1);
}

/// An operator's inboxctl finds the database as the functions do: the secret RDS manages
/// (username and password alone) with the endpoint beside it, no URL, no password in the
/// environment; a secret that does not let it in is named, never its password.
#[sqlx::test]
async fn inboxctl_reads_the_database_secret_as_the_functions_do(pool: PgPool) {
    let role = password_role(&pool, AWKWARD).await;
    let id = create_secret(&json!({"username": role, "password": AWKWARD}).to_string()).await;
    let mut command = crate::cli::inboxctl();
    command
        .env("DATABASE_SECRET_ID", &id)
        .env("DATABASE_HOST", "127.0.0.1")
        .env("DATABASE_PORT", port(&pool).to_string())
        .env("DATABASE_NAME", database_name(&pool))
        .env("DATABASE_CA_FILE", local_ca())
        .args(["--json", "stats"]);
    let (output, stdout, stderr) = crate::cli::run(&mut command);
    assert!(output.status.success(), "{stderr}");
    let stats: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(stats.is_object(), "{stdout}");

    let wrong = create_secret(&json!({"username": role, "password": "not-it"}).to_string()).await;
    let (output, stdout, stderr) = crate::cli::run(command.env("DATABASE_SECRET_ID", &wrong));
    let said = format!("{stdout}{stderr}");
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("DATABASE_SECRET_ID"), "{said}");
    assert!(!said.contains("not-it"), "{said}");

    let (output, _, stderr) = crate::cli::run(
        crate::cli::inboxctl()
            .env_remove("DATABASE_SECRET_ID")
            .args(["stats"]),
    );
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("DATABASE_SECRET_ID"), "{stderr}");
}

/// A deployed function's secret names the database; its connections are `verify-full` by
/// default, against the AWS roots the library carries (RDS's, RDS Proxy's), so a server whose
/// certificate none of them signed (the local CA's) is refused before any login: the delivery
/// is answered 503 and nothing is stored. Before, `prefer` took any certificate.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_secret_is_verified_in_full_by_default_and_a_server_no_aws_root_signed_is_refused(
    pool: PgPool,
) {
    let role = password_role(&pool, AWKWARD).await;
    let id = create_secret(&rds_secret(&pool, "localhost", &role, AWKWARD).to_string()).await;
    let mut app = TestApp::spawn(pool.clone()).await;
    // An empty DATABASE_TLS is unset: the library's default, and no local CA.
    let config = intake_config(
        &app.queue_url,
        &[("DATABASE_SECRET_ID", id), ("DATABASE_TLS", String::new())],
    );
    app.state = IntakeState::from_config(&config).await.unwrap();

    let (status, body) = deliver(&app, "evt_unverified").await;

    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 0);
    assert!(ssl_of(&pool, &role).await.is_empty(), "never logged in");
    let refused = sqlx::ConnectOptions::connect(&app.state.conn.database().options())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("invalid peer certificate: UnknownIssuer"),
        "the carried roots were read, and none signed the server's: {refused}"
    );
}

/// `DATABASE_TLS` relaxes a secret's check for a self-hosted database: `require` encrypts
/// without checking the certificate, `disable` does without TLS. A `DATABASE_URL` without
/// `sslmode` (local development, every other test) connects as it always did: TLS when the
/// server offers it, unchecked.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn database_tls_relaxes_a_secrets_check_and_a_local_url_connects_as_before(pool: PgPool) {
    let role = password_role(&pool, AWKWARD).await;
    let id = create_secret(&rds_secret(&pool, "localhost", &role, AWKWARD).to_string()).await;
    let mut app = TestApp::spawn(pool.clone()).await;
    for (n, (tls, over_tls)) in [("require", true), ("disable", false)]
        .into_iter()
        .enumerate()
    {
        let config = intake_config(
            &app.queue_url,
            &[
                ("DATABASE_SECRET_ID", id.clone()),
                ("DATABASE_TLS", tls.into()),
            ],
        );
        app.state = IntakeState::from_config(&config).await.unwrap();

        let (status, body) = deliver(&app, &format!("evt_relaxed_{n}")).await;

        assert_eq!(status, StatusCode::OK, "{tls}: {body}");
        let ssl = ssl_of(&pool, &role).await;
        assert!(
            !ssl.is_empty() && ssl.iter().all(|s| *s == over_tls),
            "{tls}: {ssl:?}"
        );
        close_sessions(&pool, &role).await;
    }

    let encoded: String = url::form_urlencoded::byte_serialize(AWKWARD.as_bytes()).collect();
    let url = format!(
        "postgres://{role}:{encoded}@127.0.0.1:{}/{}",
        port(&pool),
        database_name(&pool)
    );
    let config = intake_config(
        &app.queue_url,
        &[("DATABASE_URL", url), ("DATABASE_TLS", String::new())],
    );
    app.state = IntakeState::from_config(&config).await.unwrap();
    let (status, body) = deliver(&app, "evt_local_url").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ssl = ssl_of(&pool, &role).await;
    assert!(!ssl.is_empty() && ssl.iter().all(|s| *s), "{ssl:?}");
}
