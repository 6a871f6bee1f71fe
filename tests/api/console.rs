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
