//! The billing model's rules (docs/design.md §4), one test each, through intake, SQS and worker.

use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::*;

/// Delivers Kinde events (claims) in order, applying each.
async fn kinde(app: &TestApp, events: &[(&str, Value)]) {
    for (webhook_id, claims) in events {
        let (status, body) = app.post("kinde", &kinde_delivery(webhook_id, claims)).await;
        assert_eq!(status, http::StatusCode::OK, "{body}");
        app.run_worker().await;
    }
}

fn plan_event(kind: &str, customer: &str, plan: Option<&str>, at: &str) -> Value {
    let mut data = json!({"customer_id": customer});
    if let Some(plan) = plan {
        data["plan"] = json!({"key": plan});
    }
    json!({"type": kind, "event_timestamp": at, "data": data})
}

async fn ledger_deltas(app: &TestApp, customer: &str, period: &str) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT plan, delta FROM ledger WHERE customer_id = $1 AND period = $2 ORDER BY id",
    )
    .bind(customer)
    .bind(period)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_upgrade_tops_up_by_the_difference_and_a_downgrade_takes_nothing_back(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    kinde(
        &app,
        &[
            (
                "k1",
                plan_event(
                    "customer.plan_changed",
                    "kc_up",
                    Some("pro"),
                    "2026-03-01T00:00:00Z",
                ),
            ),
            (
                "k2",
                plan_event(
                    "customer.plan_changed",
                    "kc_up",
                    Some("team"),
                    "2026-03-05T00:00:00Z",
                ),
            ),
            (
                "k3",
                plan_event(
                    "customer.plan_changed",
                    "kc_up",
                    Some("pro"),
                    "2026-03-10T00:00:00Z",
                ),
            ),
        ],
    )
    .await;

    let account = app.account("kinde", "kc_up", "2026-03").await;
    assert_eq!(account.plan, "pro", "the newest plan change holds");
    assert_eq!(
        account.balance, 2000,
        "the period keeps the largest allowance granted in it"
    );
    assert_eq!(
        ledger_deltas(&app, "kc_up", "2026-03").await,
        [("pro".to_owned(), 500), ("team".to_owned(), 1500)],
        "the upgrade topped up by the difference; the second pro grant was the same entry"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_plan_event_too_old_to_move_the_plan_still_grants_its_own_period(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    kinde(
        &app,
        &[
            (
                "n1",
                plan_event(
                    "customer.plan_changed",
                    "kc_old",
                    Some("team"),
                    "2026-03-20T00:00:00Z",
                ),
            ),
            // Arrives later, happened earlier: the customer did hold pro in February.
            (
                "n2",
                plan_event(
                    "customer.plan_changed",
                    "kc_old",
                    Some("pro"),
                    "2026-02-10T00:00:00Z",
                ),
            ),
        ],
    )
    .await;

    let february = app.account("kinde", "kc_old", "2026-02").await;
    assert_eq!(
        february.plan, "team",
        "the older plan change did not move the register"
    );
    assert_eq!(
        february.balance, 500,
        "but it granted pro for its own period"
    );
    assert_eq!(
        app.account("kinde", "kc_old", "2026-03").await.balance,
        2000
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_payment_grants_the_plan_it_names_and_nothing_when_it_names_none(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let payment = |customer: &str, plan: Option<&str>| {
        let mut event = plan_event(
            "customer.payment_succeeded",
            customer,
            plan,
            "2026-04-02T00:00:00Z",
        );
        event["data"]["payment_id"] = json!(format!("pay_{customer}"));
        event
    };
    kinde(
        &app,
        &[
            ("p1", payment("kc_named", Some("pro"))),
            ("p2", payment("kc_unnamed", None)),
        ],
    )
    .await;

    assert_eq!(
        app.account("kinde", "kc_named", "2026-04").await.balance,
        500
    );
    let unnamed = app.account("kinde", "kc_unnamed", "2026-04").await;
    assert_eq!(unnamed.balance, 0);
    assert_eq!(
        unnamed.payments[0].status, "paid",
        "the payment itself is recorded"
    );
}

fn stripe_subscription(id: &str, customer: &str, status: &str, created: i64) -> Value {
    json!({
        "id": id, "object": "event", "created": created, "type": "customer.subscription.updated",
        "data": {"object": {"id": format!("sub_{customer}"), "object": "subscription", "customer": customer,
                 "status": status, "items": {"data": [{"price": {"id": "price_pro"}}]}}}
    })
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn events_at_the_same_provider_time_are_ordered_by_dedupe_key_whatever_the_arrival(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let at = 1_772_000_000; // Stripe's `created` has one-second resolution: ties happen.
    for (customer, first, second) in [
        ("cus_tie1", "active", "canceled"),
        ("cus_tie2", "canceled", "active"),
    ] {
        let key = |status: &str| {
            format!(
                "evt_{}_{customer}",
                if status == "active" { "a" } else { "b" }
            )
        };
        for status in [first, second] {
            app.post(
                "stripe",
                &stripe_delivery(&stripe_subscription(&key(status), customer, status, at)),
            )
            .await;
            app.run_worker().await;
        }
    }

    // evt_b… sorts after evt_a…: the canceled state wins in both arrival orders.
    for customer in ["cus_tie1", "cus_tie2"] {
        let account = app.account("stripe", customer, "2026-02").await;
        assert_eq!(account.subscriptions[0].status, "canceled", "{customer}");
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn same_second_states_that_differ_only_in_their_ends_are_ordered_by_dedupe_key(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let at = 1_772_000_000;
    let event = |id: &str, customer: &str, cancel: bool| {
        let mut event = stripe_subscription(id, customer, "active", at);
        let object = &mut event["data"]["object"];
        object["current_period_end"] = json!(at + 2_592_000);
        object["cancel_at_period_end"] = json!(cancel);
        object["cancel_at"] = match cancel {
            true => json!(at + 2_592_000),
            false => Value::Null,
        };
        event
    };
    for (customer, cancel_first) in [("cus_ends1", true), ("cus_ends2", false)] {
        // evt_b… (the scheduled cancellation) sorts after evt_a… (none scheduled).
        let scheduled = event(&format!("evt_b_{customer}"), customer, true);
        let running = event(&format!("evt_a_{customer}"), customer, false);
        let order = match cancel_first {
            true => [&scheduled, &running],
            false => [&running, &scheduled],
        };
        for event in order {
            app.post("stripe", &stripe_delivery(event)).await;
            app.run_worker().await;
        }
        let account = app.account("stripe", customer, "2026-02").await;
        let sub = &account.subscriptions[0];
        assert!(sub.cancel_at_period_end, "{customer}");
        assert_eq!(
            sub.cancel_at,
            chrono::DateTime::from_timestamp(at + 2_592_000, 0)
        );
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_deleted_customer_is_a_tombstone_that_late_events_do_not_lift(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let deleted = |customer: &str, created: i64| {
        json!({"id": format!("evt_del_{customer}"), "object": "event", "created": created,
               "type": "customer.deleted", "data": {"object": {"id": customer, "object": "customer"}}})
    };
    let t = 1_772_000_000;
    // One customer hears of its deletion last, the other first; a late `active` arrives after.
    for (customer, order) in [("cus_gone1", ["sub", "del"]), ("cus_gone2", ["del", "sub"])] {
        for what in order {
            let event = match what {
                "sub" => stripe_subscription(&format!("evt_sub_{customer}"), customer, "active", t),
                _ => deleted(customer, t + 60),
            };
            app.post("stripe", &stripe_delivery(&event)).await;
            app.run_worker().await;
        }
        let late =
            stripe_subscription(&format!("evt_late_{customer}"), customer, "active", t + 120);
        app.post("stripe", &stripe_delivery(&late)).await;
        app.run_worker().await;

        let account = app.account("stripe", customer, "2026-02").await;
        assert!(account.deleted, "{customer}");
        assert_eq!(
            account.plan, "free",
            "{customer}: a late event does not resurrect the plan"
        );
    }
}
