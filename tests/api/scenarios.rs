//! The reference scenarios of docs/design.md §4.9, driven through the real intake handler with signed
//! deliveries, the SQS server and the worker.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use shared::platform::sim::{with_interrupts, Fault, FaultAction, Point};
use sqlx::PgPool;

use crate::fold::{decided, field};
use crate::helpers::*;

fn at(rfc3339: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(rfc3339)
        .unwrap()
        .with_timezone(&Utc)
}

fn kinde_event(
    event_type: &str,
    customer: &str,
    plan: Option<&str>,
    happened: &str,
    event_id: &str,
) -> Value {
    let mut data = json!({"customer_id": customer});
    if let Some(plan) = plan {
        data["plan"] = json!({"key": plan, "name": plan});
    }
    json!({
        "type": event_type,
        "event_id": event_id,
        "event_timestamp": happened,
        "source": "api",
        "data": data
    })
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn nine_deliveries_end_on_pro_with_the_allowance_granted_once(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    app.enable_effects().await;
    let customer = "kc_nine";
    // Start: Free, balance 10.
    let start = kinde_event(
        "customer.plan_assigned",
        customer,
        Some("free"),
        "2026-03-01T00:00:00Z",
        "ev_start",
    );
    app.post("kinde", &kinde_delivery("wh_start", &start)).await;
    app.run_worker().await;
    let before = app.account("kinde", customer, "2026-03").await;
    assert_eq!((before.plan.as_str(), before.balance), ("free", 10));

    let upgrade = kinde_event(
        "customer.plan_changed",
        customer,
        Some("pro"),
        "2026-03-10T12:00:00Z",
        "ev_up",
    );
    let payment = json!({
        "type": "customer.payment_succeeded", "event_id": "ev_pay",
        "event_timestamp": "2026-03-10T12:00:30Z", "source": "api",
        "data": {"customer_id": customer, "payment_id": "pay_1", "plan": {"key": "pro"}}
    });
    // The cancellation happened 3 minutes before the upgrade, and arrives 7th.
    let cancel = kinde_event(
        "customer.agreement_cancelled",
        customer,
        None,
        "2026-03-10T11:57:00Z",
        "ev_cancel",
    );
    let script: [(&str, &Value); 9] = [
        ("wh_up", &upgrade),
        ("wh_pay", &payment),
        ("wh_up", &upgrade),
        ("wh_pay", &payment),
        ("wh_pay", &payment),
        ("wh_up", &upgrade),
        ("wh_cancel", &cancel),
        ("wh_pay", &payment),
        ("wh_pay", &payment),
    ];
    for (n, (webhook_id, claims)) in script.iter().enumerate() {
        let (status, answer) = app.post("kinde", &kinde_delivery(webhook_id, claims)).await;
        assert_eq!(
            status,
            http::StatusCode::OK,
            "delivery {} answered {answer}",
            n + 1
        );
        // The first plan change fails with its plan write and its allowance grant decided and
        // not written.
        let fails = if n == 0 { 1 } else { 0 };
        let crash = Fault::new(Point::WorkerDecided, FaultAction::Fail(fails));
        with_interrupts(crash, app.run_worker()).await;
        if n == 0 {
            let id = app.event_id("kinde", "ev_up").await;
            let row = app.event(id).await;
            assert_eq!(
                row.status, "failed",
                "the crashed attempt left nothing half-written"
            );
            let mid = app.account("kinde", customer, "2026-03").await;
            assert_eq!(
                (mid.plan.as_str(), mid.balance),
                ("free", 10),
                "the plan write was rolled back too"
            );
        }
    }
    app.run_worker().await;

    let account = app.account("kinde", customer, "2026-03").await;
    assert_eq!(account.plan, "pro");
    assert_eq!(account.balance, 500);
    let pro_grants = app
        .count(&format!(
            "SELECT count(*) FROM ledger WHERE customer_id = '{customer}' AND plan = 'pro'"
        ))
        .await;
    assert_eq!(pro_grants, 1, "the allowance is granted once");
    let stored = app
        .count("SELECT count(*) FROM inbox_events WHERE dedupe_key <> 'ev_start'")
        .await;
    assert_eq!(stored, 3);
    let copies = app
        .count(
            "SELECT sum(seen_count - 1)::bigint FROM inbox_events WHERE dedupe_key <> 'ev_start'",
        )
        .await;
    assert_eq!(copies, 6);
    let cancel_id = app.event_id("kinde", "ev_cancel").await;
    let cancelled = app.event(cancel_id).await;
    assert_eq!(cancelled.status, "ignored");
    assert_eq!(
        cancelled.reason.as_deref(),
        Some("a newer plan change is already stored")
    );
    let line = account
        .log
        .iter()
        .find(|l| l.event_id == cancel_id)
        .unwrap();
    assert_eq!(
        (line.outcome.as_str(), line.reason.as_str()),
        ("ignored", "a newer plan change is already stored")
    );
    let upgrade_row = app.event(app.event_id("kinde", "ev_up").await).await;
    assert_eq!(
        upgrade_row.status, "applied",
        "the crashed plan change was completed by a later copy"
    );

    // The app is told of the upgrade once: one plan change, one grant, one payment (in
    // the order they took effect: here the payment, naming Pro, granted the allowance).
    let start_id = app.event_id("kinde", "ev_start").await;
    let told: std::collections::BTreeMap<String, Value> = app
        .effects()
        .await
        .into_iter()
        .filter(|e| e.event_id != Some(start_id))
        .map(|e| (e.kind, e.body["data"].clone()))
        .collect();
    let kinds: Vec<&str> = told.keys().map(String::as_str).collect();
    assert_eq!(
        kinds,
        [
            "billing.allowance_granted",
            "billing.payment_succeeded",
            "billing.plan_changed"
        ]
    );
    assert_eq!(
        app.count("SELECT count(*) FROM effects").await,
        4,
        "and the start's grant"
    );
    let plan = &told["billing.plan_changed"];
    assert_eq!(
        (plan["previous_plan"].as_str(), plan["plan"].as_str()),
        (Some("free"), Some("pro"))
    );
    let grant = &told["billing.allowance_granted"];
    assert_eq!(grant["grant"]["amount"], 490, "topped up from 10 to 500");
    assert_eq!(grant["account"]["balance"], 500);

    // Why: the upgrade decided the plan and beat the start and the earlier cancellation; in
    // provider order it granted Pro first, and the payment found Pro granted. "Why pro, when a
    // cancellation came in?" is read on `plan`: it lists what its deciding register beat.
    let why = app.why("kinde", customer, Cut::default()).await;
    assert!(why.divergent.is_empty(), "{:?}", why.divergent);
    let older = |keys: &[&str]| {
        keys.iter()
            .map(|k| (k.to_string(), "older".to_owned()))
            .collect()
    };
    assert_eq!(
        decided(&app, &why, "plan").await,
        (Some("ev_up".to_owned()), older(&["ev_cancel", "ev_start"]))
    );
    assert_eq!(
        decided(&app, &why, "customer_plan").await,
        (Some("ev_up".to_owned()), older(&["ev_cancel", "ev_start"]))
    );
    let allowance = decided(&app, &why, "allowance:2026-03").await;
    assert_eq!(
        allowance,
        (
            Some("ev_up".to_owned()),
            vec![
                ("ev_pay".to_owned(), "already granted".to_owned()),
                ("ev_start".to_owned(), "smaller allowance".to_owned())
            ]
        )
    );
    assert_eq!(field(&why, "allowance:2026-03").value, json!(500));
}

pub(crate) struct Step {
    pub webhook_id: &'static str,
    pub kind: &'static str,
    pub sub: &'static str,
    pub at: &'static str,
}

pub(crate) fn polar_subscription(customer: &str, sub: &str, kind: &str, at: &str) -> Value {
    let status = if kind == "revoked" {
        "canceled"
    } else {
        "active"
    };
    json!({
        "type": format!("subscription.{kind}"),
        "timestamp": at,
        "data": {"id": sub, "customer_id": customer, "status": status, "product_id": "prod_pro",
                 "modified_at": at}
    })
}

pub(crate) const SUBSCRIPTION_STEPS: [Step; 7] = [
    Step {
        webhook_id: "m1",
        kind: "active",
        sub: "sub_old",
        at: "2026-01-01T00:00:00Z",
    },
    Step {
        webhook_id: "m2",
        kind: "revoked",
        sub: "sub_old",
        at: "2026-02-01T00:00:00Z",
    },
    Step {
        webhook_id: "m3",
        kind: "active",
        sub: "sub_old",
        at: "2026-01-01T00:00:00Z",
    },
    Step {
        webhook_id: "m4",
        kind: "active",
        sub: "sub_new",
        at: "2026-03-01T00:00:00Z",
    },
    Step {
        webhook_id: "m5",
        kind: "revoked",
        sub: "sub_old",
        at: "2026-04-01T00:00:00Z",
    },
    Step {
        webhook_id: "m6",
        kind: "revoked",
        sub: "sub_new",
        at: "2026-02-15T00:00:00Z",
    },
    Step {
        webhook_id: "m7",
        kind: "revoked",
        sub: "sub_new",
        at: "2026-05-01T00:00:00Z",
    },
];

/// Delivers the subscription steps in `order` for one customer (ids namespaced by `tag`).
pub(crate) async fn deliver_subscription_steps(
    app: &TestApp,
    tag: &str,
    order: &[usize],
) -> Vec<String> {
    let customer = format!("pc_{tag}");
    let mut plans = Vec::new();
    for &i in order {
        let step = &SUBSCRIPTION_STEPS[i];
        let sub = format!("{}_{tag}", step.sub);
        let payload = polar_subscription(&customer, &sub, step.kind, step.at);
        let (status, _) = app
            .post(
                "polar",
                &polar_delivery(&format!("{}_{tag}", step.webhook_id), &payload),
            )
            .await;
        assert_eq!(status, http::StatusCode::OK);
        app.run_worker().await;
        plans.push(app.account("polar", &customer, "2026-05").await.plan);
    }
    plans
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn subscriptions_move_only_their_own_register(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let plans = deliver_subscription_steps(&app, "canon", &[0, 1, 2, 3, 4, 5, 6]).await;
    assert_eq!(plans, ["pro", "free", "free", "pro", "pro", "pro", "free"]);

    for (webhook_id, reason) in [
        (
            "m3_canon",
            "a newer state of subscription sub_old_canon is already stored",
        ),
        // sub_old's late revocation is newer than its first one: sub_old takes its version,
        // but was canceled already, so nothing moved (and sub_new's plan is untouched).
        ("m5_canon", "subscription sub_old_canon is already canceled"),
        (
            "m6_canon",
            "a newer state of subscription sub_new_canon is already stored",
        ),
    ] {
        let row = app.event(app.event_id("polar", webhook_id).await).await;
        assert_eq!(row.status, "ignored", "{webhook_id}");
        assert_eq!(row.reason.as_deref(), Some(reason));
    }
    let account = app.account("polar", "pc_canon", "2026-05").await;
    assert_eq!(account.subscriptions.len(), 2);
    assert!(account.subscriptions.iter().all(|s| s.status == "canceled"));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn subscriptions_end_the_same_for_every_permutation(pool: PgPool) {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;
    let app = TestApp::spawn(pool).await;
    deliver_subscription_steps(&app, "ref", &[0, 1, 2, 3, 4, 5, 6]).await;
    let reference = normalized(&app, "ref").await;

    // The reverse order, and a sample of shuffles (7! is too many to drive through SQS).
    let mut orders: Vec<Vec<usize>> = vec![(0..7).rev().collect()];
    let mut runner = TestRunner::deterministic();
    let shuffle = proptest::strategy::Just((0..7).collect::<Vec<usize>>()).prop_shuffle();
    for _ in 0..12 {
        orders.push(shuffle.new_tree(&mut runner).unwrap().current());
    }
    for (n, order) in orders.iter().enumerate() {
        let tag = format!("p{n}");
        deliver_subscription_steps(&app, &tag, order).await;
        assert_eq!(normalized(&app, &tag).await, reference, "order {order:?}");
    }
}

/// The account's state with the namespace tag removed, for comparison across customers.
async fn normalized(app: &TestApp, tag: &str) -> Value {
    let mut periods = Vec::new();
    for period in ["2026-01", "2026-02", "2026-03", "2026-04", "2026-05"] {
        periods.push(
            app.account("polar", &format!("pc_{tag}"), period)
                .await
                .balance,
        );
    }
    let account = app.account("polar", &format!("pc_{tag}"), "2026-05").await;
    let text = json!({
        "plan": account.plan,
        "balances": periods,
        "subscriptions": account.subscriptions,
        "payments": account.payments,
    })
    .to_string();
    serde_json::from_str(&text.replace(&format!("_{tag}"), "")).unwrap()
}

fn stripe_subscription_event(id: &str, customer: &str, status: &str, created: i64) -> Value {
    json!({
        "id": id, "object": "event", "created": created, "type": "customer.subscription.updated",
        "data": {"object": {"id": "sub_s", "object": "subscription", "customer": customer,
                 "status": status, "items": {"data": [{"price": {"id": "price_pro"}}]}}}
    })
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_retried_active_landing_last_leaves_the_subscription_past_due(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    // Production waits: the failed attempt is not due again until after past_due lands.
    app.worker.retry = shared::domain::retry::RETRY;
    let t = at("2026-03-05T10:00:00Z").timestamp();
    let trialing = stripe_subscription_event("evt_trial", "cus_s", "trialing", t);
    let active = stripe_subscription_event("evt_active", "cus_s", "active", t + 60);
    let past_due = stripe_subscription_event("evt_past_due", "cus_s", "past_due", t + 120);

    app.post("stripe", &stripe_delivery(&trialing)).await;
    app.run_worker().await;
    // The first delivery of `active` fails in the worker; its retry lands after past_due.
    app.post("stripe", &stripe_delivery(&active)).await;
    let id = body_id(&app, "stripe", "evt_active").await;
    assert_eq!(app.event(id).await.status, "received");
    let crash = Fault::new(Point::WorkerDecided, FaultAction::Fail(1));
    let handed = with_interrupts(crash, app.run_worker()).await;
    assert_eq!(handed, 1);
    assert_eq!(app.event(id).await.status, "failed");
    app.post("stripe", &stripe_delivery(&past_due)).await;
    app.run_worker().await;
    assert_eq!(
        app.event(id).await.status,
        "failed",
        "its redelivered message came before it was due"
    );
    // Time passes: the retry is due, and the provider's own retry delivers it again.
    sqlx::query("UPDATE inbox_events SET next_attempt_at = now() WHERE id = $1")
        .bind(id)
        .execute(&app.pool)
        .await
        .unwrap();
    app.post("stripe", &stripe_delivery(&active)).await;
    app.run_worker().await;

    let account = app.account("stripe", "cus_s", "2026-03").await;
    assert_eq!(account.subscriptions[0].status, "past_due");
    assert_eq!(
        account.plan, "free",
        "past_due keeps the record but not the plan"
    );
    assert_eq!(
        account.balance, 500,
        "the trial's allowance was granted and is not taken back"
    );
    let active_row = app.event(id).await;
    assert_eq!(active_row.status, "ignored");
    assert_eq!(
        active_row.reason.as_deref(),
        Some("a newer state of subscription sub_s is already stored")
    );

    // Why: past_due decided the status, and with it the plan; the retried active is older.
    let why = app.why("stripe", "cus_s", Cut::default()).await;
    assert!(why.divergent.is_empty(), "{:?}", why.divergent);
    let by_past_due = Some("evt_past_due".to_owned());
    let older = vec![
        ("evt_active".to_owned(), "older".to_owned()),
        ("evt_trial".to_owned(), "older".to_owned()),
    ];
    assert_eq!(
        decided(&app, &why, "subscription:sub_s:status").await,
        (by_past_due.clone(), older)
    );
    assert_eq!(
        field(&why, "subscription:sub_s:status").value,
        json!("past_due")
    );
    assert_eq!(decided(&app, &why, "plan").await.0, by_past_due);
    let replayed = field(&why, "plan").decided_by.as_ref().unwrap();
    assert!(!replayed.replayed);
}

async fn body_id(app: &TestApp, source: &str, key: &str) -> i64 {
    app.event_id(source, key).await
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_late_payment_does_not_undo_a_refund(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let order = |kind: &str, at: &str| {
        json!({"type": format!("order.{kind}"), "timestamp": at,
               "data": {"id": "ord_1", "customer_id": "pc_r", "product_id": "prod_pro",
                        "status": if kind == "refunded" { "refunded" } else { "paid" },
                        "modified_at": at}})
    };
    for (id, payload) in [
        ("o1", order("paid", "2026-03-01T00:00:00Z")),
        ("o2", order("refunded", "2026-03-02T00:00:00Z")),
        // A late `paid`, even one stamped after the refund, cannot move a refunded payment.
        ("o3", order("paid", "2026-03-03T00:00:00Z")),
    ] {
        app.post("polar", &polar_delivery(id, &payload)).await;
        app.run_worker().await;
    }
    let account = app.account("polar", "pc_r", "2026-03").await;
    assert_eq!(
        account.payments,
        [shared::billing::account::PaymentView {
            id: "ord_1".into(),
            status: "refunded".into()
        }]
    );
    let late = app.event(app.event_id("polar", "o3").await).await;
    assert_eq!(late.status, "ignored");
    assert_eq!(
        late.reason.as_deref(),
        Some("payment ord_1 is refunded, which is final")
    );

    // Why: the refund decided the payment; the first paid is older, the late paid newer but
    // refunded is final.
    let why = app.why("polar", "pc_r", Cut::default()).await;
    assert!(why.divergent.is_empty(), "{:?}", why.divergent);
    assert_eq!(
        decided(&app, &why, "payment:ord_1:status").await,
        (
            Some("o2".to_owned()),
            vec![
                ("o1".to_owned(), "older".to_owned()),
                ("o3".to_owned(), "refunded is final".to_owned())
            ]
        )
    );
}

/// A Paddle Billing notification built as Paddle sends it (the development fixtures'
/// shape), with the event id and provider time given.
fn paddle_event(
    kind: &str,
    event_id: &str,
    happened: &str,
    object: &str,
    status: Option<&str>,
) -> Value {
    let spec = shared::providers::fixtures::Spec {
        kind: kind.into(),
        customer: "ctm_scenario".into(),
        plan: Some("pro".into()),
        at: at(happened),
        object_id: Some(object.into()),
        status: status.map(str::to_owned),
        event_id: Some(event_id.into()),
        ..Default::default()
    };
    shared::providers::fixtures::payload(shared::domain::SourceKind::Paddle, &spec)
        .unwrap()
        .1
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn paddle_copies_are_one_event_whatever_their_notification(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let created = paddle_event(
        "subscription",
        "evt_copy",
        "2026-03-01T00:00:00Z",
        "sub_c",
        None,
    );
    let mut replayed = created.clone();
    // The same event to another destination, or replayed: a notification id of its own.
    replayed["notification_id"] = json!("ntf_replayed");
    let mut answers = Vec::new();
    for event in [&created, &created, &replayed] {
        let (status, answer) = app.post("paddle", &paddle_delivery(event)).await;
        assert_eq!(status, http::StatusCode::OK, "{answer}");
        answers.push(answer["status"].as_str().unwrap().to_owned());
        app.run_worker().await;
    }
    assert_eq!(answers, ["stored", "duplicate", "duplicate"]);
    // Each delivery keeps the notification id it came with (docs/design.md §6.4).
    assert_eq!(
        app.count(
            "SELECT count(DISTINCT delivery_id) FROM deliveries WHERE delivery_id LIKE 'ntf_%'"
        )
        .await,
        2
    );
    assert_eq!(
        app.count("SELECT seen_count::bigint FROM inbox_events WHERE dedupe_key = 'evt_copy'")
            .await,
        3
    );
    let account = app.account("paddle", "ctm_scenario", "2026-03").await;
    assert_eq!((account.plan.as_str(), account.balance), ("pro", 500));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn paddle_out_of_order_and_a_late_cancellation_end_on_the_newest_state(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let created = paddle_event(
        "subscription",
        "evt_a",
        "2026-03-01T00:00:00Z",
        "sub_o",
        None,
    );
    let past_due = paddle_event(
        "subscription",
        "evt_b",
        "2026-03-05T00:00:00Z",
        "sub_o",
        Some("past_due"),
    );
    let resumed = paddle_event(
        "subscription",
        "evt_c",
        "2026-03-10T00:00:00Z",
        "sub_o",
        Some("active"),
    );
    // A cancellation stamped before the resumption, arriving last.
    let canceled = paddle_event(
        "subscription-canceled",
        "evt_d",
        "2026-03-07T00:00:00Z",
        "sub_o",
        None,
    );
    for event in [&resumed, &past_due, &created, &canceled] {
        app.post("paddle", &paddle_delivery(event)).await;
        app.run_worker().await;
    }
    let account = app.account("paddle", "ctm_scenario", "2026-03").await;
    assert_eq!(account.subscriptions[0].status, "active");
    assert_eq!((account.plan.as_str(), account.balance), ("pro", 500));
    for key in ["evt_a", "evt_b", "evt_d"] {
        let row = app.event(app.event_id("paddle", key).await).await;
        assert_eq!(row.status, "ignored", "{key}");
        assert_eq!(
            row.reason.as_deref(),
            Some("a newer state of subscription sub_o is already stored"),
            "{key}"
        );
    }
    let why = app.why("paddle", "ctm_scenario", Cut::default()).await;
    assert!(why.divergent.is_empty(), "{:?}", why.divergent);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn paddle_a_late_payment_does_not_undo_a_full_refund(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let completed = paddle_event(
        "transaction-completed",
        "evt_p1",
        "2026-03-01T00:00:00Z",
        "txn_r",
        None,
    );
    let refund = paddle_event("refund", "evt_p2", "2026-03-02T00:00:00Z", "txn_r", None);
    let mut late = paddle_event(
        "transaction-completed",
        "evt_p3",
        "2026-03-03T00:00:00Z",
        "txn_r",
        None,
    );
    late["event_type"] = json!("transaction.paid");
    for event in [&completed, &refund, &late] {
        app.post("paddle", &paddle_delivery(event)).await;
        app.run_worker().await;
    }
    let account = app.account("paddle", "ctm_scenario", "2026-03").await;
    assert_eq!(
        account.payments,
        [shared::billing::account::PaymentView {
            id: "txn_r".into(),
            status: "refunded".into()
        }]
    );
    let row = app.event(app.event_id("paddle", "evt_p3").await).await;
    assert_eq!(row.status, "ignored");
    assert_eq!(
        row.reason.as_deref(),
        Some("payment txn_r is refunded, which is final")
    );
    let why = app.why("paddle", "ctm_scenario", Cut::default()).await;
    assert!(why.divergent.is_empty(), "{:?}", why.divergent);
}

/// A Lemon Squeezy subscription event of the corpus's subscription (testdata/providers/
/// lemonsqueezy/), for `customer`, at `updated_at`, with Lemon Squeezy's `status`.
fn ls_subscription(event: &str, customer: u64, status: &str, updated_at: &str) -> Value {
    let (_, mut body) = crate::corpus::corpus("lemonsqueezy")
        .into_iter()
        .find(|(name, _)| name == "subscription_created")
        .unwrap();
    let cancelled = status == "cancelled";
    body["meta"]["event_name"] = json!(event);
    let attributes = &mut body["data"]["attributes"];
    attributes["customer_id"] = json!(customer);
    attributes["status"] = json!(status);
    attributes["cancelled"] = json!(cancelled);
    attributes["renews_at"] = json!("2026-04-01T00:00:00.000000Z");
    attributes["ends_at"] = if cancelled {
        json!("2026-04-01T00:00:00.000000Z")
    } else {
        Value::Null
    };
    attributes["updated_at"] = json!(updated_at);
    body
}

/// Posts a Lemon Squeezy body; the intake's verdict.
async fn ls_post(app: &TestApp, body: &Value) -> String {
    let (status, answer) = app.post("lemonsqueezy", &lemonsqueezy_delivery(body)).await;
    assert_eq!(status, http::StatusCode::OK, "{answer}");
    answer["status"].as_str().unwrap().to_owned()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn lemonsqueezy_a_retry_is_a_copy_and_two_changes_are_two_events(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = shared::domain::Catalog::parse(crate::corpus::CORPUS_PLANS).unwrap();
    let first = ls_subscription(
        "subscription_updated",
        7,
        "active",
        "2026-03-01T10:00:00.000000Z",
    );
    assert_eq!(ls_post(&app, &first).await, "stored");
    // Lemon Squeezy's retry of the notification: the same body, signed again.
    assert_eq!(ls_post(&app, &first).await, "duplicate");
    // Rendered again: its pre-signed URLs differ, nothing else.
    let mut rendered = first.clone();
    rendered["data"]["attributes"]["urls"]["customer_portal"] =
        json!("https://my-store.lemonsqueezy.com/billing?expires=2&signature=ff");
    assert_eq!(ls_post(&app, &rendered).await, "duplicate");
    // Another change of the subscription in the same second: another event.
    let other = ls_subscription(
        "subscription_updated",
        7,
        "past_due",
        "2026-03-01T10:00:00.000000Z",
    );
    assert_eq!(ls_post(&app, &other).await, "stored");
    // The subscription_updated sent beside a cancellation: two events too.
    let cancelled = ls_subscription(
        "subscription_cancelled",
        7,
        "cancelled",
        "2026-03-02T10:00:00.000000Z",
    );
    let mut beside = cancelled.clone();
    beside["meta"]["event_name"] = json!("subscription_updated");
    assert_eq!(ls_post(&app, &cancelled).await, "stored");
    assert_eq!(ls_post(&app, &beside).await, "stored");
    app.run_worker().await;
    let account = app.account("lemonsqueezy", "7", "2026-03").await;
    assert_eq!(account.subscriptions[0].status, "active");
    assert_eq!(account.plan, "pro", "valid until its end");
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, 4);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn lemonsqueezy_out_of_order_and_a_late_cancellation(pool: PgPool) {
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = shared::domain::Catalog::parse(crate::corpus::CORPUS_PLANS).unwrap();
    let created = ls_subscription(
        "subscription_created",
        8,
        "active",
        "2026-03-01T10:00:00.000000Z",
    );
    let cancelled = ls_subscription(
        "subscription_cancelled",
        8,
        "cancelled",
        "2026-03-05T10:00:00.000000Z",
    );
    let resumed = ls_subscription(
        "subscription_resumed",
        8,
        "active",
        "2026-03-06T10:00:00.000000Z",
    );
    // Out of order: the resumption first, then the creation, then the cancellation it undid.
    for body in [&resumed, &created, &cancelled] {
        assert_eq!(ls_post(&app, body).await, "stored");
        app.run_worker().await;
    }
    let account = app.account("lemonsqueezy", "8", "2026-03").await;
    assert_eq!(account.subscriptions[0].status, "active");
    assert_eq!(account.plan, "pro");
    assert!(
        !account.subscriptions[0].cancel_at_period_end
            && account.subscriptions[0].cancel_at.is_none(),
        "the late cancellation was undone before it came"
    );
    let late = app
        .event(
            app.event_id(
                "lemonsqueezy",
                shared::providers::lemonsqueezy::dedupe_key(&cancelled)
                    .unwrap()
                    .as_str(),
            )
            .await,
        )
        .await;
    assert_eq!(late.status, "ignored");
    assert_eq!(
        late.reason.as_deref(),
        Some("a newer state of subscription 1 is already stored")
    );
    assert_eq!(account.balance, 500, "granted once");
    // Expired later: it ends.
    let mut expired = ls_subscription(
        "subscription_expired",
        8,
        "expired",
        "2026-03-20T10:00:00.000000Z",
    );
    expired["data"]["attributes"]["ends_at"] = json!("2026-03-20T10:00:00.000000Z");
    ls_post(&app, &expired).await;
    app.run_worker().await;
    let account = app.account("lemonsqueezy", "8", "2026-03").await;
    assert_eq!(account.subscriptions[0].status, "canceled");
    assert_eq!(account.plan, "free");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn lemonsqueezy_a_late_order_does_not_undo_its_refund(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let files = crate::corpus::corpus("lemonsqueezy");
    let file = |name: &str| files.iter().find(|(n, _)| n == name).unwrap().1.clone();
    let (created, refunded) = (file("order_created"), file("order_refunded"));
    assert_eq!(ls_post(&app, &refunded).await, "stored");
    app.run_worker().await;
    // The order's creation arrives after its refund, then again (a retry).
    assert_eq!(ls_post(&app, &created).await, "stored");
    assert_eq!(ls_post(&app, &created).await, "duplicate");
    app.run_worker().await;
    let account = app.account("lemonsqueezy", "1", "2025-11").await;
    assert_eq!(
        account.payments,
        [shared::billing::account::PaymentView {
            id: "orders/1".into(),
            status: "refunded".into()
        }]
    );
    let key = shared::providers::lemonsqueezy::dedupe_key(&created).unwrap();
    let late = app
        .event(app.event_id("lemonsqueezy", key.as_str()).await)
        .await;
    assert_eq!(late.status, "ignored", "{:?}", late.reason);
}
