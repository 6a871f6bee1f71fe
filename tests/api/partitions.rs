//! Events stored by their provider month (docs/design.md §3.14): a month past the retention is
//! dropped whole, what the purge's rules keep going back into the kept partition with its first
//! delivery; a copy after its month is gone is stored once and changes nothing; the scheduler
//! makes the months ahead, and moves into a month it makes the rows that waited for it.

use chrono::{DateTime, Datelike, Duration as Days, NaiveDate, TimeZone, Utc};
use serde_json::Value;
use shared::handlers::scheduler;
use shared::inbox::purge::{drop_months, DroppedMonth};
use sqlx::PgPool;

use crate::helpers::*;
use crate::scheduler::scheduler_for;

/// The shortest retention there is: a month goes once its end is 6 days old.
const RETENTION: std::time::Duration = std::time::Duration::from_secs(6 * 86_400);

/// The first day of this month (UTC) and of the one before it.
fn this_and_last_month() -> (NaiveDate, NaiveDate) {
    let today = Utc::now().date_naive();
    let this = today.with_day(1).unwrap();
    let last = (this - Days::days(1)).with_day(1).unwrap();
    (this, last)
}

fn at(day: NaiveDate) -> DateTime<Utc> {
    Utc.from_utc_datetime(&day.and_hms_opt(0, 0, 0).unwrap())
}

/// A pool on the same database whose store clock (`inbox_now()`) reads `at`.
fn clocked_at(pool: &PgPool, at: DateTime<Utc>) -> PgPool {
    let offset = at.timestamp() - Utc::now().timestamp();
    let options = pool
        .connect_options()
        .as_ref()
        .clone()
        .options([("inbox.clock_offset_secs", offset.to_string())]);
    sqlx::postgres::PgPoolOptions::new().connect_lazy_with(options)
}

/// A Stripe subscription event about `sub` of `customer`, created at `created`.
fn subscription_event(id: &str, customer: &str, sub: &str, created: DateTime<Utc>) -> Value {
    let mut event = stripe_event(id, customer, created.timestamp());
    event["data"]["object"]["id"] = sub.into();
    event
}

/// The partition that holds event `id`, and its deliveries' verdicts in order.
async fn where_stored(pool: &PgPool, id: i64) -> Option<(String, Vec<String>)> {
    let partition: Option<String> =
        sqlx::query_scalar("SELECT tableoid::regclass::text FROM inbox_events WHERE id = $1")
            .bind(id)
            .fetch_optional(pool)
            .await
            .unwrap();
    let verdicts: Vec<String> =
        sqlx::query_scalar("SELECT verdict FROM deliveries WHERE event_id = $1 ORDER BY id")
            .bind(id)
            .fetch_all(pool)
            .await
            .unwrap();
    partition.map(|p| (p, verdicts))
}

async fn month_exists(pool: &PgPool, month: NaiveDate) -> bool {
    sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(format!("inbox_events_{}", month.format("%Y_%m")))
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn subscription_decided_by(pool: &PgPool, sub: &str) -> i64 {
    sqlx::query_scalar("SELECT event_id FROM subscriptions WHERE subscription_id = $1")
        .bind(sub)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Last month has a partition too, as it would where the scheduler ran then.
async fn with_last_month(pool: &PgPool, last: NaiveDate) {
    sqlx::query("SELECT inbox_make_months($1, 1)")
        .bind(last)
        .execute(pool)
        .await
        .unwrap();
}

/// Last month's events: the subscription's state (a register names it; a copy of it came
/// too) and an older state of it that lost. This month's: another subscription's.
struct Month {
    named: i64,
    lost: i64,
    newer: i64,
    lost_event: Value,
    named_event: Value,
}

async fn two_months_applied(app: &TestApp, this: NaiveDate, last: NaiveDate) -> Month {
    with_last_month(&app.pool, last).await;
    // Either side of the month's end.
    let named_event = subscription_event("evt_named", "cus_p", "sub_p", at(this) - Days::hours(1));
    let lost_event = subscription_event("evt_lost", "cus_p", "sub_p", at(this) - Days::hours(2));
    let newer_event = subscription_event("evt_newer", "cus_q", "sub_q", at(this));
    let mut ids = Vec::new();
    for event in [&named_event, &named_event, &lost_event, &newer_event] {
        let (_, answer) = app.post("stripe", &stripe_delivery(event)).await;
        ids.push(answer["event_id"].as_i64().unwrap());
        app.run_worker().await;
    }
    let month = Month {
        named: ids[0],
        lost: ids[2],
        newer: ids[3],
        lost_event,
        named_event,
    };
    assert_eq!(app.event(month.named).await.status, "applied");
    assert_eq!(app.event(month.lost).await.status, "ignored");
    assert_eq!(app.event(month.newer).await.status, "applied");
    assert_eq!(
        subscription_decided_by(&app.pool, "sub_p").await,
        month.named
    );
    month
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_month_past_the_retention_is_dropped_keeping_what_a_register_names_and_the_next_month_whole(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    let (this, last) = this_and_last_month();
    let month = two_months_applied(&app, this, last).await;
    let last_partition = format!("inbox_events_{}", last.format("%Y_%m"));
    let this_partition = format!("inbox_events_{}", this.format("%Y_%m"));
    assert_eq!(
        where_stored(&pool, month.named).await,
        Some((
            last_partition.clone(),
            vec!["stored".into(), "duplicate".into()]
        ))
    );

    // A day before last month's end is 6 days old, nothing goes.
    let early = clocked_at(&pool, at(this) + Days::days(5));
    assert_eq!(drop_months(&early, RETENTION).await.unwrap(), vec![]);
    assert!(month_exists(&pool, last).await);

    // Once it is, last month goes whole but for the event the register names, kept under its
    // own id with its first delivery; this month is untouched.
    let later = clocked_at(&pool, at(this) + Days::days(6));
    assert_eq!(
        drop_months(&later, RETENTION).await.unwrap(),
        vec![DroppedMonth {
            month: last,
            dropped: 1,
            kept: 1
        }]
    );
    assert!(!month_exists(&pool, last).await);
    assert!(month_exists(&pool, this).await);
    assert_eq!(
        where_stored(&pool, month.named).await,
        Some(("inbox_events_kept".into(), vec!["stored".into()]))
    );
    assert_eq!(where_stored(&pool, month.lost).await, None);
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM deliveries WHERE event_id = {}",
            month.lost
        ))
        .await,
        0
    );
    assert_eq!(
        where_stored(&pool, month.newer).await,
        Some((this_partition, vec!["stored".into()]))
    );
    assert_eq!(subscription_decided_by(&pool, "sub_p").await, month.named);
    // The fold of the kept events still gives every register.
    let audit = app.audit().await;
    assert!(audit.divergent.is_empty(), "{audit:?}");
    // The kept partition is purged by rows, as before: the named event stays there.
    let purged = shared::inbox::purge::purge(
        &later,
        RETENTION,
        std::time::Instant::now() + std::time::Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(purged, 0);
    assert!(where_stored(&pool, month.named).await.is_some());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_copy_after_its_month_was_dropped_is_stored_once_in_the_kept_partition_and_changes_nothing(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    let (this, last) = this_and_last_month();
    let month = two_months_applied(&app, this, last).await;
    let later = clocked_at(&pool, at(this) + Days::days(6));
    drop_months(&later, RETENTION).await.unwrap();
    let subscriptions_before: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT subscription_id, status, event_id FROM subscriptions ORDER BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();

    // The event that lost, delivered again (a replay from the provider's dashboard): its month
    // is gone, so it is stored anew, in the kept partition, once however often it comes.
    let (_, first) = app
        .post("stripe", &stripe_delivery(&month.lost_event))
        .await;
    assert_eq!(first["status"], "stored");
    let again_id = first["event_id"].as_i64().unwrap();
    assert_ne!(again_id, month.lost);
    let (_, second) = app
        .post("stripe", &stripe_delivery(&month.lost_event))
        .await;
    assert_eq!(second["status"], "duplicate");
    assert_eq!(second["event_id"].as_i64(), Some(again_id));
    assert_eq!(
        where_stored(&pool, again_id).await,
        Some((
            "inbox_events_kept".into(),
            vec!["stored".into(), "duplicate".into()]
        ))
    );
    // The kept event's copy finds it where it was kept.
    let (_, kept_copy) = app
        .post("stripe", &stripe_delivery(&month.named_event))
        .await;
    assert_eq!(kept_copy["status"], "duplicate");
    assert_eq!(kept_copy["event_id"].as_i64(), Some(month.named));

    app.run_worker().await;
    assert_eq!(app.event(again_id).await.status, "ignored");
    let subscriptions_after: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT subscription_id, status, event_id FROM subscriptions ORDER BY 1")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(subscriptions_after, subscriptions_before);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn each_scheduler_run_makes_this_month_and_the_next_two(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let (this, _) = this_and_last_month();
    let months: Vec<NaiveDate> = (0..6).map(|n| this + chrono::Months::new(n)).collect();
    for (n, &month) in months.iter().enumerate() {
        assert_eq!(month_exists(&pool, month).await, n < 3, "{month}");
    }

    // Three months on, the run makes that month and the two after it.
    let mut state = scheduler_for(&app, vec![]);
    state.pool = clocked_at(&pool, at(months[3]) + Days::days(1));
    // A retention longer than the months passed: the run's purge drops none of them.
    state.retention = std::time::Duration::from_secs(120 * 86_400);
    let report = scheduler::run(&state).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.moved_to_their_month, 0);
    for &month in &months {
        assert!(month_exists(&pool, month).await, "{month}");
    }
    // And a second run finds them there.
    let report = scheduler::run(&state).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_event_of_a_month_with_no_partition_is_stored_and_moved_into_it_when_it_is_made(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    let (this, _) = this_and_last_month();
    // The scheduler did not run: this month has no partition (it was made empty, and dropped).
    sqlx::query("SELECT inbox_drop_month($1)")
        .bind(this)
        .execute(&pool)
        .await
        .unwrap();
    assert!(!month_exists(&pool, this).await);

    let event = subscription_event("evt_early", "cus_e", "sub_e", Utc::now() - Days::minutes(1));
    let (_, stored) = app.post("stripe", &stripe_delivery(&event)).await;
    assert_eq!(stored["status"], "stored");
    let id = stored["event_id"].as_i64().unwrap();
    assert_eq!(
        where_stored(&pool, id).await,
        Some(("inbox_events_kept".into(), vec!["stored".into()]))
    );

    // The run makes the month and moves the event into it, under its id, with its delivery,
    // and says so.
    let report = scheduler::run(&scheduler_for(&app, vec![])).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.moved_to_their_month, 1);
    assert_eq!(
        scheduler::emf(&report, Utc::now())["EventsMovedToTheirMonth"],
        1.0
    );
    assert_eq!(
        where_stored(&pool, id).await,
        Some((
            format!("inbox_events_{}", this.format("%Y_%m")),
            vec!["stored".into()]
        ))
    );
    // Its copy is counted on it there, and it applies as any event.
    let (_, copy) = app.post("stripe", &stripe_delivery(&event)).await;
    assert_eq!(copy["status"], "duplicate");
    assert_eq!(copy["event_id"].as_i64(), Some(id));
    app.run_worker().await;
    assert_eq!(app.event(id).await.status, "applied");
    assert_eq!(subscription_decided_by(&pool, "sub_e").await, id);
}
