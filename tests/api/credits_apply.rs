//! Credits applied by the worker (docs/design.md §4.14): Stripe Billing Credits' grants and
//! transactions (the corpus in `testdata/providers/stripe/credits/`, shaped as Stripe's OpenAPI
//! gives `billing.credit_grant` and `billing.credit_balance_transaction`) stored as each grant's
//! register and ledger, in any order, a transaction before its grant kept and counted when the
//! grant comes; catalog credit packs minted by a paid payment and voided by its refund, in
//! either order; and what the credits tell — granted, expired, voided, low, depleted — once.

use chrono::Utc;
use serde_json::{json, Value};
use shared::billing::credits::{Quantity, DEFAULT_PRIORITY};
use shared::domain::{Catalog, CustomerId};
use sqlx::PgPool;

use crate::corpus::corpus;
use crate::helpers::*;

/// The corpus's grant, its customer and its transactions, as Stripe sends them.
const GRANT: &str = "credgr_test_61CrdGrant01QxW3mR8tYb2Lp5";
const CUSTOMER: &str = "cus_CreditCust0001";

/// The corpus's snapshot events (`1-…` to `5-…`), in file order, each made another
/// customer's, grant's and transactions' by the suffix `ns` so that two orders of the same set
/// can be compared in one database.
fn credits_corpus(ns: &str) -> Vec<Value> {
    corpus("stripe/credits")
        .into_iter()
        .map(|(_, event)| event)
        .filter(|event| !event["type"].as_str().unwrap().starts_with("v1."))
        .map(|event| namespaced(event, ns))
        .collect()
}

fn namespaced(mut event: Value, ns: &str) -> Value {
    let suffix = |v: &mut Value| {
        if let Some(s) = v.as_str() {
            *v = json!(format!("{s}{ns}"));
        }
    };
    suffix(&mut event["id"]);
    let object = &mut event["data"]["object"];
    suffix(&mut object["id"]);
    if object.get("customer").is_some() {
        suffix(&mut object["customer"]);
    }
    if object.get("credit_grant").is_some() {
        suffix(&mut object["credit_grant"]);
    }
    event
}

/// Applies what is waiting on the queue.
async fn deliver(app: &TestApp, events: &[Value]) {
    for event in events {
        let (status, answer) = app.post("stripe", &stripe_delivery(event)).await;
        assert_eq!(status, http::StatusCode::OK, "{answer}");
        app.run_worker().await;
    }
}

/// A customer's credit grant rows, as the columns say them (the events they name aside).
async fn grants_of(pool: &PgPool, customer: &str, ns: &str) -> Value {
    let rows: Value = sqlx::query_scalar(
        "SELECT COALESCE(jsonb_agg(jsonb_build_object(
                    'grant_id', grant_id, 'origin', origin, 'unit', unit, 'scope', scope,
                    'amount', amount::text, 'category', category, 'priority', priority,
                    'created_at', created_at, 'effective_at', effective_at,
                    'expires_at', expires_at, 'voided_at', voided_at, 'version_at', version_at,
                    'version_key', version_key) ORDER BY grant_id), '[]')
         FROM credit_grants WHERE customer_id = $1",
    )
    .bind(customer)
    .fetch_one(pool)
    .await
    .unwrap();
    without(rows, ns)
}

/// The transactions of a customer's grants.
async fn transactions_of(pool: &PgPool, customer: &str, ns: &str) -> Value {
    let rows: Value = sqlx::query_scalar(
        "SELECT COALESCE(jsonb_agg(jsonb_build_object(
                    'id', t.transaction_id, 'grant', t.grant_id, 'kind', t.kind,
                    'amount', t.amount::text, 'effective_at', t.effective_at)
                    ORDER BY t.transaction_id), '[]')
         FROM credit_transactions t
         WHERE t.grant_id IN (SELECT grant_id FROM credit_grants WHERE customer_id = $1)",
    )
    .bind(customer)
    .fetch_one(pool)
    .await
    .unwrap();
    without(rows, ns)
}

/// The credits effects of a customer: kind, cause and body (without the sequence), in id order.
async fn credits_effects_of(app: &TestApp, customer: &str, ns: &str) -> Vec<(String, Value)> {
    let mut told: Vec<(String, Value)> = app
        .effects()
        .await
        .into_iter()
        .filter(|e| e.customer_id == customer && e.kind.starts_with("billing.credits_"))
        .map(|mut e| {
            e.body["data"].as_object_mut().unwrap().remove("sequence");
            e.body.as_object_mut().unwrap().remove("id");
            (e.kind, without(e.body, ns))
        })
        .collect();
    told.sort_by_key(|(kind, body)| (kind.clone(), body.to_string()));
    told
}

/// `value` with the namespace `ns` taken out of every string.
fn without(value: Value, ns: &str) -> Value {
    if ns.is_empty() {
        return value;
    }
    serde_json::from_str(&value.to_string().replace(ns, "")).unwrap()
}

/// The account's credits as the registers read them.
async fn credits_of(pool: &PgPool, customer: &str) -> shared::billing::credits::Credits {
    let mut conn = pool.acquire().await.unwrap();
    let customer = CustomerId::parse(customer).unwrap();
    let (registers, _) = shared::billing::registers::of_account(&mut conn, "stripe", &customer)
        .await
        .unwrap()
        .expect("the account exists");
    registers.credits
}

async fn log_of(pool: &PgPool, customer: &str) -> Vec<(String, String, String)> {
    sqlx::query_as(
        "SELECT event_type, outcome, reason FROM account_log WHERE customer_id = $1
         ORDER BY occurred_at, event_id",
    )
    .bind(customer)
    .fetch_all(pool)
    .await
    .unwrap()
}

fn q(n: i64) -> Quantity {
    Quantity::whole(n)
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_stripe_grant_and_its_ledger_are_the_same_rows_and_effects_in_either_order(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    app.enable_effects().await;
    let (canon, reversed) = ("_NSk", "_NSr");
    deliver(&app, &credits_corpus(canon)).await;
    // The same set in reverse, with a copy of the application: the three transactions come
    // before their grant, are kept, and are counted when the grant comes.
    let mut backwards = credits_corpus(reversed);
    backwards.reverse();
    backwards.insert(2, backwards[1].clone());
    deliver(&app, &backwards).await;

    let (a, b) = (
        format!("{CUSTOMER}{canon}"),
        format!("{CUSTOMER}{reversed}"),
    );
    assert_eq!(
        grants_of(&pool, &b, reversed).await,
        grants_of(&pool, &a, canon).await
    );
    assert_eq!(
        transactions_of(&pool, &b, reversed).await,
        transactions_of(&pool, &a, canon).await
    );
    let grants = grants_of(&pool, &a, canon).await;
    assert_eq!(grants[0]["amount"], "1000.000000000000");
    assert_eq!(
        grants[0]["version_key"], "evt_1CrdGrantUpdated0001",
        "the later snapshot"
    );
    assert_eq!(
        transactions_of(&pool, &a, canon)
            .await
            .as_array()
            .unwrap()
            .len(),
        3
    );

    // Stripe's ledger: 1000 granted, 300 applied, 700 expired at expires_at: nothing left.
    for customer in [&a, &b] {
        let credits = credits_of(&pool, customer).await;
        let [total] = credits
            .totals_at(Utc::now().timestamp())
            .try_into()
            .unwrap();
        assert_eq!(
            (total.granted, total.used, total.expired, total.available),
            (q(1000), q(300), q(700), Quantity::ZERO),
            "{customer}"
        );
        let before_expiry = credits.totals_at(1_769_903_999);
        assert_eq!(before_expiry[0].available, q(700));
        assert!(credits.held().is_empty());
        assert_eq!(
            credits.balances_at(0).len(),
            1,
            "one grant: {:?}",
            credits.balances_at(0)
        );
        assert_eq!(
            credits
                .register(&format!("{GRANT}{}", &customer[CUSTOMER.len()..]))
                .map(|r| r.latest.priority()),
            Some(DEFAULT_PRIORITY)
        );
    }

    // Told the same in both orders: granted once, expired once, and depleted at the expiry.
    let told = credits_effects_of(&app, &a, canon).await;
    assert_eq!(credits_effects_of(&app, &b, reversed).await, told);
    let kinds: Vec<&str> = told.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "billing.credits_depleted",
            "billing.credits_expired",
            "billing.credits_granted"
        ]
    );
    let depleted = &told[0].1;
    assert_eq!(depleted["data"]["unit"], "usd");
    assert_eq!(depleted["data"]["crossed_at"], "2026-02-01T00:00:00Z");

    // Every event is in the account's log, those kept before their grant too.
    let log = log_of(&pool, &a).await;
    assert_eq!(log.len(), 5, "{log:#?}");
    assert!(
        log.iter().all(|(_, outcome, _)| outcome == "applied"),
        "{log:#?}"
    );
    let kept = log_of(&pool, &b).await;
    assert_eq!(kept.len(), 5, "{kept:#?}");
    // In reverse the first snapshot comes last, older than the one stored: superseded.
    let superseded: Vec<&str> = kept
        .iter()
        .filter(|(_, outcome, _)| outcome == "ignored")
        .map(|(_, _, reason)| reason.as_str())
        .collect();
    assert_eq!(superseded.len(), 1, "{kept:#?}");
    assert!(superseded[0].starts_with("a newer snapshot of credit grant"));
    let applied = kept
        .iter()
        .find(|(_, _, reason)| reason.contains("credits_applied"))
        .unwrap();
    assert!(
        applied.2.contains("kept: the grant is not known yet")
            && applied.2.contains("counted since its grant came"),
        "{applied:?}"
    );
    // The copy was a copy: one delivery more, nothing applied twice.
    let copies: i64 = app
        .count("SELECT count(*) FROM inbox_events WHERE seen_count > 1")
        .await;
    assert_eq!(copies, 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_transaction_before_its_grant_is_kept_with_its_grant_unknown_and_never_dropped(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    let events = credits_corpus("");
    let applied = events
        .iter()
        .find(|e| e["data"]["object"]["debit"]["type"] == "credits_applied")
        .unwrap();
    deliver(&app, std::slice::from_ref(applied)).await;
    let id = app
        .event_id("stripe", applied["id"].as_str().unwrap())
        .await;
    let kept = app.event(id).await;
    assert_eq!(kept.status, "applied");
    let reason = kept.reason.unwrap();
    assert!(
        reason.contains(GRANT) && reason.contains("not known yet"),
        "{reason}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM credit_transactions").await,
        1,
        "its row is kept, keyed by its grant"
    );
    assert_eq!(app.count("SELECT count(*) FROM account_log").await, 0);
    // A copy finds it kept: one row still.
    deliver(&app, std::slice::from_ref(applied)).await;
    assert_eq!(
        app.count("SELECT count(*) FROM credit_transactions").await,
        1
    );

    deliver(&app, &events[..1]).await;
    let credits = credits_of(&pool, CUSTOMER).await;
    let [grant] = credits.balances_at(1_768_600_000).try_into().unwrap();
    assert_eq!((grant.used, grant.available()), (q(300), q(700)));
    let log = log_of(&pool, CUSTOMER).await;
    assert_eq!(log.len(), 2, "{log:#?}");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_void_is_absorbing_and_told_once_whatever_snapshot_comes_after(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    app.enable_effects().await;
    let created = credits_corpus("").remove(0);
    let mut voided = created.clone();
    voided["id"] = json!("evt_1CrdGrantVoided0001");
    voided["type"] = json!("billing.credit_grant.updated");
    voided["created"] = json!(1_767_400_000);
    voided["data"]["object"]["updated"] = json!(1_767_400_000);
    voided["data"]["object"]["voided_at"] = json!(1_767_400_000);
    // A later snapshot that says nothing of the void (metadata edited, say).
    let mut later = created.clone();
    later["id"] = json!("evt_1CrdGrantLater00001");
    later["type"] = json!("billing.credit_grant.updated");
    later["created"] = json!(1_767_500_000);
    later["data"]["object"]["updated"] = json!(1_767_500_000);
    later["data"]["object"]["name"] = json!("Welcome credit (renamed)");
    deliver(&app, &[created, later, voided.clone(), voided]).await;

    let row: (Option<chrono::DateTime<Utc>>, Option<i64>, String) = sqlx::query_as(
        "SELECT voided_at, voided_by, version_key FROM credit_grants WHERE grant_id = $1",
    )
    .bind(GRANT)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row.0.unwrap().timestamp(), 1_767_400_000);
    assert_eq!(
        row.1,
        Some(app.event_id("stripe", "evt_1CrdGrantVoided0001").await),
        "the void's event is named, so the purge keeps it"
    );
    assert_eq!(row.2, "evt_1CrdGrantLater00001", "the latest snapshot");
    let credits = credits_of(&pool, CUSTOMER).await;
    let [grant] = credits.balances_at(1_767_600_000).try_into().unwrap();
    assert_eq!(
        (grant.live, grant.available(), grant.expired),
        (false, Quantity::ZERO, q(1000))
    );
    let told = credits_effects_of(&app, CUSTOMER, "").await;
    let kinds: Vec<&str> = told.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "billing.credits_depleted",
            "billing.credits_granted",
            "billing.credits_voided"
        ]
    );
}

/// The catalog of the pack tests: a Stripe price, a Polar product, a Lemon Squeezy variant and
/// a Kinde plan key that each grant a pack, Lemon Squeezy's product a plan, and the free plan's
/// low level of credits.
fn pack_catalog() -> Catalog {
    Catalog::parse(
        r#"{"price_1PackPre01": {"credits": {"amount": 1000, "unit": "credits",
                                             "expires_after_days": 365, "priority": 10}},
            "1bd0bcfe-5205-4fab-af9f-a0162303a64c": {"credits": {"amount": 250}},
            "201": {"credits": {"amount": 500, "expires_after_days": 365}},
            "1": {"plan": "pro", "monthly_allowance": 500},
            "credits_1000": {"credits": {"amount": 1000}},
            "free": {"plan": "free", "monthly_allowance": 0, "credits_low": {"credits": 500}}}"#,
    )
    .unwrap()
}

/// The pre-basil corpus's paid invoice of two packs (its one line's price made the pack's,
/// quantity 2) and its charge's full refund, for customer `customer`.
fn pack_invoice_and_refund(customer: &str) -> (Value, Value) {
    let file = |name: &str| {
        corpus("stripe/pre-basil")
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
    };
    let mut paid = file("invoice.paid");
    let mut refund = file("charge.refunded");
    let invoice = format!("in_1PackInv{customer}");
    for event in [&mut paid, &mut refund] {
        event["id"] = json!(format!("{}_{customer}", event["id"].as_str().unwrap()));
        event["data"]["object"]["customer"] = json!(customer);
    }
    paid["data"]["object"]["id"] = json!(invoice);
    let line = &mut paid["data"]["object"]["lines"]["data"][0];
    line["price"]["id"] = json!("price_1PackPre01");
    line["quantity"] = json!(2);
    refund["data"]["object"]["invoice"] = json!(invoice);
    (paid, refund)
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_stripe_pack_is_minted_once_by_its_paid_invoice_and_its_refund_voids_it_in_either_order(
    pool: PgPool,
) {
    let mut app = TestApp::spawn(pool.clone()).await;
    app.worker.catalog = pack_catalog();
    app.enable_effects().await;
    // Paid, a copy, then refunded; and for another customer the refund first.
    let (paid, refund) = pack_invoice_and_refund("cus_PackFirst01");
    deliver(&app, &[paid.clone(), paid.clone(), refund]).await;
    let (paid_late, refund_early) = pack_invoice_and_refund("cus_PackLater01");
    deliver(&app, &[refund_early, paid_late]).await;

    let first = grants_of(&pool, "cus_PackFirst01", "cus_PackFirst01").await;
    let later = grants_of(&pool, "cus_PackLater01", "cus_PackLater01").await;
    assert_eq!(first, later, "the same register in either order");
    let [grant] = first.as_array().unwrap().clone().try_into().unwrap();
    assert_eq!(grant["grant_id"], "pack:in_1PackInv:price_1PackPre01");
    assert_eq!(grant["origin"], "catalog_pack");
    assert_eq!(
        grant["amount"], "2000.000000000000",
        "two packs, minted once"
    );
    assert_eq!(grant["priority"], 10);
    assert!(
        grant["voided_at"].is_string(),
        "the refund voids it: {grant}"
    );
    for customer in ["cus_PackFirst01", "cus_PackLater01"] {
        let credits = credits_of(&pool, customer).await;
        let bought = paid["created"].as_i64().unwrap();
        let [g] = credits.balances_at(bought).try_into().unwrap();
        assert_eq!(g.available(), q(2000), "{customer}: spendable once paid");
        let [after] = credits
            .balances_at(Utc::now().timestamp())
            .try_into()
            .unwrap();
        assert_eq!(
            (after.available(), after.expired),
            (Quantity::ZERO, q(2000))
        );
    }
    let mut kinds = Vec::new();
    for customer in ["cus_PackFirst01", "cus_PackLater01"] {
        let told = credits_effects_of(&app, customer, customer).await;
        kinds.push(told.into_iter().map(|(k, _)| k).collect::<Vec<_>>());
    }
    assert_eq!(
        kinds[0],
        [
            "billing.credits_depleted",
            "billing.credits_granted",
            "billing.credits_low",
            "billing.credits_voided"
        ]
    );
    assert_eq!(kinds[1], kinds[0]);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_polar_order_of_a_pack_product_mints_it_and_its_refund_voids_it(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    app.worker.catalog = pack_catalog();
    let file = |name: &str| {
        corpus("polar")
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
    };
    let paid = file("order.paid");
    let refunded = file("order.refunded");
    for (id, event) in [
        ("msg_paid", &paid),
        ("msg_paid", &paid),
        ("msg_refund", &refunded),
    ] {
        let (status, answer) = app.post("polar", &polar_delivery(id, event)).await;
        assert_eq!(status, http::StatusCode::OK, "{answer}");
        app.run_worker().await;
    }
    let customer = paid["data"]["customer_id"].as_str().unwrap();
    let order = paid["data"]["id"].as_str().unwrap();
    let row: (String, String, String, Option<chrono::DateTime<Utc>>) = sqlx::query_as(
        "SELECT grant_id, unit, amount::text, voided_at FROM credit_grants
         WHERE source = 'polar' AND customer_id = $1",
    )
    .bind(customer)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        row.0,
        format!("pack:{order}:1bd0bcfe-5205-4fab-af9f-a0162303a64c")
    );
    assert_eq!(
        (row.1.as_str(), row.2.as_str()),
        ("credits", "250.000000000000")
    );
    let refunded_at =
        chrono::DateTime::parse_from_rfc3339(refunded["data"]["modified_at"].as_str().unwrap())
            .unwrap();
    assert_eq!(row.3.unwrap().timestamp(), refunded_at.timestamp());
}

/// A Lemon Squeezy order of two packs of variant `201` (the corpus's `order_created`, an Order
/// as docs.lemonsqueezy.com/api/orders gives it, whose `first_order_item` is an Order Item with
/// its `quantity`, docs.lemonsqueezy.com/api/order-items) and its full refund (the corpus's
/// `order_refunded`: `status: refunded`), for customer `customer`, order `order`.
fn lemonsqueezy_pack_order_and_refund(customer: i64, order: &str) -> (Value, Value) {
    let file = |name: &str| {
        corpus("lemonsqueezy")
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
    };
    let (mut paid, mut refunded) = (file("order_created"), file("order_refunded"));
    for event in [&mut paid, &mut refunded] {
        event["data"]["id"] = json!(order);
        let attributes = &mut event["data"]["attributes"];
        attributes["customer_id"] = json!(customer);
        let item = &mut attributes["first_order_item"];
        item["order_id"] = json!(order.parse::<i64>().unwrap());
        item["variant_id"] = json!(201);
        item["quantity"] = json!(2);
    }
    (paid, refunded)
}

/// The Lemon Squeezy pack's register of `customer`: (grant, amount, effective, expires, voided).
async fn lemonsqueezy_pack_of(pool: &PgPool, customer: &str) -> (String, String, i64, i64, i64) {
    sqlx::query_as(
        "SELECT grant_id, amount::text, inbox_secs(effective_at), inbox_secs(expires_at),
                inbox_secs(voided_at)
         FROM credit_grants WHERE source = 'lemonsqueezy' AND customer_id = $1",
    )
    .bind(customer)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_lemonsqueezy_order_of_a_pack_variant_mints_it_once_and_its_refund_voids_it_in_either_order(
    pool: PgPool,
) {
    let mut app = TestApp::spawn(pool.clone()).await;
    app.worker.catalog = pack_catalog();
    let send = |events: Vec<Value>| {
        let app = &app;
        async move {
            for event in events {
                let (status, answer) = app
                    .post("lemonsqueezy", &lemonsqueezy_delivery(&event))
                    .await;
                assert_eq!(status, http::StatusCode::OK, "{answer}");
                app.run_worker().await;
            }
        }
    };
    // Paid, a copy (Lemon Squeezy's retry: the same body), then refunded; for another
    // customer the refund first.
    let (paid, refunded) = lemonsqueezy_pack_order_and_refund(31, "7031");
    send(vec![paid.clone(), paid.clone(), refunded.clone()]).await;
    let (paid_late, refund_early) = lemonsqueezy_pack_order_and_refund(32, "7032");
    send(vec![refund_early, paid_late]).await;

    let time = |event: &Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(event["data"]["attributes"][field].as_str().unwrap())
            .unwrap()
            .timestamp()
    };
    let bought = time(&paid, "updated_at");
    let voided = time(&refunded, "updated_at");
    for (customer, order) in [("31", "7031"), ("32", "7032")] {
        let register = lemonsqueezy_pack_of(&pool, customer).await;
        assert_eq!(
            register,
            (
                format!("pack:orders/{order}:201"),
                "1000.000000000000".to_owned(),
                bought,
                bought + 365 * 86_400,
                voided
            ),
            "customer {customer}: two packs keyed by the order, minted once, voided at the refund"
        );
    }
    // The order granted no plan: its variant is a pack, so its product (a plan key) is not read.
    let granted: i64 =
        sqlx::query_scalar("SELECT count(*) FROM ledger WHERE source = 'lemonsqueezy'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(granted, 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_kinde_payment_of_a_pack_plan_key_mints_it_once_by_its_payment(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    app.worker.catalog = pack_catalog();
    // Kinde's payment event (the corpus's `customer.payment_succeeded`), naming the pack at
    // `data.plan.key` and the payment at `data.payment_id`; a copy, then another event of the
    // same payment.
    let (_, mut paid) = corpus("kinde")
        .into_iter()
        .find(|(n, _)| n == "customer.payment_succeeded")
        .unwrap();
    paid["data"]["customer_id"] = json!("kp_pack01");
    paid["data"]["plan"]["key"] = json!("credits_1000");
    paid["data"]["payment_id"] = json!("pay_kinde01");
    let mut again = paid.clone();
    again["event_id"] = json!("event_019ad7358c3a7e05b3f9a1c64d28e90b");
    for (webhook, claims) in [("wh_1", &paid), ("wh_1", &paid), ("wh_2", &again)] {
        let (status, answer) = app.post("kinde", &kinde_delivery(webhook, claims)).await;
        assert_eq!(status, http::StatusCode::OK, "{answer}");
        app.run_worker().await;
    }
    let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT grant_id, origin, amount::text, inbox_secs(effective_at) FROM credit_grants
         WHERE source = 'kinde' AND customer_id = 'kp_pack01'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let paid_at = chrono::DateTime::parse_from_rfc3339(paid["event_timestamp"].as_str().unwrap())
        .unwrap()
        .timestamp();
    assert_eq!(
        rows,
        [(
            "pack:pay_kinde01:credits_1000".to_owned(),
            "catalog_pack".to_owned(),
            "1000.000000000000".to_owned(),
            paid_at
        )],
        "one pack by the payment, whichever event of it came"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn low_and_depleted_are_told_once_per_downward_crossing_at_the_plans_level(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    app.worker.catalog = Catalog::parse(
        r#"{"free": {"plan": "free", "monthly_allowance": 0, "credits_low": {"usd": 500}}}"#,
    )
    .unwrap();
    app.enable_effects().await;
    let events = credits_corpus("");
    let applied = events
        .iter()
        .find(|e| e["data"]["object"]["debit"]["type"] == "credits_applied")
        .unwrap();
    // 1000 → 700 (300 applied) → 300 (400: below 500, low) → 0 (300: depleted).
    let application = |n: u32, amount: i64, at: i64| {
        let mut t = applied.clone();
        t["id"] = json!(format!("evt_1CrdTxnApplied{n:05}"));
        t["created"] = json!(at);
        let o = &mut t["data"]["object"];
        o["id"] = json!(format!("cbtxn_test_61CrdTxnApplied{n:05}"));
        o["created"] = json!(at);
        o["effective_at"] = json!(at);
        o["debit"]["amount"]["monetary"]["value"] = json!(amount);
        t
    };
    let spends = [
        application(1, 300, 1_767_300_000),
        application(2, 400, 1_767_400_000),
        application(3, 300, 1_767_500_000),
    ];
    deliver(&app, &events[..1]).await;
    deliver(&app, &spends).await;
    // A copy and a replay tell nothing again.
    deliver(&app, &spends[2..]).await;
    let told = credits_effects_of(&app, CUSTOMER, "").await;
    let crossings: Vec<(&str, &Value)> = told
        .iter()
        .filter(|(k, _)| k == "billing.credits_low" || k == "billing.credits_depleted")
        .map(|(k, body)| (k.as_str(), &body["data"]["crossed_at"]))
        .collect();
    assert_eq!(
        crossings,
        [
            ("billing.credits_depleted", &json!("2026-01-04T04:13:20Z")),
            ("billing.credits_low", &json!("2026-01-03T00:26:40Z")),
        ]
    );
    let low = told
        .iter()
        .find(|(k, _)| k == "billing.credits_low")
        .unwrap();
    assert_eq!(low.1["data"]["level"], "500");
    assert_eq!(low.1["data"]["customer_id"], CUSTOMER);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_schedulers_tick_tells_an_expiry_no_event_marks_once(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    app.enable_effects().await;
    let now = Utc::now().timestamp();
    let mut grant = credits_corpus("").remove(0);
    grant["created"] = json!(now - 86_400);
    let object = &mut grant["data"]["object"];
    for field in ["created", "effective_at", "updated"] {
        object[field] = json!(now - 86_400);
    }
    object["expires_at"] = json!(now - 3_600);
    deliver(&app, &[grant]).await;
    let kinds = |told: Vec<(String, Value)>| told.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    assert_eq!(
        kinds(credits_effects_of(&app, CUSTOMER, "").await),
        ["billing.credits_granted"],
        "the grant's event is before its expiry"
    );
    let catalog = Catalog::default();
    let written = shared::effects::credits::tick(&pool, &catalog, Utc::now())
        .await
        .unwrap();
    assert_eq!(written.len(), 2, "{written:?}");
    assert_eq!(
        kinds(credits_effects_of(&app, CUSTOMER, "").await),
        [
            "billing.credits_depleted",
            "billing.credits_expired",
            "billing.credits_granted"
        ]
    );
    let again = shared::effects::credits::tick(&pool, &catalog, Utc::now())
        .await
        .unwrap();
    assert!(again.is_empty(), "once: {again:?}");
    // An account told is no longer due: the others get the tick's turn.
    let mut conn = pool.acquire().await.unwrap();
    let due = shared::effects::credits::due(&mut conn, Utc::now())
        .await
        .unwrap();
    assert!(due.is_empty(), "{due:?}");
    // Numbered after the grant's effect, with no gap.
    let sequences: Vec<i64> = app.effects().await.iter().map(|e| e.sequence).collect();
    assert_eq!(sequences, [1, 2, 3]);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_thin_credit_grant_event_is_read_and_written_to_the_same_register(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    // The fake Stripe answers `GET /v1/billing/credit_grants/{id}` with the grant as the
    // account holds it ("Retrieves a credit grant", docs.stripe.com/api/billing/credit-grant/
    // retrieve), each request checked against Stripe's description: the corpus's grant as its
    // later snapshot shows it.
    let api = crate::thin::StripeApi::start().await;
    crate::traffic::with_stripe_api(&mut app.worker, &api);
    api.fake
        .holds(credits_corpus("")[2]["data"]["object"].clone());
    let thin = corpus("stripe/credits")
        .into_iter()
        .find(|(name, _)| name.starts_with("6-v1."))
        .unwrap()
        .1;
    deliver(&app, std::slice::from_ref(&thin)).await;
    let notice = crate::thin::status_of(&app, thin["id"].as_str().unwrap()).await;
    assert_eq!(notice.status, "applied", "{:?}", notice.reason);
    let read =
        crate::thin::status_of(&app, &format!("read:{}", thin["id"].as_str().unwrap())).await;
    assert_eq!(read.event_type, "billing.credit_grant.updated");
    // The same row the snapshot event writes, standing at the thin event's time.
    let grants = grants_of(&pool, CUSTOMER, "").await;
    assert_eq!(grants[0]["grant_id"], GRANT);
    assert_eq!(grants[0]["amount"], "1000.000000000000");
    assert_eq!(grants[0]["expires_at"], "2026-02-01T00:00:00+00:00");
    // The snapshot event of the same change, delivered too, changes nothing more.
    deliver(&app, &credits_corpus("")[2..3]).await;
    assert_eq!(app.count("SELECT count(*) FROM credit_grants").await, 1);
    let reads: Vec<String> = api
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .map(|r| format!("{} {}", r.method, r.url.path()))
        .collect();
    assert_eq!(reads, [format!("GET /v1/billing/credit_grants/{GRANT}")]);
}
