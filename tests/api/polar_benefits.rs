//! Polar benefit grants as features (docs/design.md §6.3): each grant is its own entitlement
//! register, ordered by the grant's time; a feature stays while any active grant gives it and
//! goes with the last one, in every arrival order, copies changing nothing, and
//! `billing.features_changed` told only when the account's set of features moves.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use shared::domain::{CustomerId, Features, Period};
use sqlx::PgPool;

use crate::corpus::corpus;
use crate::helpers::*;

/// A grant event of the Polar corpus's SSO grant, made `grant`'s (for `customer`, from a
/// subscription of its own) at `at`: granted (`benefit_grant.created`; a grant revoked
/// before is granted again in place) or revoked.
fn grant_event(grant: &str, customer: &str, granted: bool, at: &str) -> Value {
    let name = if granted {
        "benefit_grant.created"
    } else {
        "benefit_grant.revoked"
    };
    let mut p = corpus("polar")
        .into_iter()
        .find(|(n, _)| n == name)
        .expect("the Polar corpus has its benefit grants")
        .1;
    p["timestamp"] = json!(at);
    let data = &mut p["data"];
    data["id"] = json!(grant);
    data["subscription_id"] = json!(format!("sub_of_{grant}"));
    data["customer_id"] = json!(customer);
    data["user_id"] = json!(customer);
    data["customer"]["id"] = json!(customer);
    data["modified_at"] = json!(at);
    if granted {
        data["granted_at"] = json!(at);
    } else {
        data["revoked_at"] = json!(at);
    }
    p
}

/// One delivery of a test's event set: its grant, whether it grants, and its time.
#[derive(Clone, Copy)]
struct Grant {
    grant: &'static str,
    granted: bool,
    at: &'static str,
}

impl Grant {
    fn label(&self) -> String {
        let what = if self.granted { "granted" } else { "revoked" };
        format!("{}_{what}_{}", self.grant, self.at)
    }
}

/// What the account's features must be once `delivered` are applied, whatever their order:
/// each grant as its latest event says, `sso` while any grant is active.
fn expected(delivered: &[Grant]) -> Features {
    let mut latest: BTreeMap<&str, Grant> = BTreeMap::new();
    for g in delivered {
        if latest.get(g.grant).is_none_or(|held| held.at < g.at) {
            latest.insert(g.grant, *g);
        }
    }
    let mut features = Features::new();
    if latest.values().any(|g| g.granted) {
        features.insert("sso".into(), shared::domain::FeatureValue::Flag(true));
    }
    features
}

/// Every order of `n` items.
fn orders(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for rest in orders(n - 1) {
        for at in 0..=rest.len() {
            let mut order = rest.clone();
            order.insert(at, n - 1);
            all.push(order);
        }
    }
    all
}

/// The account's features as the app reads them (the snapshot).
async fn features(app: &TestApp, customer: &str) -> Features {
    let mut conn = app.pool.acquire().await.unwrap();
    let customer = CustomerId::parse(customer).unwrap();
    let period = Period::parse("2026-01").unwrap();
    shared::billing::account::snapshot(&mut conn, "polar", &customer, &period, &app.worker.catalog)
        .await
        .unwrap()
        .map(|s| s.features)
        .unwrap_or_default()
}

/// Delivers `g` for `customer` and works it; the intake's answer.
async fn deliver(app: &TestApp, customer: &str, g: &Grant) -> String {
    let body = grant_event(g.grant, customer, g.granted, g.at);
    let id = format!("msg_{customer}_{}", g.label());
    let (status, answer) = app.post("polar", &polar_delivery(&id, &body)).await;
    assert_eq!(status, 200, "{answer}");
    app.run_worker().await;
    answer["status"].as_str().unwrap().to_owned()
}

/// The `billing.features_changed` effects of `customer`, in sequence order: (added, removed).
async fn features_changed(app: &TestApp, customer: &str) -> Vec<(Value, Value)> {
    app.effects()
        .await
        .into_iter()
        .filter(|e| e.customer_id == customer && e.kind == "billing.features_changed")
        .map(|e| {
            (
                e.body["data"]["added"].clone(),
                e.body["data"]["removed"].clone(),
            )
        })
        .collect()
}

/// Delivers `set` for a customer of its own in every order, and after each delivery checks
/// the account's features against [`expected`], and the effects against each move of the
/// set; then every delivery again, each a copy that changes nothing.
async fn in_every_order(app: &TestApp, name: &str, set: &[Grant]) -> Vec<Features> {
    let mut ends = Vec::new();
    for (n, order) in orders(set.len()).into_iter().enumerate() {
        let customer = format!("{name}_{n}");
        let mut delivered = Vec::new();
        let mut moves = Vec::new();
        let mut before = Features::new();
        for &i in &order {
            assert_eq!(deliver(app, &customer, &set[i]).await, "stored");
            delivered.push(set[i]);
            let want = expected(&delivered);
            let have = features(app, &customer).await;
            assert_eq!(have, want, "{customer}: after {}", set[i].label());
            if want != before {
                let added: Vec<&String> =
                    want.keys().filter(|k| !before.contains_key(*k)).collect();
                let removed: Vec<&String> =
                    before.keys().filter(|k| !want.contains_key(*k)).collect();
                moves.push((json!(added), json!(removed)));
            }
            before = want;
        }
        assert_eq!(
            features_changed(app, &customer).await,
            moves,
            "{customer}: told once for each move of the set, and only then"
        );
        for &i in &order {
            assert_eq!(deliver(app, &customer, &set[i]).await, "duplicate");
        }
        assert_eq!(features(app, &customer).await, before, "{customer}: copies");
        assert_eq!(
            features_changed(app, &customer).await,
            moves,
            "{customer}: copies tell nothing"
        );
        ends.push(before);
    }
    ends
}

const G1_GRANTED: Grant = Grant {
    grant: "g1",
    granted: true,
    at: "2026-01-05T10:00:00.100000Z",
};
const G2_GRANTED: Grant = Grant {
    grant: "g2",
    granted: true,
    at: "2026-01-06T10:00:00.100000Z",
};
const G1_REVOKED: Grant = Grant {
    grant: "g1",
    granted: false,
    at: "2026-01-20T10:00:00.100000Z",
};
const G2_REVOKED: Grant = Grant {
    grant: "g2",
    granted: false,
    at: "2026-01-21T10:00:00.100000Z",
};

async fn benefits_app(pool: PgPool) -> TestApp {
    let mut app = TestApp::spawn(pool).await;
    app.enable_effects().await;
    app
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_feature_two_polar_grants_give_stays_until_the_last_is_revoked_in_every_order(
    pool: PgPool,
) {
    let app = benefits_app(pool).await;
    let sso = expected(&[G1_GRANTED]);
    // One of the two revoked: sso stays, whichever came first.
    let ends = in_every_order(&app, "one_left", &[G1_GRANTED, G2_GRANTED, G1_REVOKED]).await;
    assert_eq!(ends.len(), 6);
    assert!(ends.iter().all(|f| *f == sso), "{ends:?}");
    // Both revoked: gone, in all 24 orders (each prefix checked on the way).
    let all = [G1_GRANTED, G2_GRANTED, G1_REVOKED, G2_REVOKED];
    let ends = in_every_order(&app, "none_left", &all).await;
    assert_eq!(ends.len(), 24);
    assert!(ends.iter().all(Features::is_empty), "{ends:?}");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_polar_grant_revoked_and_granted_again_ends_as_its_latest_event_in_every_order(
    pool: PgPool,
) {
    let app = benefits_app(pool).await;
    let again = Grant {
        at: "2026-01-25T10:00:00.100000Z",
        ..G1_GRANTED
    };
    let ends = in_every_order(&app, "again", &[G1_GRANTED, G1_REVOKED, again]).await;
    assert!(
        ends.iter().all(|f| *f == expected(&[G1_GRANTED])),
        "{ends:?}"
    );

    // A late revocation older than the grant it meets is ignored, and says why.
    let customer = "late_revoke";
    deliver(&app, customer, &again).await;
    deliver(&app, customer, &G1_REVOKED).await;
    let id = app
        .event_id("polar", &format!("msg_{customer}_{}", G1_REVOKED.label()))
        .await;
    let late = app.event(id).await;
    assert_eq!(late.status, "ignored");
    assert_eq!(
        late.reason.as_deref(),
        Some("a newer state of entitlement g1 is already stored")
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_grant_and_its_revocation_at_the_same_time_end_alike_in_both_orders(pool: PgPool) {
    let app = benefits_app(pool).await;
    let at = "2026-01-05T10:00:00.100000Z";
    let granted = Grant {
        grant: "g1",
        granted: true,
        at,
    };
    let revoked = Grant {
        granted: false,
        ..granted
    };
    // In both orders the keys compare alike: the tie is decided by them, not by arrival.
    let mut ends = Vec::new();
    for (customer, order) in [("tie_a", [granted, revoked]), ("tie_b", [revoked, granted])] {
        for g in &order {
            assert_eq!(deliver(&app, customer, g).await, "stored");
        }
        ends.push(features(&app, customer).await);
    }
    assert_eq!(ends[0], ends[1], "the same end in both orders");
}

/// Polar stamps a new object's `created_at` when its row is inserted and leaves `modified_at`
/// null until its first update (`TimestampedModel`, polarsource/polar
/// server/polar/kit/db/models/base.py); the envelope's `timestamp` is the clock when the
/// webhook is sent (`WebhookService.send`, server/polar/webhook/service.py), after the grant's
/// strategy ran (`BenefitGrantService.grant_benefit`, server/polar/benefit/grant/service.py).
/// A grant created at T whose webhook went out at T+5s, revoked at T+2s (its webhook at T+3s):
/// the revocation is the later change, and wins in both orders.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_grant_revoked_before_its_created_webhook_was_sent_ends_revoked_in_both_orders(
    pool: PgPool,
) {
    let app = benefits_app(pool).await;
    let created = |customer: &str| {
        let mut p = grant_event("g_fast", customer, true, "2026-01-05T10:00:05Z");
        p["data"]["created_at"] = json!("2026-01-05T10:00:00Z");
        p["data"]["granted_at"] = json!("2026-01-05T10:00:00Z");
        p["data"]["modified_at"] = Value::Null;
        p
    };
    let revoked = |customer: &str| {
        let mut p = grant_event("g_fast", customer, false, "2026-01-05T10:00:03Z");
        p["data"]["created_at"] = json!("2026-01-05T10:00:00Z");
        p["data"]["modified_at"] = json!("2026-01-05T10:00:02Z");
        p["data"]["revoked_at"] = json!("2026-01-05T10:00:02Z");
        p
    };
    for (customer, created_first) in [("fast_a", true), ("fast_b", false)] {
        deliver_created_and_revoked(
            &app,
            customer,
            created(customer),
            revoked(customer),
            created_first,
        )
        .await;
        assert_eq!(
            features(&app, customer).await,
            Features::new(),
            "{customer}: the revocation is the later change"
        );
        let id = app
            .event_id("polar", &format!("msg_{customer}_revoked"))
            .await;
        let revoked = app.event(id).await;
        assert_eq!(
            revoked.status, "applied",
            "{customer}: {:?}",
            revoked.reason
        );
    }
    assert_eq!(app.audit().await.divergent, []);
}

/// The same rule for a subscription: `subscription.created` (no `modified_at`, created at T,
/// sent at T+5s) and `subscription.revoked` of the same subscription (modified at T+2s, sent at
/// T+3s) end canceled in both orders.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_subscription_revoked_before_its_created_webhook_was_sent_ends_canceled_in_both_orders(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool).await;
    let of = |name: &str| {
        corpus("polar")
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
    };
    for (customer, created_first) in [("subfast_a", true), ("subfast_b", false)] {
        let sub = format!("sub_{customer}");
        let mut created = of("subscription.created");
        created["timestamp"] = json!("2026-01-05T10:00:05Z");
        created["data"]["created_at"] = json!("2026-01-05T10:00:00Z");
        created["data"]["modified_at"] = Value::Null;
        let mut revoked = of("subscription.revoked");
        revoked["timestamp"] = json!("2026-01-05T10:00:03Z");
        revoked["data"]["created_at"] = json!("2026-01-05T10:00:00Z");
        revoked["data"]["modified_at"] = json!("2026-01-05T10:00:02Z");
        for p in [&mut created, &mut revoked] {
            p["data"]["id"] = json!(sub);
            p["data"]["customer_id"] = json!(customer);
            p["data"]["customer"]["id"] = json!(customer);
        }
        assert_eq!(created["data"]["status"], "active");
        assert_eq!(revoked["data"]["status"], "canceled");
        deliver_created_and_revoked(&app, customer, created, revoked, created_first).await;
        let status: String =
            sqlx::query_scalar("SELECT status FROM subscriptions WHERE subscription_id = $1")
                .bind(&sub)
                .fetch_one(&app.pool)
                .await
                .unwrap();
        assert_eq!(status, "canceled", "{customer}");
    }
    assert_eq!(app.audit().await.divergent, []);
}

/// Delivers an object's `created` and `revoked` events in the order asked, each applied by the
/// worker before the next arrives.
async fn deliver_created_and_revoked(
    app: &TestApp,
    customer: &str,
    created: Value,
    revoked: Value,
    created_first: bool,
) {
    let mut events = vec![("created", created), ("revoked", revoked)];
    if !created_first {
        events.reverse();
    }
    for (what, body) in &events {
        let id = format!("msg_{customer}_{what}");
        let (status, answer) = app.post("polar", &polar_delivery(&id, body)).await;
        assert_eq!(status, 200, "{answer}");
        app.run_worker().await;
    }
}
