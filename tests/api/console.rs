//! The console's HTTP side (docs/design.md §12.6) through the api function's real handler on
//! real Postgres: the shell and its assets need no key and hold no data, each page's fragment
//! needs an admin key, and every answer carries the strict Content-Security-Policy. The pages
//! are driven in a real browser by tests/browser.

use chrono::Utc;
use http::StatusCode;
use lambda_http::Body;
use serde_json::json;
use shared::handlers::api::{self, ApiState};
use sqlx::PgPool;

use crate::app_api::{api_state, ADMIN_KEY, READER_KEY};
use crate::helpers::*;

struct Page {
    status: StatusCode,
    content_type: String,
    csp: String,
    retry_after: Option<String>,
    body: String,
}

async fn open(state: &ApiState, path: &str, key: Option<&str>) -> Page {
    let mut builder = http::Request::builder()
        .method("GET")
        .uri(format!("https://example.test{path}"));
    if let Some(key) = key {
        builder = builder.header("authorization", format!("Bearer {key}"));
    }
    let response = api::handle(state, builder.body(Body::Empty).unwrap(), None).await;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    Page {
        status: response.status(),
        content_type: header("content-type"),
        csp: header("content-security-policy"),
        retry_after: response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned()),
        body: match response.body() {
            Body::Text(t) => t.clone(),
            other => panic!("a text body, not {other:?}"),
        },
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_shell_needs_no_key_and_each_page_needs_an_admin_one(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let state = api_state(&pool);
    let claims = json!({
        "type": "customer.plan_changed", "event_id": "ev_console", "event_timestamp": Utc::now().to_rfc3339(),
        "source": "api", "data": {"customer_id": "kc_console", "plan": {"key": "pro", "name": "Pro"}}
    });
    assert_eq!(
        app.post("kinde", &kinde_delivery("wh_console", &claims))
            .await
            .0,
        StatusCode::OK
    );
    app.run_worker().await;

    for path in [
        "/console",
        "/console/",
        "/console/events/12",
        "/lambda-url/api/console/accounts/kinde/kc_console",
    ] {
        let shell = open(&state, path, None).await;
        assert_eq!(shell.status, StatusCode::OK, "{path}");
        assert!(shell.content_type.starts_with("text/html"), "{path}");
        assert!(shell.csp.contains("script-src 'self'") && !shell.csp.contains("unsafe-inline"));
        assert!(
            !shell.body.contains("kc_console"),
            "the shell holds no data"
        );
        assert!(shell.body.contains("id=\"page\""));
    }
    let local = open(&state, "/lambda-url/api/console/", None).await;
    assert!(
        local
            .body
            .contains("/lambda-url/api/console/assets/console.js"),
        "links keep the base"
    );
    let script = open(&state, "/console/assets/console.js", None).await;
    assert_eq!(
        (script.status, script.content_type.as_str()),
        (StatusCode::OK, "text/javascript; charset=utf-8")
    );
    assert_eq!(
        open(&state, "/console/assets/other.js", None).await.status,
        StatusCode::NOT_FOUND
    );

    let no_key = open(&state, "/console/fragment/", None).await;
    assert_eq!(no_key.status, StatusCode::UNAUTHORIZED);
    assert!(no_key.body.contains("id=\"error\"") && no_key.body.contains("unauthorized"));
    let reader = open(&state, "/console/fragment/", Some(READER_KEY)).await;
    assert_eq!(reader.status, StatusCode::FORBIDDEN);
    assert!(reader.body.contains("forbidden"));

    let overview = open(&state, "/console/fragment/", Some(ADMIN_KEY)).await;
    assert_eq!(overview.status, StatusCode::OK, "{}", overview.body);
    assert!(
        overview.body.contains("id=\"needs-attention\"")
            && overview.body.contains("data-source=\"kinde\"")
    );
    // The overview's picture counts the events the list lists: the applied one, received now.
    let listed = crate::app_api::call(
        &state,
        "GET",
        "/v1/admin/events?status=applied",
        Some(ADMIN_KEY),
        &[],
        None,
    )
    .await;
    let applied = listed.body["events"].as_array().map_or(0, Vec::len);
    assert_eq!(applied, 1, "{}", listed.body);
    assert!(
        overview.body.contains(&format!(
            r#"<td class="num" data-total="applied">{applied}</td>"#
        )) && overview
            .body
            .contains(&format!(r#"<span data-total="applied">{applied}</span>"#)),
        "the picture's applied events are the list's: {}",
        overview.body
    );
    let account = open(
        &state,
        "/console/fragment/accounts/kinde/kc_console",
        Some(ADMIN_KEY),
    )
    .await;
    assert_eq!(account.status, StatusCode::OK, "{}", account.body);
    assert!(
        account.body.contains("id=\"plan\"") && account.body.contains(">pro<"),
        "{}",
        account.body
    );
    let event_id: i64 = sqlx::query_scalar("SELECT id FROM inbox_events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(account.body.contains("id=\"why-plan\""));
    assert!(
        account
            .body
            .contains(&format!("/console/events/{event_id}")),
        "why links the deciding event"
    );
    let event = open(
        &state,
        &format!("/console/fragment/events/{event_id}"),
        Some(ADMIN_KEY),
    )
    .await;
    assert!(event.body.contains("id=\"event-status\"") && event.body.contains("id=\"replay\""));
    for path in [
        "/console/fragment/events",
        "/console/fragment/effects",
        "/console/fragment/audit-trail",
        "/console/fragment/engine-room",
        "/console/fragment/divergences",
        "/console/fragment/meters",
    ] {
        assert_eq!(
            open(&state, path, Some(ADMIN_KEY)).await.status,
            StatusCode::OK,
            "{path}"
        );
    }
    let missing = open(
        &state,
        "/console/fragment/accounts/kinde/kc_nobody",
        Some(ADMIN_KEY),
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.body.contains("unknown_customer"));
    let bad = open(&state, "/console/fragment/events?sort=id", Some(ADMIN_KEY)).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

/// A page the store cannot answer is a 5xx as the API's are: `Retry-After` for the browser,
/// its cause in the log and the `ApiServerErrors` count the alarm reads (one path for both),
/// the store's words never on the page.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_page_the_store_cannot_answer_is_a_503_with_retry_after_as_the_apis_are(pool: PgPool) {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut state = api_state(&pool);
    state.conn = shared::platform::db::Held::new(
        pool.connect_options()
            .as_ref()
            .clone()
            .host("127.0.0.1")
            .port(closed),
    );
    let page = open(&state, "/console/fragment/", Some(ADMIN_KEY)).await;
    assert_eq!(
        page.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        page.body
    );
    assert!(page.body.contains("id=\"error\"") && page.body.contains("unavailable"));
    assert!(
        !page.body.contains(&closed.to_string()),
        "no cause on the page"
    );
    assert_eq!(
        page.retry_after.as_deref(),
        Some(shared::handlers::api::RETRY_AFTER_SECS.to_string().as_str())
    );
    assert!(page.csp.contains("default-src 'none'"));
}

/// The `value` of `attribute` on the tag that carries `marker` in `html`.
fn attr_of(html: &str, marker: &str, attribute: &str) -> i64 {
    let at = html
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} in {html}"));
    let tag = &html[at..at + html[at..].find('>').unwrap()];
    let from = tag.find(&format!(r#"{attribute}=""#)).unwrap() + attribute.len() + 2;
    tag[from..from + tag[from..].find('"').unwrap()]
        .parse()
        .unwrap()
}

/// Every picture's numbers are the lists': the deliveries drawn are the event's deliveries
/// listed in its story, the allowance drawn ends at the account's granted and at the sum of
/// its usage list, and each point of the plan's timeline is an event of the account's log.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_pictures_numbers_are_the_lists_numbers(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let state = api_state(&pool);
    let now = Utc::now();
    for (id, plan, at) in [
        ("ev_pic_1", "pro", now - chrono::Duration::seconds(20)),
        ("ev_pic_2", "team", now - chrono::Duration::seconds(10)),
    ] {
        let claims = json!({
            "type": "customer.plan_changed", "event_id": id, "event_timestamp": at.to_rfc3339(),
            "source": "api", "data": {"customer_id": "kc_pic", "plan": {"key": plan, "name": plan}}
        });
        let delivery = kinde_delivery(&format!("wh_{id}"), &claims);
        assert_eq!(app.post("kinde", &delivery).await.0, StatusCode::OK);
        // A copy: a second delivery of the same event.
        assert_eq!(app.post("kinde", &delivery).await.0, StatusCode::OK);
    }
    app.run_worker().await;
    for (key, amount) in [("pic-1", 3), ("pic-2", 4)] {
        let spent = crate::app_api::debit(&state, "kc_pic", key, json!({"amount": amount})).await;
        assert_eq!(spent.status, StatusCode::OK, "{}", spent.body);
    }

    let overview = open(&state, "/console/fragment/", Some(ADMIN_KEY)).await;
    assert_eq!(overview.status, StatusCode::OK, "{}", overview.body);
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM inbox_events ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    let (mut stored, mut copies) = (0, 0);
    for id in &ids {
        let story = crate::app_api::call(
            &state,
            "GET",
            &format!("/v1/admin/events/{id}"),
            Some(ADMIN_KEY),
            &[],
            None,
        )
        .await;
        for delivery in story.body["deliveries"].as_array().unwrap() {
            match delivery["verdict"].as_str() {
                Some("stored") => stored += 1,
                Some("duplicate") => copies += 1,
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!((stored, copies), (2, 2));
    for (outcome, n) in [("stored", stored), ("duplicate", copies)] {
        assert!(
            overview
                .body
                .contains(&format!(r#"<span data-total="{outcome}">{n}</span>"#)),
            "the picture's {outcome} deliveries are the stories': {}",
            overview.body
        );
    }
    assert_eq!(
        attr_of(
            &overview.body,
            r#"<figure id="deliveries-chart""#,
            "data-total"
        ),
        stored + copies
    );

    let page = open(
        &state,
        "/console/fragment/accounts/kinde/kc_pic",
        Some(ADMIN_KEY),
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let read = |path: &'static str| {
        crate::app_api::call(
            &state,
            "GET",
            path,
            Some(crate::app_api::APP_KEY),
            &[],
            None,
        )
    };
    let account = read("/v1/accounts/kinde/kc_pic").await.body;
    let usage = read("/v1/accounts/kinde/kc_pic/usage").await.body;
    let listed_used: i64 = usage["usage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|line| line["amount"].as_i64().unwrap())
        .sum();
    assert_eq!(listed_used, 7);
    assert_eq!(account["used"].as_i64(), Some(listed_used));
    let chart = r#"<figure id="allowance-chart""#;
    assert_eq!(attr_of(&page.body, chart, "data-used"), listed_used);
    assert_eq!(
        Some(attr_of(&page.body, chart, "data-granted")),
        account["allowance"].as_i64()
    );

    let log = read("/v1/accounts/kinde/kc_pic/events").await.body;
    let logged: Vec<i64> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_i64().unwrap())
        .collect();
    let points: Vec<i64> = page
        .body
        .match_indices(r#"<g class="plan-step" data-event-id=""#)
        .map(|(at, m)| {
            let rest = &page.body[at + m.len()..];
            rest[..rest.find('"').unwrap()].parse().unwrap()
        })
        .collect();
    assert_eq!(points.len(), 2, "free → pro → team: {}", page.body);
    assert!(
        points.iter().all(|p| logged.contains(p)),
        "{points:?} in {logged:?}"
    );
    assert!(
        page.body.contains(r#"pro → <strong>team</strong>"#),
        "the last change is to the account's plan, {}: {}",
        account["plan"],
        page.body
    );
}

/// Open differences of both provider audits (one credit grant Stripe holds and the store does
/// not mirror: `ours` is NULL) still let every page that counts them answer.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_pages_answer_while_the_provider_audits_hold_open_differences(pool: PgPool) {
    let state = api_state(&pool);
    sqlx::query(
        "INSERT INTO meter_audit_differences (source, customer_id, period, meter, ours, theirs)
         VALUES ('stripe', 'cus_console_meter', to_char(inbox_now(), 'YYYY-MM'), 'api_calls', 12, 9)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO credit_audit_differences (source, customer_id, grant_id, unit, ours, theirs)
         VALUES ('stripe', 'cus_console_credit', 'credgr_console', 'usd', '1000', '700'),
                ('stripe', 'cus_console_credit', 'credgr_console_unknown', 'usd', NULL, '50')",
    )
    .execute(&pool)
    .await
    .unwrap();

    for path in [
        "/console/fragment/",
        "/console/fragment/events",
        "/console/fragment/divergences",
    ] {
        let page = open(&state, path, Some(ADMIN_KEY)).await;
        assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.body);
    }
    let divergences = open(&state, "/console/fragment/divergences", Some(ADMIN_KEY)).await;
    assert!(divergences.body.contains("credgr_console_unknown"));
    assert!(divergences.body.contains("cus_console_meter"));
}
