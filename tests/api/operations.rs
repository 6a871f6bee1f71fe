//! The account's event log and replay for the app, and the admin API (docs/api.md,
//! docs/design.md §12.5), through the api function's real handler on real Postgres and the
//! SQS server: every answer is checked against docs/openapi.yaml by `app_api::call`.

use chrono::{Duration as Span, Utc};
use http::StatusCode;
use serde_json::{json, Value};
use shared::handlers::api::ApiState;
use sqlx::PgPool;

use crate::app_api::{api_state, call, Answer, ADMIN_KEY, APP_KEY, READER_KEY, REPLAY_KEY};
use crate::helpers::*;

/// A Kinde plan change of `customer` to `plan` at `at`, delivered and applied.
async fn plan_change(
    app: &TestApp,
    customer: &str,
    id: &str,
    plan: &str,
    at: chrono::DateTime<Utc>,
) -> i64 {
    let claims = json!({
        "type": "customer.plan_changed",
        "event_id": id,
        "event_timestamp": at.to_rfc3339(),
        "source": "api",
        "data": {"customer_id": customer, "plan": {"key": plan, "name": plan}}
    });
    let (status, answer) = app
        .post("kinde", &kinde_delivery(&format!("wh_{id}"), &claims))
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.run_worker().await;
    answer["event_id"].as_i64().expect("stored")
}

/// An api instance that replays onto the app's queue.
fn api_of(app: &TestApp, pool: &PgPool) -> ApiState {
    let mut state = api_state(pool);
    state.events = Some(shared::platform::queue::Queue::new(
        app.sqs.clone(),
        app.queue_url.clone(),
    ));
    state
}

async fn get(state: &ApiState, key: &str, path: &str) -> Answer {
    call(state, "GET", path, Some(key), &[], None).await
}

async fn post(state: &ApiState, key: &str, path: &str, body: Option<Value>) -> Answer {
    call(state, "POST", path, Some(key), &[], body).await
}

async fn status_of(app: &TestApp, id: i64) -> String {
    sqlx::query_scalar("SELECT status FROM inbox_events WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_accounts_log_is_its_events_in_provider_order_a_page_at_a_time(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let state = api_of(&app, &pool);
    let now = Utc::now();
    let late = plan_change(&app, "kc_log", "ev_late", "pro", now).await;
    let early = plan_change(&app, "kc_log", "ev_early", "free", now - Span::minutes(5)).await;
    let other = plan_change(&app, "kc_other", "ev_other", "pro", now).await;

    let all = get(&state, READER_KEY, "/v1/accounts/kinde/kc_log/events").await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.body);
    let ids: Vec<i64> = all.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        ids,
        [early, late],
        "provider order, the other customer's event not listed"
    );
    assert!(!ids.contains(&other));
    let first = &all.body["events"][0];
    assert_eq!(first["provider_event_id"], "ev_early");
    assert_eq!(first["type"], "customer.plan_changed");
    assert_eq!(
        (first["status"].as_str(), first["outcome"].as_str()),
        (Some("ignored"), Some("ignored"))
    );
    assert!(first["reason"].as_str().is_some_and(|r| !r.is_empty()));
    assert_eq!(
        (first["seen_count"].as_i64(), first["via"].as_str()),
        (Some(1), Some("webhook"))
    );
    assert_eq!(all.body["events"][1]["outcome"], "applied");
    assert_eq!(all.body["next"], Value::Null);

    let page = get(
        &state,
        READER_KEY,
        "/v1/accounts/kinde/kc_log/events?limit=1",
    )
    .await;
    assert_eq!(page.body["events"][0]["event_id"], early);
    let next = page.body["next"].as_str().expect("a next page").to_owned();
    let rest = get(
        &state,
        READER_KEY,
        &format!("/v1/accounts/kinde/kc_log/events?limit=1&after={next}"),
    )
    .await;
    assert_eq!(rest.body["events"][0]["event_id"], late);
    assert_eq!(rest.body["next"], Value::Null);

    for (path, status, code) in [
        (
            "/v1/accounts/kinde/kc_nobody/events",
            StatusCode::NOT_FOUND,
            "unknown_customer",
        ),
        (
            "/v1/accounts/kinde/kc_log/events?after=nonsense",
            StatusCode::BAD_REQUEST,
            "bad_cursor",
        ),
        (
            "/v1/accounts/kinde/kc_log/events?limit=101",
            StatusCode::BAD_REQUEST,
            "bad_limit",
        ),
        (
            "/v1/accounts/kinde/kc_log/events?period=2026-11",
            StatusCode::BAD_REQUEST,
            "unknown_parameter",
        ),
    ] {
        let answer = get(&state, READER_KEY, path).await;
        assert_eq!(
            (answer.status, answer.body["code"].as_str()),
            (status, Some(code)),
            "{path}"
        );
    }
    let admin = get(&state, ADMIN_KEY, "/v1/accounts/kinde/kc_log/events").await;
    assert_eq!(
        admin.status,
        StatusCode::FORBIDDEN,
        "admin is not read: an app's key reads its accounts"
    );

    // The purge took the beaten event (as it does a finished event no register names once
    // its retention is over; a Kinde plan event keeps its own grant, so here the row goes by
    // hand): the log still lists it, from the account's log.
    sqlx::query("DELETE FROM inbox_events WHERE id = $1")
        .bind(early)
        .execute(&pool)
        .await
        .unwrap();
    let after_purge = get(&state, READER_KEY, "/v1/accounts/kinde/kc_log/events").await;
    let first = &after_purge.body["events"][0];
    assert_eq!(
        (first["event_id"].as_i64(), first["status"].as_str()),
        (Some(early), Some("purged"))
    );
    assert_eq!(
        (
            first["provider_event_id"].clone(),
            first["outcome"].as_str()
        ),
        (Value::Null, Some("ignored"))
    );
    let replay = post(
        &state,
        REPLAY_KEY,
        &format!("/v1/accounts/kinde/kc_log/events/{early}/replay"),
        None,
    )
    .await;
    assert_eq!(
        (replay.status, replay.body["code"].as_str()),
        (StatusCode::CONFLICT, Some("event_purged"))
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_app_replays_its_own_event_and_another_customers_is_not_found(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let state = api_of(&app, &pool);
    let now = Utc::now();
    let mine = plan_change(&app, "kc_a", "ev_a", "pro", now).await;
    let theirs = plan_change(&app, "kc_b", "ev_b", "pro", now).await;

    let path = format!("/v1/accounts/kinde/kc_a/events/{mine}/replay");
    let replay = post(&state, REPLAY_KEY, &path, None).await;
    assert_eq!(replay.status, StatusCode::OK, "{}", replay.body);
    assert_eq!(replay.body, json!({"event_id": mine, "status": "received"}));
    assert_eq!(status_of(&app, mine).await, "received");
    assert_eq!(
        app.drain_queue().await,
        [mine],
        "handed to the worker's queue"
    );
    let again = post(&state, REPLAY_KEY, &path, None).await;
    assert_eq!(
        again.status,
        StatusCode::OK,
        "a repeat replays again, harmlessly"
    );
    app.run_worker().await;
    assert_eq!(status_of(&app, mine).await, "applied");

    // Another customer's event, another source's, a missing one: one answer, word for word
    // but the id.
    let missing = post(
        &state,
        REPLAY_KEY,
        "/v1/accounts/kinde/kc_a/events/999999/replay",
        None,
    )
    .await;
    let other = post(
        &state,
        REPLAY_KEY,
        &format!("/v1/accounts/kinde/kc_a/events/{theirs}/replay"),
        None,
    )
    .await;
    let other_source = post(
        &state,
        REPLAY_KEY,
        &format!("/v1/accounts/polar/kc_b/events/{theirs}/replay"),
        None,
    )
    .await;
    for answer in [&missing, &other, &other_source] {
        assert_eq!(
            (answer.status, answer.body["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("not_found")),
            "{}",
            answer.body
        );
    }
    assert_eq!(
        other.body["detail"]
            .as_str()
            .unwrap()
            .replace(&theirs.to_string(), "N"),
        missing.body["detail"]
            .as_str()
            .unwrap()
            .replace("999999", "N")
    );
    assert_eq!(status_of(&app, theirs).await, "applied", "untouched");

    let reader = post(&state, READER_KEY, &path, None).await;
    assert_eq!(
        (reader.status, reader.body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    let app_key = post(&state, APP_KEY, &path, None).await;
    assert_eq!(
        app_key.status,
        StatusCode::FORBIDDEN,
        "replay is its own scope"
    );
    let bad = post(
        &state,
        REPLAY_KEY,
        "/v1/accounts/kinde/kc_a/events/x1/replay",
        None,
    )
    .await;
    assert_eq!(bad.body["code"], "bad_event_id");
    let get_replay = get(&state, REPLAY_KEY, &path).await;
    assert_eq!(get_replay.status, StatusCode::METHOD_NOT_ALLOWED);

    let trail = get(&state, ADMIN_KEY, "/v1/admin/audit-trail").await;
    let actions = trail.body["actions"].as_array().unwrap();
    assert_eq!(
        actions.len(),
        2,
        "two replays done, none refused: {}",
        trail.body
    );
    assert!(actions.iter().all(|a| a["who"] == "replayer"
        && a["action"] == "account_event.replay"
        && a["target"].as_str() == Some(mine.to_string().as_str())));
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_keys_replays_are_bounded_per_minute_with_a_retry_after(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let state = api_of(&app, &pool);
    let event = plan_change(&app, "kc_many", "ev_many", "pro", Utc::now()).await;
    let path = format!("/v1/accounts/kinde/kc_many/events/{event}/replay");
    for _ in 0..shared::operate::trail::REPLAYS_PER_MINUTE {
        assert_eq!(
            post(&state, REPLAY_KEY, &path, None).await.status,
            StatusCode::OK
        );
    }
    let limited = call(&state, "POST", &path, Some(REPLAY_KEY), &[], None).await;
    assert_eq!(
        (limited.status, limited.body["code"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("rate_limited"))
    );
    let response = shared::handlers::api::handle(
        &state,
        http::Request::builder()
            .method("POST")
            .uri(format!("https://example.test{path}"))
            .header("authorization", format!("Bearer {REPLAY_KEY}"))
            .body(lambda_http::Body::Empty)
            .unwrap(),
        None,
    )
    .await;
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    // Another key has its own minute.
    let admin = post(
        &state,
        ADMIN_KEY,
        &format!("/v1/admin/events/{event}/replay"),
        None,
    )
    .await;
    assert_eq!(admin.status, StatusCode::OK, "{}", admin.body);
    let refused: i64 = app
        .count("SELECT count(*) FROM api_actions WHERE who = 'replayer'")
        .await;
    assert_eq!(
        refused,
        shared::operate::trail::REPLAYS_PER_MINUTE,
        "a refused replay writes nothing"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_overview_counts_a_dead_event_and_refused_deliveries_and_says_what_needs_a_person(
    pool: PgPool,
) {
    let mut app = TestApp::spawn(pool.clone()).await;
    let clock = shared::handlers::api::SetClock::at(Utc::now());
    app.state.clock = shared::handlers::api::Clock::Set(clock.clone());
    let state = api_of(&app, &pool);
    let dead = plan_change(&app, "kc_dead", "ev_dead", "pro", Utc::now()).await;
    // As the retry sweep leaves an event whose every attempt failed.
    sqlx::query(
        "UPDATE inbox_events SET status = 'dead', last_error = 'the store said no' WHERE id = $1",
    )
    .bind(dead)
    .execute(&pool)
    .await
    .unwrap();
    let mut tampered = stripe_delivery(&stripe_event("evt_x", "cus_x", Utc::now().timestamp()));
    tampered.body = b"{}".to_vec();
    for _ in 0..3 {
        assert_eq!(
            app.post("stripe", &tampered).await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    // The first refusal is written at once, the others with the instance's next request once
    // the window is over (whatever that request is).
    let refused = |overview: &Answer| {
        overview.body["sources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["source"] == "stripe")
            .unwrap()["unauthorized_last_hour"]
            .clone()
    };
    assert_eq!(
        refused(&get(&state, ADMIN_KEY, "/v1/admin/overview").await),
        1
    );
    clock.set(clock.now() + shared::operate::refusals::WINDOW);
    let (status, _) = app
        .post(
            "kinde",
            &kinde_delivery(
                "wh_after",
                &json!({
                    "type": "customer.plan_changed", "event_id": "ev_after",
                    "event_timestamp": Utc::now().to_rfc3339(), "source": "api",
                    "data": {"customer_id": "kc_after", "plan": {"key": "pro", "name": "pro"}}
                }),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    let overview = get(&state, ADMIN_KEY, "/v1/admin/overview").await;
    assert_eq!(overview.status, StatusCode::OK, "{}", overview.body);
    let source = |name: &str| {
        overview.body["sources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["source"] == name)
            .unwrap()
            .clone()
    };
    let kinde = source("kinde");
    assert_eq!(
        (
            kinde["dead"].as_i64(),
            kinde["events_by_status"]["dead"].as_i64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(kinde["deliveries_last_hour"], 2);
    assert!(kinde["last_delivery_at"].is_string());
    assert_eq!(source("stripe")["unauthorized_last_hour"], 3);
    let first = &overview.body["needs_attention"][0];
    assert_eq!(
        (
            first["kind"].as_str(),
            first["source"].as_str(),
            first["count"].as_i64()
        ),
        (Some("dead_events"), Some("kinde"), Some(1))
    );
    assert_eq!(first["link"], "events?status=dead&source=kinde");
    let silent: Vec<&str> = overview.body["needs_attention"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"] == "silent_source")
        .filter_map(|a| a["source"].as_str())
        .collect();
    assert!(
        silent.is_empty(),
        "stripe and polar never received a delivery: configured, not used yet, no alarm: {silent:?}"
    );

    for key in [READER_KEY, APP_KEY, REPLAY_KEY] {
        let refused = get(&state, key, "/v1/admin/overview").await;
        assert_eq!(
            (refused.status, refused.body["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("forbidden"))
        );
    }
    let unknown = get(&state, ADMIN_KEY, "/v1/admin/nothing").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    // An admin key reads why of any account.
    let why = get(&state, ADMIN_KEY, "/v1/accounts/kinde/kc_dead/why").await;
    assert_eq!(why.status, StatusCode::OK, "{}", why.body);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_operator_finds_an_event_reads_its_story_and_replays_one_or_all_dead(pool: PgPool) {
    let mut app = TestApp::spawn(pool.clone()).await;
    let effects_queue = app.enable_effects().await;
    let mut state = api_of(&app, &pool);
    state.effects = Some(shared::platform::queue::Queue::new(
        app.sqs.clone(),
        effects_queue.clone(),
    ));
    let now = Utc::now();
    let a = plan_change(&app, "kc_ops", "ev_ops_a", "pro", now - Span::minutes(2)).await;
    let b = plan_change(&app, "kc_ops", "ev_ops_b", "free", now - Span::minutes(1)).await;
    let c = plan_change(&app, "kc_ops2", "ev_ops_c", "pro", now).await;
    sqlx::query("UPDATE inbox_events SET status = 'dead', last_error = 'boom' WHERE id = ANY($1)")
        .bind(vec![a, c])
        .execute(&pool)
        .await
        .unwrap();

    let dead = get(
        &state,
        ADMIN_KEY,
        "/v1/admin/events?status=dead&source=kinde",
    )
    .await;
    let ids: Vec<i64> = dead.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [c, a], "newest first");
    let paged = get(
        &state,
        ADMIN_KEY,
        &format!("/v1/admin/events?limit=1&after={c}"),
    )
    .await;
    assert_eq!(paged.body["events"][0]["event_id"], b);
    for (query, expected) in [
        ("customer=kc_ops2", vec![c]),
        ("provider_event_id=ev_ops_b", vec![b]),
        ("type=customer.plan_changed&customer=kc_ops", vec![b, a]),
    ] {
        let found = get(&state, ADMIN_KEY, &format!("/v1/admin/events?{query}")).await;
        let ids: Vec<i64> = found.body["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event_id"].as_i64().unwrap())
            .collect();
        assert_eq!(ids, expected, "{query}");
    }
    for (query, code) in [
        ("status=lost", "bad_status"),
        ("after=x", "bad_cursor"),
        ("sort=id", "unknown_parameter"),
    ] {
        let answer = get(&state, ADMIN_KEY, &format!("/v1/admin/events?{query}")).await;
        assert_eq!(answer.body["code"], code, "{query}");
    }
    assert_eq!(
        get(&state, ADMIN_KEY, "/v1/admin/events?source=nowhere")
            .await
            .body["code"],
        "unknown_source"
    );

    let story = get(&state, ADMIN_KEY, &format!("/v1/admin/events/{a}")).await;
    assert_eq!(story.status, StatusCode::OK, "{}", story.body);
    assert_eq!(
        (
            story.body["event"]["status"].as_str(),
            story.body["event"]["last_error"].as_str()
        ),
        (Some("dead"), Some("boom"))
    );
    assert_eq!(story.body["deliveries"].as_array().unwrap().len(), 1);
    assert_eq!(
        story.body["payload"]["event_id"], "ev_ops_a",
        "the verified claims"
    );
    let raw = story.body.to_string();
    assert!(
        !raw.contains("signature") && !raw.contains("raw_body"),
        "no signature, no raw body: {raw}"
    );
    assert_eq!(
        get(&state, ADMIN_KEY, "/v1/admin/events/424242")
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    let one = post(
        &state,
        ADMIN_KEY,
        &format!("/v1/admin/events/{a}/replay"),
        None,
    )
    .await;
    assert_eq!(one.body, json!({"event_id": a, "status": "received"}));
    let all = post(
        &state,
        ADMIN_KEY,
        "/v1/admin/events/replay",
        Some(json!({"status": "dead", "source": "kinde"})),
    )
    .await;
    assert_eq!(
        all.body,
        json!({"replayed": 1, "event_ids": [c], "more": false})
    );
    for (body, code) in [
        (json!({"status": "applied"}), "bad_status"),
        (json!({"status": "dead", "extra": 1}), "bad_body"),
    ] {
        assert_eq!(
            post(&state, ADMIN_KEY, "/v1/admin/events/replay", Some(body))
                .await
                .body["code"],
            code
        );
    }
    app.run_worker().await;
    assert_eq!(
        (status_of(&app, a).await, status_of(&app, c).await),
        ("ignored".into(), "applied".into()),
        "a, older than b, is beaten on its replay; c applies"
    );

    // Effects: listed by status, one sent again.
    let effects = get(
        &state,
        ADMIN_KEY,
        "/v1/admin/effects?status=pending&limit=1",
    )
    .await;
    assert_eq!(effects.status, StatusCode::OK, "{}", effects.body);
    let effect = effects.body["effects"][0]["effect_id"]
        .as_str()
        .expect("an effect")
        .to_owned();
    assert!(effects.body["next"].is_string());
    let next = effects.body["next"].as_str().unwrap();
    let second = get(
        &state,
        ADMIN_KEY,
        &format!("/v1/admin/effects?status=pending&limit=1&after={next}"),
    )
    .await;
    assert_ne!(second.body["effects"][0]["effect_id"], effect.as_str());
    app.drain(&effects_queue).await;
    let replayed = post(
        &state,
        ADMIN_KEY,
        &format!("/v1/admin/effects/{effect}/replay"),
        None,
    )
    .await;
    assert_eq!(
        replayed.body,
        json!({"effect_id": effect, "status": "pending"})
    );
    assert_eq!(
        app.drain(&effects_queue).await.len(),
        1,
        "handed to the dispatcher's queue"
    );
    assert_eq!(
        post(&state, ADMIN_KEY, "/v1/admin/effects/eff_none/replay", None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    assert_eq!(
        get(&state, ADMIN_KEY, "/v1/admin/divergences").await.body,
        json!({"divergences": [], "meter_differences": [], "credit_differences": []})
    );
    let trail = get(&state, ADMIN_KEY, "/v1/admin/audit-trail?limit=2").await;
    let actions: Vec<&str> = trail.body["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["effect.replay", "events.replay"],
        "newest first, who did it: {}",
        trail.body
    );
    assert!(trail.body["actions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|a| a["who"] == "ops"));
    let rest = get(
        &state,
        ADMIN_KEY,
        &format!(
            "/v1/admin/audit-trail?after={}",
            trail.body["next"].as_str().unwrap()
        ),
    )
    .await;
    assert_eq!(rest.body["actions"][0]["action"], "event.replay");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_divergence_the_audit_found_is_listed_and_needs_a_person(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let state = api_of(&app, &pool);
    plan_change(&app, "kc_moved", "ev_moved", "pro", Utc::now()).await;
    // A register moved by hand, as a bug or an operator's UPDATE would.
    sqlx::query("UPDATE customer_plans SET plan_key = 'free' WHERE customer_id = 'kc_moved'")
        .execute(&pool)
        .await
        .unwrap();
    let config = test_audit();
    let far = std::time::Instant::now() + std::time::Duration::from_secs(60);
    shared::audit::run(&pool, &config.sources, &config.catalog, far, 10)
        .await
        .unwrap();

    let listed = get(&state, ADMIN_KEY, "/v1/admin/divergences").await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    let divergences = listed.body["divergences"].as_array().unwrap();
    assert!(!divergences.is_empty(), "{}", listed.body);
    let first = &divergences[0];
    assert_eq!(
        (first["source"].as_str(), first["customer_id"].as_str()),
        (Some("kinde"), Some("kc_moved"))
    );
    assert!(first["first_seen"].is_string() && first["stored"] != first["folded"]);
    let overview = get(&state, ADMIN_KEY, "/v1/admin/overview").await;
    assert_eq!(
        overview.body["divergences_open"].as_i64(),
        Some(divergences.len() as i64)
    );
    let attention = overview.body["needs_attention"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == "divergences")
        .expect("divergences need a person");
    assert_eq!(
        attention["link"], "divergences",
        "the page that lists every divergent account, not the latest one's"
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_source_gone_quiet_needs_a_person_and_one_never_used_does_not(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let mut state = api_of(&app, &pool);
    state.silent_hours = 24.0;
    let id = plan_change(&app, "kc_quiet", "ev_quiet", "pro", Utc::now()).await;
    let silent = |overview: &Answer| -> Vec<(String, String)> {
        overview.body["needs_attention"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["kind"] == "silent_source")
            .map(|a| (a["source"].to_string(), a["detail"].to_string()))
            .collect()
    };
    let fresh = get(&state, ADMIN_KEY, "/v1/admin/overview").await;
    assert_eq!(fresh.status, StatusCode::OK, "{}", fresh.body);
    assert_eq!(silent(&fresh), [], "{}", fresh.body);
    // Kinde's only delivery, 30 hours ago.
    for moved in [
        "UPDATE inbox_events SET received_at = received_at - interval '30 hours' WHERE id = $1",
        "UPDATE deliveries SET received_at = received_at - interval '30 hours' WHERE event_id = $1",
    ] {
        sqlx::query(moved).bind(id).execute(&pool).await.unwrap();
    }
    let quiet = get(&state, ADMIN_KEY, "/v1/admin/overview").await;
    let said = silent(&quiet);
    assert_eq!(said.len(), 1, "{}", quiet.body);
    assert_eq!(said[0].0, "\"kinde\"");
    assert!(said[0].1.contains("nothing from kinde for 30"), "{said:?}");
    let unused = quiet.body["sources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["last_delivery_at"].is_null())
        .count();
    assert_eq!(
        unused, 2,
        "stripe and polar say no delivery yet by a null last delivery"
    );
}

/// What no request can mean (a cursor at a time before any Postgres holds, a NUL in a filter,
/// an id or a cursor) is the caller's mistake, told with its own code: never a 503, which asks
/// the caller to retry, counts toward the server-errors alarm and pages the operator. A
/// well-formed cursor that is not one of the account's places is refused as the usage list
/// refuses one, rather than read as "from the start".
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_cursor_or_value_no_page_can_hold_is_a_400_with_its_code_never_a_503(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let state = api_of(&app, &pool);
    let now = Utc::now();
    for customer in ["kc_edge", "kc_else"] {
        plan_change(
            &app,
            customer,
            &format!("ev_{customer}_1"),
            "pro",
            now - Span::minutes(1),
        )
        .await;
        plan_change(&app, customer, &format!("ev_{customer}_2"), "free", now).await;
    }
    let theirs = get(
        &state,
        READER_KEY,
        "/v1/accounts/kinde/kc_else/events?limit=1",
    )
    .await;
    let their_next = theirs.body["next"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let mine = get(
        &state,
        READER_KEY,
        "/v1/accounts/kinde/kc_edge/events?limit=1",
    )
    .await;
    let my_next = mine.body["next"].as_str().expect("a next page").to_owned();

    let log = "/v1/accounts/kinde/kc_edge/events";
    let reads = [
        (
            READER_KEY,
            format!("{log}?after=-1000000000000000000.1"),
            "bad_cursor",
        ),
        (
            READER_KEY,
            format!("{log}?after=99999999999999999.1"),
            "bad_cursor",
        ),
        (READER_KEY, format!("{log}?after=-1.-1"), "bad_cursor"),
        (READER_KEY, format!("{log}?after=0.0"), "bad_cursor"),
        (
            READER_KEY,
            format!("{log}?after={their_next}"),
            "bad_cursor",
        ),
        (READER_KEY, format!("{log}?after=1%00.1"), "bad_parameter"),
        (
            ADMIN_KEY,
            "/v1/admin/events?type=%00".into(),
            "bad_parameter",
        ),
        (
            ADMIN_KEY,
            "/v1/admin/events?customer=kc_edge%00".into(),
            "bad_parameter",
        ),
        (
            ADMIN_KEY,
            "/v1/admin/events?provider_event_id=ev%00".into(),
            "bad_parameter",
        ),
        (
            ADMIN_KEY,
            "/v1/admin/effects?after=1.eff_%00".into(),
            "bad_parameter",
        ),
        (
            ADMIN_KEY,
            "/v1/admin/effects?after=-1000000000000000000.eff_1".into(),
            "bad_cursor",
        ),
    ];
    for (key, path, code) in &reads {
        let answer = get(&state, key, path).await;
        assert_eq!(
            (answer.status, answer.body["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some(*code)),
            "{path}: {}",
            answer.body
        );
    }
    for path in [
        "/v1/admin/effects/eff_%00/replay",
        "/v1/admin/meter-reports/mr_%00/replay",
    ] {
        let answer = post(&state, ADMIN_KEY, path, None).await;
        assert_eq!(
            (answer.status, answer.body["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("bad_path")),
            "{path}: {}",
            answer.body
        );
    }
    // The account's own place still pages on.
    let rest = get(&state, READER_KEY, &format!("{log}?after={my_next}")).await;
    assert_eq!(rest.status, StatusCode::OK, "{}", rest.body);
    assert_eq!(rest.body["events"][0]["provider_event_id"], "ev_kc_edge_2");
}

/// The event ids of an account's log as the app reads it (`GET …/events`, every page).
async fn logged_ids(state: &ApiState, source: &str, customer: &str) -> Vec<i64> {
    let mut ids = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(next) => format!("/v1/accounts/{source}/{customer}/events?limit=2&after={next}"),
            None => format!("/v1/accounts/{source}/{customer}/events?limit=2"),
        };
        let page = get(state, READER_KEY, &path).await;
        assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.body);
        ids.extend(
            page.body["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["event_id"].as_i64().unwrap()),
        );
        match page.body["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return ids,
        }
    }
}

/// An account's log is its events whichever row names the account: a Stripe thin event's row
/// names no customer (its read does), yet the thin event is the account's, listed in its log
/// (its read is not: it stands for the thin event) and replayed by the app's key. The route
/// lists what `inboxctl account` lists.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_accounts_log_lists_its_thin_events_as_the_cli_does_and_the_app_replays_them(
    pool: PgPool,
) {
    use crate::thin::{app_with_api, period, shows, thin_events, CUSTOMER};
    let (app, api) = app_with_api(pool.clone()).await;
    let state = api_of(&app, &pool);
    let shown = [
        "subscription.incomplete",
        "subscription.active",
        "subscription.canceled",
    ];
    let mut thin = Vec::new();
    for (event, shown) in thin_events().iter().zip(shown) {
        shows(&api, shown).await;
        let (status, answer) = app.post("stripe", &stripe_delivery(event)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        app.run_worker().await;
        thin.push(answer["event_id"].as_i64().unwrap());
    }
    let read = app
        .event_id(
            "stripe",
            &format!("read:{}", thin_events()[0]["id"].as_str().unwrap()),
        )
        .await;

    let listed = logged_ids(&state, "stripe", CUSTOMER).await;
    assert_eq!(listed, thin, "the thin events, in provider order; no read");
    let cli: Vec<i64> = app
        .account("stripe", CUSTOMER, &period())
        .await
        .log
        .iter()
        .map(|line| line.event_id)
        .collect();
    assert_eq!(
        listed, cli,
        "the route and inboxctl account list the same events"
    );

    let replay = post(
        &state,
        REPLAY_KEY,
        &format!("/v1/accounts/stripe/{CUSTOMER}/events/{}/replay", thin[1]),
        None,
    )
    .await;
    assert_eq!(replay.status, StatusCode::OK, "{}", replay.body);
    assert_eq!(replay.body["event_id"], thin[1]);
    let of_read = post(
        &state,
        REPLAY_KEY,
        &format!("/v1/accounts/stripe/{CUSTOMER}/events/{read}/replay"),
        None,
    )
    .await;
    assert_eq!(
        (of_read.status, of_read.body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found")),
        "a read is not an event of the log: its thin event is"
    );
}

/// A customer that is an Account (Accounts v2): Stripe's links-only `invoice_payment.paid`
/// and the refund of its charge name no customer on their rows; both are the account's, in its
/// log as `inboxctl account` shows it.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_account_customers_log_lists_its_links_and_refunds_as_the_cli_does(pool: PgPool) {
    use crate::corpus::{accounts_v2_api, send_accounts_v2, ACCOUNT_CUSTOMER};
    let api = accounts_v2_api(None).await;
    let app = send_accounts_v2(pool.clone(), &api, None, false).await;
    let state = api_of(&app, &pool);
    let links: i64 = app
        .count("SELECT id FROM inbox_events WHERE type = 'invoice_payment.paid'")
        .await;
    let refund: i64 = app
        .count("SELECT id FROM inbox_events WHERE type = 'charge.refunded'")
        .await;

    let listed = logged_ids(&state, "stripe", ACCOUNT_CUSTOMER).await;
    assert!(
        listed.contains(&links) && listed.contains(&refund),
        "{listed:?} lists {links} and {refund}"
    );
    let cli: Vec<i64> = app
        .account("stripe", ACCOUNT_CUSTOMER, "2025-12")
        .await
        .log
        .iter()
        .map(|line| line.event_id)
        .collect();
    assert_eq!(
        listed, cli,
        "the route and inboxctl account list the same events"
    );
    let stored: i64 = app
        .count("SELECT count(*) FROM inbox_events WHERE dedupe_key NOT LIKE 'read:%'")
        .await;
    assert_eq!(
        listed.len() as i64,
        stored,
        "every event the account was sent"
    );
}
