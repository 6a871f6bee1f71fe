//! inboxctl against a real database: what operators see, in text and JSON, and how it fails.

use std::process::{Command, Output};

use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::*;

/// The inboxctl binary, built beside this test binary by `cargo test --workspace`.
pub(crate) fn inboxctl() -> Command {
    let dir = std::env::current_exe().unwrap();
    let bin = dir.parent().unwrap().parent().unwrap().join("inboxctl");
    assert!(
        bin.exists(),
        "{} is built by `cargo test --workspace`",
        bin.display()
    );
    let mut command = Command::new(bin);
    command.env_remove("DATABASE_URL").env("INBOX_PLANS", PLANS);
    command
}

/// The URL of the test's own database.
pub(crate) async fn database_url(pool: &PgPool) -> String {
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .unwrap();
    let server = std::env::var("DATABASE_URL").unwrap();
    let (base, _) = server.rsplit_once('/').unwrap();
    format!("{base}/{name}")
}

pub(crate) fn run(command: &mut Command) -> (Output, String, String) {
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output, stdout, stderr)
}

/// A Kinde customer moved to Pro, with a late cancellation that is ignored.
async fn upgraded_customer(app: &TestApp) {
    for (webhook, claims) in [
        (
            "wh_cli_up",
            json!({"type": "customer.plan_changed", "event_id": "e1",
            "event_timestamp": "2026-03-10T12:00:00Z", "data": {"customer_id": "kc_cli", "plan": {"key": "pro"}}}),
        ),
        (
            "wh_cli_cancel",
            json!({"type": "customer.agreement_cancelled", "event_id": "e2",
            "event_timestamp": "2026-03-10T11:57:00Z", "data": {"customer_id": "kc_cli"}}),
        ),
    ] {
        app.post("kinde", &kinde_delivery(webhook, &claims)).await;
        app.run_worker().await;
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn account_json_has_the_contract_fields(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    upgraded_customer(&app).await;
    let url = database_url(&app.pool).await;

    let (output, stdout, stderr) = run(inboxctl()
        .args(["account", "kc_cli", "--period", "2026-03", "--json"])
        .env("DATABASE_URL", &url));

    assert!(output.status.success(), "{stderr}");
    let account: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(account["customer_id"], "kc_cli");
    assert_eq!(account["plan"], "pro");
    assert_eq!(account["balance"], 500);
    assert_eq!(account["period"], "2026-03");
    assert!(account["subscriptions"].is_array());
    assert!(account["payments"].is_array());
    let log = account["log"].as_array().unwrap();
    assert_eq!(log.len(), 2);
    for line in log {
        for field in ["event_id", "type", "outcome", "reason"] {
            assert!(!line[field].is_null(), "log line has {field}: {line}");
        }
    }
    // Oldest first, in provider order: the cancellation happened before the upgrade.
    assert_eq!(log[0]["type"], "customer.agreement_cancelled");
    assert_eq!(log[0]["outcome"], "ignored");
    assert_eq!(log[0]["reason"], "a newer plan change is already stored");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn account_text_explains_the_plan(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    upgraded_customer(&app).await;
    let url = database_url(&app.pool).await;

    let (output, stdout, _) = run(inboxctl()
        .args(["account", "kc_cli", "--period", "2026-03"])
        .env("DATABASE_URL", &url));

    assert!(output.status.success());
    assert!(stdout.contains("plan      pro"), "{stdout}");
    assert!(stdout.contains("balance   500 for 2026-03"), "{stdout}");
    assert!(
        stdout.contains("a newer plan change is already stored"),
        "{stdout}"
    );
}

/// A customer with thousands of events a day keeps a long log (it outlives the purge): the
/// text shows its latest lines and says how many there are, `--log N` asks for N, and
/// `--log 0` and the JSON give the whole log, in provider order either way.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn account_shows_the_latest_lines_of_a_long_log_and_all_when_asked(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // Plan changes a second apart, delivered newest first.
    for n in (0..120).rev() {
        let plan = ["pro", "team"][n % 2];
        let claims = json!({"type": "customer.plan_changed", "event_id": format!("e_long{n}"),
            "event_timestamp": format!("2026-03-10T12:{:02}:{:02}Z", n / 60, n % 60),
            "data": {"customer_id": "kc_long", "plan": {"key": plan}}});
        app.post("kinde", &kinde_delivery(&format!("wh_long{n}"), &claims))
            .await;
    }
    app.run_worker().await;
    let url = database_url(&app.pool).await;
    let account = |args: &[&str]| {
        let mut command = inboxctl();
        command
            .args(["account", "kc_long", "--period", "2026-03"])
            .args(args)
            .env("DATABASE_URL", &url);
        run(&mut command)
    };

    let (output, text, stderr) = account(&[]);
    assert!(output.status.success(), "{stderr}");
    assert!(
        text.contains("event log, in provider order (the latest 100 of 120; --log 0 shows all)"),
        "{text}"
    );
    let (_, all, _) = account(&["--log", "0"]);
    assert!(all.contains("event log, in provider order:"), "{all}");

    let (_, latest, _) = account(&["--log", "5", "--json"]);
    let latest: Value = serde_json::from_str(&latest).unwrap();
    assert_eq!(latest["log_total"], 120);
    let mut expected = Vec::new();
    for n in 115..120 {
        expected.push(json!(app.event_id("kinde", &format!("e_long{n}")).await));
    }
    let shown: Vec<Value> = latest["log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|line| line["event_id"].clone())
        .collect();
    assert_eq!(shown, expected, "the latest five, oldest first");

    let (_, whole, _) = account(&["--json"]);
    let whole: Value = serde_json::from_str(&whole).unwrap();
    assert_eq!(whole["log"].as_array().unwrap().len(), 120);
    assert_eq!(whole["log_total"], 120);

    let (output, _, stderr) = account(&["--log=-1"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr.contains("invalid value '-1' for '--log <N>'"),
        "{stderr}"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn events_event_and_stats_read_the_inbox(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let delivery = stripe_delivery(&stripe_event(
        "evt_cli",
        "cus_cli",
        chrono::Utc::now().timestamp(),
    ));
    let (_, body) = app.post("stripe", &delivery).await;
    app.post("stripe", &delivery).await;
    app.run_worker().await;
    let id = body["event_id"].as_i64().unwrap();
    let url = database_url(&app.pool).await;

    let (_, events, _) = run(inboxctl()
        .args(["events", "--status", "applied", "--json"])
        .env("DATABASE_URL", &url));
    let events: Value = serde_json::from_str(&events).unwrap();
    assert_eq!(events[0]["id"], id);
    assert_eq!(events[0]["seen_count"], 2);

    let (_, event, _) = run(inboxctl()
        .args(["event", &id.to_string(), "--json"])
        .env("DATABASE_URL", &url));
    let event: Value = serde_json::from_str(&event).unwrap();
    assert_eq!(event["status"], "applied");
    let verdicts: Vec<&str> = event["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(verdicts, ["stored", "duplicate"]);

    let (output, stats, _) = run(inboxctl()
        .args(["stats", "--json"])
        .env("DATABASE_URL", &url));
    assert!(output.status.success());
    let stats: Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(stats["by_status"]["applied"], 1);
    assert_eq!(stats["copies_per_event"], 2.0);
    assert!(stats["delivery_lag_p50_secs"].is_number());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn errors_exit_non_zero_with_a_clear_message(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let url = database_url(&app.pool).await;

    let (output, _, stderr) = run(inboxctl()
        .args(["account", "nobody"])
        .env("DATABASE_URL", &url));
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr.contains("no account for customer 'nobody'"),
        "{stderr}"
    );

    let (output, stdout, _) = run(inboxctl()
        .args(["account", "nobody", "--json"])
        .env("DATABASE_URL", &url));
    assert_eq!(output.status.code(), Some(1));
    let error: Value = serde_json::from_str(&stdout).unwrap();
    assert!(error["error"].as_str().unwrap().contains("no account"));

    let (output, _, stderr) = run(inboxctl()
        .args(["account", "x", "--period", "2026-13"])
        .env("DATABASE_URL", &url));
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.contains("--period must be YYYY-MM"), "{stderr}");

    let (output, _, stderr) = run(inboxctl()
        .args(["event", "999999"])
        .env("DATABASE_URL", &url));
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.contains("no event 999999"), "{stderr}");

    let down = "postgres://postgres@127.0.0.1:1/none";
    let (output, _, stderr) = run(inboxctl().args(["stats"]).env("DATABASE_URL", down));
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.contains("connecting to DATABASE_URL"), "{stderr}");

    let (output, _, stderr) = run(inboxctl().args(["stats"]));
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.contains("DATABASE_URL is not set"), "{stderr}");

    let (output, _, stderr) = run(inboxctl().args(["events", "--limit", "many"]));
    assert_eq!(
        output.status.code(),
        Some(2),
        "bad arguments are a usage error"
    );
    assert!(stderr.contains("--limit"), "{stderr}");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn replay_of_dead_events_puts_them_back_on_the_queue(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (_, body) = app
        .post(
            "stripe",
            &stripe_delivery(&stripe_event(
                "evt_cli_dead",
                "cus_cd",
                chrono::Utc::now().timestamp(),
            )),
        )
        .await;
    app.drain_queue().await;
    let id = body["event_id"].as_i64().unwrap();
    sqlx::query("UPDATE inbox_events SET status = 'dead', attempts = 6, last_error = 'boom'")
        .execute(&app.pool)
        .await
        .unwrap();
    let url = database_url(&app.pool).await;

    let (output, stdout, stderr) = run(inboxctl()
        .args(["replay", "--status", "dead", "--json"])
        .env("DATABASE_URL", &url)
        .env("QUEUE_URL", &app.queue_url));

    assert!(output.status.success(), "{stderr}");
    let answer: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["replayed"], json!([id]));
    app.run_worker().await;
    assert_eq!(app.event(id).await.status, "applied");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_bridge_deletes_what_the_worker_finished_and_leaves_what_failed(pool: PgPool) {
    use shared::platform::sim::{with_interrupts, Fault, FaultAction, Point};
    let app = TestApp::spawn(pool).await;
    for n in 0..3 {
        app.post(
            "stripe",
            &stripe_delivery(&stripe_event(
                &format!("evt_bridge_{n}"),
                "cus_b",
                chrono::Utc::now().timestamp() + n,
            )),
        )
        .await;
    }
    // The first event the worker takes fails; the other two finish.
    let crash = Fault::new(Point::WorkerDecided, FaultAction::Fail(1));

    let mut total = shared::dev::lambda_triggers::PumpReport::default();
    while total.received < 3 {
        let pump =
            shared::dev::lambda_triggers::pump_once(&app.sqs, &app.queue_url, 1, |event| async {
                Ok(shared::handlers::worker::handle_batch(&app.worker, event).await)
            });
        let report = with_interrupts(crash.clone(), pump).await.unwrap();
        total.received += report.received;
        total.deleted += report.deleted;
        total.failed += report.failed;
    }

    assert_eq!((total.received, total.deleted, total.failed), (3, 2, 1));
    let attributes = app
        .sqs
        .get_queue_attributes()
        .queue_url(&app.queue_url)
        .attribute_names(
            aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
        )
        .send()
        .await
        .unwrap();
    let in_flight = attributes
        .attributes()
        .unwrap()
        .get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .unwrap()
        .clone();
    assert_eq!(in_flight, "1", "the failed message waits for redelivery");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn account_reads_a_connected_accounts_customer_and_says_why_a_price_is_no_plan(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let now = chrono::Utc::now().timestamp();
    let mut event = stripe_event("evt_connect", "cus_1", now);
    event["account"] = json!("acct_1Connect");
    event["data"]["object"]["items"]["data"][0]["price"]["id"] = json!("price_legacy");
    app.post("stripe", &stripe_delivery(&event)).await;
    app.run_worker().await;
    let url = database_url(&app.pool).await;

    let (output, stdout, stderr) = run(inboxctl()
        .args([
            "account",
            "cus_1",
            "--stripe-account",
            "acct_1Connect",
            "--json",
        ])
        .env("DATABASE_URL", &url));
    assert!(output.status.success(), "{stderr}");
    let account: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(account["customer_id"], "acct_1Connect/cus_1");
    assert_eq!(account["plan"], "free");
    assert_eq!(account["subscriptions"][0]["status"], "active");
    assert_eq!(
        account["log"][0]["reason"],
        "subscription sub_1 is active; no plan: 'price_legacy' is not in the plan catalog"
    );

    let (output, _, stderr) = run(inboxctl()
        .args(["account", "cus_1"])
        .env("DATABASE_URL", &url));
    assert!(!output.status.success(), "cus_1 alone is no account");
    assert!(!stderr.is_empty());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn effects_are_listed_shown_and_replayed(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    let effects_queue = app.enable_effects().await;
    upgraded_customer(&app).await;
    app.drain(&effects_queue).await;
    let url = database_url(&app.pool).await;

    let (output, stdout, stderr) = run(inboxctl()
        .args(["effects", "--status", "pending", "--json"])
        .env("DATABASE_URL", &url));
    assert!(output.status.success(), "{stderr}");
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    let kinds: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"billing.plan_changed"), "{kinds:?}");
    let id = listed[0]["id"].as_str().unwrap().to_owned();

    let (output, stdout, stderr) = run(inboxctl().args(["effect", &id]).env("DATABASE_URL", &url));
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains(&format!("effect {id}")), "{stdout}");
    assert!(
        stdout.contains("\"type\": \"billing."),
        "the body: {stdout}"
    );

    // A sent effect, replayed: pending again and on the dispatcher's queue.
    sqlx::query("UPDATE effects SET status = 'sent', sent_at = now() WHERE id = $1")
        .bind(&id)
        .execute(&app.pool)
        .await
        .unwrap();
    let (output, stdout, stderr) = run(inboxctl()
        .args(["effects", "replay", &id, "--json"])
        .env("DATABASE_URL", &url)
        .env("EFFECTS_QUEUE_URL", &effects_queue));
    assert!(output.status.success(), "{stderr}");
    let replayed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(replayed["replayed"], json!([id]));
    assert_eq!(app.drain(&effects_queue).await, [id]);

    // Bad input is named, with a non-zero exit.
    for (args, message) in [
        (
            vec!["effects", "--status", "lost"],
            "unknown effect status 'lost' (pending, sent, dead)",
        ),
        (vec!["effect", "eff_0000"], "no effect eff_0000"),
        (
            vec!["effects", "replay", "--queue-url", "http://q"],
            "name effect ids to replay, or --status",
        ),
    ] {
        let (output, _, stderr) = run(inboxctl().args(&args).env("DATABASE_URL", &url));
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}

/// `inboxctl bench` end to end on a small backlog, as is and with 1 ms added to each Postgres
/// round trip (`--pg-delay-ms`, through its proxy): every figure the benchmarks page is
/// written from is there, every event is applied, and its databases are gone afterwards.
/// No figure's size is asserted: timing belongs to the bench, not to a test. The two runs go
/// one after the other, so that neither sees the other's databases.
#[tokio::test]
async fn the_bench_reports_every_figure_and_leaves_no_database_behind() {
    let server = std::env::var("DATABASE_URL").unwrap();
    let admin = PgPool::connect(&server).await.unwrap();
    let benches = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_database WHERE datname LIKE 'inbox\\_bench\\_%'",
        )
        .fetch_one(&admin)
        .await
        .unwrap()
    };
    let before = benches().await;

    for delay in ["0", "1"] {
        // Signed for the Stripe and Polar sources only: the local Kinde key and its JWKS are
        // served by the stack's scripts, not by the test run.
        let (output, stdout, stderr) = run(inboxctl().env_remove("INBOX_DEV_KINDE_KEY").args([
            "--json",
            "--database-url",
            &server,
            "bench",
            "--deliveries",
            "100",
            "--concurrency",
            "2",
            "--customers",
            "3",
            "--pg-delay-ms",
            delay,
        ]));
        assert!(output.status.success(), "{stdout}\n{stderr}");
        let report: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();

        assert_eq!(
            (report["deliveries"].as_i64(), report["events"].as_i64()),
            (Some(100), Some(70))
        );
        assert_eq!(report["customers_per_source"], 3);
        assert_eq!(report["pg_delay_ms"].as_f64(), delay.parse().ok());
        assert_eq!(
            report["worker"]["applied"], 70,
            "every event is applied: {report}"
        );
        let positive = |v: &Value| v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0);
        for figure in ["pg_round_trip_ms", "pg_round_trip_direct_ms"] {
            assert!(positive(&report[figure]), "{figure}: {report}");
        }
        for figure in [
            "per_sec",
            "raw_per_sec",
            "send_alone_per_sec",
            "ceiling_per_sec",
            "ratio_to_ceiling",
            "store_send_per_sec",
            "ratio_to_store_send",
            "p50_ms",
            "p99_ms",
            "statements_per_delivery",
            "wal_bytes_per_delivery",
        ] {
            assert!(
                positive(&report["intake"][figure]),
                "intake {figure}: {report}"
            );
        }
        for figure in [
            "per_sec",
            "raw_per_sec",
            "ratio",
            "drain_secs",
            "statements_per_event",
            "wal_bytes_per_event",
        ] {
            assert!(
                positive(&report["worker"][figure]),
                "worker {figure}: {report}"
            );
        }
        // The steady phase: half as many deliveries again, every event of it final.
        let steady = &report["steady"];
        assert_eq!(
            (
                steady["deliveries"].as_i64(),
                steady["events"].as_i64(),
                steady["unfinished"].as_i64()
            ),
            (Some(50), Some(35), Some(0)),
            "{report}"
        );
        for figure in [
            "offered_per_sec",
            "achieved_per_sec",
            "stored_to_final_p50_ms",
            "stored_to_final_p99_ms",
            "stored_to_final_max_ms",
            "intake_p50_ms",
            "intake_p99_ms",
            "sqs_receive_floor_ms",
        ] {
            assert!(positive(&steady[figure]), "steady {figure}: {report}");
        }
        // Every phase's share of the cores and CPU per operation (a phase of a small backlog
        // may fall within one of /proc/stat's 10 ms ticks, so zero is a figure too).
        for phase in [
            "raw_store",
            "send_alone",
            "store_send",
            "intake",
            "drain",
            "raw_worker",
            "steady",
        ] {
            let cpu = &report["cpu"][phase];
            assert!(
                cpu["busy"]
                    .as_f64()
                    .is_some_and(|b| (0.0..=1.0).contains(&b)),
                "cpu {phase}: {report}"
            );
            let ms = |key: &str| cpu[key].as_f64().filter(|ms| *ms >= 0.0);
            let (all, own, others) = (ms("ms_per_op"), ms("own_ms_per_op"), ms("others_ms_per_op"));
            assert!(all.is_some() && own.is_some(), "cpu {phase}: {report}");
            // This process's share and the others' make up the whole.
            assert!(
                own.zip(others)
                    .zip(all)
                    .is_some_and(|((own, others), all)| (own + others - all).abs() < 1e-9),
                "cpu {phase}: {report}"
            );
        }
        // The bounds from those shares: null only where a phase fell within one tick.
        for bound in ["cores_bound_per_sec", "services_bound_per_sec"] {
            let b = &report["intake"][bound];
            assert!(b.is_null() || positive(b), "intake {bound}: {report}");
        }
        assert!(positive(&report["cpu"]["cores"]), "{report}");
        assert!(positive(&report["stored"]["bytes_per_event"]));
        assert!(positive(&report["stored"]["tables"]["inbox_events"]));
        assert_eq!(
            benches().await,
            before,
            "the bench removes its databases (--pg-delay-ms {delay})"
        );
    }
}

/// `inboxctl --json` with the test's database, and its exit code and parsed stdout.
fn json_of(url: &str, args: &[&str]) -> (Option<i32>, Value) {
    let (output, stdout, stderr) =
        run(inboxctl().args(args).arg("--json").env("DATABASE_URL", url));
    let value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout} {stderr}"));
    (output.status.code(), value)
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn usage_record_spends_once_per_key_and_usage_and_account_show_it(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    upgraded_customer(&app).await;
    let url = database_url(&app.pool).await;
    let record = [
        "usage", "record", "kc_cli", "3", "--key", "req_a", "--period", "2026-03",
    ];

    let (code, first) = json_of(&url, &record);
    assert_eq!(code, Some(0), "{first}");
    assert_eq!(
        (
            &first["amount"],
            &first["period"],
            &first["used"],
            &first["remaining"],
            &first["replayed"]
        ),
        (
            &json!(3),
            &json!("2026-03"),
            &json!(3),
            &json!(497),
            &json!(false)
        )
    );
    assert!(first["usage_id"].as_str().unwrap().starts_with("use_"));
    let (code, again) = json_of(&url, &record);
    assert_eq!(code, Some(0));
    assert_eq!(again["usage_id"], first["usage_id"]);
    assert_eq!(again["replayed"], true);

    let (output, stdout, stderr) = run(inboxctl()
        .args(["usage", "kc_cli", "--period", "2026-03"])
        .env("DATABASE_URL", &url));
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains("3 used of 500, 497 remaining"), "{stdout}");
    assert!(stdout.contains("req_a"), "{stdout}");
    let (code, page) = json_of(&url, &["usage", "kc_cli", "--period", "2026-03"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        (
            &page["allowance"],
            &page["used"],
            &page["remaining"],
            &page["next"]
        ),
        (&json!(500), &json!(3), &json!(497), &Value::Null)
    );
    assert_eq!(page["usage"][0]["idempotency_key"], "req_a");

    let (code, account) = json_of(&url, &["account", "kc_cli", "--period", "2026-03"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        (&account["balance"], &account["used"], &account["remaining"]),
        (&json!(500), &json!(3), &json!(497))
    );
    let (_, text, _) = run(inboxctl()
        .args(["account", "kc_cli", "--period", "2026-03"])
        .env("DATABASE_URL", &url));
    assert!(
        text.contains("balance   500 for 2026-03: 3 used, 497 remaining"),
        "{text}"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn usage_record_refusals_exit_with_their_own_codes(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    upgraded_customer(&app).await;
    let url = database_url(&app.pool).await;
    let (code, _) = json_of(
        &url,
        &[
            "usage", "record", "kc_cli", "10", "--key", "k1", "--period", "2026-03",
        ],
    );
    assert_eq!(code, Some(0));

    let (code, exhausted) = json_of(
        &url,
        &[
            "usage", "record", "kc_cli", "600", "--key", "k2", "--period", "2026-03",
        ],
    );
    assert_eq!(code, Some(3));
    assert_eq!(exhausted["code"], "allowance_exhausted");
    assert_eq!(exhausted["remaining"], 490);
    let (output, _, stderr) = run(inboxctl()
        .args([
            "usage", "record", "kc_cli", "600", "--key", "k2", "--period", "2026-03",
        ])
        .env("DATABASE_URL", &url));
    assert_eq!(
        output.status.code(),
        Some(3),
        "a refusal is stable under its key"
    );
    assert!(
        stderr.contains("600 is more than the 490 remaining"),
        "{stderr}"
    );

    let (code, conflict) = json_of(
        &url,
        &[
            "usage", "record", "kc_cli", "11", "--key", "k1", "--period", "2026-03",
        ],
    );
    assert_eq!(code, Some(4));
    assert_eq!(conflict["code"], "idempotency_conflict");

    let (code, unknown) = json_of(&url, &["usage", "record", "nobody", "1", "--key", "k1"]);
    assert_eq!(code, Some(6));
    assert_eq!(unknown["code"], "unknown_customer");
    let (code, unknown) = json_of(&url, &["usage", "nobody", "--source", "kinde"]);
    assert_eq!(code, Some(6));
    assert_eq!(unknown["code"], "unknown_customer");

    // Polar's customer.deleted leaves a tombstone that spends nothing.
    let deleted = crate::corpus::corpus("polar")
        .into_iter()
        .find(|(n, _)| n == "customer.deleted")
        .unwrap()
        .1;
    let gone = deleted["data"]["id"].as_str().unwrap().to_owned();
    app.post("polar", &polar_delivery("msg_deleted", &deleted))
        .await;
    app.run_worker().await;
    let (code, refused) = json_of(&url, &["usage", "record", &gone, "1", "--key", "k1"]);
    assert_eq!(code, Some(5), "{refused}");
    assert_eq!(refused["code"], "customer_deleted");

    for (args, words) in [
        (
            vec!["usage", "record", "kc_cli", "0", "--key", "k"],
            "a whole number from 1 to 1000000000",
        ),
        (
            vec!["usage", "record", "kc_cli", "1", "--key", "a b"],
            "visible ASCII",
        ),
        (
            vec!["usage", "kc_cli", "--period", "2026-13"],
            "--period must be YYYY-MM",
        ),
    ] {
        let (output, _, stderr) = run(inboxctl().args(&args).env("DATABASE_URL", &url));
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert!(stderr.contains(words), "{args:?}: {stderr}");
    }
    let (output, _, _) = run(inboxctl()
        .args(["usage", "record", "kc_cli", "1"])
        .env("DATABASE_URL", &url));
    assert_eq!(output.status.code(), Some(2), "--key is required");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn usage_record_refuses_what_the_api_refuses_and_stores_nothing_under_the_key(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    upgraded_customer(&app).await;
    let url = database_url(&app.pool).await;
    let next_year = (chrono::Utc::now() + chrono::Duration::days(400))
        .format("%Y-%m")
        .to_string();
    let refused: [(Vec<&str>, &str, &str); 3] = [
        (
            vec![
                "usage", "record", "kc_cli", "3", "--key", "k1", "--period", &next_year,
            ],
            "future_period",
            "has not begun",
        ),
        (
            vec![
                "usage",
                "record",
                "kc_cli",
                "1000000001",
                "--key",
                "k1",
                "--period",
                "2026-03",
            ],
            "bad_amount",
            "a whole number from 1 to 1000000000",
        ),
        (
            vec![
                "usage",
                "record",
                "kc_cli",
                "3",
                "--key",
                "k1",
                "--period",
                "2026-03",
                "--note",
                "a\u{1b}[2Jb",
            ],
            "bad_note",
            "control characters",
        ),
    ];
    for (args, code, words) in &refused {
        let (output, _, stderr) = run(inboxctl().args(args).env("DATABASE_URL", &url));
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(words), "{args:?}: {stderr}");
        let (exit, json) = json_of(&url, args);
        assert_eq!(
            (exit, json["code"].as_str()),
            (Some(1), Some(*code)),
            "{json}"
        );
    }
    assert_eq!(app.count("SELECT count(*) FROM usage_debits").await, 0);
    // The key is still free: its first real request is decided, not replayed.
    let (code, first) = json_of(
        &url,
        &[
            "usage", "record", "kc_cli", "3", "--key", "k1", "--period", "2026-03",
        ],
    );
    assert_eq!(
        (code, first["replayed"].as_bool(), first["used"].as_i64()),
        (Some(0), Some(false), Some(3)),
        "{first}"
    );

    // A cursor of no page of this list is an error, not the first page again.
    let (output, _, stderr) = run(inboxctl()
        .args([
            "usage",
            "kc_cli",
            "--period",
            "2026-03",
            "--after",
            "use_garbage",
        ])
        .env("DATABASE_URL", &url));
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is no usage id of kc_cli in 2026-03"),
        "{stderr}"
    );
    let (code, json) = json_of(
        &url,
        &[
            "usage",
            "kc_cli",
            "--period",
            "2026-03",
            "--after",
            "use_garbage",
        ],
    );
    assert_eq!((code, json["code"].as_str()), (Some(1), Some("bad_cursor")));
}

#[test]
fn dev_sources_prints_the_local_stacks_sources_one_per_provider() {
    let jwks = "http://127.0.0.1:61999/jwks.json";
    let (output, stdout, stderr) = run(inboxctl().args(["dev", "sources", "--jwks-url", jwks]));
    assert!(output.status.success(), "{stderr}");

    let sources = shared::platform::config::parse_sources(stdout.trim()).unwrap();
    let kinds: Vec<_> = sources.iter().map(|s| s.kind).collect();
    assert_eq!(kinds, shared::domain::SourceKind::ALL);
    let kinde = sources.iter().find(|s| s.name == "kinde").unwrap();
    assert_eq!(kinde.jwks_url.as_deref(), Some(jwks));
    let stripe = sources.iter().find(|s| s.name == "stripe").unwrap();
    assert_eq!(stripe.secrets, [STRIPE_SECRET]);
}

#[test]
fn the_bridge_without_a_queue_says_which_variable_is_missing() {
    let (output, _, stderr) = run(inboxctl().env_remove("QUEUE_URL").args(["dev"]));

    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr.contains("QUEUE_URL is not set (or pass --queue-url)"),
        "{stderr}"
    );
}

/// `inboxctl bench --budget` with tiny counts (docs/design.md §6.7): thin events, a
/// reconciliation and meter reports at once through one Stripe source's budget, against the
/// fake Stripe's rate limiter at its sandbox limits. Every thin event is applied, every missed
/// event the walk lists is stored, every report is sent, the fake refused nothing over its
/// limit, and the bench's database is gone afterwards. No figure's size is asserted beyond
/// those counts: timing belongs to the bench.
#[tokio::test]
async fn the_budget_bench_applies_every_event_with_no_request_over_the_limit() {
    let server = std::env::var("DATABASE_URL").unwrap();
    let admin = PgPool::connect(&server).await.unwrap();
    let benches = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_database WHERE datname LIKE 'inbox\\_budgetbench\\_%'",
        )
        .fetch_one(&admin)
        .await
        .unwrap()
    };
    let before = benches().await;
    let (output, stdout, stderr) = run(inboxctl().env_remove("INBOX_DEV_KINDE_KEY").args([
        "--json",
        "--database-url",
        &server,
        "bench",
        "--budget",
        "50",
        "--debits",
        "10",
    ]));
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["quiet"], true, "{report}");
    assert_eq!(report["thin_applied"], 50, "{report}");
    assert_eq!(report["reconciled"], 50, "{report}");
    assert_eq!(report["fake"]["over_limit"], 0, "{report}");
    let peak = report["fake"]["peak_per_second"].as_u64().unwrap();
    assert!((1..=25).contains(&peak), "{report}");
    let reports = &report["meter_reports"];
    assert_eq!(
        (reports["written"].as_i64(), reports["sent"].as_i64()),
        (Some(10), Some(10)),
        "{report}"
    );
    assert_eq!(report["meter_reports"]["sent_first_claim"], 10, "{report}");
    assert_eq!(benches().await, before, "the bench removes its database");
}

/// `inboxctl bench --api` with tiny counts: every level and phase reports its rate, its ratio
/// to the raw call, its latencies, its statements and cores' shares, nothing failed, the round
/// trips were counted on the wire, every debit of the hot account landed on it, and its
/// database is gone afterwards. No figure's size is asserted, only that it is there.
#[tokio::test]
async fn the_api_bench_reports_every_phase_and_leaves_no_database_behind() {
    let server = std::env::var("DATABASE_URL").unwrap();
    let admin = PgPool::connect(&server).await.unwrap();
    let benches = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_database WHERE datname LIKE 'inbox\\_apibench\\_%'",
        )
        .fetch_one(&admin)
        .await
        .unwrap()
    };
    let before = benches().await;
    let (output, stdout, stderr) = run(inboxctl().env_remove("INBOX_DEV_KINDE_KEY").args([
        "--json",
        "--database-url",
        &server,
        "bench",
        "--api",
        "--requests",
        "100",
        "--customers",
        "5",
    ]));
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(
        (report["requests"].as_i64(), report["customers"].as_i64()),
        (Some(100), Some(5))
    );
    assert_eq!(report["source"], "stripe", "{report}");
    let positive = |v: &Value| v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0);
    assert!(positive(&report["pg_round_trip_ms"]), "{report}");
    let levels = report["levels"].as_array().unwrap();
    assert_eq!(
        levels
            .iter()
            .map(|l| l["concurrency"].as_i64())
            .collect::<Vec<_>>(),
        [Some(4), Some(16)]
    );
    for level in levels {
        for phase in ["read", "feature", "debit", "hot_debit"] {
            assert!(positive(&level[phase]["ratio"]), "{phase}: {report}");
            for side in ["api", "raw"] {
                let figures = &level[phase][side];
                for figure in ["per_sec", "p50_ms", "p99_ms", "statements_per_op"] {
                    assert!(
                        positive(&figures[figure]),
                        "{phase} {side} {figure}: {report}"
                    );
                }
                assert_eq!(figures["failed"], 0, "{phase} {side}: {report}");
                let cpu = &figures["cpu"];
                assert!(
                    cpu["busy"]
                        .as_f64()
                        .is_some_and(|b| (0.0..=1.0).contains(&b)),
                    "{phase} {side}: {report}"
                );
                // Of the others' share, the phase's own Postgres backends (their /proc).
                assert!(
                    figures["postgres_ms_per_op"]
                        .as_f64()
                        .is_some_and(|ms| ms >= 0.0),
                    "{phase} {side}: {report}"
                );
                for share in ["ms_per_op", "own_ms_per_op", "others_ms_per_op"] {
                    assert!(
                        cpu[share].as_f64().is_some_and(|ms| ms >= 0.0),
                        "{phase} {side} {share}: {report}"
                    );
                }
            }
        }
    }
    // Effects are off: a read, a feature check and a debit are one round trip each, through
    // the handler and raw.
    assert_eq!(report["round_trips"]["ops"], 50);
    for side in ["api", "raw"] {
        for kind in ["read", "feature", "debit", "hot_debit"] {
            assert_eq!(
                report["round_trips"][side][kind].as_f64(),
                Some(1.0),
                "{side} {kind}: {report}"
            );
        }
    }
    // Each level's hot phases (handler and raw: 100 each) and warm-ups (one per instance and
    // connection, 4 + 4 and 16 + 16), and the wire count's 50 + 50 and two warm-ups.
    assert_eq!(
        report["hot_used"].as_i64(),
        Some(2 * 2 * 100 + 2 * (4 + 16) + 2 * 50 + 2),
        "{report}"
    );
    assert_eq!(benches().await, before, "the bench removes its database");
}

/// A Kinde customer on a plan key the catalog does not know, then past due twice (a failed
/// payment, then an overdue invoice), from the provider's own corpus.
async fn unknown_plan_and_past_due(app: &TestApp) -> [i64; 3] {
    let file = |name: &str| {
        crate::corpus::corpus("kinde")
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("testdata/providers/kinde/{name}.json"))
            .1
    };
    let mut changed = file("customer.plan_changed");
    changed["data"]["customer"]["id"] = json!("kc_standing");
    changed["data"]["plan"]["code"] = json!("legacy");
    let mut failed = file("customer.payment_failed");
    failed["data"]["customer_id"] = json!("kc_standing");
    failed["data"]["plan"]["key"] = json!("legacy");
    let mut overdue = file("customer.invoice_overdue");
    overdue["data"]["customer_id"] = json!("kc_standing");
    let mut ids = [0; 3];
    for (n, (name, claims)) in [
        ("changed", changed),
        ("failed", failed),
        ("overdue", overdue),
    ]
    .into_iter()
    .enumerate()
    {
        let (_, answer) = app
            .post(
                "kinde",
                &kinde_delivery(&format!("wh_standing_{name}"), &claims),
            )
            .await;
        ids[n] = answer["event_id"].as_i64().unwrap();
        app.run_worker().await;
    }
    ids
}

/// `account` shows what makes a Kinde customer free when its plan key is unknown and its
/// payments are past due (the register's key, the standing, the plan's reasons in `why`'s
/// words), and `why` tells the story the log tells: the event that set a field is one the
/// log says `applied`; the later overdue invoice, which found the customer past due already
/// (`ignored`), is listed as such with the log's words, not as the field's decider.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn account_shows_an_unknown_plan_key_and_past_due_and_why_tells_the_logs_story(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let [_, failed, overdue] = unknown_plan_and_past_due(&app).await;
    let url = database_url(&app.pool).await;
    let account = ["account", "kc_standing", "--period", "2026-01"];

    let (code, view) = json_of(&url, &account);
    assert_eq!(code, Some(0), "{view}");
    assert_eq!(view["plan"], "free");
    assert_eq!(view["customer_plan_key"], "legacy", "{view}");
    assert_eq!(view["standing"], "past_due", "{view}");
    assert_eq!(
        view["plan_reasons"],
        json!([{"reason": "unknown price", "detail": "plan key 'legacy' is not in the plan catalog"}])
    );
    let (output, text, stderr) = run(inboxctl().args(account).env("DATABASE_URL", &url));
    assert!(output.status.success(), "{stderr}");
    for line in [
        "plan register: 'legacy' (not in the plan catalog)",
        "not counted: unknown price: plan key 'legacy' is not in the plan catalog",
        "standing  payments past due",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }

    let sources = shared::providers::fixtures::dev_sources(&shared::providers::fixtures::Local {
        jwks_url: "http://127.0.0.1:9/unused",
    })
    .to_string();
    let (output, stdout, stderr) = run(inboxctl()
        .args(["why", "kc_standing", "--json"])
        .env("DATABASE_URL", &url)
        .env("INBOX_SOURCES", &sources));
    assert!(output.status.success(), "{stderr}");
    let why: Value = serde_json::from_str(&stdout).unwrap();
    let log: Vec<&Value> = view["log"].as_array().unwrap().iter().collect();
    let line = |id: &Value| {
        log.iter()
            .find(|l| l["event_id"] == *id)
            .unwrap_or_else(|| panic!("a log line for {id}"))
    };
    for field in why["fields"].as_array().unwrap() {
        if let Some(by) = field["decided_by"].get("event_id") {
            assert_eq!(line(by)["outcome"], "applied", "{field}");
        }
    }
    let standing = why["fields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["field"] == "standing")
        .unwrap();
    assert_eq!(standing["value"], "past_due");
    assert_eq!(standing["decided_by"]["event_id"], failed, "{standing}");
    let overdue_line = line(&json!(overdue));
    assert_eq!(overdue_line["outcome"], "ignored");
    assert_eq!(
        standing["beaten"],
        json!([{"event_id": overdue, "reason": "already held", "detail": overdue_line["reason"]}])
    );
}

/// The intake handler of `app`, served over HTTP on a free port (what `cargo lambda watch`
/// does locally): its base URL, where `inboxctl send` posts to `{url}/webhooks/{source}`.
pub(crate) async fn serve_intake(app: std::sync::Arc<TestApp>) -> String {
    use http_body_util::{BodyExt, Full};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let app = app.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |request: http::Request<hyper::body::Incoming>| {
                        let app = app.clone();
                        async move {
                            let (parts, body) = request.into_parts();
                            let body = body.collect().await?.to_bytes();
                            let request = lambda_http::Request::from_parts(
                                parts,
                                lambda_http::Body::from(body.to_vec()),
                            );
                            let response =
                                shared::handlers::intake::handle(&app.state, request).await;
                            let (parts, body) = response.into_parts();
                            let body = match body {
                                lambda_http::Body::Text(text) => text.into_bytes(),
                                lambda_http::Body::Binary(bytes) => bytes,
                                _ => Vec::new(),
                            };
                            Ok::<_, hyper::Error>(http::Response::from_parts(
                                parts,
                                Full::new(hyper::body::Bytes::from(body)),
                            ))
                        }
                    },
                );
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    url
}

/// The development sources (what `stack_env` gives `inboxctl send`), the Stripe source's
/// secret replaced by `stripe_secret` when given.
pub(crate) fn dev_sources(stripe_secret: Option<&str>) -> String {
    let local = shared::providers::fixtures::Local {
        jwks_url: "http://127.0.0.1:9/unused",
    };
    let mut sources = shared::providers::fixtures::dev_sources(&local);
    if let Some(secret) = stripe_secret {
        for source in sources.as_array_mut().unwrap() {
            if source["name"] == "stripe" {
                source["secrets"] = json!([secret]);
            }
        }
    }
    sources.to_string()
}

/// `inboxctl send stripe subscription` to `intake`, signed with `sources`; run off the test's
/// runtime, which serves the intake meanwhile.
async fn send_to(intake: &str, sources: &str, json_output: bool) -> (Option<i32>, String, String) {
    let (intake, sources) = (intake.to_owned(), sources.to_owned());
    tokio::task::spawn_blocking(move || send_blocking(&intake, &sources, json_output))
        .await
        .unwrap()
}

fn send_blocking(intake: &str, sources: &str, json_output: bool) -> (Option<i32>, String, String) {
    // Stripe signs with a secret: no Kinde key is read.
    let mut command = inboxctl();
    command
        .env_remove("INBOX_DEV_KINDE_KEY")
        .args(["send", "stripe", "subscription", "--customer", "cus_send"])
        .args(["--intake-url", intake])
        .env("INBOX_SOURCES", sources);
    if json_output {
        command.arg("--json");
    }
    let (output, stdout, stderr) = run(&mut command);
    (output.status.code(), stdout, stderr)
}

/// A delivery the intake refuses (a signature it cannot verify: 401; its database down: 503)
/// is a failure of `send`: the answer is printed as for any delivery, and the exit code is 1.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn send_exits_non_zero_when_the_intake_refuses_the_delivery(pool: PgPool) {
    let app = std::sync::Arc::new(TestApp::spawn(pool.clone()).await);
    let intake = serve_intake(app.clone()).await;

    let (code, stdout, stderr) = send_to(&intake, &dev_sources(None), false).await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("-> 200"), "{stdout}");

    let forged = dev_sources(Some("whsec_not_the_intakes_secret"));
    let (code, stdout, stderr) = send_to(&intake, &forged, false).await;
    assert!(stdout.contains("-> 401"), "{stdout}");
    assert_eq!(code, Some(1), "a refused delivery fails: {stdout}{stderr}");
    assert!(stderr.contains("refused"), "{stderr}");
    let (code, stdout, stderr) = send_to(&intake, &forged, true).await;
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    let answer: Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(answer["answers"][0]["status"], 401, "{answer}");

    // The database down: the intake answers 503 and stores nothing.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down_url = format!(
        "postgres://postgres@127.0.0.1:{}/down",
        closed.local_addr().unwrap().port()
    );
    drop(closed);
    let sqs = sqs_client().await;
    let queue_url = create_queue(&sqs).await;
    let queue = shared::platform::queue::Queue::new(sqs.clone(), queue_url.clone());
    let down = shared::platform::db::lazy_pool(&down_url, 2).unwrap();
    let down_app = TestApp::with_parts(pool, down, sqs, queue_url, queue).await;
    let down_intake = serve_intake(std::sync::Arc::new(down_app)).await;
    let (code, stdout, stderr) = send_to(&down_intake, &dev_sources(None), false).await;
    assert!(stdout.contains("-> 503"), "{stdout}");
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert_eq!(
        app.count("SELECT count(*) FROM inbox_events").await,
        1,
        "only the first was stored"
    );
}

/// `inboxctl send polar benefit-grant-*`: a Polar benefit grant of the feature `--feature`
/// names (`key=value`), granted then revoked; a feature that names no key is refused before
/// anything is sent.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn send_polar_benefit_grants_give_and_take_the_named_feature(pool: PgPool) {
    let app = std::sync::Arc::new(TestApp::spawn(pool).await);
    let intake = serve_intake(app.clone()).await;
    let send = |args: Vec<&'static str>| {
        let intake = intake.clone();
        tokio::task::spawn_blocking(move || {
            let mut command = inboxctl();
            command
                .env_remove("INBOX_DEV_KINDE_KEY")
                .args(["send", "polar"])
                .args(args)
                .args(["--customer", "cus_feat", "--object", "grant_1"])
                .args(["--intake-url", &intake])
                .env("INBOX_SOURCES", dev_sources(None));
            let (output, stdout, stderr) = run(&mut command);
            (output.status.code(), stdout, stderr)
        })
    };
    let features = || async {
        let mut conn = app.pool.acquire().await.unwrap();
        let customer = shared::domain::CustomerId::parse("cus_feat").unwrap();
        let period = shared::domain::Period::parse("2026-01").unwrap();
        let snapshot = shared::billing::account::snapshot(
            &mut conn,
            "polar",
            &customer,
            &period,
            &app.worker.catalog,
        )
        .await
        .unwrap()
        .expect("the account exists");
        json!(snapshot.features)
    };

    let (code, stdout, stderr) = send(vec![
        "benefit-grant-created",
        "--feature",
        "seats=20",
        "--at",
        "2026-01-05T10:00:00Z",
    ])
    .await
    .unwrap();
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("benefit_grant.created -> 200"), "{stdout}");
    app.run_worker().await;
    assert_eq!(features().await, json!({"seats": 20}));

    let (code, stdout, stderr) = send(vec![
        "benefit-grant-revoked",
        "--feature",
        "seats=20",
        "--at",
        "2026-01-20T10:00:00Z",
    ])
    .await
    .unwrap();
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    app.run_worker().await;
    assert_eq!(features().await, json!({}));

    let (code, _, stderr) = send(vec!["benefit-grant-created", "--feature", "=3"])
        .await
        .unwrap();
    assert_eq!(code, Some(1));
    assert!(stderr.contains("names no feature"), "{stderr}");
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 2);
}

/// `scripts/stack.sh`'s `stack_env` points `inboxctl` (INTAKE_URL, INBOX_INVOKE_URL) at the
/// intake port it is given, so that a second shell reaches a stack moved off 61900.
#[test]
fn stack_env_points_inboxctl_at_the_intake_port() {
    let root = env!("CARGO_MANIFEST_DIR");
    let output = Command::new("bash")
        .arg("-c")
        .arg(r#"source scripts/stack.sh && stack_env && printf '%s\n%s\n' "$INTAKE_URL" "$INBOX_INVOKE_URL""#)
        .current_dir(root)
        .env("INBOX_INTAKE_PORT", "61901")
        .env_remove("INTAKE_URL")
        .env_remove("INBOX_INVOKE_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "http://127.0.0.1:61901/lambda-url/intake",
            "http://127.0.0.1:61901"
        ]
    );
}

/// `scripts/dev --help` prints its header comment and nothing of the script after it.
#[test]
fn dev_help_is_the_scripts_header_only() {
    let output = Command::new("bash")
        .args(["scripts/dev", "--help"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.contains("scripts/dev stop"), "{stdout}");
    assert!(!stdout.contains("set -euo pipefail"), "{stdout}");
    assert!(
        stdout.lines().all(|l| !l.starts_with('#')),
        "comment marks are taken off: {stdout}"
    );
}

/// Every line of `inboxctl` text output fits 100 columns, and `why` gives a subscription's
/// fields, decided by one event and beating the same ones, in one row: the beaten event is
/// named once, not once per field.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn tables_fit_100_columns_and_why_names_a_subscriptions_beaten_event_once(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    unknown_plan_and_past_due(&app).await;
    // Active, then past due a minute later: the later state beats the earlier on every field.
    let older = app
        .store_stripe_event("evt_wide_1", "cus_wide", 1_772_704_800)
        .await;
    let mut past_due = stripe_event("evt_wide_2", "cus_wide", 1_772_704_860);
    past_due["data"]["object"]["status"] = json!("past_due");
    app.post("stripe", &stripe_delivery(&past_due)).await;
    app.run_worker().await;
    let url = database_url(&app.pool).await;
    let sources = dev_sources(None);
    let text = |args: &[&str]| {
        let (output, stdout, stderr) = run(inboxctl()
            .args(args)
            .env("DATABASE_URL", &url)
            .env("INBOX_SOURCES", &sources));
        assert!(output.status.success(), "{args:?}: {stderr}");
        stdout
    };
    for args in [
        &["account", "kc_standing", "--period", "2026-01"][..],
        &["account", "cus_wide"],
        &["why", "cus_wide"],
        &["why", "kc_standing"],
        &["events"],
        &["event", &older.to_string()],
    ] {
        let stdout = text(args);
        for line in stdout.lines() {
            assert!(
                line.chars().count() <= 100,
                "{args:?}: a line of {} columns:\n{stdout}",
                line.chars().count()
            );
        }
    }
    let why = text(&["why", "cus_wide"]);
    assert_eq!(
        why.matches(&format!("#{older} older")).count(),
        2,
        "the beaten event once for the subscription's fields, once for the plan it decides:\n{why}"
    );
    for name in [
        "status",
        "plan",
        "current_period_end",
        "cancel_at_period_end",
    ] {
        assert!(why.contains(name), "{name}: {why}");
    }
}

/// `inboxctl listen` applies what it receives as docs/effects.md tells an app to, and says
/// what it did with each request: a state applied latest-sequence-wins (the plan's move,
/// "free → pro"), a fact applied once whatever its sequence (the grant's 500), a copy of an
/// effect it applied not applied again, an older state not applied.
#[tokio::test]
async fn listen_applies_effects_by_the_state_and_fact_rules_and_says_so() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    const SECRET: &str = "whsec_YmlsbGluZy1pbmJveC1kZXYtZWZmZWN0cy1rZXktMDE=";
    let mut child = inboxctl()
        .args(["listen", "--port", "0", "--secret", SECRET])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    stderr.read_line(&mut first).unwrap();
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("listen says where it listens: {first}"))
        .to_owned();
    let (lines, printed) = std::sync::mpsc::channel();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });

    let key = shared::signing::standard_webhooks::decode_secret(
        SECRET,
        shared::signing::standard_webhooks::SecretEncoding::Base64,
    )
    .unwrap();
    let effect = |id: &str, kind: &str, sequence: i64, own: Value| {
        let mut data = json!({"source": "kinde", "customer_id": "kc_listen", "sequence": sequence,
            "account": {"plan": own["plan"].as_str().unwrap_or("pro"), "balance": 500,
                        "used": 0, "remaining": 500, "period": "2026-12"}});
        data.as_object_mut()
            .unwrap()
            .extend(own.as_object().unwrap().clone());
        json!({"id": id, "type": kind, "occurred_at": "2026-12-01T10:00:00.000Z", "data": data})
    };
    let http = reqwest::Client::new();
    let post = |body: &Value| {
        let id = body["id"].as_str().unwrap().to_owned();
        let raw = body.to_string().into_bytes();
        let now = chrono::Utc::now().timestamp();
        let signature = shared::signing::standard_webhooks::signature(&key, &id, now, &raw);
        let request = http
            .post(&url)
            .header("webhook-id", id)
            .header("webhook-timestamp", now.to_string())
            .header("webhook-signature", signature)
            .header("content-type", "application/json")
            .body(raw);
        async move {
            let answer = request.send().await.unwrap();
            assert_eq!(answer.status(), http::StatusCode::NO_CONTENT);
        }
    };
    let upgrade = effect(
        "eff_up",
        "billing.plan_changed",
        1,
        json!({"plan": "pro", "previous_plan": "free"}),
    );
    post(&upgrade).await;
    post(&effect(
        "eff_team",
        "billing.plan_changed",
        3,
        json!({"plan": "team", "previous_plan": "pro"}),
    ))
    .await;
    post(&upgrade).await; // a copy: the dispatcher sent it again
    post(&effect(
        "eff_down",
        "billing.plan_changed",
        2,
        json!({"plan": "free", "previous_plan": "pro"}),
    ))
    .await;
    post(&effect(
        "eff_grant",
        "billing.allowance_granted",
        1,
        json!({"grant": {"plan": "pro", "period": "2026-12", "amount": 500}}),
    ))
    .await;
    let mut said = Vec::new();
    for _ in 0..5 {
        let line = printed
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("a line for each effect; so far: {said:#?}"));
        said.push(line);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let [up, team, copy, down, grant] = said.as_slice() else {
        unreachable!()
    };
    assert!(
        up.starts_with("eff_up") && up.contains("free → pro"),
        "{said:#?}"
    );
    assert!(team.contains("pro → team"), "{said:#?}");
    assert!(
        copy.starts_with("eff_up") && copy.contains("copy"),
        "{said:#?}"
    );
    assert!(
        down.starts_with("eff_down") && down.contains("older") && !down.contains("→"),
        "{said:#?}"
    );
    assert!(
        grant.contains("500") && grant.contains("applied"),
        "{said:#?}"
    );
}

/// A Stripe customer on pro (whose catalog features include `audit-log: false`) with an
/// active-entitlement summary that gives `sso` and `audit-log`: `inboxctl features` lists each
/// feature with its value, where it comes from and the event behind it, as the API's feature
/// check answers it; `inboxctl account` shows the same table, and its JSON the features with
/// their origins.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn features_lists_each_feature_with_where_it_comes_from_and_its_event(pool: PgPool) {
    use crate::feature_check::{entitlement_summary, plans_with_features, summary_register};
    let app = TestApp::spawn(pool).await;
    let now = chrono::Utc::now().timestamp();
    let subscribed = app
        .store_stripe_event("evt_cli_fsub", "cus_cli_f", now - 60)
        .await;
    let summary = entitlement_summary("evt_cli_fsum", "cus_cli_f", now, &["sso", "audit-log"]);
    let (_, answer) = app.post("stripe", &stripe_delivery(&summary)).await;
    let summarised = answer["event_id"].as_i64().unwrap();
    app.run_worker().await;
    summary_register(&app, "cus_cli_f", summarised, &["sso", "audit-log"]).await;
    let url = database_url(&app.pool).await;
    let plans = plans_with_features();
    let inboxctl = || {
        let mut command = inboxctl();
        command.env("DATABASE_URL", &url).env("INBOX_PLANS", &plans);
        command
    };

    let (output, stdout, stderr) = run(inboxctl().args(["features", "cus_cli_f", "--json"]));
    assert!(output.status.success(), "{stderr}");
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (&listed["source"], &listed["customer_id"], &listed["plan"]),
        (&json!("stripe"), &json!("cus_cli_f"), &json!("pro"))
    );
    let features = listed["features"].as_array().unwrap();
    let keys: Vec<&str> = features.iter().filter_map(|f| f["key"].as_str()).collect();
    assert_eq!(keys, ["audit-log", "export", "seats", "sso"]);
    let audit = &features[0];
    assert_eq!(
        (&audit["allowed"], &audit["value"], &audit["source"]),
        (&json!(true), &json!(true), &json!("provider"))
    );
    assert_eq!(audit["decided_by"]["event_id"], summarised);
    assert_eq!(
        audit["decided_by"]["type"],
        "entitlements.active_entitlement_summary.updated"
    );
    let seats = &features[2];
    assert_eq!(
        (
            &seats["value"],
            &seats["source"],
            &seats["decided_by"]["event_id"]
        ),
        (&json!(20), &json!("catalog"), &json!(subscribed))
    );

    let (output, text, stderr) = run(inboxctl().args(["features", "cus_cli_f"]));
    assert!(output.status.success(), "{stderr}");
    for shown in [
        "customer  cus_cli_f (stripe), plan pro",
        "catalog (plan pro)",
        "provider",
        &format!("#{summarised} entitlements.active_entitlement_summary.updated"),
        &format!("#{subscribed} customer.subscription.updated"),
        "\"csv\"",
    ] {
        assert!(text.contains(shown), "{shown}: {text}");
    }

    // `account` shows the same table, and its JSON the features with their origins.
    let (output, text, stderr) = run(inboxctl().args(["account", "cus_cli_f"]));
    assert!(output.status.success(), "{stderr}");
    assert!(
        text.contains(&format!(
            "#{summarised} entitlements.active_entitlement_summary.updated"
        )),
        "{text}"
    );
    let (output, stdout, stderr) = run(inboxctl().args(["account", "cus_cli_f", "--json"]));
    assert!(output.status.success(), "{stderr}");
    let account: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        account["features"],
        json!({"sso": true, "seats": 20, "export": "csv", "audit-log": true})
    );
    assert_eq!(
        account["feature_origins"]["audit-log"]["source"],
        "provider"
    );
    assert_eq!(
        account["feature_origins"]["sso"]["decided_by"]["event_id"],
        subscribed
    );

    // A customer with no account is an error, in text and in JSON.
    let (output, _, stderr) = run(inboxctl().args(["features", "cus_nobody"]));
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr.contains("no account for customer 'cus_nobody'"),
        "{stderr}"
    );
    let (output, stdout, _) = run(inboxctl().args(["features", "cus_nobody", "--json"]));
    assert_eq!(output.status.code(), Some(1));
    let error: Value = serde_json::from_str(&stdout).unwrap();
    assert!(
        error["error"].as_str().unwrap().contains("cus_nobody"),
        "{error}"
    );
}

/// A Connect customer is named with `--stripe-account`, as `account` and `usage` name it; a
/// catalog that gives its plan no features says so.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn features_reads_a_connect_customer_and_says_when_there_are_none(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let mut event = stripe_event(
        "evt_cli_fconn",
        "cus_cli_fc",
        chrono::Utc::now().timestamp(),
    );
    event["account"] = json!("acct_1CliF");
    app.post("stripe", &stripe_delivery(&event)).await;
    app.run_worker().await;
    let url = database_url(&app.pool).await;
    let with_plans = |plans: &str, args: &[&str]| {
        run(inboxctl()
            .args(args)
            .env("DATABASE_URL", &url)
            .env("INBOX_PLANS", plans))
    };
    let plans = crate::feature_check::plans_with_features();
    let (output, stdout, stderr) = with_plans(
        &plans,
        &[
            "features",
            "cus_cli_fc",
            "--stripe-account",
            "acct_1CliF",
            "--json",
        ],
    );
    assert!(output.status.success(), "{stderr}");
    let listed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(listed["customer_id"], "acct_1CliF/cus_cli_fc");
    assert_eq!(listed["features"].as_array().map(Vec::len), Some(4));
    // Without the account, the platform's own cus_cli_fc: no such customer.
    let (output, _, stderr) = with_plans(&plans, &["features", "cus_cli_fc"]);
    assert!(!output.status.success());
    assert!(stderr.contains("no account for customer"), "{stderr}");
    // The test catalog without features: pro gives none.
    let (output, text, stderr) = with_plans(
        PLANS,
        &["features", "cus_cli_fc", "--stripe-account", "acct_1CliF"],
    );
    assert!(output.status.success(), "{stderr}");
    assert!(
        text.contains("no features: the catalog gives plan 'pro' none"),
        "{text}"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn usage_record_reports_to_the_sources_meter_and_usage_reverse_takes_it_back(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    upgraded_customer(&app).await;
    let url = database_url(&app.pool).await;
    // INBOX_SOURCES gives the Kinde source a meter: the debit writes its report, as the API's.
    let sources = json!([crate::meters::metered_entry(
        "kinde",
        "http://127.0.0.1:9",
        json!({"feature_code": "api_calls"}),
    )])
    .to_string();
    let metered = |args: &[&str]| {
        let (output, stdout, stderr) = run(inboxctl()
            .args(args)
            .arg("--json")
            .env("DATABASE_URL", &url)
            .env("INBOX_SOURCES", &sources));
        let value = serde_json::from_str::<Value>(&stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout} {stderr}"));
        (output.status.code(), value)
    };
    let (code, debit) = metered(&[
        "usage", "record", "kc_cli", "7", "--key", "req_m", "--period", "2026-03",
    ]);
    assert_eq!(code, Some(0), "{debit}");
    let usage_id = debit["usage_id"].as_str().unwrap().to_owned();
    let (_, listed) = metered(&["meters"]);
    let report = &listed.as_array().unwrap()[0];
    assert_eq!(
        (
            &report["usage_id"],
            &report["value"],
            &report["meter"],
            &report["status"]
        ),
        (
            &json!(usage_id),
            &json!(7),
            &json!("api_calls"),
            &json!("pending")
        )
    );

    // Reversed before the dispatcher sent it: the amount is back and the report withdrawn.
    let (code, reversed) = metered(&["usage", "reverse", "kc_cli", &usage_id]);
    assert_eq!(code, Some(0), "{reversed}");
    assert_eq!(
        (
            &reversed["used"],
            &reversed["remaining"],
            &reversed["replayed"]
        ),
        (&json!(0), &json!(500), &json!(false))
    );
    let (code, again) = metered(&["usage", "reverse", "kc_cli", &usage_id]);
    assert_eq!((code, &again["replayed"]), (Some(0), &json!(true)));
    let (_, listed) = metered(&["meters"]);
    assert_eq!(listed[0]["status"], "withdrawn");
    assert_eq!(
        listed.as_array().unwrap().len(),
        1,
        "no correction of what never went out"
    );

    // What cannot be reversed exits with its own code, and says why.
    let (code, unknown) = metered(&["usage", "reverse", "kc_cli", "use_nothing"]);
    assert_eq!((code, &unknown["code"]), (Some(7), &json!("not_found")));
    let (code, _) = metered(&[
        "usage", "record", "kc_cli", "900", "--key", "req_big", "--period", "2026-03",
    ]);
    assert_eq!(code, Some(3));
    let refused: String =
        sqlx::query_scalar("SELECT usage_id FROM usage_debits WHERE idempotency_key = 'req_big'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    let (code, not_accepted) = metered(&["usage", "reverse", "kc_cli", &refused]);
    assert_eq!(
        (code, &not_accepted["code"]),
        (Some(8), &json!("not_accepted"))
    );
}

/// `inboxctl send paddle <kind>`, every kind, signed as Paddle signs (`Paddle-Signature`) with
/// the development source's secret: each is stored, and a second `--copies` is a copy.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn send_paddle_signs_every_kind_as_paddle_does(pool: PgPool) {
    let app = std::sync::Arc::new(TestApp::spawn(pool.clone()).await);
    let intake = serve_intake(app.clone()).await;
    let sources = dev_sources(None);
    for kind in shared::providers::fixtures::kinds(shared::domain::SourceKind::Paddle) {
        let (intake, sources, kind) = (intake.clone(), sources.clone(), kind.to_string());
        let (code, stdout, stderr) = tokio::task::spawn_blocking(move || {
            let mut command = inboxctl();
            // Paddle signs with a secret: no Kinde key is read.
            command
                .env_remove("INBOX_DEV_KINDE_KEY")
                .args([
                    "send",
                    "paddle",
                    &kind,
                    "--customer",
                    "ctm_send",
                    "--copies",
                    "2",
                ])
                .args(["--intake-url", &intake])
                .env("INBOX_SOURCES", &sources);
            let (output, stdout, stderr) = run(&mut command);
            (output.status.code(), stdout, stderr)
        })
        .await
        .unwrap();
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        assert!(stdout.contains("\"status\":\"stored\""), "{stdout}");
        assert!(stdout.contains("\"status\":\"duplicate\""), "{stdout}");
    }
    app.run_worker().await;
    let account = app
        .account(
            "paddle",
            "ctm_send",
            &chrono::Utc::now().format("%Y-%m").to_string(),
        )
        .await;
    assert_eq!(account.payments.len(), 3, "{:?}", account.payments);
    assert_eq!(account.subscriptions[0].status, "canceled");
}

/// The dev stack's catalog as `scripts/stack.sh`'s `stack_env` sets it (`INBOX_PLANS`).
fn dev_stack_plans() -> String {
    let output = Command::new("bash")
        .arg("-c")
        .arg(r#"source scripts/stack.sh && stack_env && printf '%s' "$INBOX_PLANS""#)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("INBOX_PLANS")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// On the dev stack, `inboxctl send paddle subscription` and `inboxctl send lemonsqueezy
/// subscription` / `order-created` carry the ids Paddle and Lemon Squeezy send (a `pri_…`
/// price, a numeric variant), and the dev stack's catalog keys them: each grants its plan,
/// `--plan` the team's too.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn paddle_and_lemonsqueezy_sends_grant_their_plan_on_the_dev_stacks_catalog(pool: PgPool) {
    use shared::providers::{lemonsqueezy, paddle};
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = shared::platform::config::parse_plans(&dev_stack_plans()).unwrap();
    let app = std::sync::Arc::new(app);
    let intake = serve_intake(app.clone()).await;
    let send = |args: Vec<String>| {
        let intake = intake.clone();
        tokio::task::spawn_blocking(move || {
            let mut command = inboxctl();
            command
                .env_remove("INBOX_DEV_KINDE_KEY")
                .arg("send")
                .args(&args)
                .args(["--intake-url", &intake, "--json"])
                .env("INBOX_SOURCES", dev_sources(None));
            let (output, stdout, stderr) = run(&mut command);
            assert!(output.status.success(), "{args:?}: {stdout}{stderr}");
            let answer: Value = serde_json::from_str(&stdout).unwrap();
            answer["answers"][0]["body"]["event_id"].as_i64().unwrap()
        })
    };
    let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let at = chrono::Utc::now() - chrono::Duration::minutes(5);
    let at = at.to_rfc3339();
    let period = chrono::Utc::now().format("%Y-%m").to_string();

    let paddle_sub = send(args(&[
        "paddle",
        "subscription",
        "--customer",
        "ctm_devplan",
        "--at",
        &at,
    ]))
    .await
    .unwrap();
    let ls_sub = send(args(&[
        "lemonsqueezy",
        "subscription",
        "--customer",
        "9001",
        "--at",
        &at,
    ]))
    .await
    .unwrap();
    let ls_order = send(args(&[
        "lemonsqueezy",
        "order-created",
        "--customer",
        "9002",
        "--at",
        &at,
    ]))
    .await
    .unwrap();
    let paddle_team = send(args(&[
        "paddle",
        "subscription",
        "--customer",
        "ctm_devteam",
        "--plan",
        paddle::fixtures::DEV_TEAM_PRICE,
        "--at",
        &at,
    ]))
    .await
    .unwrap();
    let ls_team = send(args(&[
        "lemonsqueezy",
        "subscription",
        "--customer",
        "9003",
        "--plan",
        lemonsqueezy::fixtures::DEV_TEAM_VARIANT,
        "--at",
        &at,
    ]))
    .await
    .unwrap();
    app.run_worker().await;

    // What they carry: Paddle's price ids, Lemon Squeezy's variant ids as numbers.
    let payload = |id| {
        let app = app.clone();
        async move { app.event(id).await.payload.unwrap() }
    };
    let price = &payload(paddle_sub).await["data"]["items"][0]["price"]["id"];
    assert_eq!(price, paddle::fixtures::DEV_PRICE);
    assert!(price.as_str().unwrap().starts_with("pri_"), "{price}");
    let variant = &payload(ls_sub).await["data"]["attributes"]["variant_id"];
    assert!(variant.is_u64(), "{variant}");
    assert_eq!(variant.to_string(), lemonsqueezy::fixtures::DEV_VARIANT);
    let item = &payload(ls_order).await["data"]["attributes"]["first_order_item"];
    assert!(item["variant_id"].is_u64(), "{item}");

    for (source, customer, plan, balance, status) in [
        ("paddle", "ctm_devplan", "pro", 500, "active"),
        ("lemonsqueezy", "9001", "pro", 500, "active"),
        // An order grants its plan's allowance; the plan is a subscription's.
        ("lemonsqueezy", "9002", "free", 500, "paid"),
        ("paddle", "ctm_devteam", "team", 2000, "active"),
        ("lemonsqueezy", "9003", "team", 2000, "active"),
    ] {
        let account = app.account(source, customer, &period).await;
        let line = shared::handlers::engine_room::scenario::AccountLine::of(Some(&account));
        assert_eq!(
            (line.plan.as_str(), line.balance, line.status.as_str()),
            (plan, balance, status),
            "{source} {customer}: {account:?}"
        );
    }
    for id in [paddle_sub, ls_sub, ls_order, paddle_team, ls_team] {
        assert_eq!(app.event(id).await.status, "applied", "event {id}");
    }
    let order = app.account("lemonsqueezy", "9002", &period).await;
    let granted = format!("granted 500 for pro in {period}");
    assert!(order.log[0].reason.ends_with(&granted), "{:?}", order.log);
}
