//! `inboxctl why`, `inboxctl audit` and `GET /v1/accounts/{source}/{customer}/why` on real
//! deliveries: each field names the event that decided it and those it beat, a cut in time
//! gives the fold as it was then, and a register moved by hand shows as `stored` and fails
//! the audit.

use http::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::app_api::{api_state, call, APP_KEY};
use crate::cli::{database_url, inboxctl, run};
use crate::helpers::*;

const T: i64 = 1_772_704_800; // 2026-03-05T10:00:00Z

/// The development sources, as the functions read them from INBOX_SOURCES.
fn sources_env() -> String {
    let local = shared::providers::fixtures::Local {
        jwks_url: "http://127.0.0.1:9/unused",
    };
    shared::providers::fixtures::dev_sources(&local).to_string()
}

fn subscription_event(id: &str, status: &str, price: &str, created: i64) -> Value {
    json!({
        "id": id, "object": "event", "created": created, "livemode": false,
        "type": "customer.subscription.updated",
        "data": {"object": {"id": "sub_why", "object": "subscription", "customer": "cus_why",
                 "status": status, "items": {"data": [{"price": {"id": price}}]}}}
    })
}

/// `cus_why`'s subscription: active on pro at T, then trialing on team a minute later, the
/// later event delivered first. Returns the ids of (the older, the newer).
async fn moved_to_team(app: &TestApp) -> (i64, i64) {
    let mut ids = Vec::new();
    for event in [
        subscription_event("evt_why_team", "trialing", "price_team", T + 60),
        subscription_event("evt_why_pro", "active", "price_pro", T),
    ] {
        let (status, answer) = app.post("stripe", &stripe_delivery(&event)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        ids.push(answer["event_id"].as_i64().unwrap());
        app.run_worker().await;
    }
    (ids[1], ids[0])
}

fn field<'a>(why: &'a Value, name: &str) -> &'a Value {
    why["fields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["field"] == name)
        .unwrap_or_else(|| panic!("field {name} in {why}"))
}

fn cli(url: &str, args: &[&str]) -> (std::process::Output, String, String) {
    run(inboxctl()
        .args(args)
        .env("DATABASE_URL", url)
        .env("INBOX_SOURCES", sources_env()))
}

fn why_json(url: &str, extra: &[&str]) -> Value {
    let mut args = vec!["why", "cus_why", "--json"];
    args.extend_from_slice(extra);
    let (output, stdout, stderr) = cli(url, &args);
    assert!(output.status.success(), "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

const STATUS: &str = "subscription:sub_why:status";

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn why_names_the_event_that_decided_each_field_and_the_older_one_it_beat(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    let (older, newer) = moved_to_team(&app).await;
    let url = database_url(&app.pool).await;

    let why = why_json(&url, &[]);
    assert_eq!(why["source"], "stripe");
    assert_eq!(why["customer_id"], "cus_why");
    let plan = field(&why, "plan");
    assert_eq!(plan["value"], "team");
    assert_eq!(plan["decided_by"]["event_id"], newer);
    assert_eq!(plan["decided_by"]["type"], "customer.subscription.updated");
    assert_eq!(plan["decided_by"]["via"], "webhook");
    assert_eq!(plan["decided_by"]["replayed"], false);
    let status = field(&why, STATUS);
    assert_eq!(status["value"], "trialing");
    assert_eq!(status["decided_by"]["event_id"], newer);
    assert_eq!(
        status["decided_by"]["occurred_at"]
            .as_str()
            .map(|t| chrono::DateTime::parse_from_rfc3339(t).unwrap().timestamp()),
        Some(T + 60)
    );
    assert_eq!(
        status["beaten"].as_array().unwrap().as_slice(),
        [json!({"event_id": older, "reason": "older",
                "detail": "its provider time 2026-03-05T10:00:00.000000Z is before 2026-03-05T10:01:00.000000Z"})]
    );
    assert!(status.get("stored").is_none(), "{status}");
    assert_eq!(why["divergent"], json!([]));
    assert_eq!(why["pending"], json!([]));
    assert_eq!(why["purged"], 0);

    // As it was before the later event: the earlier plan, decided by the earlier event.
    let then = why_json(&url, &["--at", "2026-03-05T10:00:30Z"]);
    assert_eq!(then["at"], "2026-03-05T10:00:30Z");
    assert_eq!(field(&then, "plan")["value"], "pro");
    assert_eq!(field(&then, "plan")["decided_by"]["event_id"], older);
    assert_eq!(field(&then, STATUS)["value"], "active");
    // What the store knew before anything arrived: no field of the fold.
    let before = why_json(&url, &["--received-before", "2020-01-01T00:00:00Z"]);
    assert_eq!(field(&before, "plan")["value"], "free");
    assert!(before["fields"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["field"] != STATUS));

    let (output, stdout, stderr) = cli(&url, &["why", "cus_why"]);
    assert!(output.status.success(), "{stderr}");
    // The subscription's fields are one row, named by the subscription, a line each.
    assert!(stdout.contains("sub_why"), "{stdout}");
    assert!(stdout.contains("  status"), "{stdout}");
    assert!(stdout.contains(&format!("#{older} older")), "{stdout}");
    assert!(stdout.contains("divergent none"), "{stdout}");

    let (output, stdout, stderr) = cli(&url, &["audit", "--all", "--json"]);
    assert!(output.status.success(), "{stdout}{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report, json!({"checked": 1, "skipped": 0, "divergent": []}));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_register_moved_by_hand_shows_what_is_stored_and_fails_the_audit(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    moved_to_team(&app).await;
    let url = database_url(&app.pool).await;
    sqlx::query("UPDATE subscriptions SET status = 'active'")
        .execute(&app.pool)
        .await
        .unwrap();

    let why = why_json(&url, &[]);
    let status = field(&why, STATUS);
    assert_eq!(status["value"], "trialing");
    assert_eq!(status["stored"], "active");
    assert_eq!(why["divergent"], json!([STATUS]));
    let (_, text, _) = cli(&url, &["why", "cus_why"]);
    assert!(text.contains(&format!("! {STATUS}")), "{text}");
    assert!(text.contains("stored: active"), "{text}");

    let (output, stdout, _) = cli(&url, &["audit", "--all", "--json"]);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        report,
        json!({"checked": 1, "skipped": 0, "divergent": [{"source": "stripe",
               "customer_id": "cus_why", "field": STATUS, "stored": "active", "folded": "trialing"}]})
    );
    let (output, stdout, stderr) = cli(&url, &["audit", "--customer", "cus_why"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stdout.contains(STATUS) && stdout.contains("trialing"),
        "{stdout}"
    );
    assert!(stderr.contains("differ"), "{stderr}");
    let (output, _, _) = cli(&url, &["audit", "--customer", "cus_other"]);
    assert!(
        output.status.success(),
        "no account of that customer: nothing differs"
    );

    // A period's used moved by hand differs from the sum of its accepted debits.
    let (output, _, stderr) = cli(
        &url,
        &[
            "usage", "record", "cus_why", "5", "--key", "k1", "--period", "2026-03",
        ],
    );
    assert!(output.status.success(), "{stderr}");
    sqlx::query("UPDATE usage_periods SET used = 7")
        .execute(&app.pool)
        .await
        .unwrap();
    let why = why_json(&url, &[]);
    let used = field(&why, "used:2026-03");
    assert_eq!((&used["value"], &used["stored"]), (&json!(5), &json!(7)));
    assert_eq!(why["divergent"], json!([STATUS, "used:2026-03"]));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn why_and_audit_refuse_what_they_cannot_answer(pool: PgPool) {
    let app = TestApp::spawn(pool).await;
    moved_to_team(&app).await;
    let url = database_url(&app.pool).await;

    let (output, _, stderr) = cli(&url, &["why", "cus_nobody"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr.contains("no account for customer 'cus_nobody'"),
        "{stderr}"
    );
    let (output, _, stderr) = cli(&url, &["why", "cus_why", "--source", "nowhere"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.contains("no source 'nowhere'"), "{stderr}");
    let (output, _, stderr) = cli(&url, &["why", "cus_why", "--at", "yesterday"]);
    assert_eq!(output.status.code(), Some(2), "a usage error");
    assert!(stderr.contains("RFC 3339"), "{stderr}");
    let (output, _, stderr) = cli(&url, &["audit"]);
    assert_eq!(output.status.code(), Some(2), "a usage error");
    assert!(
        stderr.contains("--all") && stderr.contains("--customer"),
        "{stderr}"
    );
    let (output, _, stderr) = run(inboxctl()
        .args(["why", "cus_why"])
        .env("DATABASE_URL", &url)
        .env_remove("INBOX_SOURCES"));
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr.contains("INBOX_SOURCES is not set"), "{stderr}");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_why_route_answers_the_fold_as_the_cli_does(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let (older, newer) = moved_to_team(&app).await;
    let state = api_state(&pool);
    let path = "/v1/accounts/stripe/cus_why/why";

    let answer = call(&state, "GET", path, Some(APP_KEY), &[], None).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let url = database_url(&app.pool).await;
    assert_eq!(
        answer.body,
        why_json(&url, &[]),
        "the same answer as inboxctl why"
    );
    assert_eq!(field(&answer.body, "plan")["decided_by"]["event_id"], newer);
    assert_eq!(field(&answer.body, STATUS)["beaten"][0]["event_id"], older);

    let then = call(
        &state,
        "GET",
        &format!("{path}?at=2026-03-05T10:00:30Z"),
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(then.status, StatusCode::OK);
    assert_eq!(field(&then.body, "plan")["value"], "pro");

    for (query, name) in [
        ("at=yesterday", "at"),
        ("received_before=2026-03-05", "received_before"),
    ] {
        let bad = call(
            &state,
            "GET",
            &format!("{path}?{query}"),
            Some(APP_KEY),
            &[],
            None,
        )
        .await;
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
        assert_eq!(bad.body["code"], "bad_time");
        let detail = bad.body["detail"].as_str().unwrap();
        assert!(
            detail.starts_with(&format!("{name} is an RFC 3339 time")),
            "{detail}"
        );
    }
    let anonymous = call(&state, "GET", path, None, &[], None).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let unknown = call(
        &state,
        "GET",
        "/v1/accounts/stripe/cus_nobody/why",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.body["code"], "unknown_customer");
}

/// `customer_subscription_updated` of a customer that is an Account (`customer` null,
/// `customer_account` set), from a Connect endpoint when `connected` is named.
fn account_customer_event(id: &str, status: &str, price: &str, connected: Option<&str>) -> Value {
    let mut event = subscription_event(id, status, price, T);
    event["data"]["object"]["customer"] = Value::Null;
    event["data"]["object"]["customer_account"] = json!("acct_1WhyCust");
    if let Some(connected) = connected {
        event["account"] = json!(connected);
        // Stripe's ids are unique across accounts: the connected account's is another.
        event["data"]["object"]["id"] = json!("sub_why_connected");
    }
    event
}

/// A customer that is an Account (docs/design.md §4.6a, §6.2): `why`, its route and the audit
/// name it by its `acct_…`; the platform's own and a connected account's are two accounts,
/// told apart by `?stripe_account=` / `--stripe-account`.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn why_and_the_audit_name_a_customer_that_is_an_account(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let mut ids = Vec::new();
    for event in [
        account_customer_event("evt_why_acct_own", "active", "price_pro", None),
        account_customer_event(
            "evt_why_acct_conn",
            "trialing",
            "price_team",
            Some("acct_1WhyConn"),
        ),
    ] {
        let (status, answer) = app.post("stripe", &stripe_delivery(&event)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        ids.push(answer["event_id"].as_i64().unwrap());
        app.run_worker().await;
    }
    let state = api_state(&pool);
    let url = database_url(&app.pool).await;
    for (query, plan, event_id, stripe_account, cli_args) in [
        ("", "pro", ids[0], Value::Null, vec![]),
        (
            "?stripe_account=acct_1WhyConn",
            "team",
            ids[1],
            json!("acct_1WhyConn"),
            vec!["--stripe-account", "acct_1WhyConn"],
        ),
    ] {
        let path = format!("/v1/accounts/stripe/acct_1WhyCust/why{query}");
        let answer = call(&state, "GET", &path, Some(APP_KEY), &[], None).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}: {}", answer.body);
        assert_eq!(answer.body["customer_id"], "acct_1WhyCust", "{path}");
        assert_eq!(answer.body["stripe_account"], stripe_account, "{path}");
        assert_eq!(field(&answer.body, "plan")["value"], plan, "{path}");
        assert_eq!(
            field(&answer.body, "plan")["decided_by"]["event_id"],
            event_id,
            "{path}"
        );
        let mut args = vec!["why", "acct_1WhyCust", "--json"];
        args.extend(cli_args);
        let (output, stdout, stderr) = cli(&url, &args);
        assert!(output.status.success(), "{stderr}");
        let cli_why: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(field(&cli_why, "plan")["value"], plan, "{args:?}");
    }
    // The connected account itself is no customer.
    let connected = call(
        &state,
        "GET",
        "/v1/accounts/stripe/acct_1WhyConn/why",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(connected.body["code"], "unknown_customer");

    let (output, stdout, stderr) = cli(&url, &["audit", "--all", "--json"]);
    assert!(output.status.success(), "{stdout}{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report, json!({"checked": 2, "skipped": 0, "divergent": []}));
    for customer in ["acct_1WhyCust", "acct_1WhyConn/acct_1WhyCust"] {
        let (output, stdout, stderr) = cli(&url, &["audit", "--customer", customer]);
        assert!(output.status.success(), "{customer}: {stdout}{stderr}");
    }
}
