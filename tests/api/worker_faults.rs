//! The worker under concurrency and faults: workers racing on one batch or on one customer,
//! a worker process killed mid-transaction, the retry schedule up to `dead`, and messages
//! for events that are not the receiver's to process.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use chrono::{DateTime, Utc};
use http::StatusCode;
use serde_json::{json, Value};
use shared::billing::account::{PaymentView, SubscriptionView};
use shared::domain::retry::RETRY;
use shared::domain::EventStatus;
use shared::handlers::worker::{handle_batch, process_event, Processed, WorkerState};
use shared::platform::sim::{with_interrupts, Fault, FaultAction, Point};
use sqlx::PgPool;

use crate::helpers::*;

/// The billing period every event below falls in.
const PERIOD: &str = "2026-03";
/// 2026-03-05T10:00:00Z, the provider time the events below count from.
const T0: i64 = 1_772_704_800;

/// The child process of the crash test: a worker that ends its process before commit.
const CHILD_TEST: &str =
    "worker_faults::a_worker_told_to_exit_before_commit_ends_its_process_when_run_as_a_child";
const CHILD_DB_URL: &str = "INBOX_CHILD_DB_URL";
const CHILD_EVENT_ID: &str = "INBOX_CHILD_EVENT_ID";
/// The lease of both the crashed worker and the one that takes over after it.
const SHORT_LEASE: Duration = Duration::from_secs(1);

fn stripe_subscription(
    id: &str,
    customer: &str,
    sub: &str,
    status: &str,
    price: &str,
    at: i64,
) -> Value {
    json!({
        "id": id, "object": "event", "created": at, "type": "customer.subscription.updated",
        "data": {"object": {"id": sub, "object": "subscription", "customer": customer,
                 "status": status, "items": {"data": [{"price": {"id": price}}]}}}
    })
}

fn stripe_invoice(
    id: &str,
    event_type: &str,
    customer: &str,
    invoice: &str,
    price: &str,
    at: i64,
) -> Value {
    json!({
        "id": id, "object": "event", "created": at, "type": event_type,
        "data": {"object": {"id": invoice, "object": "invoice", "customer": customer,
                 "lines": {"data": [{"price": {"id": price}}]}}}
    })
}

/// Delivers a Stripe event through the intake; returns the stored event's id.
async fn store(app: &TestApp, event: &Value) -> i64 {
    let (status, body) = app.post("stripe", &stripe_delivery(event)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "stored", "{body}");
    body["event_id"]
        .as_i64()
        .expect("the intake answers the event id")
}

async fn store_all(app: &TestApp, events: &[Value]) -> Vec<i64> {
    let mut ids = Vec::with_capacity(events.len());
    for event in events {
        ids.push(store(app, event).await);
    }
    ids
}

/// An event row's processing state.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
struct Progress {
    status: String,
    attempts: i32,
    locked_until: Option<DateTime<Utc>>,
    next_attempt_at: Option<DateTime<Utc>>,
    processed_at: Option<DateTime<Utc>>,
    reason: Option<String>,
    last_error: Option<String>,
}

async fn progress(pool: &PgPool, id: i64) -> Progress {
    sqlx::query_as(
        "SELECT status, attempts, locked_until, next_attempt_at, processed_at, reason, last_error
         FROM inbox_events WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn count(pool: &PgPool, sql: &str, bind: &str) -> i64 {
    sqlx::query_scalar(sql)
        .bind(bind)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// How many rows a customer has in the ledger, the registers, the log and `accounts`.
async fn effects_of_customer(pool: &PgPool, customer: &str) -> i64 {
    let mut total = 0;
    for table in [
        "ledger",
        "subscriptions",
        "payments",
        "account_log",
        "accounts",
    ] {
        total += count(
            pool,
            &format!("SELECT count(*) FROM {table} WHERE customer_id = $1"),
            customer,
        )
        .await;
    }
    total
}

/// The database's clock right now (not the transaction's start).
async fn db_clock(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Simulates the wait: the event's retry is due now.
async fn make_due(pool: &PgPool, id: i64) {
    sqlx::query("UPDATE inbox_events SET next_attempt_at = now() WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
}

/// An SQS batch of `(message id, event id)` messages.
fn batch(messages: &[(&str, i64)]) -> SqsEvent {
    let mut event = SqsEvent::default();
    for (message_id, event_id) in messages {
        let mut record = SqsMessage::default();
        record.message_id = Some((*message_id).to_owned());
        record.body = Some(shared::platform::queue::message_body(*event_id));
        record.event_source = Some("aws:sqs".into());
        event.records.push(record);
    }
    event
}

fn reported(response: SqsBatchResponse) -> Vec<String> {
    response
        .batch_item_failures
        .into_iter()
        .map(|f| f.item_identifier)
        .collect()
}

/// The account's billing state, with the namespace tag removed so that two customers fed
/// the same events compare equal. The log is left out: which event of two equal ones
/// found the work done depends on the order.
async fn billing_state(app: &TestApp, customer: &str, tag: &str) -> Value {
    let account = app.account("stripe", customer, PERIOD).await;
    let ledger: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT entry_key, plan, allowance FROM ledger
         WHERE source = 'stripe' AND customer_id = $1 ORDER BY entry_key",
    )
    .bind(customer)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let text = json!({
        "plan": account.plan,
        "balance": account.balance,
        "past_due": account.past_due,
        "deleted": account.deleted,
        "subscriptions": account.subscriptions,
        "payments": account.payments,
        "ledger": ledger,
    })
    .to_string();
    serde_json::from_str(&text.replace(&format!("_{tag}"), "")).unwrap()
}

/// Three customers, each with a trial on Pro, an upgrade to Team and a paid Team invoice.
fn three_customers(tag: &str) -> Vec<Value> {
    let mut events = Vec::new();
    for c in ["a", "b", "c"] {
        let customer = format!("cus_{c}_{tag}");
        let sub = format!("sub_{c}_{tag}");
        events.push(stripe_subscription(
            &format!("evt_{c}1_{tag}"),
            &customer,
            &sub,
            "trialing",
            "price_pro",
            T0,
        ));
        events.push(stripe_invoice(
            &format!("evt_{c}2_{tag}"),
            "invoice.paid",
            &customer,
            &format!("in_{c}_{tag}"),
            "price_team",
            T0 + 90,
        ));
        events.push(stripe_subscription(
            &format!("evt_{c}3_{tag}"),
            &customer,
            &sub,
            "active",
            "price_team",
            T0 + 60,
        ));
    }
    events
}

/// Receives `n` messages from the test queue (each once), within a bounded wait.
async fn receive(app: &TestApp, n: usize) -> Vec<aws_sdk_sqs::types::Message> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut messages = Vec::new();
    while messages.len() < n && Instant::now() < deadline {
        let received = app
            .sqs
            .receive_message()
            .queue_url(&app.queue_url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        messages.extend(received.messages.unwrap_or_default());
    }
    assert_eq!(messages.len(), n, "every stored event was enqueued once");
    messages
}

/// A statement writing an event's row while a worker claims the event (a copy being counted
/// by the intake, a reconciliation storing the same event) makes the claim wait for it, not
/// pass the event by. A claim that skipped the locked row acknowledged the message, and the
/// event waited for the rescue, five minutes later.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_whose_row_is_being_written_when_claimed_is_still_applied(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let id = store(
        &app,
        &stripe_subscription(
            "evt_busy",
            "cus_busy",
            "sub_busy",
            "active",
            "price_pro",
            T0,
        ),
    )
    .await;
    // A copy being counted: the intake's statement holds the row's lock while it runs.
    let mut copy = pool.begin().await.unwrap();
    sqlx::query("UPDATE inbox_events SET seen_count = seen_count + 1 WHERE id = $1")
        .bind(id)
        .execute(&mut *copy)
        .await
        .unwrap();
    let copy_commits = async {
        // Once the worker's claim waits on the copy (or after 5 s, if it never does).
        for _ in 0..500 {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        copy.commit().await.unwrap();
    };
    let (handed, ()) = tokio::join!(app.run_worker(), copy_commits);
    assert_eq!(handed, 1);
    let progress = progress(&pool, id).await;
    assert_eq!(progress.status, "applied", "{progress:?}");
    assert_eq!(app.event(id).await.seen_count, 2);
}

/// A message is acknowledged without work only when its event's row says why: final, held
/// under a live lease, not due, gone. An event whose lease ran out while the batch's claim
/// waited on another row is one a worker could take (the claim passed it by: its lease was
/// live when the claim began), so its message is given back to the queue, not acknowledged;
/// acknowledged, the event waited for the rescue, which had just sent it and would send it
/// again only 5 minutes later.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_message_whose_event_a_worker_could_take_is_given_back_though_the_claim_passed_it_by(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    let busy = store(
        &app,
        &stripe_subscription(
            "evt_busy",
            "cus_busy",
            "sub_busy",
            "active",
            "price_pro",
            T0,
        ),
    )
    .await;
    let lapsing = store(
        &app,
        &stripe_subscription(
            "evt_lapsing",
            "cus_lapsing",
            "sub_lapsing",
            "active",
            "price_pro",
            T0,
        ),
    )
    .await;
    app.drain_queue().await;
    // Another worker holds `lapsing`, its lease still running when the claim begins.
    sqlx::query(
        "UPDATE inbox_events SET status = 'processing', attempts = 1, claim_gen = claim_gen + 1,
                locked_until = now() + interval '1 minute'
         WHERE id = $1",
    )
    .bind(lapsing)
    .execute(&pool)
    .await
    .unwrap();
    // A copy of `busy` being counted holds its row, so the claim waits there.
    let mut copy = pool.begin().await.unwrap();
    sqlx::query("UPDATE inbox_events SET seen_count = seen_count + 1 WHERE id = $1")
        .bind(busy)
        .execute(&mut *copy)
        .await
        .unwrap();
    let meanwhile = async {
        for _ in 0..500 {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // While the claim waits, the other worker's lease runs out (it stopped).
        sqlx::query(
            "UPDATE inbox_events SET locked_until = now() - interval '1 second' WHERE id = $1",
        )
        .bind(lapsing)
        .execute(&pool)
        .await
        .unwrap();
        copy.commit().await.unwrap();
    };
    let (response, ()) = tokio::join!(
        handle_batch(
            &app.worker,
            batch(&[("m-busy", busy), ("m-lapsing", lapsing)])
        ),
        meanwhile
    );
    assert_eq!(reported(response), vec!["m-lapsing".to_owned()]);
    assert_eq!(progress(&pool, busy).await.status, "applied");
    let left = progress(&pool, lapsing).await;
    assert_eq!((left.status.as_str(), left.attempts), ("processing", 1));

    // Delivered again, the message brings a worker to the event.
    let response = handle_batch(&app.worker, batch(&[("m-lapsing", lapsing)])).await;
    assert_eq!(reported(response), Vec::<String>::new());
    let done = progress(&pool, lapsing).await;
    assert_eq!((done.status.as_str(), done.attempts), ("applied", 2));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn two_workers_racing_on_one_batch_apply_each_event_exactly_once(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let second = test_worker(app.pool.clone());
    let ids = store_all(&app, &three_customers("race")).await;

    let messages = receive(&app, ids.len()).await;
    let event = shared::dev::lambda_triggers::sqs_event(&messages, &app.queue_url);
    let mut received: Vec<i64> = messages
        .iter()
        .map(|m| shared::platform::queue::parse_message_body(m.body().unwrap()).unwrap())
        .collect();
    received.sort_unstable();
    assert_eq!(received, ids, "one message per stored event");

    let (first, other) = tokio::join!(
        handle_batch(&app.worker, event.clone()),
        handle_batch(&second, event)
    );
    assert_eq!(reported(first), Vec::<String>::new());
    assert_eq!(reported(other), Vec::<String>::new());
    for m in &messages {
        app.sqs
            .delete_message()
            .queue_url(&app.queue_url)
            .receipt_handle(m.receipt_handle().unwrap())
            .send()
            .await
            .unwrap();
    }

    for &id in &ids {
        let row = progress(&app.pool, id).await;
        assert!(
            row.status == "applied" || row.status == "ignored",
            "event {id} is final: {row:?}"
        );
        assert_eq!(row.attempts, 1, "event {id} was claimed once: {row:?}");
        assert_eq!(row.locked_until, None);
        assert!(row.processed_at.is_some());
        let lines: i64 = sqlx::query_scalar("SELECT count(*) FROM account_log WHERE event_id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
        assert_eq!(lines, 1, "event {id} has one log line");
    }

    // The same events for other customers, through one worker alone.
    store_all(&app, &three_customers("solo")).await;
    app.run_worker().await;

    for c in ["a", "b", "c"] {
        let customer = format!("cus_{c}_race");
        let account = app.account("stripe", &customer, PERIOD).await;
        assert_eq!(account.plan, "team");
        assert_eq!(account.balance, 2000, "the largest allowance, granted once");
        assert_eq!(
            account.subscriptions,
            [SubscriptionView {
                id: format!("sub_{c}_race"),
                status: "active".into(),
                plan: Some("team".into()),
                current_period_end: None,
                cancel_at_period_end: false,
                cancel_at: None,
                trial_end: None,
                ended_at: None,
            }]
        );
        assert_eq!(
            account.payments,
            [PaymentView {
                id: format!("in_{c}_race"),
                status: "paid".into(),
            }]
        );
        assert_eq!(account.log.len(), 3);
        let grants = count(
            &app.pool,
            "SELECT count(*) FROM ledger WHERE customer_id = $1",
            &customer,
        )
        .await;
        assert_eq!(grants, 2, "one grant for pro and one for team");
        assert_eq!(
            billing_state(&app, &customer, "race").await,
            billing_state(&app, &format!("cus_{c}_solo"), "solo").await,
            "customer {c}"
        );
    }
}

/// One customer's subscription and invoices, in provider-time order.
fn one_customers_history(tag: &str) -> Vec<Value> {
    let customer = format!("cus_{tag}");
    let sub = format!("sub_{tag}");
    let id = |n: u32| format!("evt_{n}_{tag}");
    let invoice = |n: u32| format!("in_{n}_{tag}");
    vec![
        stripe_subscription(&id(0), &customer, &sub, "trialing", "price_pro", T0),
        stripe_invoice(
            &id(1),
            "invoice.paid",
            &customer,
            &invoice(1),
            "price_pro",
            T0 + 30,
        ),
        stripe_subscription(&id(2), &customer, &sub, "active", "price_pro", T0 + 60),
        stripe_subscription(&id(3), &customer, &sub, "active", "price_team", T0 + 120),
        stripe_invoice(
            &id(4),
            "invoice.paid",
            &customer,
            &invoice(2),
            "price_team",
            T0 + 130,
        ),
        stripe_invoice(
            &id(5),
            "invoice.payment_failed",
            &customer,
            &invoice(3),
            "price_team",
            T0 + 170,
        ),
        stripe_subscription(&id(6), &customer, &sub, "past_due", "price_team", T0 + 180),
    ]
}

async fn process_all(worker: &WorkerState, ids: &[i64]) -> Vec<(i64, Processed)> {
    let mut outcomes = Vec::new();
    for &id in ids {
        outcomes.push((id, process_event(worker, id).await.unwrap()));
    }
    outcomes
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn two_workers_splitting_one_customers_events_end_as_one_worker_in_provider_order(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let second = test_worker(app.pool.clone());

    let reference_ids = store_all(&app, &one_customers_history("ref")).await;
    for (id, outcome) in process_all(&app.worker, &reference_ids).await {
        assert!(
            matches!(outcome, Processed::Finished { .. }),
            "{id}: {outcome:?}"
        );
    }
    let reference = billing_state(&app, "cus_ref", "ref").await;
    let account = app.account("stripe", "cus_ref", PERIOD).await;
    assert_eq!(
        account.subscriptions[0].status, "past_due",
        "the newest state"
    );
    assert_eq!(
        account.plan, "free",
        "past_due keeps the record but not the plan"
    );
    assert_eq!(account.balance, 2000, "the largest allowance of the period");

    // Which worker takes event i: bit i of the mask; each worker's own order varies too.
    let splits: [(u32, bool, bool); 5] = [
        (0b0101010, false, false),
        (0b1110000, true, false),
        (0b0011001, false, true),
        (0b1001110, true, true),
        (0b0000011, true, false),
    ];
    for (round, (mask, first_reversed, second_reversed)) in splits.into_iter().enumerate() {
        let tag = format!("r{round}");
        let ids = store_all(&app, &one_customers_history(&tag)).await;
        let (mut mine, mut theirs): (Vec<i64>, Vec<i64>) = (Vec::new(), Vec::new());
        for (i, &id) in ids.iter().enumerate() {
            if mask & (1 << i) == 0 {
                mine.push(id);
            } else {
                theirs.push(id);
            }
        }
        if first_reversed {
            mine.reverse();
        }
        if second_reversed {
            theirs.reverse();
        }
        let (a, b) = tokio::join!(
            process_all(&app.worker, &mine),
            process_all(&second, &theirs)
        );
        for (id, outcome) in a.into_iter().chain(b) {
            assert!(
                matches!(
                    outcome,
                    Processed::Finished {
                        status: EventStatus::Applied | EventStatus::Ignored,
                        ..
                    }
                ),
                "round {round}, event {id}: {outcome:?}"
            );
            assert_eq!(progress(&app.pool, id).await.attempts, 1);
        }
        let customer = format!("cus_{tag}");
        let grants = count(
            &app.pool,
            "SELECT count(*) FROM ledger WHERE customer_id = $1",
            &customer,
        )
        .await;
        assert_eq!(grants, 2, "round {round}: one grant per plan of the period");
        let lines = count(
            &app.pool,
            "SELECT count(*) FROM account_log WHERE customer_id = $1",
            &customer,
        )
        .await;
        assert_eq!(lines, 7, "round {round}: one log line per event");
        assert_eq!(
            billing_state(&app, &customer, &tag).await,
            reference,
            "round {round}: worker one took {mine:?}, worker two {theirs:?}"
        );
    }
}

/// The test database's URL: the server of `DATABASE_URL`, with this test's database.
async fn test_database_url(pool: &PgPool) -> String {
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .unwrap();
    let server = std::env::var("DATABASE_URL").expect("DATABASE_URL is set");
    let (server, query) = match server.split_once('?') {
        Some((server, query)) => (server.to_owned(), format!("?{query}")),
        None => (server, String::new()),
    };
    let scheme_end = server.find("://").map_or(0, |i| i + 3);
    let base = match server[scheme_end..].find('/') {
        Some(slash) => &server[..scheme_end + slash],
        None => server.as_str(),
    };
    format!("{base}/{db}{query}")
}

/// Runs the child test in a process of its own; returns its exit code and its output.
fn run_child(database_url: String, event_id: i64) -> (Option<i32>, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD_DB_URL, database_url)
        .env(CHILD_EVENT_ID, event_id.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the test binary runs again as a child");
    let deadline = Instant::now() + Duration::from_secs(60);
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

/// A no-op unless the crash test runs it as its child: then it processes the event it is
/// given, and the injected fault ends the process after every write, before the commit.
#[tokio::test]
async fn a_worker_told_to_exit_before_commit_ends_its_process_when_run_as_a_child() {
    let (Ok(url), Ok(event_id)) = (std::env::var(CHILD_DB_URL), std::env::var(CHILD_EVENT_ID))
    else {
        return;
    };
    let pool = shared::platform::db::lazy_pool(&url, 2).unwrap();
    let mut worker = test_worker(pool);
    worker.lease = SHORT_LEASE;
    let exit = Fault::new(Point::WorkerDecided, FaultAction::Exit);
    let outcome = with_interrupts(exit, process_event(&worker, event_id.parse().unwrap())).await;
    panic!("the process should have ended before commit; the worker returned {outcome:?}");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_worker_killed_before_commit_leaves_nothing_and_the_event_is_applied_after_its_lease(
    pool: PgPool,
) {
    let mut app = TestApp::spawn(pool).await;
    app.worker.lease = SHORT_LEASE;
    let id = store(
        &app,
        &stripe_subscription(
            "evt_killed",
            "cus_killed",
            "sub_killed",
            "active",
            "price_pro",
            T0,
        ),
    )
    .await;

    let url = test_database_url(&app.pool).await;
    let (code, output) = tokio::task::spawn_blocking(move || run_child(url, id))
        .await
        .unwrap();
    assert_eq!(
        code,
        Some(86),
        "the child ended on the fault; its output:\n{output}"
    );

    let row = progress(&app.pool, id).await;
    assert_eq!(row.status, "processing", "{row:?}");
    assert_eq!(row.attempts, 1);
    assert!(row.locked_until.is_some(), "the lease outlives the crash");
    assert_eq!(row.processed_at, None);
    assert_eq!(
        effects_of_customer(&app.pool, "cus_killed").await,
        0,
        "the open transaction was rolled back with its connection"
    );

    // Once the lease runs out, a worker takes the event over.
    let deadline = Instant::now() + Duration::from_secs(10);
    let outcome = loop {
        match process_event(&app.worker, id).await.unwrap() {
            Processed::Skipped if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => break other,
        }
    };
    assert!(
        matches!(
            outcome,
            Processed::Finished {
                status: EventStatus::Applied,
                ..
            }
        ),
        "{outcome:?}"
    );
    let row = progress(&app.pool, id).await;
    assert_eq!(
        (row.status.as_str(), row.attempts),
        ("applied", 2),
        "{row:?}"
    );
    assert_eq!(row.locked_until, None);
    let grants = count(
        &app.pool,
        "SELECT count(*) FROM ledger WHERE customer_id = $1",
        "cus_killed",
    )
    .await;
    assert_eq!(grants, 1);
    let account = app.account("stripe", "cus_killed", PERIOD).await;
    assert_eq!((account.plan.as_str(), account.balance), ("pro", 500));
    assert_eq!(account.log.len(), 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_failing_six_times_follows_the_retry_schedule_and_ends_dead(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    app.worker.retry = RETRY;
    let fault = Fault::new(Point::WorkerDecided, FaultAction::Fail(6));
    let id = store(
        &app,
        &stripe_subscription(
            "evt_doomed",
            "cus_doomed",
            "sub_doomed",
            "active",
            "price_pro",
            T0,
        ),
    )
    .await;

    for attempt in 1..=6 {
        if attempt > 1 {
            make_due(&app.pool, id).await;
        }
        let before = db_clock(&app.pool).await;
        let processing = process_event(&app.worker, id);
        let outcome = with_interrupts(fault.clone(), processing).await.unwrap();
        let after = db_clock(&app.pool).await;
        let row = progress(&app.pool, id).await;
        assert_eq!(row.attempts, attempt, "{row:?}");
        assert_eq!(row.locked_until, None, "{row:?}");
        let error = row.last_error.clone().unwrap_or_default();
        assert!(
            error.contains("injected fault"),
            "attempt {attempt}: {row:?}"
        );
        assert_eq!(effects_of_customer(&app.pool, "cus_doomed").await, 0);
        match RETRY.wait_after(attempt) {
            Some(delay) => {
                assert_eq!(
                    outcome,
                    Processed::Failed {
                        status: EventStatus::Failed,
                        error
                    }
                );
                assert_eq!(row.status, "failed");
                let delay = chrono::Duration::from_std(delay).unwrap();
                let next = row
                    .next_attempt_at
                    .expect("a failed event has its retry time");
                assert!(
                    before + delay <= next && next <= after + delay,
                    "attempt {attempt}: next attempt at {next}, called between {before} and {after}"
                );
                if delay >= chrono::Duration::seconds(30) {
                    // Not due yet: a message arriving now finds nothing to do.
                    assert_eq!(
                        process_event(&app.worker, id).await.unwrap(),
                        Processed::Skipped
                    );
                    assert_eq!(progress(&app.pool, id).await, row);
                }
            }
            None => {
                assert_eq!(
                    outcome,
                    Processed::Failed {
                        status: EventStatus::Dead,
                        error
                    }
                );
                assert_eq!(row.status, "dead");
                assert_eq!(row.next_attempt_at, None);
            }
        }
    }

    // Dead is never claimed again, due or not.
    let dead = progress(&app.pool, id).await;
    assert_eq!(
        process_event(&app.worker, id).await.unwrap(),
        Processed::Skipped
    );
    make_due(&app.pool, id).await;
    assert_eq!(
        process_event(&app.worker, id).await.unwrap(),
        Processed::Skipped
    );
    let row = progress(&app.pool, id).await;
    assert_eq!((row.status.as_str(), row.attempts), ("dead", 6));
    assert_eq!(row.last_error, dead.last_error);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_batch_asks_again_only_for_events_that_failed_and_can_be_retried(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let done = store(
        &app,
        &stripe_subscription(
            "evt_done",
            "cus_done",
            "sub_done",
            "active",
            "price_pro",
            T0,
        ),
    )
    .await;
    let flaky = store(
        &app,
        &stripe_subscription(
            "evt_flaky",
            "cus_flaky",
            "sub_flaky",
            "active",
            "price_pro",
            T0,
        ),
    )
    .await;
    assert!(matches!(
        process_event(&app.worker, done).await.unwrap(),
        Processed::Finished {
            status: EventStatus::Applied,
            ..
        }
    ));

    // Retries are due at once in this worker, so each batch is the next attempt.
    let fault = Fault::new(Point::WorkerDecided, FaultAction::Fail(6));
    let messages = [("m-done", done), ("m-flaky", flaky)];
    for attempt in 1..=6 {
        let attempt_batch = handle_batch(&app.worker, batch(&messages));
        let response = with_interrupts(fault.clone(), attempt_batch).await;
        let row = progress(&app.pool, flaky).await;
        assert_eq!(row.attempts, attempt);
        if attempt < 6 {
            assert_eq!(row.status, "failed");
            assert_eq!(
                reported(response),
                ["m-flaky"],
                "attempt {attempt}: a failed event is delivered again, a final one is not"
            );
        } else {
            assert_eq!(row.status, "dead");
            assert_eq!(
                reported(response),
                Vec::<String>::new(),
                "a dead event is not delivered again"
            );
        }
    }
    let response = handle_batch(&app.worker, batch(&messages)).await;
    assert_eq!(reported(response), Vec::<String>::new());
    assert_eq!(progress(&app.pool, flaky).await.attempts, 6);
    assert_eq!(progress(&app.pool, done).await.attempts, 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_message_for_an_applied_leased_or_not_yet_due_event_is_acked_without_work(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let applied = store(
        &app,
        &stripe_subscription(
            "evt_applied",
            "cus_applied",
            "sub_applied",
            "active",
            "price_pro",
            T0,
        ),
    )
    .await;
    let leased = store(
        &app,
        &stripe_subscription(
            "evt_leased",
            "cus_leased",
            "sub_leased",
            "active",
            "price_pro",
            T0,
        ),
    )
    .await;
    let waiting = store(
        &app,
        &stripe_subscription(
            "evt_waiting",
            "cus_waiting",
            "sub_waiting",
            "active",
            "price_pro",
            T0,
        ),
    )
    .await;
    assert!(matches!(
        process_event(&app.worker, applied).await.unwrap(),
        Processed::Finished {
            status: EventStatus::Applied,
            ..
        }
    ));
    // Another worker holds a lease on one event; another failed and is not due yet.
    sqlx::query(
        "UPDATE inbox_events SET status = 'processing', attempts = attempts + 1,
                locked_until = now() + interval '1 minute'
         WHERE id = $1",
    )
    .bind(leased)
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE inbox_events SET status = 'failed', attempts = 1, last_error = 'earlier failure',
                next_attempt_at = now() + interval '1 hour'
         WHERE id = $1",
    )
    .bind(waiting)
    .execute(&app.pool)
    .await
    .unwrap();

    let ids = [applied, leased, waiting];
    let mut before = Vec::new();
    for &id in &ids {
        before.push(progress(&app.pool, id).await);
    }
    let effects = |customer: &'static str| effects_of_customer(&app.pool, customer);
    let applied_effects = effects("cus_applied").await;

    for &id in &ids {
        assert_eq!(
            process_event(&app.worker, id).await.unwrap(),
            Processed::Skipped,
            "event {id}"
        );
    }
    let response = handle_batch(
        &app.worker,
        batch(&[
            ("m-applied", applied),
            ("m-leased", leased),
            ("m-waiting", waiting),
            ("m-gone", i64::MAX),
        ]),
    )
    .await;
    assert_eq!(reported(response), Vec::<String>::new(), "all acked");

    for (&id, before) in ids.iter().zip(&before) {
        assert_eq!(
            &progress(&app.pool, id).await,
            before,
            "event {id} is untouched"
        );
    }
    assert_eq!(effects("cus_applied").await, applied_effects);
    assert_eq!(effects("cus_leased").await, 0);
    assert_eq!(effects("cus_waiting").await, 0);
}

/// A worker whose lease ran out holds nothing after a replay and a new claim, though the new
/// claim's attempt count, which the replay reset, is the one the old lease was taken with:
/// a lease is named by a claim generation that only grows.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_lease_that_ran_out_is_not_taken_back_by_a_replayed_claim(pool: PgPool) {
    use shared::inbox::lease;
    let app = TestApp::spawn(pool.clone()).await;
    let id = app
        .store_stripe_event("evt_replayed_lease", "cus_rl", T0)
        .await;
    let mut conn = pool.acquire().await.unwrap();
    let old = lease::claim(&mut conn, &[id], Duration::from_millis(1))
        .await
        .unwrap();
    assert_eq!(old.len(), 1, "the first worker holds the event");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let replayed = shared::inbox::replay::replay(&pool, &app.state.queue, &[id])
        .await
        .unwrap();
    assert_eq!(
        replayed,
        [id],
        "an expired lease does not keep the event from a replay"
    );
    let new = lease::claim(&mut conn, &[id], Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(new.len(), 1, "a second worker holds it now");
    assert_eq!(
        new[0].attempts, old[0].attempts,
        "the replay reset the attempt count"
    );

    assert!(
        !lease::still_held(&mut conn, &old[0]).await.unwrap(),
        "the old lease is gone"
    );
    let finished = lease::finish_held(&mut conn, &old[0], EventStatus::Ignored, "late", None)
        .await
        .unwrap();
    assert!(!finished, "the old lease cannot finish the event");
    let failed = lease::record_failure(&mut conn, &old[0], "late", &RETRY)
        .await
        .unwrap();
    assert_eq!(failed, None, "nor record a failure over the new lease");
    assert!(
        lease::still_held(&mut conn, &new[0]).await.unwrap(),
        "the new lease holds"
    );
}

/// An invocation that ends before an event's budget would gives back the events it has not
/// begun: no event is begun that Lambda could stop half way, except the batch's first (an
/// invocation shorter than one budget still moves).
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_batch_whose_invocation_is_ending_is_given_back_to_the_queue(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let ids = [
        app.store_stripe_event("evt_ending_1", "cus_ending", T0)
            .await,
        app.store_stripe_event("evt_ending_2", "cus_ending", T0 + 1)
            .await,
        app.store_stripe_event("evt_ending_3", "cus_ending", T0 + 2)
            .await,
    ];
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    let response =
        shared::handlers::worker::handle_batch_until(&app.worker, sqs_batch(&ids), Some(until))
            .await;
    let mut given_back = reported(response);
    given_back.sort();
    assert_eq!(given_back, [format!("m{}", ids[1]), format!("m{}", ids[2])]);
    let statuses: Vec<String> =
        sqlx::query_scalar("SELECT status FROM inbox_events WHERE id = ANY($1) ORDER BY id")
            .bind(&ids[..])
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        statuses,
        ["applied", "processing", "processing"],
        "the rest claimed, not worked"
    );
}
