//! The fold of an account's events (docs/design.md §4.11) through the real pipeline: `why`
//! names the event that decided each field and those it beat, `--at` and `--received-before`
//! give the state at a past time, and the audit finds a register moved by anything but its
//! events.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::helpers::*;
use crate::scenarios::{deliver_subscription_steps, SUBSCRIPTION_STEPS};

fn at(rfc3339: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(rfc3339)
        .unwrap()
        .with_timezone(&Utc)
}

pub(crate) fn field<'a>(why: &'a Why, name: &str) -> &'a shared::audit::WhyField {
    why.fields
        .iter()
        .find(|f| f.field == name)
        .unwrap_or_else(|| panic!("{name} in {:#?}", why.fields))
}

/// The deciding event's key, and the keys and reasons of those it beat.
pub(crate) async fn decided(
    app: &TestApp,
    why: &Why,
    name: &str,
) -> (Option<String>, Vec<(String, String)>) {
    let f = field(why, name);
    let key = |id: i64| async move {
        sqlx::query_scalar::<_, String>("SELECT dedupe_key FROM inbox_events WHERE id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .unwrap()
    };
    let by = match &f.decided_by {
        Some(e) => Some(key(e.event_id).await),
        None => None,
    };
    let mut beaten = Vec::new();
    for b in &f.beaten {
        beaten.push((key(b.event_id).await, b.reason.to_owned()));
    }
    beaten.sort();
    (by, beaten)
}

async fn now(app: &TestApp) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT inbox_now()")
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn why_names_the_events_that_decided_the_subscriptions_scenario(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    deliver_subscription_steps(&app, "w", &[0, 1, 2, 3, 4, 5, 6]).await;
    let why = app.why("polar", "pc_w", Cut::default()).await;
    assert!(why.divergent.is_empty(), "{:?}", why.divergent);
    let plan = field(&why, "plan");
    assert_eq!(plan.value, json!("free"));
    // Free since sub_new's revocation of 05-01, the latest write to an entitling register.
    assert_eq!(decided(&app, &why, "plan").await.0.as_deref(), Some("m7_w"));
    let by = plan.decided_by.as_ref().unwrap();
    assert_eq!(
        (by.event_type.as_str(), by.via, by.replayed),
        (
            "subscription.revoked",
            shared::billing::fold::Via::Webhook,
            false
        )
    );
    assert_eq!(by.occurred_at, at("2026-05-01T00:00:00Z"));
    // sub_old: its 02-01 revocation set it; every earlier state is older, and the 04-01
    // revocation, which holds the version, found it revoked already (its log line:
    // ignored), as the log tells it.
    let (by, beaten) = decided(&app, &why, "subscription:sub_old_w:status").await;
    assert_eq!(by.as_deref(), Some("m2_w"));
    let older = |keys: &[&str]| {
        keys.iter()
            .map(|k| (k.to_string(), "older".to_owned()))
            .collect::<Vec<_>>()
    };
    let mut expected = older(&["m1_w", "m3_w"]);
    expected.push(("m5_w".to_owned(), "already held".to_owned()));
    assert_eq!(beaten, expected);
    assert_eq!(
        field(&why, "subscription:sub_old_w:status").value,
        json!("canceled")
    );
    let (by, beaten) = decided(&app, &why, "subscription:sub_new_w:status").await;
    assert_eq!(by.as_deref(), Some("m7_w"));
    assert_eq!(beaten, older(&["m4_w", "m6_w"]));
    // Each month a subscription was active in was granted pro's allowance once.
    let (by, _) = decided(&app, &why, "allowance:2026-01").await;
    assert!(
        by.as_deref() == Some("m1_w") || by.as_deref() == Some("m3_w"),
        "{by:?}"
    );
    assert_eq!(field(&why, "allowance:2026-03").value, json!(500));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn as_of_each_step_of_the_subscriptions_scenario_gives_its_plan(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    // What the store knew after each delivery: the plans of the reference table (§4.9).
    let mut known = Vec::new();
    for i in 0..SUBSCRIPTION_STEPS.len() {
        deliver_subscription_steps(&app, "a", &[i]).await;
        known.push(now(&app).await);
    }
    let plan = |why: &Why| field(why, "plan").value.clone();
    let mut plans = Vec::new();
    for t in &known {
        let cut = Cut {
            received_before: Some(*t),
            ..Cut::default()
        };
        plans.push(plan(&app.why("polar", "pc_a", cut).await));
    }
    assert_eq!(
        plans,
        ["pro", "free", "free", "pro", "pro", "pro", "free"].map(|p| json!(p))
    );
    // And by the provider's time: the state the events give up to each instant.
    for (instant, expected) in [
        ("2026-01-01T00:00:00Z", "pro"),
        ("2026-01-31T00:00:00Z", "pro"),
        ("2026-02-01T00:00:00Z", "free"),
        ("2026-02-15T00:00:00Z", "free"),
        ("2026-03-01T00:00:00Z", "pro"),
        ("2026-04-01T00:00:00Z", "pro"),
        ("2026-05-01T00:00:00Z", "free"),
    ] {
        let cut = Cut {
            at: Some(at(instant)),
            ..Cut::default()
        };
        assert_eq!(
            plan(&app.why("polar", "pc_a", cut).await),
            json!(expected),
            "at {instant}"
        );
    }
    // Before the first event the account had nothing.
    let cut = Cut {
        at: Some(at("2025-12-31T00:00:00Z")),
        ..Cut::default()
    };
    let before = app.why("polar", "pc_a", cut).await;
    assert_eq!(plan(&before), json!("free"));
    assert_eq!(field(&before, "plan").decided_by, None);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_register_moved_by_hand_is_found_by_the_audit_and_by_why(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    deliver_subscription_steps(&app, "h", &[0, 1, 2, 3, 4, 5, 6]).await;
    let clean = app.audit().await;
    assert_eq!((clean.checked, clean.divergent.len()), (1, 0), "{clean:?}");

    sqlx::query("UPDATE subscriptions SET status = 'active' WHERE subscription_id = 'sub_new_h'")
        .execute(&app.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE ledger SET delta = delta + 100 WHERE period = '2026-03'")
        .execute(&app.pool)
        .await
        .unwrap();
    let found = app.audit().await;
    let fields: Vec<(&str, Value, Value)> = found
        .divergent
        .iter()
        .map(|d| (d.field.as_str(), d.stored.clone(), d.folded.clone()))
        .collect();
    assert_eq!(
        fields,
        [
            ("allowance:2026-03", json!(600), json!(500)),
            (
                "subscription:sub_new_h:status",
                json!("active"),
                json!("canceled")
            ),
        ]
    );
    assert!(found
        .divergent
        .iter()
        .all(|d| d.customer_id == "pc_h" && d.source == "polar"));

    let why = app.why("polar", "pc_h", Cut::default()).await;
    assert_eq!(
        why.divergent,
        ["allowance:2026-03", "subscription:sub_new_h:status"]
    );
    let status = field(&why, "subscription:sub_new_h:status");
    // Its deciding event says canceled; the register holds what no event gave.
    assert_eq!(
        (status.value.clone(), status.stored.clone()),
        (json!("canceled"), Some(json!("active")))
    );
    assert_eq!(
        decided(&app, &why, "subscription:sub_new_h:status")
            .await
            .0
            .as_deref(),
        Some("m7_h")
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_account_purged_down_to_what_its_registers_name_still_folds_to_them(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    deliver_subscription_steps(&app, "p", &[0, 1, 2, 3, 4, 5, 6]).await;
    sqlx::query("UPDATE inbox_events SET received_at = now() - interval '40 days'")
        .execute(&app.pool)
        .await
        .unwrap();
    let purged = shared::inbox::purge::purge(
        &app.pool,
        std::time::Duration::from_secs(30 * 86_400),
        std::time::Instant::now() + std::time::Duration::from_secs(30),
    )
    .await
    .unwrap();
    // The events that lost their register and granted nothing go.
    assert!(purged > 0);
    let audit = app.audit().await;
    assert_eq!((audit.checked, audit.divergent.len()), (1, 0), "{audit:?}");
    let why = app.why("polar", "pc_p", Cut::default()).await;
    assert_eq!(field(&why, "plan").value, json!("free"));
    assert_eq!(why.purged, purged as i64);
    // What the purge took is named: the answer is whole from its latest event on.
    assert!(why.complete_from.is_some());
}
