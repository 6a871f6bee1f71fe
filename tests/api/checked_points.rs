//! The audit's checked points (docs/design.md §4.11): an account found clean keeps the fold of
//! its events at its newest event, and the next audit folds only the events after it; an
//! event that sorts before the point and finishes after it, a purge of an event it covers and
//! a catalog it was not folded under each make the next audit fold from nothing; an account
//! past the fold's cap is audited in steps from its point. A point's state is the fold of the
//! events it covers, whatever order they came in.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use shared::audit::{self, Audited, CheckedPoint, Cut};
use shared::domain::CustomerId;
use shared::handlers::worker::WorkerState;
use sqlx::PgPool;

use crate::helpers::*;
use crate::order::{self, Case};
use crate::scenarios::polar_subscription;

/// Delivers a Polar subscription event of `pc_<tag>` and applies it.
async fn deliver(app: &TestApp, tag: &str, webhook: &str, sub: &str, kind: &str, at: &str) {
    let payload = polar_subscription(&format!("pc_{tag}"), sub, kind, at);
    let (status, _) = app.post("polar", &polar_delivery(webhook, &payload)).await;
    assert_eq!(status, http::StatusCode::OK);
    assert_eq!(app.run_worker().await, 1);
}

async fn audit_one(app: &TestApp, customer: &str, cap: i64) -> Audited {
    let mut conn = app.pool.acquire().await.unwrap();
    let customer = CustomerId::parse(customer).unwrap();
    audit::audit_account_in_steps_of(
        &mut conn,
        &app.audit_sources(),
        &app.worker.catalog,
        ("polar", &customer),
        cap,
    )
    .await
    .unwrap()
}

async fn point_of(pool: &PgPool, source: &str, customer: &str) -> Option<CheckedPoint> {
    let mut conn = pool.acquire().await.unwrap();
    let customer = CustomerId::parse(customer).unwrap();
    audit::checked_point(&mut conn, (source, &customer))
        .await
        .unwrap()
}

/// The fold of every kept event of the account the provider created up to `cut`, from
/// nothing: what a point at `cut` must hold.
async fn fold_up_to(
    pool: &PgPool,
    worker: &WorkerState,
    (source, customer): (&str, &str),
    cut: DateTime<Utc>,
) -> shared::billing::fold::FoldState {
    let mut conn = pool.acquire().await.unwrap();
    let customer = CustomerId::parse(customer).unwrap();
    let cut = Cut {
        at: Some(cut),
        ..Cut::default()
    };
    audit::fold_account(
        &mut conn,
        &audit_sources(worker),
        &worker.catalog,
        (source, &customer),
        cut,
    )
    .await
    .unwrap()
    .folded
    .state_at_cut()
}

fn at(rfc3339: &str) -> DateTime<Utc> {
    rfc3339.parse().unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_account_found_clean_keeps_a_point_and_the_next_audit_goes_on_from_it(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    deliver(&app, "k", "k1", "sub_a", "active", "2026-01-01T00:00:00Z").await;
    deliver(&app, "k", "k2", "sub_b", "active", "2026-03-01T00:00:00Z").await;
    assert_eq!(audit_one(&app, "pc_k", 100).await, Audited::Checked(vec![]));
    let point = point_of(&app.pool, "polar", "pc_k").await.expect("a point");
    assert_eq!((point.cut, point.events), (at("2026-03-01T00:00:00Z"), 2));
    let folded = fold_up_to(&app.pool, &app.worker, ("polar", "pc_k"), point.cut).await;
    assert_eq!(point.state, folded);

    // The next audit starts from the point's state, not from nothing: a state moved by hand
    // there shows as a difference (the registers agree with the events).
    sqlx::query(
        "UPDATE audit_points SET state = jsonb_set(state,
            '{registers,subscriptions,sub_a,value,status}', '\"past_due\"')",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let Audited::Checked(found) = audit_one(&app, "pc_k", 100).await else {
        panic!("not compared");
    };
    let fields: Vec<&str> = found.iter().map(|d| d.field.as_str()).collect();
    assert_eq!(fields, ["subscription:sub_a:status"]);

    // A new event after the point: folded onto it, and the point moves to it.
    sqlx::query("UPDATE audit_points SET state = NULL, cut = NULL")
        .execute(&app.pool)
        .await
        .unwrap();
    assert_eq!(audit_one(&app, "pc_k", 100).await, Audited::Checked(vec![]));
    deliver(&app, "k", "k3", "sub_a", "revoked", "2026-04-01T00:00:00Z").await;
    assert_eq!(audit_one(&app, "pc_k", 100).await, Audited::Checked(vec![]));
    let point = point_of(&app.pool, "polar", "pc_k").await.expect("a point");
    assert_eq!((point.cut, point.events), (at("2026-04-01T00:00:00Z"), 3));
    let folded = fold_up_to(&app.pool, &app.worker, ("polar", "pc_k"), point.cut).await;
    assert_eq!(point.state, folded);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_that_sorts_before_the_point_and_finishes_after_it_drops_the_point(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    deliver(&app, "o", "o1", "sub_a", "active", "2026-01-01T00:00:00Z").await;
    deliver(&app, "o", "o2", "sub_b", "active", "2026-03-01T00:00:00Z").await;
    assert_eq!(audit_one(&app, "pc_o", 100).await, Audited::Checked(vec![]));
    let point = point_of(&app.pool, "polar", "pc_o").await.expect("a point");
    assert_eq!(point.cut, at("2026-03-01T00:00:00Z"));

    // Out of order: created in February, received after the point was kept. Folded from the
    // point it would be missed (a subscription the registers hold and the fold does not).
    deliver(
        &app,
        "o",
        "o3",
        "sub_late",
        "active",
        "2026-02-01T00:00:00Z",
    )
    .await;
    assert_eq!(point_of(&app.pool, "polar", "pc_o").await, None);
    assert_eq!(audit_one(&app, "pc_o", 100).await, Audited::Checked(vec![]));
    let point = point_of(&app.pool, "polar", "pc_o").await.expect("a point");
    assert_eq!((point.cut, point.events), (at("2026-03-01T00:00:00Z"), 3));
    let folded = fold_up_to(&app.pool, &app.worker, ("polar", "pc_o"), point.cut).await;
    assert_eq!(point.state, folded);
    assert!(point.state.registers.subscriptions.contains_key("sub_late"));

    // One at the point's very time sorts at or before it too.
    deliver(&app, "o", "o4", "sub_c", "active", "2026-03-01T00:00:00Z").await;
    assert_eq!(point_of(&app.pool, "polar", "pc_o").await, None);
    assert_eq!(audit_one(&app, "pc_o", 100).await, Audited::Checked(vec![]));

    // An event after the point leaves it where it is, for the next audit to go on from.
    deliver(&app, "o", "o5", "sub_d", "active", "2026-05-01T00:00:00Z").await;
    let point = point_of(&app.pool, "polar", "pc_o").await.expect("kept");
    assert_eq!(point.cut, at("2026-03-01T00:00:00Z"));
    assert_eq!(audit_one(&app, "pc_o", 100).await, Audited::Checked(vec![]));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_finished_after_the_audits_snapshot_is_never_left_out_of_its_point(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    deliver(&app, "r", "r1", "sub_a", "active", "2026-03-01T00:00:00Z").await;
    assert_eq!(audit_one(&app, "pc_r", 100).await, Audited::Checked(vec![]));
    // The audit read its snapshot with the row at this count of moves; an event of the
    // account finishes before the audit writes its point: the row moved, the write is refused.
    let moves: i64 = sqlx::query_scalar("SELECT moves FROM audit_points")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    deliver(&app, "r", "r2", "sub_b", "active", "2026-04-01T00:00:00Z").await;
    let written = sqlx::query(
        "UPDATE audit_points SET cut = '2026-05-01' WHERE customer_id = 'pc_r' AND moves = $1",
    )
    .bind(moves)
    .execute(&app.pool)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(
        written, 0,
        "every finished event of the account moves its point's row"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_purge_of_an_event_a_point_covers_takes_the_points_state(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    deliver(&app, "p", "p1", "sub_a", "active", "2026-01-01T00:00:00Z").await;
    deliver(&app, "p", "p2", "sub_a", "revoked", "2026-02-01T00:00:00Z").await;
    deliver(&app, "p", "p3", "sub_a", "revoked", "2026-03-01T00:00:00Z").await;
    deliver(&app, "p", "p4", "sub_b", "active", "2026-03-15T00:00:00Z").await;
    assert_eq!(audit_one(&app, "pc_p", 100).await, Audited::Checked(vec![]));
    assert!(point_of(&app.pool, "polar", "pc_p").await.is_some());
    sqlx::query("UPDATE inbox_events SET received_at = now() - interval '40 days'")
        .execute(&app.pool)
        .await
        .unwrap();
    let purged = shared::inbox::purge::purge(
        &app.pool,
        Duration::from_secs(30 * 86_400),
        Instant::now() + Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert_eq!(
        purged, 1,
        "sub_a's first revocation: no register holds it, it granted nothing"
    );
    assert_eq!(point_of(&app.pool, "polar", "pc_p").await, None);
    // Folded again from what is kept, and the point kept again: the fold of the kept events.
    assert_eq!(audit_one(&app, "pc_p", 100).await, Audited::Checked(vec![]));
    let point = point_of(&app.pool, "polar", "pc_p").await.expect("a point");
    assert_eq!(point.events, 3);
    let folded = fold_up_to(&app.pool, &app.worker, ("polar", "pc_p"), point.cut).await;
    assert_eq!(point.state, folded);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_point_folded_under_another_catalog_is_not_resumed(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    deliver(&app, "c", "c1", "sub_a", "active", "2026-01-01T00:00:00Z").await;
    assert_eq!(audit_one(&app, "pc_c", 100).await, Audited::Checked(vec![]));
    // A state the catalog of this audit would not give, under another fingerprint.
    sqlx::query(
        "UPDATE audit_points SET fingerprint = 'another catalog', state = jsonb_set(state,
            '{registers,subscriptions,sub_a,value,status}', '\"past_due\"')",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(audit_one(&app, "pc_c", 100).await, Audited::Checked(vec![]));
    let point = point_of(&app.pool, "polar", "pc_c").await.expect("a point");
    let folded = fold_up_to(&app.pool, &app.worker, ("polar", "pc_c"), point.cut).await;
    assert_eq!(point.state, folded);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_account_past_the_folds_cap_is_audited_in_steps_from_its_point(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let steps = [
        ("s1", "sub_a", "active", "2026-01-01T00:00:00Z"),
        ("s2", "sub_b", "active", "2026-01-15T00:00:00Z"),
        ("s3", "sub_a", "revoked", "2026-02-01T00:00:00Z"),
        ("s4", "sub_c", "active", "2026-02-15T00:00:00Z"),
        ("s5", "sub_b", "revoked", "2026-03-01T00:00:00Z"),
        ("s6", "sub_d", "active", "2026-03-15T00:00:00Z"),
        ("s7", "sub_c", "revoked", "2026-04-01T00:00:00Z"),
    ];
    for (webhook, sub, kind, time) in steps {
        deliver(&app, "cap", webhook, sub, kind, time).await;
    }
    // Three events at a time: two audits fold six of them in steps, the third reaches the
    // newest and compares.
    let mut audits = Vec::new();
    for _ in 0..4 {
        let audited = audit_one(&app, "pc_cap", 3).await;
        let done = audited == Audited::Checked(vec![]);
        audits.push(audited);
        if done {
            break;
        }
    }
    assert_eq!(
        audits.last(),
        Some(&Audited::Checked(vec![])),
        "never compared: {audits:?}"
    );
    assert_eq!(audits.len(), 3, "{audits:?}");
    let point = point_of(&app.pool, "polar", "pc_cap")
        .await
        .expect("a point");
    assert_eq!((point.cut, point.events), (at("2026-04-01T00:00:00Z"), 7));
    let folded = fold_up_to(&app.pool, &app.worker, ("polar", "pc_cap"), point.cut).await;
    assert_eq!(point.state, folded);
    // From the point, the next audit needs only what came after it.
    deliver(
        &app,
        "cap",
        "s8",
        "sub_d",
        "revoked",
        "2026-05-01T00:00:00Z",
    )
    .await;
    assert_eq!(audit_one(&app, "pc_cap", 3).await, Audited::Checked(vec![]));
}

/// Every account of the namespace, each source.
fn accounts(ns: &str) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for customer in 0..order::CUSTOMERS {
        for source in ["kinde", "stripe", "polar", "paddle"] {
            out.push((source, order::customer_id(customer, ns)));
        }
    }
    out
}

async fn audit_namespace(pool: &PgPool, worker: &WorkerState, ns: &str) -> Vec<Audited> {
    let mut conn = pool.acquire().await.unwrap();
    let sources = audit_sources(worker);
    let mut out = Vec::new();
    for (source, customer) in accounts(ns) {
        let customer = CustomerId::parse(&customer).unwrap();
        let audited =
            audit::audit_account(&mut conn, &sources, &worker.catalog, (source, &customer))
                .await
                .unwrap();
        out.push(audited);
    }
    out
}

static CASE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The case's events delivered shuffled with copies, an audit of every account after the
/// deliveries `audit_after` says (points kept at many cuts, then events sorting before them);
/// at the end every point holds the fold of the events it covers, and the audit from the
/// points finds what the audit from nothing finds.
async fn check(
    pool: &PgPool,
    worker: &WorkerState,
    case: &Case,
    audit_after: &[bool],
) -> Result<(), TestCaseError> {
    let ns = format!(
        "q{}",
        CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let events: Vec<order::Materialized> = case
        .events
        .iter()
        .enumerate()
        .map(|(i, e)| order::materialize(i, e, &ns))
        .collect();
    for (n, delivery) in case.deliveries.iter().enumerate() {
        let id = order::store(pool, &events[delivery.index]).await;
        order::process(worker, id).await?;
        if audit_after.get(n).copied().unwrap_or(false) {
            audit_namespace(pool, worker, &ns).await;
        }
    }
    let from_points = audit_namespace(pool, worker, &ns).await;
    for (source, customer) in accounts(&ns) {
        if let Some(point) = point_of(pool, source, &customer).await {
            let folded = fold_up_to(pool, worker, (source, &customer), point.cut).await;
            prop_assert_eq!(&point.state, &folded, "{} {}", source, customer);
        }
    }
    let customers: Vec<String> = accounts(&ns).into_iter().map(|(_, c)| c).collect();
    sqlx::query("DELETE FROM audit_points WHERE customer_id = ANY($1)")
        .bind(&customers)
        .execute(pool)
        .await
        .unwrap();
    let from_nothing = audit_namespace(pool, worker, &ns).await;
    prop_assert_eq!(from_points, from_nothing);
    Ok(())
}

#[test]
fn a_point_holds_the_fold_of_the_events_it_covers_in_every_order() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (pool, database) = runtime.block_on(crate::helpers::fresh_database());
    let worker = test_worker(pool.clone());
    let cases = std::env::var("INBOX_PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = order::case_strategy().prop_flat_map(|case| {
        let n = case.deliveries.len();
        (
            Just(case),
            proptest::collection::vec(proptest::bool::weighted(0.4), n),
        )
    });
    let result = runner.run(&strategy, |(case, audit_after)| {
        runtime.block_on(check(&pool, &worker, &case, &audit_after))
    });
    runtime.block_on(crate::helpers::drop_database(pool, &database));
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// The fold reads each event's first delivery (`via`) by an index in that order, whatever the
/// statistics say: planned as a walk of `deliveries_pkey` filtered by the event (as it was on
/// freshly loaded tables, where sorting looked dearer), it read every delivery for each event
/// of the account: 3.2 s of Postgres for one account of 1,400 events, the bench's hot account.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_events_first_delivery_is_read_by_an_index_in_that_order(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    // The planner's choice on fresh tables: no sort where an index gives the order.
    sqlx::query::<sqlx::Postgres>("SET enable_sort = off")
        .execute(&mut *conn)
        .await
        .unwrap();
    let lines: Vec<String> = sqlx::query_scalar(
        "EXPLAIN (FORMAT TEXT, COSTS OFF)
         SELECT d.headers->>'via' FROM deliveries d WHERE d.event_id = 42 ORDER BY d.id LIMIT 1",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let plan = lines.join("\n");
    assert!(
        plan.contains("deliveries_event_first") && !plan.contains("Filter"),
        "{plan}"
    );
}

/// An account's unfinished events are read by an index that holds only unfinished events,
/// whatever the statistics say: through `inbox_events_customer` the audit read every event the
/// account ever had to filter their status (the bench's hot account: 2,100 rows, 4,400 buffers
/// each audit), as it did when the table's statistics were taken while its events still waited.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_accounts_unfinished_events_are_read_by_an_index_of_unfinished_events(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    // Each month's partition (docs/design.md §3.14): the partitioned table holds no rows.
    sqlx::query(
        "DO $$ DECLARE p regclass; BEGIN
             FOR p IN SELECT inhrelid::regclass FROM pg_inherits
                      WHERE inhparent = 'inbox_events'::regclass LOOP
                 EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = false)', p);
             END LOOP;
         END $$",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    // Statistics taken while the table was young (a few small accounts, their events
    // waiting), then one account's long history stored and finished: the bench's hot account.
    let insert = |customers: &'static str, from: i32, to: i32| {
        format!(
            "INSERT INTO inbox_events (source, dedupe_key, type, raw_body, payload_hash,
                                       customer_key, occurred_at, status)
             SELECT 'stripe', 'evt_' || g, 'invoice.paid', '\\x7b7d', sha256(g::text::bytea),
                    {customers}, now() - make_interval(secs => g), 'received'
             FROM generate_series({from}, {to}) g"
        )
    };
    for sql in [
        insert("'cus_' || (g % 20)", 1, 60),
        "ANALYZE inbox_events".to_owned(),
        insert("'cus_hot'", 61, 2160),
        "UPDATE inbox_events SET status = 'applied'".to_owned(),
    ] {
        sqlx::query(&sql).execute(&mut *conn).await.unwrap();
    }
    let hot = CustomerId::parse("cus_hot").unwrap();
    let pending = shared::inbox::kept::pending(&mut conn, "stripe", &hot)
        .await
        .unwrap();
    assert!(pending.is_empty(), "{pending:?}");
    // `kept::pending`'s statement: the events in flight alone (docs/design.md §3.4), never the
    // account's history.
    let lines: Vec<String> = sqlx::query_scalar(
        "EXPLAIN (FORMAT TEXT, COSTS OFF)
         SELECT w.event_id FROM inbox_work w
         WHERE w.source = 'stripe' AND w.customer_key = 'cus_hot' AND w.stage = 'pending'
         ORDER BY w.event_id LIMIT 100",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let plan = lines.join("\n");
    assert!(
        plan.contains("inbox_work") && !plan.contains("inbox_events"),
        "{plan}"
    );
}
