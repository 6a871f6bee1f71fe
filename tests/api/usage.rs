//! Usage (docs/design.md §4.10): the allowance is spent atomically and idempotently, and the
//! account's snapshot tells allowance, used and remaining. Allowances are granted by real
//! Kinde plan events through intake, SQS and worker; debits go through `billing::usage`.

use std::collections::HashSet;

use serde_json::{json, Value};
use shared::billing::account::{self, AccountSnapshot};
use shared::billing::usage::{self, Debit, DebitPeriod, DebitRequest, Debited, Listed};
use shared::domain::{CustomerId, Period};
use sqlx::PgPool;

use crate::helpers::*;

const MARCH: &str = "2026-03";

fn plan_changed(customer: &str, plan: &str, at: &str) -> Value {
    json!({"type": "customer.plan_changed", "event_timestamp": at,
           "data": {"customer_id": customer, "plan": {"key": plan}}})
}

/// `customer` on `plan` from March 1st: its allowance for March is granted.
async fn granted(app: &TestApp, webhook_id: &str, customer: &str, plan: &str, at: &str) {
    let (status, body) = app
        .post(
            "kinde",
            &kinde_delivery(webhook_id, &plan_changed(customer, plan, at)),
        )
        .await;
    assert_eq!(status, http::StatusCode::OK, "{body}");
    app.run_worker().await;
}

fn customer(id: &str) -> CustomerId {
    CustomerId::parse(id).unwrap()
}

fn march() -> Period {
    Period::parse(MARCH).unwrap()
}

fn request<'a>(customer: &'a CustomerId, key: &'a str, amount: i64) -> DebitRequest<'a> {
    DebitRequest {
        source: "kinde",
        customer,
        key,
        amount,
        period: DebitPeriod::Named(march()),
        note: None,
        effects: None,
        meter: None,
        unit: shared::billing::credits::ALLOWANCE_UNIT,
    }
}

async fn debit(pool: &PgPool, req: &DebitRequest<'_>) -> Debited {
    let mut conn = pool.acquire().await.unwrap();
    usage::debit(&mut conn, req).await.unwrap()
}

async fn snapshot(app: &TestApp, id: &str) -> AccountSnapshot {
    let mut conn = app.pool.acquire().await.unwrap();
    account::snapshot(
        &mut conn,
        "kinde",
        &customer(id),
        &march(),
        &app.worker.catalog,
    )
    .await
    .unwrap()
    .unwrap_or_else(|| panic!("{id} exists"))
}

/// A pool with room for many debits at once.
async fn wide_pool(pool: &PgPool, connections: u32) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(connections)
        .connect_with(pool.connect_options().as_ref().clone())
        .await
        .unwrap()
}

fn without_replayed(debit: &Debit) -> Debit {
    match debit.clone() {
        Debit::Accepted {
            usage_id,
            amount,
            period,
            used,
            remaining,
            allocation,
            ..
        } => Debit::Accepted {
            usage_id,
            amount,
            period,
            used,
            remaining,
            replayed: false,
            allocation,
        },
        Debit::Exhausted {
            remaining, remains, ..
        } => Debit::Exhausted {
            remaining,
            replayed: false,
            remains,
        },
        other => other,
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn sixty_four_concurrent_debits_of_ten_against_five_hundred_accept_exactly_fifty(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    granted(&app, "k_pro", "kc_busy", "pro", "2026-03-01T00:00:00Z").await;
    let wide = wide_pool(&app.pool, 16).await;
    let who = customer("kc_busy");
    let keys: Vec<String> = (0..64).map(|n| format!("req_{n}")).collect();
    let answers = futures::future::join_all(keys.iter().map(|key| {
        let (wide, who) = (wide.clone(), who.clone());
        async move { debit(&wide, &request(&who, key, 10)).await }
    }))
    .await;
    let accepted: Vec<&Debited> = answers
        .iter()
        .filter(|a| matches!(a.debit, Debit::Accepted { .. }))
        .collect();
    assert_eq!(accepted.len(), 50);
    assert!(answers.iter().all(|a| matches!(
        a.debit,
        Debit::Accepted { .. } | Debit::Exhausted { remaining: 0, .. }
    )));
    let mut used_after: Vec<i64> = accepted
        .iter()
        .map(|a| match a.debit {
            Debit::Accepted { used, .. } => used,
            _ => unreachable!(),
        })
        .collect();
    used_after.sort();
    assert_eq!(used_after, (1..=50).map(|n| n * 10).collect::<Vec<_>>());
    let account = snapshot(&app, "kc_busy").await;
    assert_eq!(
        (account.allowance, account.used, account.remaining),
        (500, 500, 0)
    );
    let summed: i64 = sqlx::query_scalar(
        "SELECT sum(amount)::bigint FROM usage_debits WHERE customer_id = 'kc_busy' AND accepted",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(summed, 500, "used is the sum of the accepted debits");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_same_key_sent_thirty_times_at_once_debits_once_and_answers_the_same(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    granted(&app, "k_pro", "kc_retry", "pro", "2026-03-01T00:00:00Z").await;
    let wide = wide_pool(&app.pool, 16).await;
    let who = customer("kc_retry");
    let answers = futures::future::join_all((0..30).map(|_| {
        let (wide, who) = (wide.clone(), who.clone());
        async move { debit(&wide, &request(&who, "req_once", 3)).await }
    }))
    .await;
    let first = without_replayed(&answers[0].debit);
    assert!(
        matches!(
            first,
            Debit::Accepted {
                used: 3,
                remaining: 497,
                ..
            }
        ),
        "{first:?}"
    );
    assert!(answers.iter().all(|a| without_replayed(&a.debit) == first));
    let fresh = answers
        .iter()
        .filter(|a| {
            matches!(
                a.debit,
                Debit::Accepted {
                    replayed: false,
                    ..
                }
            )
        })
        .count();
    assert_eq!(fresh, 1, "one answer decided it, the others replayed it");
    assert_eq!(snapshot(&app, "kc_retry").await.used, 3);
    assert_eq!(
        app.count("SELECT count(*) FROM usage_debits").await,
        1,
        "one debit stored"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_refusal_is_stable_under_its_key_after_a_grant_raises_the_allowance(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    granted(&app, "k_pro", "kc_up", "pro", "2026-03-01T00:00:00Z").await;
    let who = customer("kc_up");
    let spent = debit(&app.pool, &request(&who, "req_big", 450)).await;
    assert!(matches!(spent.debit, Debit::Accepted { remaining: 50, .. }));
    let refused = debit(&app.pool, &request(&who, "req_more", 100)).await;
    assert!(matches!(
        refused.debit,
        Debit::Exhausted {
            remaining: 50,
            replayed: false,
            ..
        }
    ));
    // An upgrade later in the month tops the allowance up to 2,000.
    granted(&app, "k_team", "kc_up", "team", "2026-03-10T00:00:00Z").await;
    let account = snapshot(&app, "kc_up").await;
    assert_eq!(
        (
            account.plan.as_str(),
            account.allowance,
            account.used,
            account.remaining
        ),
        ("team", 2000, 450, 1550)
    );
    let again = debit(&app.pool, &request(&who, "req_more", 100)).await;
    assert!(
        matches!(
            &again.debit,
            Debit::Exhausted {
                remaining: 50,
                replayed: true,
                ..
            }
        ),
        "the key answers as it did"
    );
    assert_eq!(without_replayed(&again.debit), refused.debit);
    let new_key = debit(&app.pool, &request(&who, "req_more_2", 100)).await;
    assert!(matches!(
        new_key.debit,
        Debit::Accepted {
            used: 550,
            remaining: 1450,
            ..
        }
    ));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_key_reused_with_another_amount_period_or_note_is_a_conflict(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    granted(&app, "k_pro", "kc_reuse", "pro", "2026-03-01T00:00:00Z").await;
    let who = customer("kc_reuse");
    let first = DebitRequest {
        note: Some("export"),
        ..request(&who, "req_1", 5)
    };
    assert!(matches!(
        debit(&app.pool, &first).await.debit,
        Debit::Accepted { .. }
    ));
    let other_amount = DebitRequest {
        amount: 6,
        ..first.clone()
    };
    let other_period = DebitRequest {
        period: DebitPeriod::Named(Period::parse("2026-04").unwrap()),
        ..first.clone()
    };
    let other_note = DebitRequest {
        note: None,
        ..first.clone()
    };
    for reuse in [other_amount, other_period, other_note] {
        assert_eq!(debit(&app.pool, &reuse).await.debit, Debit::KeyConflict);
    }
    assert_eq!(snapshot(&app, "kc_reuse").await.used, 5);
}

/// The Polar corpus's file `name`, as Polar sends it.
fn polar(name: &str) -> Value {
    crate::corpus::corpus("polar")
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("testdata/providers/polar/{name}.json"))
        .1
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_debit_on_a_deleted_or_unknown_customer_is_refused_and_not_stored(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = shared::domain::Catalog::parse(crate::corpus::CORPUS_PLANS).unwrap();
    let nobody = customer("kc_nobody");
    assert_eq!(
        debit(&app.pool, &request(&nobody, "req_1", 1)).await.debit,
        Debit::UnknownCustomer
    );
    // Polar's subscription.active of 2025-12 grants that month's allowance.
    let id = "c1a124cb-d614-4eeb-91b9-1802cb91d276";
    let mut deleted = polar("customer.deleted");
    deleted["data"]["id"] = id.into();
    deleted["data"]["external_id"] = Value::Null;
    app.post(
        "polar",
        &polar_delivery("msg_active", &polar("subscription.active")),
    )
    .await;
    app.run_worker().await;
    let gone = customer(id);
    let december = Period::parse("2025-12").unwrap();
    let in_polar = |key: &'static str| DebitRequest {
        source: "polar",
        period: DebitPeriod::Named(december.clone()),
        ..request(&gone, key, 1)
    };
    let before = debit(&app.pool, &in_polar("req_before")).await;
    assert!(
        matches!(before.debit, Debit::Accepted { used: 1, .. }),
        "{before:?}"
    );
    app.post("polar", &polar_delivery("msg_deleted", &deleted))
        .await;
    app.run_worker().await;
    assert_eq!(
        debit(&app.pool, &in_polar("req_after")).await.debit,
        Debit::CustomerDeleted
    );
    let replay = debit(&app.pool, &in_polar("req_before")).await;
    assert!(
        matches!(replay.debit, Debit::Accepted { replayed: true, .. }),
        "a key decided before the deletion keeps its answer"
    );
    let mut conn = app.pool.acquire().await.unwrap();
    let account = account::snapshot(&mut conn, "polar", &gone, &december, &app.worker.catalog)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            account.plan.as_str(),
            account.deleted,
            account.allowance,
            account.used,
            account.remaining
        ),
        ("free", true, 0, 1, 0)
    );
    assert_eq!(app.count("SELECT count(*) FROM usage_debits").await, 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_first_exhaustion_of_a_period_is_told_once_with_effects_on(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    app.enable_effects().await;
    granted(&app, "k_pro", "kc_out", "pro", "2026-03-01T00:00:00Z").await;
    let who = customer("kc_out");
    let catalog = app.worker.catalog.clone();
    let with_effects = |key: &'static str, amount: i64| DebitRequest {
        effects: Some(&catalog),
        ..request(&who, key, amount)
    };
    let partial = debit(&app.pool, &with_effects("req_1", 200)).await;
    assert_eq!(partial.told, None);
    let last = debit(&app.pool, &with_effects("req_2", 300)).await;
    assert!(matches!(last.debit, Debit::Accepted { remaining: 0, .. }));
    let told = last
        .told
        .clone()
        .expect("the debit that left nothing tells it");
    let refused = debit(&app.pool, &with_effects("req_3", 1)).await;
    assert!(matches!(
        refused.debit,
        Debit::Exhausted { remaining: 0, .. }
    ));
    assert_eq!(refused.told, None, "told once per period");
    let replayed = debit(&app.pool, &with_effects("req_2", 300)).await;
    assert_eq!(replayed.told, None);
    let effects: Vec<EffectRow> = app
        .effects()
        .await
        .into_iter()
        .filter(|e| e.kind == "billing.allowance_exhausted")
        .collect();
    assert_eq!(effects.len(), 1);
    let effect = &effects[0];
    assert_eq!(effect.id, told);
    assert_eq!(effect.event_id, None);
    assert_eq!(effect.status, "pending");
    assert!(
        effect.enqueued_at.is_some(),
        "marked: the API sends it, the rescue if not"
    );
    let body = &effect.body;
    assert_eq!(body["id"], told.as_str());
    assert_eq!(body["type"], "billing.allowance_exhausted");
    assert!(body["occurred_at"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));
    let data = &body["data"];
    assert_eq!(data["customer_id"], "kc_out");
    assert_eq!(data["period"], MARCH);
    assert_eq!(
        data["account"],
        json!({"plan": "pro", "features": {}, "period": MARCH, "balance": 500, "used": 500, "remaining": 0})
    );
    assert_eq!(data["usage"]["idempotency_key"], "req_2");
    assert_eq!(data["sequence"], effect.sequence);
    let sequences: HashSet<i64> = app.effects().await.iter().map(|e| e.sequence).collect();
    assert_eq!(
        sequences.len(),
        app.effects().await.len(),
        "the account's sequence numbers stay distinct"
    );
    // Another period is another exhaustion.
    let april = DebitRequest {
        period: DebitPeriod::Named(Period::parse("2026-04").unwrap()),
        ..with_effects("req_april", 1)
    };
    let other = debit(&app.pool, &april).await;
    assert!(matches!(other.debit, Debit::Exhausted { remaining: 0, .. }));
    assert!(other.told.is_some_and(|id| id != told));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn without_effects_no_exhaustion_is_written(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    granted(&app, "k_pro", "kc_quiet", "pro", "2026-03-01T00:00:00Z").await;
    let who = customer("kc_quiet");
    let spent = debit(&app.pool, &request(&who, "req_1", 500)).await;
    assert!(matches!(spent.debit, Debit::Accepted { remaining: 0, .. }));
    assert_eq!(spent.told, None);
    assert_eq!(app.count("SELECT count(*) FROM effects").await, 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_snapshot_version_moves_with_each_accepted_debit_and_each_event(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    granted(&app, "k_pro", "kc_v", "pro", "2026-03-01T00:00:00Z").await;
    let who = customer("kc_v");
    let start = snapshot(&app, "kc_v").await;
    assert_eq!(
        (
            start.plan.as_str(),
            start.entitled,
            start.allowance,
            start.used,
            start.remaining
        ),
        ("pro", true, 500, 0, 500)
    );
    debit(&app.pool, &request(&who, "req_1", 3)).await;
    let after_debit = snapshot(&app, "kc_v").await;
    assert!(after_debit.version > start.version);
    assert_eq!((after_debit.used, after_debit.remaining), (3, 497));
    debit(&app.pool, &request(&who, "req_1", 3)).await;
    assert_eq!(
        snapshot(&app, "kc_v").await.version,
        after_debit.version,
        "a replayed key moves nothing"
    );
    granted(&app, "k_team", "kc_v", "team", "2026-03-02T00:00:00Z").await;
    let after_event = snapshot(&app, "kc_v").await;
    assert!(after_event.version > after_debit.version);
    assert_eq!(after_event.allowance, 2000);
    // The operators' view tells the same: balance is the allowance.
    let view = app.account("kinde", "kc_v", MARCH).await;
    assert_eq!((view.balance, view.used, view.remaining), (2000, 3, 1997));
    let json = serde_json::to_value(&after_event).unwrap();
    for field in [
        "source",
        "customer_id",
        "plan",
        "entitled",
        "deleted",
        "period",
        "allowance",
        "used",
        "remaining",
        "subscriptions",
        "version",
    ] {
        assert!(json.get(field).is_some(), "{field}");
    }
    assert!(
        json.get("customer_plan").is_none(),
        "operators' fields stay out"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_usage_list_pages_through_the_accepted_debits_of_the_period(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    granted(&app, "k_pro", "kc_list", "pro", "2026-03-01T00:00:00Z").await;
    let who = customer("kc_list");
    for n in 0..5 {
        let key = format!("req_{n}");
        let req = DebitRequest {
            note: Some("batch"),
            ..request(&who, &key, 100)
        };
        debit(&app.pool, &req).await;
    }
    // Refused: not usage.
    debit(&app.pool, &request(&who, "req_refused", 1)).await;
    let mut conn = app.pool.acquire().await.unwrap();
    let mut keys = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let Listed::Page(page) =
            usage::list(&mut conn, "kinde", &who, &march(), 2, after.as_deref())
                .await
                .unwrap()
        else {
            panic!("a page after {after:?}");
        };
        pages += 1;
        assert_eq!((page.allowance, page.used, page.remaining), (500, 500, 0));
        keys.extend(page.usage.iter().map(|l| l.idempotency_key.clone()));
        assert!(page
            .usage
            .iter()
            .all(|l| l.note.as_deref() == Some("batch")));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(keys, ["req_0", "req_1", "req_2", "req_3", "req_4"]);
    let unknown = usage::list(
        &mut conn,
        "kinde",
        &customer("kc_nobody"),
        &march(),
        2,
        None,
    )
    .await
    .unwrap();
    assert_eq!(unknown, Listed::UnknownCustomer);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_effects_account_block_tells_used_and_remaining_beside_balance(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    app.enable_effects().await;
    granted(&app, "k_pro", "kc_block", "pro", "2026-03-01T00:00:00Z").await;
    let who = customer("kc_block");
    debit(&app.pool, &request(&who, "req_1", 120)).await;
    granted(&app, "k_team", "kc_block", "team", "2026-03-05T00:00:00Z").await;
    let effects = app.effects().await;
    let plan = effects
        .iter()
        .rfind(|e| e.kind == "billing.plan_changed")
        .expect("the upgrade is told");
    assert_eq!(
        plan.body["data"]["account"],
        json!({"plan": "team", "features": {}, "period": MARCH, "balance": 2000, "used": 120,
               "remaining": 1880})
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn replay_and_purge_leave_the_debits_as_they_are(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    granted(&app, "k_pro", "kc_keep", "pro", "2026-03-01T00:00:00Z").await;
    let who = customer("kc_keep");
    debit(&app.pool, &request(&who, "req_1", 42)).await;
    let event_id = app.event_id("kinde", "k_pro").await;
    shared::inbox::replay::replay(&app.pool, &app.state.queue, &[event_id])
        .await
        .unwrap();
    app.run_worker().await;
    let purged = shared::inbox::purge::purge(
        &app.pool,
        std::time::Duration::ZERO,
        std::time::Instant::now() + std::time::Duration::from_secs(30),
    )
    .await
    .unwrap();
    // The plan register and the grant name the event: the fold needs it, so it stays
    // (docs/design.md §3.9); the purge ran, and the debits are as they were.
    assert_eq!(purged, 0, "the event the registers name is kept");
    let account = snapshot(&app, "kc_keep").await;
    assert_eq!(
        (account.allowance, account.used, account.remaining),
        (500, 42, 458)
    );
    let replay = debit(&app.pool, &request(&who, "req_1", 42)).await;
    assert!(matches!(
        replay.debit,
        Debit::Accepted {
            used: 42,
            replayed: true,
            ..
        }
    ));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_debit_in_flight_leaves_the_account_row_to_the_workers_unlocked_commit(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    granted(&app, "k_pro", "kc_hot", "pro", "2026-03-01T00:00:00Z").await;
    let who = customer("kc_hot");
    // A first debit makes the period's row, so the one in flight below only adds a debit.
    debit(&app.pool, &request(&who, "req_0", 1)).await;
    let mut in_flight = app.pool.begin().await.unwrap();
    let open = usage::debit(&mut in_flight, &request(&who, "req_1", 1))
        .await
        .unwrap();
    assert!(matches!(open.debit, Debit::Accepted { .. }));
    // What the worker's commit asks of the account row (inbox::commit's `as_read`): a debit
    // that holds the row (a foreign key's KEY SHARE does) sends every event of a busy
    // account down the locked path.
    let mut worker_side = app.pool.acquire().await.unwrap();
    let free: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM accounts WHERE source = 'kinde' AND customer_id = 'kc_hot'
         FOR UPDATE SKIP LOCKED",
    )
    .fetch_optional(&mut *worker_side)
    .await
    .unwrap();
    in_flight.commit().await.unwrap();
    assert_eq!(free, Some(1), "the account row is not held by the debit");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_exhaustion_told_and_purged_is_not_told_again(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    app.enable_effects().await;
    granted(&app, "k_pro", "kc_purged", "pro", "2026-03-01T00:00:00Z").await;
    let who = customer("kc_purged");
    let catalog = app.worker.catalog.clone();
    let with_effects = |key: &'static str, amount: i64| DebitRequest {
        effects: Some(&catalog),
        ..request(&who, key, amount)
    };
    let last = debit(&app.pool, &with_effects("req_all", 500)).await;
    assert!(last.told.is_some());
    // Delivered, and purged after the retention as every sent effect is.
    sqlx::query("UPDATE effects SET status = 'sent', sent_at = inbox_now() - interval '40 days'")
        .execute(&app.pool)
        .await
        .unwrap();
    let purged = shared::effects::outbox::purge(
        &app.pool,
        std::time::Duration::from_secs(30 * 86_400),
        std::time::Instant::now() + std::time::Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert!(purged >= 1);
    let refused = debit(&app.pool, &with_effects("req_more", 1)).await;
    assert!(matches!(
        refused.debit,
        Debit::Exhausted { remaining: 0, .. }
    ));
    assert_eq!(
        refused.told, None,
        "the period was told once, and it stays told"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM effects WHERE kind = 'billing.allowance_exhausted'")
            .await,
        0
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_published_view_tells_each_periods_allowance_used_and_remaining(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    granted(&app, "k_pro", "kc_view", "pro", "2026-03-01T00:00:00Z").await;
    let who = customer("kc_view");
    debit(&app.pool, &request(&who, "req_1", 120)).await;
    let april = DebitRequest {
        period: DebitPeriod::Named(Period::parse("2026-04").unwrap()),
        ..request(&who, "req_2", 5)
    };
    debit(&app.pool, &april).await;
    let rows: Vec<(String, String, String, bool, i64, i64, i64)> = sqlx::query_as(
        "SELECT source, customer_id, period, deleted, allowance, used, remaining
         FROM billing_allowance ORDER BY period",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let row = |period: &str, allowance, used, remaining| {
        (
            "kinde".to_owned(),
            "kc_view".to_owned(),
            period.to_owned(),
            false,
            allowance,
            used,
            remaining,
        )
    };
    // April has no grant: its refused debit made the period's row, with nothing in it.
    assert_eq!(
        rows,
        [row("2026-03", 500, 120, 380), row("2026-04", 0, 0, 0)]
    );
    let account = snapshot(&app, "kc_view").await;
    assert_eq!(
        (account.allowance, account.used, account.remaining),
        (rows[0].4, rows[0].5, rows[0].6),
        "the view and the snapshot agree"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_request_naming_no_period_is_the_same_request_in_a_later_month(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    granted(&app, "k_pro", "kc_late", "pro", "2026-03-01T00:00:00Z").await;
    let who = customer("kc_late");
    let arrived = |period: &str| DebitRequest {
        period: DebitPeriod::Arrival(Period::parse(period).unwrap()),
        ..request(&who, "req_eom", 4)
    };
    let first = debit(&app.pool, &arrived(MARCH)).await.debit;
    assert!(
        matches!(
            &first,
            Debit::Accepted {
                used: 4,
                replayed: false,
                ..
            }
        ),
        "{first:?}"
    );
    let retried = debit(&app.pool, &arrived("2026-04")).await.debit;
    assert_eq!(
        without_replayed(&retried),
        first,
        "the first answer, in March"
    );
    assert!(matches!(retried, Debit::Accepted { replayed: true, .. }));
    // A month named is another request, even the month the first one spent.
    let named = request(&who, "req_eom", 4);
    assert_eq!(debit(&app.pool, &named).await.debit, Debit::KeyConflict);
    // And the other way round: a key that named its month conflicts with naming none.
    debit(&app.pool, &request(&who, "req_named", 1)).await;
    let unnamed = DebitRequest {
        period: DebitPeriod::Arrival(march()),
        ..request(&who, "req_named", 1)
    };
    assert_eq!(debit(&app.pool, &unnamed).await.debit, Debit::KeyConflict);
    assert_eq!(snapshot(&app, "kc_late").await.used, 5);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_debit_stored_before_its_request_was_kept_whole_answers_either_request(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    granted(&app, "k_pro", "kc_old", "pro", "2026-03-01T00:00:00Z").await;
    // The release before this one calls the 8-argument function while the next deploys.
    let outcome: String = sqlx::query_scalar(
        "SELECT outcome
         FROM inbox_debit('kinde', 'kc_old', 'req_old', 6, '2026-03', NULL, 'use_old', NULL)",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(outcome, "accepted");
    let period_named: Option<bool> =
        sqlx::query_scalar("SELECT period_named FROM usage_debits WHERE usage_id = 'use_old'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(period_named, None, "not known");
    let who = customer("kc_old");
    let named = request(&who, "req_old", 6);
    let unnamed = DebitRequest {
        period: DebitPeriod::Arrival(Period::parse("2026-04").unwrap()),
        ..named.clone()
    };
    for asked in [named, unnamed] {
        let answer = debit(&app.pool, &asked).await.debit;
        assert!(
            matches!(&answer, Debit::Accepted { usage_id, used: 6, replayed: true, period, .. }
                if usage_id == "use_old" && *period == march()),
            "{answer:?}"
        );
    }
}
