//! Through a transaction-mode pooler, as RDS Proxy stands in front of the deployed database
//! (docs/deploy.md, "RDS Proxy"): PgBouncer 1.18 with `pool_mode = transaction` and 2 server
//! connections per database (scripts/stack.sh, `INBOX_PGBOUNCER_PORT`). It keeps no prepared
//! statement across server connections and resets none between clients, so a named statement
//! fails once the next transaction lands elsewhere, and stays in `pg_prepared_statements`
//! where it was parsed. With `DATABASE_POOLER=transaction` the whole pipeline runs through it
//! and leaves none; without, the same statements leave theirs, and a named one fails.

use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::json;
use shared::handlers::api::ApiState;
use shared::handlers::scheduler::{self, SchedulerState};
use shared::platform::config::{DatabaseConfig, Pooler, DATABASE_POOLER_VAR, DATABASE_URL_VAR};
use shared::platform::database::Database;
use shared::platform::queue::Queue;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

use crate::app_api::{api_state, call, debit, on_pro, APP_KEY};
use crate::helpers::*;

/// The child process: the pipeline with the setting on, which is the process's (one function
/// instance, one configuration).
const CHILD_TEST: &str =
    "pooler::the_pipeline_runs_through_the_pooler_naming_no_statement_when_run_as_a_child";
const CHILD_DB: &str = "INBOX_POOLER_CHILD_DB";
/// What the child's `DATABASE_POOLER` is.
const CHILD_POOLER: &str = "INBOX_POOLER_CHILD_POOLER";
/// The server connections PgBouncer keeps per database (`default_pool_size`).
const SERVER_CONNECTIONS: usize = 2;

fn pgbouncer_url(database: &str) -> String {
    let port = std::env::var("INBOX_PGBOUNCER_PORT")
        .expect("INBOX_PGBOUNCER_PORT is set (scripts/stack.sh stack_env starts PgBouncer)");
    format!("postgres://postgres@127.0.0.1:{port}/{database}")
}

async fn database_name(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn through_pgbouncer(database: &str) -> PgConnection {
    PgConnectOptions::from_str(&pgbouncer_url(database))
        .unwrap()
        .connect()
        .await
        .expect("PgBouncer answers (scripts/stack.sh ensure_pgbouncer)")
}

/// The prepared statements on every server connection PgBouncer holds for `database`, by
/// backend: as many clients as it has server connections each open a transaction and hold
/// it, so each sits on its own server connection, and each reads its own
/// `pg_prepared_statements` (a backend's prepared statements are its own to read). Then each
/// ends its server connection, so that the test's database can be dropped.
async fn prepared_statements_on_the_server_connections(database: &str) -> Vec<(i32, Vec<String>)> {
    let mut clients = Vec::new();
    let mut seen = Vec::new();
    for _ in 0..SERVER_CONNECTIONS {
        let mut client = through_pgbouncer(database).await;
        sqlx::raw_sql("BEGIN").execute(&mut client).await.unwrap();
        // Unnamed, so that the reading leaves nothing of its own.
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .persistent(false)
            .fetch_one(&mut client)
            .await
            .unwrap();
        let names: Vec<String> =
            sqlx::query_scalar("SELECT name FROM pg_prepared_statements ORDER BY name")
                .persistent(false)
                .fetch_all(&mut client)
                .await
                .unwrap();
        seen.push((pid, names));
        clients.push(client);
    }
    for mut client in clients {
        // The server ends the connection under the statement: an error here, by design.
        let _ = sqlx::raw_sql("SELECT pg_terminate_backend(pg_backend_pid())")
            .execute(&mut client)
            .await;
    }
    let mut pids: Vec<i32> = seen.iter().map(|(pid, _)| *pid).collect();
    pids.dedup();
    assert_eq!(
        pids.len(),
        SERVER_CONNECTIONS,
        "one server connection each: {seen:?}"
    );
    seen
}

/// Runs the child test in a process of its own, on `database`, with `DATABASE_POOLER` set to
/// `pooler`; its exit code and output.
fn run_child(database: String, pooler: &str) -> (Option<i32>, String) {
    run_test_as_child(CHILD_TEST, &[(CHILD_DB, &database), (CHILD_POOLER, pooler)])
}

/// Runs the test `test` of this binary in a process of its own, with `envs`: a process's
/// `DATABASE_POOLER` is its own, as a function instance's is. Its exit code and output.
pub(crate) fn run_test_as_child(test: &str, envs: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut child = Command::new(std::env::current_exe().unwrap());
    child.args(["--exact", test, "--nocapture", "--test-threads=1"]);
    for (var, value) in envs {
        child.env(var, value);
    }
    let mut child = child
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the test binary runs again as a child");
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().ok();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

/// The work every function does, through `bouncer` (a pool through PgBouncer) while the test
/// reads `direct`: the intake stores signed deliveries, the worker applies them, the
/// scheduler runs its steps, and eight api instances take 64 debits of 10 at once against an
/// allowance of 500, then read the account. What the answers were, for the caller to judge.
async fn pipeline(direct: PgPool, bouncer: PgPool) -> (usize, usize, Option<i64>, Vec<String>) {
    let sqs = sqs_client().await;
    let queue_url = create_queue(&sqs).await;
    let queue = Queue::new(sqs.clone(), queue_url.clone());
    let mut app = TestApp::with_parts(direct, bouncer.clone(), sqs, queue_url, queue).await;
    app.worker = test_worker(bouncer.clone());
    on_pro(&app, "kc_pooled").await;

    let report = scheduler::run(&SchedulerState {
        pool: bouncer.clone(),
        queue: Queue::new(app.sqs.clone(), app.queue_url.clone()),
        reconcilers: Vec::new(),
        sources: ["stripe", "polar", "kinde"].map(String::from).to_vec(),
        retention: Duration::from_secs(30 * 86_400),
        effects: None,
        outbox: None,
        budget: Duration::from_secs(30),
        database: None,
        audit: Some(test_audit()),
    })
    .await;

    // Eight instances, each its own client connection, multiplexed on two server connections.
    let states: Vec<ApiState> = (0..8).map(|_| api_state(&bouncer)).collect();
    let answers = futures::future::join_all((0..64).map(|i| {
        let state = &states[i % states.len()];
        async move {
            debit(
                state,
                "kc_pooled",
                &format!("pooled-{i}"),
                json!({"amount": 10}),
            )
            .await
        }
    }))
    .await;
    let accepted = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .count();
    let refused = answers
        .iter()
        .filter(|a| a.status == StatusCode::CONFLICT && a.body["code"] == "allowance_exhausted")
        .count();
    let read = call(
        &states[0],
        "GET",
        "/v1/accounts/kinde/kc_pooled",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    (accepted, refused, read.body["used"].as_i64(), report.errors)
}

/// A no-op unless a pooler test runs it as its child: then the functions' configuration
/// names PgBouncer and the `DATABASE_POOLER` it is given, read as a function reads it at cold
/// start, and the pipeline runs through it.
#[tokio::test]
async fn the_pipeline_runs_through_the_pooler_naming_no_statement_when_run_as_a_child() {
    let (Ok(database), Ok(pooler)) = (std::env::var(CHILD_DB), std::env::var(CHILD_POOLER)) else {
        return;
    };
    let url = pgbouncer_url(&database);
    let config = DatabaseConfig::read(|var| match var {
        DATABASE_URL_VAR => Some(url.clone()),
        DATABASE_POOLER_VAR => Some(pooler.clone()),
        _ => None,
    })
    .unwrap();
    let bouncer = Database::open(&config).await.unwrap().pool(4);
    assert_eq!(
        shared::platform::database::sends_unnamed_statements(),
        config.pooler == Pooler::Transaction
    );
    let direct_url = std::env::var("DATABASE_URL").unwrap();
    let direct = shared::platform::db::lazy_pool(
        &format!(
            "{}/{database}",
            &direct_url[..direct_url.rfind('/').unwrap()]
        ),
        2,
    )
    .unwrap();

    let (accepted, refused, used, errors) = pipeline(direct.clone(), bouncer.clone()).await;
    assert_eq!((accepted, refused, used), (50, 14, Some(500)));
    assert!(errors.is_empty(), "every scheduler step ran: {errors:?}");

    // The worker's transaction is bounded there too, without a SET (shared::apply::begin).
    let mut conn = bouncer.acquire().await.unwrap();
    let mut tx = shared::apply::begin(&mut conn).await.unwrap();
    let bound: String =
        sqlx::query_scalar("SELECT current_setting('idle_in_transaction_session_timeout')")
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    assert_eq!(bound, "10s");
    tx.rollback().await.unwrap();

    // A statement that fails in the transaction of its own leaves no server connection in it:
    // the pooler can hand that connection to the next client at once.
    if config.pooler == Pooler::Transaction {
        let failed = sqlx::query("SELECT 1 / 0")
            .execute(shared::platform::db::exec(&mut *conn))
            .await;
        assert!(failed.is_err());
        let aborted: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND state = 'idle in transaction (aborted)'",
        )
        .fetch_one(&direct)
        .await
        .unwrap();
        assert_eq!(
            aborted, 0,
            "the failed statement's transaction was rolled back"
        );
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn with_the_pooler_setting_the_pipeline_runs_through_pgbouncer_and_names_no_statement(
    pool: PgPool,
) {
    let database = database_name(&pool).await;
    let child_database = database.clone();
    let (code, output) =
        tokio::task::spawn_blocking(move || run_child(child_database, "transaction"))
            .await
            .unwrap();
    assert_eq!(code, Some(0), "the child's output:\n{output}");
    assert!(
        output.contains("1 passed"),
        "the child ran the pipeline:\n{output}"
    );

    // What it wrote, read directly: one grant of 500, fifty debits of 10.
    let debited: i64 = sqlx::query_scalar("SELECT count(*) FROM usage_debits WHERE accepted")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(debited, 50);
    // And nothing of it is left on any server connection.
    for (pid, names) in prepared_statements_on_the_server_connections(&database).await {
        assert!(names.is_empty(), "backend {pid} holds {names:?}");
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn without_the_pooler_setting_the_same_pipeline_fails_through_pgbouncer(pool: PgPool) {
    let database = database_name(&pool).await;
    let child_database = database.clone();
    let (code, output) = tokio::task::spawn_blocking(move || run_child(child_database, "none"))
        .await
        .unwrap();
    // Named statements parsed on one server connection are looked for on the other.
    assert_eq!(code, Some(101), "the child's test failed:\n{output}");
    assert!(output.contains("1 failed"), "{output}");
    prepared_statements_on_the_server_connections(&database).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn without_the_pooler_setting_the_same_work_leaves_named_statements_on_the_server_connections(
    pool: PgPool,
) {
    assert!(!shared::platform::database::sends_unnamed_statements());
    let database = database_name(&pool).await;
    let bouncer = shared::platform::db::lazy_pool(&pgbouncer_url(&database), 4).unwrap();
    // The intake's store alone: whether it succeeds depends on where its next transaction
    // lands; what it leaves does not.
    let sqs = sqs_client().await;
    let queue_url = create_queue(&sqs).await;
    let queue = Queue::new(sqs.clone(), queue_url.clone());
    let app = TestApp::with_parts(pool.clone(), bouncer, sqs, queue_url, queue).await;
    for i in 0..4 {
        let event = stripe_event(&format!("evt_named_{i}"), "cus_named", 1_772_704_800 + i);
        app.post("stripe", &stripe_delivery(&event)).await;
    }

    let left: Vec<String> = prepared_statements_on_the_server_connections(&database)
        .await
        .into_iter()
        .flat_map(|(_, names)| names)
        .collect();
    assert!(
        left.iter().any(|name| name.starts_with("sqlx_s_")),
        "named statements left: {left:?}"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_named_statement_fails_once_the_pooler_moves_the_client_and_an_unnamed_one_does_not(
    pool: PgPool,
) {
    let database = database_name(&pool).await;
    for persistent in [true, false] {
        let mut client = through_pgbouncer(&database).await;
        let statement = "SELECT pg_backend_pid(), $1::int";
        let (parsed_on, _): (i32, i32) = sqlx::query_as(statement)
            .bind(1)
            .persistent(persistent)
            .fetch_one(&mut client)
            .await
            .unwrap();
        // Hold every server connection but one that is not where the statement was parsed:
        // the client's next transaction runs on that one.
        let mut held = Vec::new();
        loop {
            let mut other = through_pgbouncer(&database).await;
            sqlx::raw_sql("BEGIN").execute(&mut other).await.unwrap();
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .persistent(false)
                .fetch_one(&mut other)
                .await
                .unwrap();
            held.push((pid, other));
            if held.iter().any(|(pid, _)| *pid == parsed_on) {
                break;
            }
        }
        // Free the ones that are not the statement's.
        let mut kept = Vec::new();
        for (pid, mut other) in held {
            if pid == parsed_on {
                kept.push(other);
            } else {
                sqlx::raw_sql("ROLLBACK").execute(&mut other).await.unwrap();
                other.close().await.unwrap();
            }
        }

        let again = sqlx::query_as::<_, (i32, i32)>(statement)
            .bind(2)
            .persistent(persistent)
            .fetch_one(&mut client)
            .await;
        match (persistent, again) {
            (true, Err(error)) => assert!(
                error
                    .to_string()
                    .contains("prepared statement \"sqlx_s_1\" does not exist"),
                "{error}"
            ),
            (false, Ok((ran_on, two))) => {
                assert_ne!(ran_on, parsed_on);
                assert_eq!(two, 2);
            }
            (persistent, other) => panic!("persistent {persistent}: {other:?}"),
        }
        for mut other in kept {
            sqlx::raw_sql("ROLLBACK").execute(&mut other).await.unwrap();
        }
    }
    prepared_statements_on_the_server_connections(&database).await;
}
