//! A Polar `meter_credit` benefit mirrored as credit grants (docs/design.md §6.3, §4.14):
//! each crediting of a benefit grant — its grant, each cycle — is a grant of origin
//! `polar_meter_credit`, a cycle without rollover ends the crediting before it (Polar resets
//! the meter), a revocation that took the crediting back voids what remains; the same grants
//! and balances in every order, copies changing nothing; the app's debits burn them in the
//! burn order beside a catalog pack, and `why` names the benefit grant's event.
//!
//! The events are `testdata/providers/polar/meter_credit/` (a `BenefitGrantMeterCreditWebhook`
//! as Polar sends it: polarsource/polar `server/polar/benefit/schemas.py`, the properties
//! `BenefitGrantMeterCreditProperties` its `BenefitMeterCreditService` stores,
//! `server/polar/benefit/strategies/meter_credit/`), signed and delivered through intake and
//! worker.

use chrono::{DateTime, Duration, Utc};
use http::StatusCode;
use serde_json::{json, Value};
use shared::billing::credits::{Credits, Quantity};
use shared::domain::{Catalog, CustomerId};
use sqlx::PgPool;

use crate::app_api::{api_state, call, APP_KEY, READER_KEY};
use crate::corpus::corpus;
use crate::helpers::*;

/// The corpus's benefit grant.
const GRANT: &str = "4a7c1e93-2d58-4f0b-b6e1-8c3d9a2f5e71";

/// The corpus's four events (granted, cycled twice, revoked), in file order, made `customer`'s
/// and `grant`'s, every time moved by `shift` (so a test can set them around its clock).
fn meter_credit_events(customer: &str, grant: &str, shift: Duration) -> Vec<Value> {
    corpus("polar/meter_credit")
        .into_iter()
        .map(|(_, event)| {
            let mut event = shifted(event, shift);
            let data = &mut event["data"];
            data["id"] = json!(grant);
            data["customer_id"] = json!(customer);
            data["user_id"] = json!(customer);
            data["customer"]["id"] = json!(customer);
            event
        })
        .collect()
}

/// `value` with every RFC 3339 time in it moved by `shift`, written as Polar writes it.
fn shifted(value: Value, shift: Duration) -> Value {
    match value {
        Value::String(s) => match DateTime::parse_from_rfc3339(&s) {
            Ok(at) => {
                let moved = (at + shift).with_timezone(&Utc);
                let z = moved.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
                // `last_credited_at` is Python's `isoformat()`: `+00:00`, not `Z`.
                json!(if s.ends_with("+00:00") {
                    z.replace('Z', "+00:00")
                } else {
                    z
                })
            }
            Err(_) => Value::String(s),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(|v| shifted(v, shift)).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, shifted(v, shift)))
                .collect(),
        ),
        other => other,
    }
}

/// Delivers `event` signed as Polar signs it under the message id `id`, and works it; the
/// intake's answer (`stored` or `duplicate`) and the stored event's id.
async fn deliver(app: &TestApp, id: &str, event: &Value) -> (String, i64) {
    let (status, answer) = app.post("polar", &polar_delivery(id, event)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.run_worker().await;
    (
        answer["status"].as_str().unwrap().to_owned(),
        answer["event_id"].as_i64().unwrap(),
    )
}

/// A customer's credit grant rows as the columns say them, `ns` taken out of every string.
async fn grants_of(pool: &PgPool, customer: &str, ns: &str) -> Value {
    let rows: Value = sqlx::query_scalar(
        "SELECT COALESCE(jsonb_agg(jsonb_build_object(
                    'grant_id', grant_id, 'origin', origin, 'unit', unit, 'scope', scope,
                    'amount', amount::text, 'category', category, 'priority', priority,
                    'effective_at', effective_at, 'expires_at', expires_at,
                    'voided_at', voided_at, 'version_at', version_at,
                    'version_key', version_key) ORDER BY grant_id), '[]')
         FROM credit_grants WHERE source = 'polar' AND customer_id = $1",
    )
    .bind(customer)
    .fetch_one(pool)
    .await
    .unwrap();
    serde_json::from_str(&rows.to_string().replace(ns, "")).unwrap()
}

/// The account's credits as the registers read them.
async fn credits_of(pool: &PgPool, customer: &str) -> Credits {
    let mut conn = pool.acquire().await.unwrap();
    let customer = CustomerId::parse(customer).unwrap();
    let (registers, _) = shared::billing::registers::of_account(&mut conn, "polar", &customer)
        .await
        .unwrap()
        .expect("the account exists");
    registers.credits
}

/// What the `credits` unit holds at `at`: (available, granted, expired).
fn held(credits: &Credits, at: &str) -> (Quantity, Quantity, Quantity) {
    let at = DateTime::parse_from_rfc3339(at).unwrap().timestamp();
    credits
        .totals_at(at)
        .into_iter()
        .find(|t| t.unit == "credits")
        .map(|t| (t.available, t.granted, t.expired))
        .unwrap_or((Quantity::ZERO, Quantity::ZERO, Quantity::ZERO))
}

fn q(n: i64) -> Quantity {
    Quantity::whole(n)
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

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_meter_credit_grant_its_cycles_and_revocation_give_the_same_grants_in_every_order(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    let mut ends = Vec::new();
    for (n, order) in orders(4).into_iter().enumerate() {
        let customer = format!("cust_mc_{n:02}");
        let grant = format!("{GRANT}-o{n:02}");
        let events = meter_credit_events(&customer, &grant, Duration::zero());
        for (k, &i) in order.iter().enumerate() {
            let id = format!("msg_{customer}_{i}");
            assert_eq!(deliver(&app, &id, &events[i]).await.0, "stored");
            // A copy of every other delivery at once, re-signed by Polar's retry.
            if k % 2 == 1 {
                assert_eq!(deliver(&app, &id, &events[i]).await.0, "duplicate");
            }
        }
        for &i in order.iter().rev() {
            let id = format!("msg_{customer}_{i}");
            assert_eq!(deliver(&app, &id, &events[i]).await.0, "duplicate");
        }
        let statuses: Vec<String> = sqlx::query_scalar(
            "SELECT status FROM inbox_events WHERE source = 'polar' AND dedupe_key LIKE $1",
        )
        .bind(format!("msg_{customer}_%"))
        .fetch_all(&pool)
        .await
        .unwrap();
        assert!(
            statuses.iter().all(|s| s == "applied" || s == "ignored"),
            "{customer}: {statuses:?}"
        );
        let credits = credits_of(&pool, &customer).await;
        let balances: Vec<_> = [
            "2025-12-15T00:00:00Z",
            "2026-01-15T00:00:00Z",
            "2026-02-10T00:00:00Z",
            "2026-03-01T00:00:00Z",
        ]
        .into_iter()
        .map(|at| held(&credits, at))
        .collect();
        ends.push((
            grants_of(&pool, &customer, &format!("-o{n:02}")).await,
            balances,
        ));
    }
    let (grants, balances) = &ends[0];
    for (n, end) in ends.iter().enumerate() {
        assert_eq!(end, &ends[0], "order {n} ends as the first");
    }
    // One grant a crediting, each of the benefit's 1,000 units, keyed by its time.
    let rows = grants.as_array().unwrap();
    let ids: Vec<&str> = rows
        .iter()
        .map(|g| g["grant_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            format!("meter_credit:{GRANT}:2025-12-01T10:00:04.320114Z"),
            format!("meter_credit:{GRANT}:2026-01-01T10:00:06.112457Z"),
            format!("meter_credit:{GRANT}:2026-02-01T10:00:05.740981Z"),
        ]
    );
    for g in rows {
        assert_eq!(
            (&g["origin"], &g["unit"], &g["amount"], &g["category"]),
            (
                &json!("polar_meter_credit"),
                &json!("credits"),
                &json!("1000.000000000000"),
                &json!("paid")
            )
        );
    }
    // No rollover: each cycle's reset ends the crediting before it; the revocation took the
    // last one back.
    let ends_of = |g: &Value| (g["expires_at"].clone(), g["voided_at"].clone());
    assert_eq!(
        ends_of(&rows[0]),
        (json!("2026-01-01T10:00:06+00:00"), Value::Null)
    );
    assert_eq!(
        ends_of(&rows[1]),
        (json!("2026-02-01T10:00:05+00:00"), Value::Null)
    );
    assert_eq!(
        ends_of(&rows[2]),
        (Value::Null, json!("2026-02-20T15:31:09+00:00"))
    );
    assert_eq!(
        balances,
        &vec![
            (q(1000), q(1000), q(0)),
            (q(1000), q(2000), q(1000)),
            (q(1000), q(3000), q(2000)),
            (q(0), q(3000), q(3000)),
        ],
        "(available, granted, expired) in each month"
    );
}

/// The pack catalog: Polar's corpus product `1bd0bcfe-…` is a pack of 250 credits, spent
/// first (priority 10).
fn pack_catalog() -> Catalog {
    Catalog::parse(
        r#"{"1bd0bcfe-5205-4fab-af9f-a0162303a64c":
                {"credits": {"amount": 250, "priority": 10}}}"#,
    )
    .unwrap()
}

/// The corpus's paid Polar order (of the pack's product), `customer`'s, made at `at`.
fn pack_order(customer: &str, at: DateTime<Utc>) -> Value {
    let (_, mut paid) = corpus("polar")
        .into_iter()
        .find(|(n, _)| n == "order.paid")
        .unwrap();
    let when = json!(at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
    paid["timestamp"] = when.clone();
    let data = &mut paid["data"];
    data["created_at"] = when.clone();
    data["modified_at"] = when;
    data["customer_id"] = json!(customer);
    data["customer"]["id"] = json!(customer);
    paid
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_debit_burns_the_meter_credit_in_burn_order_beside_a_pack_and_why_names_its_event(
    pool: PgPool,
) {
    let mut app = TestApp::spawn(pool.clone()).await;
    app.worker.catalog = pack_catalog();
    app.enable_effects().await;
    let customer = "cust_mc_debit";
    // Granted two days ago (the corpus's grant moved to then); a pack bought a day ago.
    let first = meter_credit_events(customer, GRANT, Duration::zero()).remove(0)["data"]
        ["properties"]["last_credited_at"]
        .as_str()
        .map(|s| DateTime::parse_from_rfc3339(s).unwrap())
        .unwrap();
    let shift = (Utc::now() - Duration::days(2)) - first.with_timezone(&Utc);
    let events = meter_credit_events(customer, GRANT, shift);
    let (_, granted) = deliver(&app, "msg_debit_granted", &events[0]).await;
    let (_, bought) = deliver(
        &app,
        "msg_debit_pack",
        &pack_order(customer, Utc::now() - Duration::days(1)),
    )
    .await;
    let state = api_state(&pool);
    let read = call(
        &state,
        "GET",
        &format!("/v1/accounts/polar/{customer}/credits"),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    let listed: Vec<(Value, Value)> = read.body["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["origin"].clone(), g["remaining"].clone()))
        .collect();
    assert_eq!(
        listed,
        [
            (json!("catalog_pack"), json!("250")),
            (json!("polar_meter_credit"), json!("1000"))
        ],
        "in burn order: the pack's priority 10 before the benefit's default"
    );
    // No plan, so no allowance: 300 takes the pack's 250, then 50 of the meter credit.
    let spent = call(
        &state,
        "POST",
        &format!("/v1/accounts/polar/{customer}/usage"),
        Some(APP_KEY),
        &[("idempotency-key", "k-300")],
        Some(json!({"amount": 300})),
    )
    .await;
    assert_eq!(spent.status, StatusCode::OK, "{}", spent.body);
    let order = meter_credit_events(customer, GRANT, shift).remove(0);
    let paid_order = pack_order(customer, Utc::now())["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let crediting = DateTime::parse_from_rfc3339(
        order["data"]["properties"]["last_credited_at"]
            .as_str()
            .unwrap(),
    )
    .unwrap()
    .with_timezone(&Utc);
    let meter_grant = format!(
        "meter_credit:{GRANT}:{}",
        crediting.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    );
    let pack_grant = format!("pack:{paid_order}:1bd0bcfe-5205-4fab-af9f-a0162303a64c");
    assert_eq!(
        spent.body["allocation"]["from_grants"],
        json!([{"grant_id": pack_grant, "amount": "250"},
               {"grant_id": meter_grant, "amount": "50"}]),
        "{}",
        spent.body
    );
    let why = call(
        &state,
        "GET",
        &format!("/v1/accounts/polar/{customer}/why"),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(why.status, StatusCode::OK, "{}", why.body);
    let [balance] = why.body["credits"]
        .as_array()
        .unwrap()
        .clone()
        .try_into()
        .unwrap();
    assert_eq!(
        (&balance["available"], &balance["used"]),
        (&json!("950"), &json!("300"))
    );
    assert_eq!(
        balance["debits"][0]["from_grants"],
        json!([
            {"grant_id": pack_grant, "origin": "catalog_pack", "event_id": bought,
             "amount": "250"},
            {"grant_id": meter_grant, "origin": "polar_meter_credit", "event_id": granted,
             "amount": "50"},
        ]),
        "each grant by the event its register holds: the order, the benefit grant's"
    );
    // The account read carries the same balances.
    let account = call(
        &state,
        "GET",
        &format!("/v1/accounts/polar/{customer}"),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(account.status, StatusCode::OK, "{}", account.body);
    assert_eq!(account.body["credits"][0]["available"], "950");
    // What the worker told of the grant: granted, its origin named.
    let granted_told: Vec<Value> = app
        .effects()
        .await
        .into_iter()
        .filter(|e| e.customer_id == customer && e.kind == "billing.credits_granted")
        .map(|e| e.body["data"]["grant"].clone())
        .filter(|g| g["origin"] == "polar_meter_credit")
        .collect();
    assert_eq!(granted_told.len(), 1, "told once");
    assert_eq!(granted_told[0]["grant_id"], json!(meter_grant));
    let mut events: Vec<i64> = balance["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_i64().unwrap())
        .collect();
    events.sort();
    assert_eq!(events, [granted, bought]);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_cycle_without_rollover_ends_the_credit_before_it_and_with_rollover_keeps_it(
    pool: PgPool,
) {
    let app = TestApp::spawn(pool.clone()).await;
    let state = api_state(&pool);
    // The corpus's grant and first cycle, the cycle ten days ago; the cycle told first, then
    // the grant, so the end comes from the later event before the crediting it ends.
    let first = meter_credit_events("x", GRANT, Duration::zero())[1]["data"]["modified_at"]
        .as_str()
        .map(|s| DateTime::parse_from_rfc3339(s).unwrap())
        .unwrap();
    let shift = (Utc::now() - Duration::days(10)) - first.with_timezone(&Utc);
    for rollover in [false, true] {
        let customer = format!("cust_mc_rollover_{rollover}");
        let grant = format!("{GRANT}-{rollover}");
        let mut events = meter_credit_events(&customer, &grant, shift);
        for event in &mut events {
            event["data"]["benefit"]["properties"]["rollover"] = json!(rollover);
        }
        deliver(&app, &format!("msg_{customer}_cycled"), &events[1]).await;
        let read = |at: Option<String>| {
            let state = &state;
            let customer = customer.clone();
            async move {
                let path = match at {
                    Some(at) => format!("/v1/accounts/polar/{customer}/credits?at={at}"),
                    None => format!("/v1/accounts/polar/{customer}/credits"),
                };
                let answer = call(state, "GET", &path, Some(READER_KEY), &[], None).await;
                assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
                answer.body
            }
        };
        let before_grant = read(None).await;
        deliver(&app, &format!("msg_{customer}_granted"), &events[0]).await;
        let now = read(None).await;
        let before_cycle =
            (Utc::now() - Duration::days(11)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let then = read(Some(before_cycle)).await;
        let available = |body: &Value| body["balances"][0]["available"].clone();
        assert_eq!(available(&then), json!("1000"), "before the cycle");
        let grants = now["grants"].as_array().unwrap();
        assert_eq!(grants.len(), 2, "{now}");
        if rollover {
            assert_eq!(available(&now), json!("2000"), "what remains rolls over");
            assert!(grants.iter().all(|g| g["expires_at"].is_null()));
        } else {
            assert_eq!(available(&now), json!("1000"), "the meter was reset");
            assert_eq!(now["balances"][0]["expired"], json!("1000"));
            let ended: Vec<&Value> = grants
                .iter()
                .filter(|g| !g["expires_at"].is_null())
                .collect();
            assert_eq!(ended.len(), 1);
            assert_eq!(
                ended[0]["expires_at"],
                grants.iter().find(|g| g["expires_at"].is_null()).unwrap()["effective_at"]
            );
        }
        // The cycle names the crediting before it: its grant's own event, told late,
        // changes nothing the cycle said.
        assert_eq!(
            (&before_grant["grants"], &before_grant["balances"]),
            (&now["grants"], &now["balances"])
        );
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_debit_made_after_a_cycle_told_late_is_rederived_onto_the_new_crediting(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let state = api_state(&pool);
    let customer = "cust_mc_late_cycle";
    // The grant 41 days ago, its cycle 10 days ago; the cycle's event is told after a debit.
    let cycled_at = meter_credit_events("x", GRANT, Duration::zero())[1]["data"]["properties"]
        ["last_credited_at"]
        .as_str()
        .map(|s| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc))
        .unwrap();
    let shift = (Utc::now() - Duration::days(10)) - cycled_at;
    let events = meter_credit_events(customer, GRANT, shift);
    let crediting = |i: usize| {
        let at = DateTime::parse_from_rfc3339(
            events[i]["data"]["properties"]["last_credited_at"]
                .as_str()
                .unwrap(),
        )
        .unwrap()
        .with_timezone(&Utc);
        format!(
            "meter_credit:{GRANT}:{}",
            at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        )
    };
    deliver(&app, "msg_late_granted", &events[0]).await;
    let spent = call(
        &state,
        "POST",
        &format!("/v1/accounts/polar/{customer}/usage"),
        Some(APP_KEY),
        &[("idempotency-key", "k-late")],
        Some(json!({"amount": 300})),
    )
    .await;
    assert_eq!(spent.status, StatusCode::OK, "{}", spent.body);
    assert_eq!(
        spent.body["allocation"]["from_grants"],
        json!([{"grant_id": crediting(0), "amount": "300"}]),
        "as decided: the only crediting known"
    );
    let (_, cycle) = deliver(&app, "msg_late_cycled", &events[1]).await;
    // The meter was reset ten days ago: the debit, made since, spent the cycle's crediting.
    let read = call(
        &state,
        "GET",
        &format!("/v1/accounts/polar/{customer}/credits"),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    assert_eq!(
        read.body["balances"][0]["available"], "700",
        "{}",
        read.body
    );
    let remaining: Vec<(Value, Value)> = read.body["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["grant_id"].clone(), g["remaining"].clone()))
        .collect();
    assert!(
        remaining.contains(&(json!(crediting(1)), json!("700"))),
        "{remaining:?}"
    );
    let why = call(
        &state,
        "GET",
        &format!("/v1/accounts/polar/{customer}/why"),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        why.body["credits"][0]["debits"][0]["from_grants"],
        json!([{"grant_id": crediting(1), "origin": "polar_meter_credit", "event_id": cycle,
                "amount": "300"}]),
        "{}",
        why.body
    );
    // The next debit's check under the lock agrees: 700 is there, 701 is not.
    let over = call(
        &state,
        "POST",
        &format!("/v1/accounts/polar/{customer}/usage"),
        Some(APP_KEY),
        &[("idempotency-key", "k-over")],
        Some(json!({"amount": 701})),
    )
    .await;
    assert_eq!(over.status, StatusCode::CONFLICT, "{}", over.body);
    let fits = call(
        &state,
        "POST",
        &format!("/v1/accounts/polar/{customer}/usage"),
        Some(APP_KEY),
        &[("idempotency-key", "k-fits")],
        Some(json!({"amount": 700})),
    )
    .await;
    assert_eq!(fits.status, StatusCode::OK, "{}", fits.body);
}
