//! The provider-shaped corpus (`testdata/providers/`, see its README): every file is sent
//! through the intake, signed as its provider signs it, and applied by the worker, in file
//! order and in reverse; the resulting accounts are what the providers' own sequence means.

use std::path::{Path, PathBuf};

use serde_json::Value;
use shared::billing::account::AccountView;
use sqlx::PgPool;

use crate::helpers::*;

/// The catalog entries for the corpus's prices and products.
pub(crate) const CORPUS_PLANS: &str = r#"{
    "pro": {"plan": "pro", "monthly_allowance": 500},
    "team": {"plan": "team", "monthly_allowance": 2000},
    "price_1ProMonthlyPre01": {"plan": "pro", "monthly_allowance": 500},
    "price_1ProMonthlyBas01": {"plan": "pro", "monthly_allowance": 500},
    "price_1ProMonthlyClo01": {"plan": "pro", "monthly_allowance": 500},
    "price_1ProMonthlyDah01": {"plan": "pro", "monthly_allowance": 500},
    "price_1ProMonthlyEnd01": {"plan": "pro", "monthly_allowance": 500},
    "pri_01gsz8x8sawmvhz1pv30nge1ke": {"plan": "pro", "monthly_allowance": 500},
    "pri_01h84cdy3xatsp16afda2gekzy": {"plan": "team", "monthly_allowance": 2000},
    "ab440482-0ee4-41c0-b579-bae502ba592b": {"plan": "pro", "monthly_allowance": 500},
    "1bd0bcfe-5205-4fab-af9f-a0162303a64c": {"plan": "pro", "monthly_allowance": 500},
    "1": {"plan": "pro", "monthly_allowance": 500},
    "2": {"plan": "pro", "monthly_allowance": 500}
}"#;

pub(crate) fn corpus(dir: &str) -> Vec<(String, Value)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/providers");
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "testdata/providers/{dir} has files");
    files
        .into_iter()
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let body = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            (name, body)
        })
        .collect()
}

/// A test app whose worker knows the corpus's plans.
pub(crate) async fn corpus_app(pool: PgPool) -> TestApp {
    let mut app = TestApp::spawn(pool).await;
    app.worker.catalog = shared::domain::Catalog::parse(CORPUS_PLANS).unwrap();
    app
}

/// Sends every file of `dir` as `source` (in reverse when asked), applies each, and checks
/// that each was read: none is unprocessable.
async fn send_all(pool: PgPool, source: &str, dir: &str, reverse: bool) -> TestApp {
    let app = corpus_app(pool).await;
    send_files(&app, source, dir, reverse).await;
    app
}

/// Sends every file of `dir` as `source`, each stored new and then applied or ignored.
async fn send_files(app: &TestApp, source: &str, dir: &str, reverse: bool) {
    let mut files = corpus(dir);
    if reverse {
        files.reverse();
    }
    for (name, body) in &files {
        send_one(app, source, &format!("{dir}/{name}"), body).await;
    }
}

/// The signed delivery of corpus file `name` as `source` would send it.
fn delivery_of(source: &str, name: &str, body: &Value) -> Delivery {
    match source {
        "stripe" => stripe_delivery(body),
        "polar" => polar_delivery(&format!("msg_{name}"), body),
        "lemonsqueezy" => lemonsqueezy_delivery(body),
        "paddle" => paddle_delivery(body),
        _ => kinde_delivery(&format!("wh_{name}"), body),
    }
}

/// Sends one body as `source`, stored new and then applied or ignored; its stored reason.
pub(crate) async fn send_one(app: &TestApp, source: &str, name: &str, body: &Value) -> String {
    let delivery = delivery_of(source, name, body);
    let (status, answer) = app.post(source, &delivery).await;
    assert_eq!(status, http::StatusCode::OK, "{name}: {answer}");
    assert_eq!(answer["status"], "stored", "{name}: {answer}");
    app.run_worker().await;
    let row = app.event(answer["event_id"].as_i64().unwrap()).await;
    assert!(
        row.status == "applied" || row.status == "ignored",
        "{name} is {}: {:?}",
        row.status,
        row.reason
    );
    row.reason.unwrap_or_default()
}

pub(crate) fn payments(account: &AccountView) -> Vec<(&str, &str)> {
    account
        .payments
        .iter()
        .map(|p| (p.id.as_str(), p.status.as_str()))
        .collect()
}

fn reason_of<'a>(account: &'a AccountView, event_type: &str) -> &'a str {
    &account
        .log
        .iter()
        .find(|l| l.event_type == event_type)
        .unwrap_or_else(|| panic!("a log line for {event_type}"))
        .reason
}

async fn stripe_generation(pool: PgPool, dir: &str, ids: [&str; 5], reverse: bool) {
    let app = send_all(pool, "stripe", dir, reverse).await;
    assert_generation(&app, ids).await;
}

/// The accounts a generation's corpus leaves, in either order and by either way in.
pub(crate) async fn assert_generation(app: &TestApp, ids: [&str; 5]) {
    let [customer, subscription, invoice, failed_invoice, gone] = ids;
    let account = app.account("stripe", customer, "2025-12").await;
    // Created (incomplete) and updated (active) share a second; deleted (canceled) is last.
    assert_eq!(account.subscriptions.len(), 1);
    assert_eq!(account.subscriptions[0].id, subscription);
    assert_eq!(account.subscriptions[0].status, "canceled");
    assert_eq!(account.plan, "free");
    // The full refund reaches the invoice it paid, in either API generation.
    assert_eq!(
        payments(&account),
        vec![(invoice, "refunded"), (failed_invoice, "failed")]
    );
    assert_eq!(account.balance, 500, "pro granted once for 2025-12");
    assert!(!account.deleted);
    let other = app.account("stripe", gone, "2025-12").await;
    assert!(other.deleted);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_pre_basil_corpus_in_file_order(pool: PgPool) {
    stripe_generation(pool, "stripe/pre-basil", PRE_BASIL, false).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_pre_basil_corpus_in_reverse(pool: PgPool) {
    stripe_generation(pool, "stripe/pre-basil", PRE_BASIL, true).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_basil_corpus_in_file_order(pool: PgPool) {
    stripe_generation(pool, "stripe/basil", BASIL, false).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_basil_corpus_in_reverse(pool: PgPool) {
    stripe_generation(pool, "stripe/basil", BASIL, true).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_clover_corpus_in_file_order(pool: PgPool) {
    let ids = ids("Clover");
    stripe_generation(
        pool,
        "stripe/clover",
        ids.each_ref().map(String::as_str),
        false,
    )
    .await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_clover_corpus_in_reverse(pool: PgPool) {
    let ids = ids("Clover");
    stripe_generation(
        pool,
        "stripe/clover",
        ids.each_ref().map(String::as_str),
        true,
    )
    .await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_dahlia_corpus_in_file_order(pool: PgPool) {
    let ids = ids("Dahlia");
    stripe_generation(
        pool,
        "stripe/dahlia",
        ids.each_ref().map(String::as_str),
        false,
    )
    .await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_dahlia_corpus_in_reverse(pool: PgPool) {
    let ids = ids("Dahlia");
    stripe_generation(
        pool,
        "stripe/dahlia",
        ids.each_ref().map(String::as_str),
        true,
    )
    .await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_endive_corpus_in_file_order(pool: PgPool) {
    let ids = ids("Endive");
    stripe_generation(
        pool,
        "stripe/endive",
        ids.each_ref().map(String::as_str),
        false,
    )
    .await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_endive_corpus_in_reverse(pool: PgPool) {
    let ids = ids("Endive");
    stripe_generation(
        pool,
        "stripe/endive",
        ids.each_ref().map(String::as_str),
        true,
    )
    .await;
}

/// The fixed ids of a generation after basil (testdata/providers/README.md): customer,
/// subscription, paid and failed invoice, the other customer.
fn ids(name: &str) -> [String; 5] {
    [
        format!("cus_{name}Cust001"),
        format!("sub_1{name}Sub00001"),
        format!("in_1{name}Inv00001"),
        format!("in_1{name}Inv00002"),
        format!("cus_{name}Gone0001"),
    ]
}

/// The endive first invoice as a renewal on 2026-01-01 whose lines carry no price id (a
/// line's `pricing` without `price_details`, as `InvoiceLineItem.Pricing` allows), billing
/// `subscription`.
pub(crate) fn renewal_without_price(subscription: &str) -> Value {
    let mut files = corpus("stripe/endive");
    let (_, mut event) = files.remove(
        files
            .iter()
            .position(|(name, _)| name == "invoice.paid")
            .unwrap(),
    );
    event["id"] = "evt_1Sk9Y5E6qL1xZc8Jr3Nw8Kp2".into();
    event["created"] = 1_767_225_601.into();
    let invoice = &mut event["data"]["object"];
    invoice["id"] = "in_1EndiveInv00003".into();
    invoice["billing_reason"] = "subscription_cycle".into();
    invoice["parent"]["subscription_details"]["subscription"] = subscription.into();
    for line in invoice["lines"]["data"].as_array_mut().unwrap() {
        line["invoice"] = "in_1EndiveInv00003".into();
        line["pricing"] =
            serde_json::json!({"type": "price_details", "unit_amount_decimal": "2900"});
        line["parent"]["subscription_item_details"]["subscription"] = subscription.into();
        line["subscription"] = subscription.into();
    }
    event
}

/// Regression (issue 30): an endive `invoice.paid` for an active pro subscription whose
/// lines name no price was a payment granting nothing, silently. The plan is the
/// subscription's, as its register holds it.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_invoice_without_a_price_grants_its_subscriptions_plan(pool: PgPool) {
    let app = corpus_app(pool).await;
    for (name, body) in corpus("stripe/endive") {
        if name.starts_with("customer.subscription.created")
            || name.starts_with("customer.subscription.updated")
        {
            send_one(&app, "stripe", &name, &body).await;
        }
    }
    let renewal = renewal_without_price("sub_1EndiveSub00001");
    let reason = send_one(&app, "stripe", "renewal", &renewal).await;
    let account = app.account("stripe", "cus_EndiveCust001", "2026-01").await;
    assert_eq!(
        account.balance, 500,
        "the pro allowance for 2026-01: {reason}"
    );
    assert!(
        reason.contains("plan pro from subscription sub_1EndiveSub00001"),
        "{reason}"
    );
    assert_eq!(payments(&account), vec![("in_1EndiveInv00003", "paid")]);
}

/// When nothing tells the plan (the register does not know the invoice's subscription), the
/// invoice is a payment without an allowance, and its reason says what was read.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_invoice_without_a_price_or_known_subscription_says_what_it_read(pool: PgPool) {
    let app = corpus_app(pool).await;
    let renewal = renewal_without_price("sub_1EndiveUnknown01");
    let reason = send_one(&app, "stripe", "renewal", &renewal).await;
    let account = app.account("stripe", "cus_EndiveCust001", "2026-01").await;
    assert_eq!(account.balance, 0);
    assert_eq!(payments(&account), vec![("in_1EndiveInv00003", "paid")]);
    for said in [
        "no allowance granted",
        "parent.subscription_details.subscription",
        "lines.data[].parent.subscription_item_details.subscription",
        "pricing.price_details.price",
        "the subscription register holds no known plan for sub_1EndiveUnknown01",
    ] {
        assert!(reason.contains(said), "{said:?} in {reason}");
    }
}

const PRE_BASIL: [&str; 5] = [
    "cus_PreBasilCust01",
    "sub_1PreBasilSub0001",
    "in_1PreBasilInv0001",
    "in_1PreBasilInv0002",
    "cus_PreBasilGone01",
];

pub(crate) const BASIL: [&str; 5] = [
    "cus_BasilCust0001",
    "sub_1BasilSub000001",
    "in_1BasilInv000001",
    "in_1BasilInv000002",
    "cus_BasilGone00001",
];

async fn polar(pool: PgPool, reverse: bool) {
    let app = send_all(pool, "polar", "polar", reverse).await;
    let customer = "c1a124cb-d614-4eeb-91b9-1802cb91d276";
    let account = app.account("polar", customer, "2025-12").await;
    assert_eq!(account.subscriptions.len(), 1);
    assert_eq!(account.subscriptions[0].status, "canceled", "revoked last");
    assert_eq!(account.plan, "free");
    assert_eq!(
        payments(&account),
        vec![("6ba7b106-d1ce-4c08-826f-cbb47601f6dd", "refunded")]
    );
    assert_eq!(account.balance, 500);
    assert!(
        account.features.is_empty(),
        "the SSO grant was revoked after it was granted: {:?}",
        account.features
    );
    if reverse {
        assert_eq!(
            reason_of(&account, "benefit_grant.created"),
            "a newer state of entitlement 0f6d8a2e-3b71-4c59-9e04-b2a7c5d1e863 is already stored"
        );
    }
    let gone = app
        .account("polar", "a11631ae-4254-40cf-9591-87ec939431c4", "2025-12")
        .await;
    assert!(
        gone.deleted,
        "customer.deleted names its customer at data.id"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn polar_corpus_in_file_order(pool: PgPool) {
    polar(pool, false).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn polar_corpus_in_reverse(pool: PgPool) {
    polar(pool, true).await;
}

/// The Lemon Squeezy corpus (testdata/providers/README.md): one customer's subscription,
/// created in November 2025 with its order, renewed in December after a failed payment,
/// cancelled, resumed, paused, unpaused, moved to the yearly variant, expired; its order
/// refunded.
async fn lemonsqueezy(pool: PgPool, reverse: bool) {
    let app = send_all(pool, "lemonsqueezy", "lemonsqueezy", reverse).await;
    let account = app.account("lemonsqueezy", "1", "2025-12").await;
    assert_eq!(account.subscriptions.len(), 1);
    assert_eq!(account.subscriptions[0].id, "1");
    assert_eq!(account.subscriptions[0].status, "canceled", "expired last");
    assert_eq!(account.plan, "free");
    // An order and a subscription invoice may share a number: each payment is its API path.
    let mut paid = payments(&account);
    paid.sort();
    assert_eq!(
        paid,
        vec![
            ("orders/1", "refunded"),
            ("subscription-invoices/1", "paid"),
            ("subscription-invoices/2", "paid")
        ]
    );
    assert_eq!(account.balance, 500, "pro granted once for 2025-12");
    let november = app.account("lemonsqueezy", "1", "2025-11").await;
    assert_eq!(november.balance, 500, "and once for 2025-11");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn lemonsqueezy_corpus_in_file_order(pool: PgPool) {
    lemonsqueezy(pool, false).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn lemonsqueezy_corpus_in_reverse(pool: PgPool) {
    lemonsqueezy(pool, true).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn lemonsqueezy_corpus_delivered_again_after_its_purge_changes_nothing(pool: PgPool) {
    delivered_again_after_the_purge(pool, "lemonsqueezy", "lemonsqueezy").await;
}

async fn kinde(pool: PgPool, reverse: bool) {
    let app = send_all(pool, "kinde", "kinde", reverse).await;
    let customer = "customer_019ad69d9d4872c1a5e83b0f6d2c4e91";
    let account = app.account("kinde", customer, "2025-12").await;
    // Cancelled last, and the last payment failed: no plan, payments past due.
    assert_eq!(account.customer_plan, None);
    assert!(account.past_due);
    assert_eq!(account.plan, "free");
    assert_eq!(
        account.balance, 2000,
        "pro, then the change to team, in 2025-12"
    );
    assert_eq!(
        app.account("kinde", customer, "2026-01").await.balance,
        0,
        "a failed payment grants nothing"
    );
    assert!(
        reason_of(&account, "customer.plan_changed")
            .ends_with("customer at data.customer.id, plan at data.plan.code"),
        "the log says which layout was read"
    );
    assert_eq!(
        reason_of(&account, "customer.meter_usage_updated"),
        "customer.meter_usage_updated carries no billing state"
    );
    let stored: i64 = app
        .count("SELECT count(*) FROM inbox_events WHERE dedupe_key LIKE 'event_%'")
        .await;
    assert_eq!(stored, 8, "every token is keyed by its signed event_id");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn kinde_corpus_in_file_order(pool: PgPool) {
    kinde(pool, false).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn kinde_corpus_in_reverse(pool: PgPool) {
    kinde(pool, true).await;
}

/// Every billing table's rows, without what only records which stored event wrote a row
/// (its inbox id), when, and the account's version (which every finished event moves): the
/// Paddle's SDK notifications (testdata/providers/paddle/): one subscription through its
/// life, a trial, a one-off purchase with a failed attempt first, a partial refund.
async fn paddle(pool: PgPool, reverse: bool) {
    let app = send_all(pool, "paddle", "paddle", reverse).await;
    let account = app
        .account("paddle", "ctm_01h7hswb86rtps5ggbq7ybydcw", "2023-08")
        .await;
    assert_eq!(account.subscriptions.len(), 1);
    assert_eq!(account.subscriptions[0].status, "canceled", "canceled last");
    assert_eq!(account.plan, "free");
    assert_eq!(account.balance, 500, "pro's allowance, granted once");
    if reverse {
        assert_eq!(
            reason_of(&account, "subscription.created"),
            "a newer state of subscription sub_01h7ht5z5wdg9pz18jx1fagp8k is already stored"
        );
    }
    let trial = app
        .account("paddle", "ctm_01h84cjfwmdph1k8kgsyjt3k7g", "2023-08")
        .await;
    assert_eq!((trial.plan.as_str(), trial.balance), ("team", 2000));
    let buyer = app
        .account("paddle", "ctm_01h8e18bxp9hby49dnm8ewf0m0", "2023-08")
        .await;
    assert_eq!(
        payments(&buyer),
        vec![("txn_01h8dzxgkvdwemdhbpcapj2tbj", "paid")],
        "the failed attempt came first"
    );
    assert_eq!(buyer.balance, 500);
    // A subscription imported from another billing system, then its transaction paid.
    let imported = app
        .account("paddle", "ctm_01gxwxe6vzgz6hcsbwjs6zrszr", "2023-04")
        .await;
    assert_eq!(
        (imported.plan.as_str(), imported.balance),
        ("pro", 500),
        "granted once"
    );
    assert_eq!(imported.subscriptions[0].status, "active");
    let refunded = app
        .account("paddle", "ctm_01h8441jn5pcwrfhwh78jqt8hk", "2023-08")
        .await;
    assert_eq!(
        reason_of(&refunded, "adjustment.updated"),
        "a partial refund changes no billing state"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn paddle_corpus_in_file_order(pool: PgPool) {
    paddle(pool, false).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn paddle_corpus_in_reverse(pool: PgPool) {
    paddle(pool, true).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn paddle_corpus_delivered_again_after_its_purge_changes_nothing(pool: PgPool) {
    delivered_again_after_the_purge(pool, "paddle", "paddle").await;
}

/// billing state, comparable across a purge.
async fn billing_state(app: &TestApp) -> Vec<String> {
    let mut rows = Vec::new();
    for table in [
        "accounts",
        "customer_plans",
        "customer_standing",
        "subscriptions",
        "payments",
        "payment_intents",
        "ledger",
        "entitlements",
    ] {
        let sql = format!(
            "SELECT '{table} ' || (to_jsonb(t) - 'id' - 'event_id' - 'refunded_by' - 'created_at' - 'version')::text
             FROM {table} t ORDER BY 1"
        );
        let table_rows: Vec<String> = sqlx::query_scalar(&sql).fetch_all(&app.pool).await.unwrap();
        rows.extend(table_rows);
    }
    rows
}

/// Every corpus event applied and told, purged 40 days later with its effects (but for the
/// events the registers name, which the fold needs), then delivered again, last first (late
/// retries, a reconciliation's reads): each purged one is stored anew, and nothing moves and
/// nothing is told twice (docs/design.md §3.9).
async fn delivered_again_after_the_purge(pool: PgPool, source: &str, dir: &str) {
    let mut app = corpus_app(pool).await;
    let effects_queue = app.enable_effects().await;
    send_files(&app, source, dir, false).await;
    let state = billing_state(&app).await;
    let told = app.effects().await.len();
    assert!(told > 0, "{dir} changes something");
    app.drain(&effects_queue).await;
    sqlx::query("UPDATE effects SET status = 'sent', sent_at = now() - interval '40 days'")
        .execute(&app.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE inbox_events SET received_at = now() - interval '40 days'")
        .execute(&app.pool)
        .await
        .unwrap();
    let retention = std::time::Duration::from_secs(30 * 86_400);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let events = app.count("SELECT count(*) FROM inbox_events").await;
    let purged = shared::inbox::purge::purge(&app.pool, retention, deadline)
        .await
        .unwrap();
    // What a register, a grant, a payment intent or a tombstone names stays (§3.9, §4.11).
    let named = app
        .count(
            "SELECT count(*) FROM inbox_events e WHERE
                EXISTS (SELECT 1 FROM customer_plans r WHERE r.event_id = e.id)
             OR EXISTS (SELECT 1 FROM customer_standing r WHERE r.event_id = e.id)
             OR EXISTS (SELECT 1 FROM subscriptions r WHERE r.event_id = e.id)
             OR EXISTS (SELECT 1 FROM payments r WHERE r.event_id = e.id)
             OR EXISTS (SELECT 1 FROM ledger r WHERE r.event_id = e.id)
             OR EXISTS (SELECT 1 FROM entitlements r WHERE r.event_id = e.id)
             OR EXISTS (SELECT 1 FROM payment_intents r WHERE e.id IN (r.linked_by, r.refunded_by))
             OR EXISTS (SELECT 1 FROM accounts r WHERE r.deleted_by = e.id)",
        )
        .await;
    assert!(named > 0, "{dir}: the registers name their events");
    assert_eq!(
        purged as i64 + named,
        events,
        "every {dir} event was final, and all but the ones the registers name went"
    );
    assert_eq!(app.count("SELECT count(*) FROM inbox_events").await, named);
    let purged = shared::effects::outbox::purge(&app.pool, retention, deadline)
        .await
        .unwrap();
    assert_eq!(purged as usize, told);

    // The fold of what the purge kept gives every register again (docs/design.md §4.11).
    let audit = app.audit().await;
    assert!(audit.checked > 0 && audit.skipped == 0, "{dir}: {audit:?}");
    assert_eq!(audit.divergent, [], "{dir}: the audit after the purge");

    // Last first; a purged event is stored anew, a kept one is a copy.
    let mut files = corpus(dir);
    files.reverse();
    for (name, body) in &files {
        let delivery = delivery_of(source, &format!("{dir}/{name}"), body);
        let (_, answer) = app.post(source, &delivery).await;
        assert!(
            answer["status"] == "stored" || answer["status"] == "duplicate",
            "{name}: {answer}"
        );
        app.run_worker().await;
    }

    assert_eq!(billing_state(&app).await, state, "{dir}: nothing moved");
    let audit = app.audit().await;
    assert_eq!(
        audit.divergent,
        [],
        "{dir}: the audit after the deliveries again"
    );
    assert_eq!(
        app.effects().await.len(),
        0,
        "{dir}: nothing told twice: {:#?}",
        app.effects().await
    );
    assert!(app.drain(&effects_queue).await.is_empty());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_pre_basil_corpus_delivered_again_after_its_purge_changes_nothing(pool: PgPool) {
    delivered_again_after_the_purge(pool, "stripe", "stripe/pre-basil").await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_basil_corpus_delivered_again_after_its_purge_changes_nothing(pool: PgPool) {
    delivered_again_after_the_purge(pool, "stripe", "stripe/basil").await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_clover_corpus_delivered_again_after_its_purge_changes_nothing(pool: PgPool) {
    delivered_again_after_the_purge(pool, "stripe", "stripe/clover").await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_dahlia_corpus_delivered_again_after_its_purge_changes_nothing(pool: PgPool) {
    delivered_again_after_the_purge(pool, "stripe", "stripe/dahlia").await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_endive_corpus_delivered_again_after_its_purge_changes_nothing(pool: PgPool) {
    delivered_again_after_the_purge(pool, "stripe", "stripe/endive").await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn polar_corpus_delivered_again_after_its_purge_changes_nothing(pool: PgPool) {
    delivered_again_after_the_purge(pool, "polar", "polar").await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn kinde_corpus_delivered_again_after_its_purge_changes_nothing(pool: PgPool) {
    delivered_again_after_the_purge(pool, "kinde", "kinde").await;
}

/// The customer that is an Account in `stripe/accounts-v2/` (testdata/providers/README.md).
pub(crate) const ACCOUNT_CUSTOMER: &str = "acct_1AcctV2Cust0001";
const ACCOUNT_SUB: &str = "sub_1AcctV2Sub00001";
const ACCOUNT_INVOICE: &str = "in_1AcctV2Inv00001";
const ACCOUNT_INTENT: &str = "pi_3AcctV2Pi000001";
/// A Connect platform's connected account, as a Connect endpoint's events name it.
const CONNECTED: &str = "acct_1PlatformConn01";

/// The objects the worker reads for the accounts-v2 corpus, held by the fake Stripe: the
/// refunded charge's payment intent (the charge names no customer) and the invoice payment
/// that links it to its invoice; each held by `connected` (or by the platform), so read as
/// another account it is Stripe's 404.
pub(crate) async fn accounts_v2_api(connected: Option<&str>) -> crate::thin::StripeApi {
    let api = crate::thin::StripeApi::start().await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/providers/stripe/accounts-v2");
    let intent: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("objects/payment_intent.json")).unwrap(),
    )
    .unwrap();
    let (_, paid) = corpus("stripe/accounts-v2")
        .into_iter()
        .find(|(name, _)| name == "invoice_payment.paid")
        .unwrap();
    api.fake
        .holds_in(connected, intent)
        .holds_in(connected, paid["data"]["object"].clone());
    api
}

/// Every read of the intent was made in the API version the reads are written against.
fn intent_read_as_written(reads: &[wiremock::Request]) {
    let intent = format!("/v1/payment_intents/{ACCOUNT_INTENT}");
    for read in reads.iter().filter(|r| r.url.path() == intent) {
        assert_eq!(read.headers["Stripe-Version"], "2025-03-31.basil");
    }
}

/// The accounts-v2 corpus sent as `source` would send it, each event from the connected
/// account `connected` if named, in file order or reversed, with the worker reading `api`.
pub(crate) async fn send_accounts_v2(
    pool: PgPool,
    api: &wiremock::MockServer,
    connected: Option<&str>,
    reverse: bool,
) -> TestApp {
    let mut app = corpus_app(pool).await;
    crate::traffic::with_stripe_api(&mut app.worker, api);
    let mut files = corpus("stripe/accounts-v2");
    if reverse {
        files.reverse();
    }
    for (name, mut body) in files {
        if let Some(account) = connected {
            body["account"] = account.into();
        }
        send_one(&app, "stripe", &format!("accounts-v2/{name}"), &body).await;
    }
    app
}

/// How many accounts of the stripe source are keyed `customer`.
async fn accounts_keyed(app: &TestApp, customer: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM accounts WHERE source = 'stripe' AND customer_id = $1")
        .bind(customer)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

/// A customer that is an Account (Accounts v2): its subscription, invoice and refund are the
/// account `acct_…`, the refund found through its payment intent (docs/design.md §6.2).
async fn accounts_v2_corpus(pool: PgPool, reverse: bool) {
    let api = accounts_v2_api(None).await;
    let app = send_accounts_v2(pool, &api, None, reverse).await;
    let account = app.account("stripe", ACCOUNT_CUSTOMER, "2025-12").await;
    assert_eq!(account.subscriptions.len(), 1);
    assert_eq!(account.subscriptions[0].id, ACCOUNT_SUB);
    assert_eq!(account.subscriptions[0].status, "active");
    assert_eq!(payments(&account), vec![(ACCOUNT_INVOICE, "refunded")]);
    assert_eq!(account.balance, 500, "pro granted once for 2025-12");
    assert_eq!(
        app.count("SELECT count(*) FROM accounts").await,
        1,
        "one account: the Account's"
    );
    let audit = app.audit().await;
    assert!(audit.checked > 0 && audit.skipped == 0, "{audit:?}");
    assert_eq!(audit.divergent, [], "the fold gives every register again");
    // The platform's own customer: its intent is read, and no read goes as a connected account.
    let reads = api.received_requests().await.unwrap();
    assert!(reads
        .iter()
        .any(|r| r.url.path() == format!("/v1/payment_intents/{ACCOUNT_INTENT}")));
    intent_read_as_written(&reads);
    assert!(
        reads
            .iter()
            .all(|r| r.headers.get("Stripe-Account").is_none()),
        "{reads:?}"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_accounts_v2_corpus_in_file_order(pool: PgPool) {
    accounts_v2_corpus(pool, false).await;
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn stripe_accounts_v2_corpus_in_reverse(pool: PgPool) {
    accounts_v2_corpus(pool, true).await;
}

/// docs/design.md §4.6a: from a Connect endpoint (`account`), a customer that is an Account
/// is that connected account's customer, `acct_…/acct_…`, and every read goes as the
/// connected account; the Account is no account of the platform's own.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_connected_accounts_customer_that_is_an_account_is_keyed_under_the_connected_account(
    pool: PgPool,
) {
    let api = accounts_v2_api(Some(CONNECTED)).await;
    let app = send_accounts_v2(pool, &api, Some(CONNECTED), false).await;
    let key = format!("{CONNECTED}/{ACCOUNT_CUSTOMER}");
    let account = app.account("stripe", &key, "2025-12").await;
    assert_eq!(account.subscriptions[0].status, "active");
    assert_eq!(payments(&account), vec![(ACCOUNT_INVOICE, "refunded")]);
    assert_eq!(account.balance, 500);
    assert_eq!(accounts_keyed(&app, ACCOUNT_CUSTOMER).await, 0);
    let reads = api.received_requests().await.unwrap();
    assert!(!reads.is_empty());
    intent_read_as_written(&reads);
    for read in reads {
        assert_eq!(
            read.headers
                .get("Stripe-Account")
                .map(|v| v.to_str().unwrap()),
            Some(CONNECTED),
            "{}",
            read.url
        );
    }
}

/// docs/design.md §6.2: a customer its account migrated to Accounts v2 has a Customer id and an
/// Account id; its events before the migration name the Customer, those after name both. One
/// account, keyed by the Customer id.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_customer_named_by_both_ids_is_one_account_keyed_by_its_customer_id(pool: PgPool) {
    let app = corpus_app(pool).await;
    let ids = ids("Dahlia");
    for (name, mut body) in corpus("stripe/dahlia") {
        let object = &mut body["data"]["object"];
        // Subscriptions and invoices after the migration name the Account too.
        if object.get("customer_account").is_some() && name != "customer.subscription.created" {
            object["customer_account"] = "acct_1DahliaMigrated1".into();
        }
        send_one(&app, "stripe", &format!("dahlia/{name}"), &body).await;
    }
    assert_generation(&app, ids.each_ref().map(String::as_str)).await;
    assert_eq!(accounts_keyed(&app, "acct_1DahliaMigrated1").await, 0);
}

/// Without an API key nothing tells whose a refund is when its charge names no customer and
/// its payment intent is known under none: it is ignored, and says why.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_account_customers_refund_without_a_key_or_a_known_intent_says_why(pool: PgPool) {
    let app = corpus_app(pool).await;
    let (_, refund) = corpus("stripe/accounts-v2")
        .into_iter()
        .find(|(name, _)| name == "charge.refunded")
        .unwrap();
    let reason = send_one(&app, "stripe", "accounts-v2/charge.refunded", &refund).await;
    assert!(
        reason.contains(&format!(
            "the event names no customer, and none is known for {ACCOUNT_INTENT}"
        )),
        "{reason}"
    );
}
