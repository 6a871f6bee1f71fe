//! What a new user meets at the API's edges, each answer checked against docs/openapi.yaml
//! (through `app_api::call`): a parameter a route does not take, a cursor that is not one,
//! a key without the route's scope, each refused with the code and words docs/api.md gives.

use http::StatusCode;
use serde_json::json;
use shared::platform::api_keys::{self, KeyEntry, Keys, Scope};
use sqlx::PgPool;

use crate::app_api::{api_state, call, on_pro, ADMIN_KEY, APP_KEY};
use crate::helpers::*;

/// A route that takes no query parameter says so, rather than "it takes " and nothing; one
/// that takes some names them. The overview and the divergences answer 400 for it, as the
/// document says every admin read may.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_unknown_parameter_is_named_with_what_the_route_takes(pool: PgPool) {
    let state = api_state(&pool);
    for route in ["/v1/admin/overview", "/v1/admin/divergences"] {
        let answer = call(
            &state,
            "GET",
            &format!("{route}?limit=5"),
            Some(ADMIN_KEY),
            &[],
            None,
        )
        .await;
        assert_eq!(
            (answer.status, answer.body["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("unknown_parameter")),
            "{route}"
        );
        assert_eq!(
            answer.body["detail"], "this route takes no query parameter ('limit' given)",
            "{route}"
        );
    }
    let trail = call(
        &state,
        "GET",
        "/v1/admin/audit-trail?page=2",
        Some(ADMIN_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        trail.body["detail"],
        "this route takes no parameter 'page'; it takes limit, after"
    );
}

/// A list's `after` is its previous page's `next`; anything else is a cursor that is not
/// one (400 `bad_cursor`, as on the account's lists), not an event id.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_admin_lists_cursor_that_is_not_one_is_bad_cursor(pool: PgPool) {
    let state = api_state(&pool);
    for path in [
        "/v1/admin/audit-trail?after=yesterday",
        "/v1/admin/audit-trail?after=0",
        "/v1/admin/events?after=-3",
    ] {
        let answer = call(&state, "GET", path, Some(ADMIN_KEY), &[], None).await;
        assert_eq!(
            (answer.status, answer.body["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("bad_cursor")),
            "{path}: {}",
            answer.body
        );
    }
}

/// A debit needs `usage`, and only `usage` (docs/api.md, Keys): an `admin` key is refused
/// for lacking it, not for lacking `read`; a key of `usage` alone debits.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_debit_needs_the_usage_scope_and_no_other(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_scopes").await;
    let spender = "bik_test_spender_key_with_usage_only";
    let mut state = api_state(&pool);
    state.keys = Keys::new(&[
        KeyEntry {
            name: "ops".into(),
            sha256: api_keys::hash(ADMIN_KEY),
            scopes: vec![Scope::Admin],
        },
        KeyEntry {
            name: "spender".into(),
            sha256: api_keys::hash(spender),
            scopes: vec![Scope::Usage],
        },
        KeyEntry {
            name: "app".into(),
            sha256: api_keys::hash(APP_KEY),
            scopes: vec![Scope::Read, Scope::Usage],
        },
    ]);
    let path = "/v1/accounts/kinde/kc_scopes/usage";
    let debit = |key: &'static str, idempotency: &'static str| {
        let state = &state;
        async move {
            call(
                state,
                "POST",
                path,
                Some(key),
                &[("idempotency-key", idempotency)],
                Some(json!({"amount": 2})),
            )
            .await
        }
    };

    let admin = debit(ADMIN_KEY, "k_admin").await;
    let spent = debit(spender, "k_spender").await;

    assert_eq!(
        (admin.status, admin.body["detail"].as_str()),
        (
            StatusCode::FORBIDDEN,
            Some("this key lacks the 'usage' scope")
        )
    );
    assert_eq!(spent.status, StatusCode::OK, "{}", spent.body);
    assert_eq!(spent.body["remaining"], 498, "{}", spent.body);
    let read = call(
        &state,
        "GET",
        "/v1/accounts/kinde/kc_scopes",
        Some(spender),
        &[],
        None,
    )
    .await;
    assert_eq!(
        (read.status, read.body["detail"].as_str()),
        (
            StatusCode::FORBIDDEN,
            Some("this key lacks the 'read' scope")
        ),
        "usage is not read"
    );
}

/// What every route can answer is listed on every operation: 400 (a query parameter it does
/// not take), 401, 403, 413 (a body over 4 KiB is refused before routing) and 503.
#[test]
fn every_operation_lists_what_every_route_can_answer() {
    let doc: serde_json::Value =
        serde_yaml_ng::from_str(include_str!("../../docs/openapi.yaml")).unwrap();
    let mut missing = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let Some(responses) = operation.get("responses") else {
                continue;
            };
            for status in ["400", "401", "403", "413", "503"] {
                if responses.get(status).is_none() {
                    missing.push(format!("{method} {path}: {status}"));
                }
            }
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
    assert!(doc
        .pointer("/components/responses/MethodNotAllowed")
        .is_some());
}
