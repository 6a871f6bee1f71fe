//! The scheduler's audit: registers compared with the fold of their accounts' events, a
//! difference reported every run while it lasts and recorded once, the walk over all accounts.

use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::{json, Value};
use shared::audit;
use shared::handlers::scheduler::{self, RunReport};
use sqlx::PgPool;

use crate::helpers::*;
use crate::scheduler::{exec, scheduler_for};

/// One account per provider, each from a real signed delivery, applied by the worker.
async fn three_accounts(app: &TestApp) {
    let now = Utc::now().timestamp();
    let (status, _) = app
        .post(
            "stripe",
            &stripe_delivery(&stripe_event("evt_aud", "cus_aud", now)),
        )
        .await;
    assert_eq!(status, http::StatusCode::OK);
    let polar = json!({
        "type": "subscription.active",
        "timestamp": "2026-03-01T00:00:00Z",
        "data": {"id": "sub_paud", "customer_id": "pc_aud", "status": "active",
                 "product_id": "prod_pro", "modified_at": "2026-03-01T00:00:00Z"}
    });
    let (status, _) = app.post("polar", &polar_delivery("msg_aud", &polar)).await;
    assert_eq!(status, http::StatusCode::OK);
    let kinde = json!({
        "type": "customer.plan_assigned", "event_id": "ev_aud",
        "event_timestamp": "2026-03-01T00:00:00Z", "source": "api",
        "data": {"customer_id": "kc_aud", "plan": {"key": "pro", "name": "pro"}}
    });
    let (status, _) = app.post("kinde", &kinde_delivery("wh_aud", &kinde)).await;
    assert_eq!(status, http::StatusCode::OK);
    assert_eq!(app.run_worker().await, 3);
}

fn metric(report: &RunReport, name: &str) -> f64 {
    let line: Value = scheduler::emf(report, Utc::now());
    line[name]
        .as_f64()
        .unwrap_or_else(|| panic!("{name} in {line}"))
}

fn fields(report: &RunReport) -> Vec<String> {
    report.divergences.iter().map(|d| d.field.clone()).collect()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_register_moved_by_hand_is_reported_every_run_recorded_once_and_gone_once_put_back(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    three_accounts(&app).await;
    let scheduler = scheduler_for(&app, vec![]);

    let clean = scheduler::run(&scheduler).await;
    assert!(clean.errors.is_empty(), "{:?}", clean.errors);
    assert_eq!((clean.audited, clean.divergent), (3, 0), "{clean:?}");
    assert_eq!(metric(&clean, "StateDivergence"), 0.0);
    assert_eq!(metric(&clean, "AccountsAudited"), 3.0);

    exec(
        &app,
        "UPDATE subscriptions SET status = 'canceled' WHERE source = 'stripe' AND customer_id = 'cus_aud'",
    )
    .await;
    let mut new = Vec::new();
    for _ in 0..2 {
        let report = scheduler::run(&scheduler).await;
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!(fields(&report), ["subscription:sub_1:status"]);
        let d = &report.divergences[0];
        assert_eq!(
            (d.source.as_str(), d.customer_id.as_str()),
            ("stripe", "cus_aud")
        );
        assert_eq!(
            (&d.stored, &d.folded),
            (&json!("canceled"), &json!("active"))
        );
        assert!(metric(&report, "StateDivergence") >= 1.0);
        assert_eq!(app.count("SELECT count(*) FROM audit_divergences").await, 1);
        new.push(report.new_divergent);
    }
    // Logged the first time only.
    assert_eq!(new, [1, 0]);

    exec(
        &app,
        "UPDATE subscriptions SET status = 'active' WHERE source = 'stripe' AND customer_id = 'cus_aud'",
    )
    .await;
    let back = scheduler::run(&scheduler).await;
    assert_eq!((back.audited, back.divergent), (3, 0), "{back:?}");
    assert_eq!(metric(&back, "StateDivergence"), 0.0);
    assert_eq!(app.count("SELECT count(*) FROM audit_divergences").await, 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_ledger_entry_moved_by_hand_is_a_difference_of_the_period_allowance(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    three_accounts(&app).await;
    exec(
        &app,
        "UPDATE ledger SET delta = delta + 1 WHERE source = 'kinde' AND customer_id = 'kc_aud'",
    )
    .await;
    let report = scheduler::run(&scheduler_for(&app, vec![])).await;
    assert_eq!(fields(&report), ["allowance:2026-03"], "{report:?}");
    assert_eq!(report.divergences[0].customer_id, "kc_aud");
    assert_eq!(report.new_divergent, 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_walk_audits_every_account_a_few_at_a_time_and_wraps(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    three_accounts(&app).await;
    let config = test_audit();
    let far = || Instant::now() + Duration::from_secs(60);
    let mut seen = std::collections::BTreeSet::new();
    let mut wrapped_at = None;
    for n in 1..=4 {
        let report = audit::run(&app.pool, &config.sources, &config.catalog, far(), 1)
            .await
            .unwrap();
        assert!(report.checked <= 1, "run {n}: {report:?}");
        let position: (Option<String>, Option<String>) =
            sqlx::query_as("SELECT after_source, after_customer FROM audit_position")
                .fetch_one(&app.pool)
                .await
                .unwrap();
        if let (Some(source), Some(customer)) = position.clone() {
            seen.insert((source, customer));
        }
        if report.wrapped {
            assert_eq!(position, (None, None), "a wrapped walk starts again");
            wrapped_at.get_or_insert(n);
        }
    }
    let all: std::collections::BTreeSet<(String, String)> =
        sqlx::query_as("SELECT source, customer_id FROM accounts")
            .fetch_all(&app.pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert_eq!(all.len(), 3);
    assert_eq!(seen, all, "every account is walked");
    assert_eq!(wrapped_at, Some(4), "three runs of one, then the end");
    // And again from the start.
    audit::run(&app.pool, &config.sources, &config.catalog, far(), 1)
        .await
        .unwrap();
    let after: Option<String> = sqlx::query_scalar("SELECT after_customer FROM audit_position")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(after.as_deref(), all.iter().next().map(|a| a.1.as_str()));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_account_with_an_event_still_received_is_skipped_not_reported(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    three_accounts(&app).await;
    // A register moved, and the account's next event stored but not applied yet: until it
    // is, the registers are not what its finished events give, and that is no difference.
    exec(
        &app,
        "UPDATE subscriptions SET status = 'past_due' WHERE source = 'stripe' AND customer_id = 'cus_aud'",
    )
    .await;
    let later = Utc::now().timestamp() + 1;
    app.post(
        "stripe",
        &stripe_delivery(&stripe_event("evt_aud_next", "cus_aud", later)),
    )
    .await;
    app.drain_queue().await;

    let report = scheduler::run(&scheduler_for(&app, vec![])).await;
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!((report.audited, report.audit_skipped), (2, 1), "{report:?}");
    assert_eq!(report.divergent, 0);
    assert_eq!(app.count("SELECT count(*) FROM audit_divergences").await, 0);
}

/// Every value a register holds that the app API or `inboxctl account` shows, moved by hand in
/// SQL, is a difference the audit names (and once put back, none): a field the fold does not
/// compare is a state the alarm never sees. `trial_end` and a plan's catalog name were such
/// fields (issue 37); `used:{period}` is `why.rs`'s.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn every_register_field_the_api_shows_moved_by_hand_is_named_by_the_audit(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // A Stripe subscription in trial whose cancellation is scheduled on a date, every end set.
    let t = 1_772_323_200; // 2026-03-01T00:00:00Z
    let subscription = json!({
        "id": "evt_fields", "object": "event", "api_version": "2024-06-20", "created": t,
        "livemode": false, "type": "customer.subscription.updated",
        "data": {"object": {"id": "sub_fields", "object": "subscription", "customer": "cus_fields",
            "status": "trialing", "current_period_end": t + 30 * 86_400,
            "cancel_at_period_end": false, "cancel_at": t + 20 * 86_400,
            "trial_end": t + 14 * 86_400, "ended_at": null,
            "items": {"object": "list", "data": [{"price": {"id": "price_pro"}}]}}}
    });
    let (status, _) = app.post("stripe", &stripe_delivery(&subscription)).await;
    assert_eq!(status, http::StatusCode::OK);
    // Its active entitlements, the whole list (an entitlement register).
    let summary = json!({
        "id": "evt_fields_ent", "object": "event", "api_version": "2025-03-31.basil",
        "created": t, "livemode": false, "type": "entitlements.active_entitlement_summary.updated",
        "data": {"object": {"object": "entitlements.active_entitlement_summary",
            "customer": "cus_fields", "livemode": false,
            "entitlements": {"object": "list", "has_more": false,
                "url": "/v1/customer/cus_fields/entitlements",
                "data": [{"id": "ent_fields", "object": "entitlements.active_entitlement",
                          "feature": "feat_fields", "livemode": false, "lookup_key": "sso"}]}}}
    });
    let (status, _) = app.post("stripe", &stripe_delivery(&summary)).await;
    assert_eq!(status, http::StatusCode::OK);
    // A Kinde customer on pro, paid, then overdue.
    let kinde = |event_type: &str, id: &str, at: &str, data: Value| {
        let mut data = data;
        data["customer_id"] = json!("kc_fields");
        json!({"type": event_type, "event_id": id, "event_timestamp": at, "source": "api", "data": data})
    };
    for (webhook, claims) in [
        (
            "wh_f1",
            kinde(
                "customer.plan_assigned",
                "ev_f1",
                "2026-03-01T00:00:00Z",
                json!({"plan": {"key": "pro"}}),
            ),
        ),
        (
            "wh_f2",
            kinde(
                "customer.payment_succeeded",
                "ev_f2",
                "2026-03-01T00:01:00Z",
                json!({"payment_id": "pay_fields", "plan": {"key": "pro"}}),
            ),
        ),
        (
            "wh_f3",
            kinde(
                "customer.invoice_overdue",
                "ev_f3",
                "2026-03-02T00:00:00Z",
                json!({}),
            ),
        ),
    ] {
        let (status, _) = app.post("kinde", &kinde_delivery(webhook, &claims)).await;
        assert_eq!(status, http::StatusCode::OK);
    }
    assert_eq!(app.run_worker().await, 5);
    // Found clean, each account keeps a checked point: every move below is audited from it.
    assert_eq!(app.audit().await.divergent, []);
    assert_eq!(
        app.count("SELECT count(*) FROM audit_points WHERE state IS NOT NULL")
            .await,
        2,
        "a point per account"
    );

    let stripe = "source = 'stripe' AND customer_id = 'cus_fields'";
    let kinde = "source = 'kinde' AND customer_id = 'kc_fields'";
    // (table, the change, the change undone, the field the audit names)
    let moves = [
        (
            "subscriptions",
            "status = 'past_due'",
            "status = 'trialing'",
            "subscription:sub_fields:status",
        ),
        (
            "subscriptions",
            "plan = 'team'",
            "plan = 'pro'",
            "subscription:sub_fields:plan",
        ),
        (
            "subscriptions",
            "plan_key = 'price_team'",
            "plan_key = 'price_pro'",
            "subscription:sub_fields:plan_key",
        ),
        (
            "subscriptions",
            "current_period_end = current_period_end + interval '1 day'",
            "current_period_end = current_period_end - interval '1 day'",
            "subscription:sub_fields:current_period_end",
        ),
        (
            "subscriptions",
            "cancel_at_period_end = true",
            "cancel_at_period_end = false",
            "subscription:sub_fields:cancel_at_period_end",
        ),
        (
            "subscriptions",
            "cancel_at = cancel_at + interval '1 day'",
            "cancel_at = cancel_at - interval '1 day'",
            "subscription:sub_fields:cancel_at",
        ),
        (
            "subscriptions",
            "trial_end = trial_end + interval '1 day'",
            "trial_end = trial_end - interval '1 day'",
            "subscription:sub_fields:trial_end",
        ),
        (
            "subscriptions",
            "ended_at = '2026-03-03T00:00:00Z'",
            "ended_at = NULL",
            "subscription:sub_fields:ended_at",
        ),
        (
            "ledger",
            "delta = delta + 1",
            "delta = delta - 1",
            "allowance:2026-03",
        ),
        (
            "accounts",
            "deleted_at = '2026-03-03T00:00:00Z'",
            "deleted_at = NULL",
            "deleted",
        ),
        (
            "customer_plans",
            "plan = 'team'",
            "plan = 'pro'",
            "customer_plan",
        ),
        (
            "customer_plans",
            "plan_key = 'team'",
            "plan_key = 'pro'",
            "customer_plan_key",
        ),
        (
            "customer_standing",
            "past_due = false",
            "past_due = true",
            "standing",
        ),
        (
            "payments",
            "status = 'failed'",
            "status = 'paid'",
            "payment:pay_fields:status",
        ),
        (
            "entitlements",
            r#"features = '{"sso": true, "seats": 20}'"#,
            r#"features = '{"sso": true}'"#,
            "entitlement:active_entitlement_summary",
        ),
        (
            "entitlements",
            "active = false",
            "active = true",
            "entitlement:active_entitlement_summary",
        ),
    ];
    for (table, change, undo, field) in moves {
        let account = match table {
            "customer_plans" | "customer_standing" | "payments" => kinde,
            _ => stripe,
        };
        exec(
            &app,
            &format!("UPDATE {table} SET {change} WHERE {account}"),
        )
        .await;
        let found: Vec<String> = app
            .audit()
            .await
            .divergent
            .iter()
            .map(|d| format!("{}/{}", d.customer_id, d.field))
            .collect();
        let customer = if account == stripe {
            "cus_fields"
        } else {
            "kc_fields"
        };
        assert_eq!(
            found,
            [format!("{customer}/{field}")],
            "{table} SET {change}"
        );
        exec(&app, &format!("UPDATE {table} SET {undo} WHERE {account}")).await;
        assert_eq!(app.audit().await.divergent, [], "{table} SET {undo}");
    }
}
