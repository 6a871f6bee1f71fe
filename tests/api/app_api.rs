//! The app API (docs/api.md) through its real handler, on real Postgres: one call reads the
//! account, debits spend the allowance atomically and once per key, and every answer is
//! checked against docs/openapi.yaml, the contract an app generates its client from; so is
//! every request, against what the document says the route takes.

use std::sync::OnceLock;

use chrono::Utc;
use http::StatusCode;
use lambda_http::Body;
use serde_json::{json, Value};
use shared::domain::SourceKind;
use shared::handlers::api::{self, ApiState};
use shared::platform::api_keys::{self, KeyEntry, Keys, Scope};
use shared::platform::db::Held;
use sqlx::PgPool;

use crate::helpers::*;

pub const APP_KEY: &str = "bik_test_app_key_with_read_and_usage";
pub const READER_KEY: &str = "bik_test_reader_key_with_read_only";
pub const REPLAY_KEY: &str = "bik_test_replayer_key_with_read_and_replay";
pub const ADMIN_KEY: &str = "bik_test_admin_key_with_admin_only";

fn keys() -> Vec<KeyEntry> {
    vec![
        KeyEntry {
            name: "replayer".into(),
            sha256: api_keys::hash(REPLAY_KEY),
            scopes: vec![Scope::Read, Scope::Replay],
        },
        KeyEntry {
            name: "ops".into(),
            sha256: api_keys::hash(ADMIN_KEY),
            scopes: vec![Scope::Admin],
        },
        KeyEntry {
            name: "app".into(),
            sha256: api_keys::hash(APP_KEY),
            scopes: vec![Scope::Read, Scope::Usage],
        },
        KeyEntry {
            name: "reader".into(),
            sha256: api_keys::hash(READER_KEY),
            scopes: vec![Scope::Read],
        },
    ]
}

/// An api function instance on `pool`: its own held connection, the test sources and plans.
pub fn api_state(pool: &PgPool) -> ApiState {
    ApiState {
        conn: Held::new(pool.connect_options().as_ref().clone()),
        pool: pool.clone(),
        sources: vec![
            ("stripe".into(), SourceKind::Stripe),
            ("polar".into(), SourceKind::StandardWebhooks),
            ("kinde".into(), SourceKind::Kinde),
        ],
        fold_sources: shared::audit::sources_of(&test_sources("http://127.0.0.1:9/unused")),
        catalog: shared::domain::Catalog::parse(PLANS).unwrap(),
        keys: Keys::new(&keys()),
        effects: None,
        events: None,
        outbox: None,
        meters: Default::default(),
        silent_hours: shared::platform::config::DEFAULT_SILENT_HOURS,
        console_base: String::new(),
        engine_room: None,
        clock: api::Clock::System,
    }
}

/// What the api function answered: status, body, and the replay header.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Value,
    pub replayed_header: bool,
}

/// Sends a request to the handler and checks the answer, and the request as the answer took
/// it, against the OpenAPI document.
pub async fn call(
    state: &ApiState,
    method: &str,
    path: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Answer {
    let mut builder = http::Request::builder()
        .method(method)
        .uri(format!("https://example.test{path}"));
    if let Some(key) = key {
        builder = builder.header("authorization", format!("Bearer {key}"));
    }
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let sent = body.clone();
    let body = match body {
        Some(body) => Body::from(body.to_string()),
        None => Body::Empty,
    };
    let response = api::handle(state, builder.body(body).unwrap(), None).await;
    let status = response.status();
    let replayed_header = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let body: Value = match response.body() {
        Body::Text(t) => serde_json::from_str(t).unwrap(),
        other => panic!("a JSON body, not {other:?}"),
    };
    conforms(method, path, status, &body);
    request_conforms(method, path, headers, sent.as_ref(), status, &body);
    Answer {
        status,
        body,
        replayed_header,
    }
}

/// docs/openapi.yaml as JSON.
pub(crate) fn openapi() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let text = include_str!("../../docs/openapi.yaml");
        serde_yaml_ng::from_str(text).expect("docs/openapi.yaml is YAML")
    })
}

/// The document's path template for a request path, if it has one: the template whose
/// segments match (a `{name}` matches any one), the one with the most literal segments when
/// several do (`/v1/admin/events/replay` before `/v1/admin/events/{event_id}`).
fn template_of(path: &str) -> Option<&'static str> {
    let route = path.split('?').next().unwrap();
    let segments: Vec<&str> = route.split('/').collect();
    let paths = openapi()["paths"]
        .as_object()
        .expect("the document has paths");
    paths
        .keys()
        .filter_map(|template| {
            let parts: Vec<&str> = template.split('/').collect();
            let matches = parts.len() == segments.len()
                && parts
                    .iter()
                    .zip(&segments)
                    .all(|(part, segment)| part.starts_with('{') || part == segment);
            let literal = parts.iter().filter(|p| !p.starts_with('{')).count();
            matches.then_some((literal, template.as_str()))
        })
        .max_by_key(|(literal, _)| *literal)
        .map(|(_, template)| template)
}

/// The JSON pointer of an operation in the document.
fn operation_of(template: &str, method: &str) -> String {
    let escaped = template.replace('~', "~0").replace('/', "~1");
    format!("/paths/{escaped}/{}", method.to_lowercase())
}

/// Asserts that an answer is what the OpenAPI document says the route answers with that
/// status: the response schema, resolved through the document's own `$ref`s.
fn conforms(method: &str, path: &str, status: StatusCode, body: &Value) {
    let doc = openapi();
    let Some(template) = template_of(path) else {
        // A path the document has no route for: only the error shape applies.
        return assert_valid(doc, "/components/schemas/Error", body);
    };
    let operation = operation_of(template, method);
    let Some(responses) = doc.pointer(&format!("{operation}/responses")) else {
        // A method the route does not have (405): an error.
        return assert_valid(doc, "/components/schemas/Error", body);
    };
    let Some(mut response) = responses.get(status.as_str()) else {
        panic!("{method} {template} has no documented {status} answer: {body}");
    };
    let mut pointer = format!("{operation}/responses/{}", status.as_str());
    if let Some(reference) = response.get("$ref").and_then(Value::as_str) {
        pointer = reference.trim_start_matches('#').to_owned();
        response = doc.pointer(&pointer).unwrap();
    }
    assert!(response
        .pointer("/content/application~1json/schema")
        .is_some());
    assert_valid(
        doc,
        &format!("{pointer}/content/application~1json/schema"),
        body,
    );
}

/// The 400 codes that say a debit's body is not what the document's `DebitRequest` describes.
const BODY_CODES: [&str; 6] = [
    "bad_body",
    "body_not_object",
    "null_field",
    "bad_amount",
    "bad_note",
    "bad_period",
];

/// Asserts that the document describes a request as the handler took it: a debit's body that
/// the handler answered as a debit (200, 409, 422) is a `DebitRequest`, and one refused for
/// its shape is not; the query parameters of a request not refused for them are the ones the
/// operation lists, and an `Idempotency-Key` that was taken fits the header's schema.
fn request_conforms(
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
    status: StatusCode,
    answer: &Value,
) {
    let doc = openapi();
    let Some(template) = template_of(path) else {
        return;
    };
    let operation = operation_of(template, method);
    let Some(op) = doc.pointer(&operation) else {
        return;
    };
    let code = answer["code"].as_str().unwrap_or_default();
    let debited = matches!(status.as_u16(), 200 | 409 | 422);
    if let (Some(body), Some(_)) = (body, op.get("requestBody")) {
        let schema = format!("{operation}/requestBody/content/application~1json/schema");
        let errors = schema_errors(doc, &schema, body);
        if debited {
            assert!(
                errors.is_empty(),
                "taken, so documented: {body}: {errors:?}"
            );
        }
        if status == StatusCode::BAD_REQUEST && BODY_CODES.contains(&code) {
            assert!(!errors.is_empty(), "{code}, yet the document takes {body}");
        }
    }
    if debited {
        let key = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("idempotency-key"))
            .map(|(_, value)| json!(value));
        let param = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .position(|p| p["name"] == "Idempotency-Key");
        if let (Some(key), Some(i)) = (key, param) {
            let errors = schema_errors(doc, &format!("{operation}/parameters/{i}/schema"), &key);
            assert!(errors.is_empty(), "{key}: {errors:?}");
        }
    }
    let listed: Vec<&str> = [
        doc.pointer(&format!(
            "{}/parameters",
            operation.rsplit_once('/').unwrap().0
        )),
        op.get("parameters"),
    ]
    .into_iter()
    .flatten()
    .filter_map(Value::as_array)
    .flatten()
    .map(|p| match p.get("$ref").and_then(Value::as_str) {
        Some(reference) => doc.pointer(reference.trim_start_matches('#')).unwrap(),
        None => p,
    })
    .filter(|p| p["in"] == "query")
    .filter_map(|p| p["name"].as_str())
    .collect();
    let query = path.split_once('?').map(|(_, q)| q).unwrap_or_default();
    let names: Vec<String> = url::form_urlencoded::parse(query.as_bytes())
        .map(|(name, _)| name.into_owned())
        .collect();
    let undocumented: Vec<&String> = names
        .iter()
        .filter(|name| !listed.contains(&name.as_str()))
        .collect();
    if code == "unknown_parameter" {
        assert!(
            !undocumented.is_empty(),
            "{path}: every parameter is listed"
        );
    } else {
        assert!(
            undocumented.is_empty(),
            "{path}: {undocumented:?} are not listed"
        );
    }
}

fn assert_valid(doc: &Value, pointer: &str, body: &Value) {
    let errors = schema_errors(doc, pointer, body);
    assert!(errors.is_empty(), "{body} against {pointer}: {errors:?}");
}

/// What a value breaks of the document's schema at `pointer`, resolved through its `$ref`s.
pub(crate) fn schema_errors(doc: &Value, pointer: &str, body: &Value) -> Vec<String> {
    let mut root = doc.clone();
    root["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    // A JSON pointer in a URI fragment: braces are not URI characters.
    let fragment = pointer.replace('{', "%7B").replace('}', "%7D");
    root["$ref"] = json!(format!("#{fragment}"));
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .build(&root)
        .expect("the OpenAPI document's schemas compile");
    validator
        .iter_errors(body)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

/// Puts `customer` on Kinde's pro plan now (500 this month), through intake and worker.
pub async fn on_pro(app: &TestApp, customer: &str) {
    on_pro_at(app, customer, &Utc::now().to_rfc3339()).await;
}

/// Puts `customer` on Kinde's pro plan at `at` (500 in that month).
async fn on_pro_at(app: &TestApp, customer: &str, at: &str) {
    let claims = json!({
        "type": "customer.plan_changed",
        "event_id": format!("ev_{customer}_pro"),
        "event_timestamp": at,
        "source": "api",
        "data": {"customer_id": customer, "plan": {"key": "pro", "name": "Pro"}}
    });
    let (status, answer) = app
        .post("kinde", &kinde_delivery(&format!("wh_{customer}"), &claims))
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.run_worker().await;
}

fn usage_path(customer: &str) -> String {
    format!("/v1/accounts/kinde/{customer}/usage")
}

pub async fn debit(state: &ApiState, customer: &str, key: &str, body: Value) -> Answer {
    call(
        state,
        "POST",
        &usage_path(customer),
        Some(APP_KEY),
        &[("idempotency-key", key)],
        Some(body),
    )
    .await
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_app_reads_the_account_in_one_call_and_spends_its_allowance_once_per_key(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_demo").await;
    let state = api_state(&pool);

    let account = call(
        &state,
        "GET",
        "/v1/accounts/kinde/kc_demo",
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(account.status, StatusCode::OK, "{}", account.body);
    let body = &account.body;
    assert_eq!(body["customer_id"], "kc_demo");
    assert_eq!(body["plan"], "pro");
    assert_eq!(body["entitled"], true);
    assert_eq!(
        (
            body["allowance"].as_i64(),
            body["used"].as_i64(),
            body["remaining"].as_i64()
        ),
        (Some(500), Some(0), Some(500))
    );

    let spent = debit(
        &state,
        "kc_demo",
        "render-1",
        json!({"amount": 3, "note": "report"}),
    )
    .await;
    assert_eq!(spent.status, StatusCode::OK, "{}", spent.body);
    assert_eq!(
        (
            spent.body["used"].as_i64(),
            spent.body["remaining"].as_i64()
        ),
        (Some(3), Some(497))
    );
    assert_eq!(spent.body["replayed"], false);
    assert!(!spent.replayed_header);

    let again = debit(
        &state,
        "kc_demo",
        "render-1",
        json!({"amount": 3, "note": "report"}),
    )
    .await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body["usage_id"], spent.body["usage_id"]);
    assert_eq!(again.body["remaining"], 497);
    assert_eq!(again.body["replayed"], true);
    assert!(again.replayed_header);

    let other = debit(
        &state,
        "kc_demo",
        "render-1",
        json!({"amount": 4, "note": "report"}),
    )
    .await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.body["code"], "idempotency_conflict");

    let read = call(
        &state,
        "GET",
        "/v1/accounts/kinde/kc_demo",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        (read.body["used"].as_i64(), read.body["remaining"].as_i64()),
        (Some(3), Some(497))
    );
    assert!(read.body["version"].as_i64() > account.body["version"].as_i64());

    let listed = call(
        &state,
        "GET",
        &usage_path("kc_demo"),
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    let lines = listed.body["usage"].as_array().unwrap();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["idempotency_key"], "render-1");
    assert_eq!(lines[0]["note"], "report");
    assert_eq!(listed.body["next"], Value::Null);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_debit_past_the_allowance_is_refused_and_stays_refused_under_its_key(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_big").await;
    let state = api_state(&pool);

    let most = debit(&state, "kc_big", "k-most", json!({"amount": 498})).await;
    assert_eq!(most.status, StatusCode::OK);
    let refused = debit(&state, "kc_big", "k-more", json!({"amount": 3})).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    assert_eq!(refused.body["code"], "allowance_exhausted");
    assert_eq!(refused.body["remaining"], 2);

    // The rest fits, under a new key; the refused key stays refused.
    let rest = debit(&state, "kc_big", "k-rest", json!({"amount": 2})).await;
    assert_eq!(rest.body["remaining"], 0);
    let still = debit(&state, "kc_big", "k-more", json!({"amount": 3})).await;
    assert_eq!(still.status, StatusCode::CONFLICT);
    assert_eq!(still.body["code"], "allowance_exhausted");
    assert!(still.replayed_header);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn sixty_four_concurrent_debits_of_ten_against_500_accept_exactly_fifty(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_rush").await;
    // Eight function instances, each with its own connection, take the requests at once.
    let states: Vec<ApiState> = (0..8).map(|_| api_state(&pool)).collect();
    let answers = futures::future::join_all((0..64).map(|i| {
        let state = &states[i % states.len()];
        async move {
            debit(
                state,
                "kc_rush",
                &format!("rush-{i}"),
                json!({"amount": 10}),
            )
            .await
        }
    }))
    .await;

    let accepted = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .count();
    let refused = answers
        .iter()
        .filter(|a| a.status == StatusCode::CONFLICT && a.body["code"] == "allowance_exhausted")
        .count();
    assert_eq!((accepted, refused), (50, 14));
    let read = call(
        &states[0],
        "GET",
        "/v1/accounts/kinde/kc_rush",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        (read.body["used"].as_i64(), read.body["remaining"].as_i64()),
        (Some(500), Some(0))
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_same_key_sent_thirty_times_at_once_debits_once_and_answers_the_same(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_retry").await;
    let states: Vec<ApiState> = (0..6).map(|_| api_state(&pool)).collect();
    let answers = futures::future::join_all((0..30).map(|i| {
        let state = &states[i % states.len()];
        async move { debit(state, "kc_retry", "same-key", json!({"amount": 7})).await }
    }))
    .await;

    assert!(answers.iter().all(|a| a.status == StatusCode::OK));
    let first: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.body["replayed"] == false)
        .collect();
    assert_eq!(first.len(), 1, "one answer is the debit itself");
    let strip = |a: &Answer| {
        let mut body = a.body.clone();
        body.as_object_mut().unwrap().remove("replayed");
        body
    };
    assert!(answers.iter().all(|a| strip(a) == strip(first[0])));
    let read = call(
        &states[0],
        "GET",
        "/v1/accounts/kinde/kc_retry",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(read.body["used"], 7);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_request_without_a_listed_key_or_its_scope_is_refused(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_keys").await;
    let state = api_state(&pool);
    let path = "/v1/accounts/kinde/kc_keys";

    for key in [None, Some("bik_not_a_listed_key"), Some("")] {
        let answer = call(&state, "GET", path, key, &[], None).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{key:?}");
        assert_eq!(answer.body["code"], "unauthorized");
    }
    let basic = call(
        &state,
        "GET",
        path,
        None,
        &[("authorization", "Basic YXBwOmtleQ==")],
        None,
    )
    .await;
    assert_eq!(basic.status, StatusCode::UNAUTHORIZED);

    let reader = call(
        &state,
        "POST",
        &usage_path("kc_keys"),
        Some(READER_KEY),
        &[("idempotency-key", "k1")],
        Some(json!({"amount": 1})),
    )
    .await;
    assert_eq!(reader.status, StatusCode::FORBIDDEN);
    assert_eq!(reader.body["code"], "forbidden");
    // Nothing was debited.
    let read = call(&state, "GET", path, Some(READER_KEY), &[], None).await;
    assert_eq!(read.body["used"], 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_bad_request_gets_its_own_code_and_debits_nothing(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_bad").await;
    let state = api_state(&pool);
    let path = usage_path("kc_bad");
    let post = |headers: Vec<(&'static str, String)>, body: Value| {
        let state = &state;
        let path = path.clone();
        async move {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            call(state, "POST", &path, Some(APP_KEY), &headers, Some(body)).await
        }
    };
    let key = || vec![("idempotency-key", "k-bad".to_owned())];

    let cases = [
        (
            post(vec![], json!({"amount": 1})).await,
            400,
            "missing_idempotency_key",
        ),
        (
            post(
                vec![("idempotency-key", "two words".into())],
                json!({"amount": 1}),
            )
            .await,
            400,
            "bad_idempotency_key",
        ),
        (
            post(
                vec![("idempotency-key", "k".repeat(256))],
                json!({"amount": 1}),
            )
            .await,
            400,
            "bad_idempotency_key",
        ),
        (post(key(), json!({"amount": 0})).await, 400, "bad_amount"),
        (post(key(), json!({"amount": -5})).await, 400, "bad_amount"),
        (post(key(), json!({"amount": 2.5})).await, 400, "bad_amount"),
        (
            post(key(), json!({"amount": 1, "period": "2999-01"})).await,
            400,
            "future_period",
        ),
        (
            post(key(), json!({"amount": 1, "period": "Dec"})).await,
            400,
            "bad_period",
        ),
        (
            post(key(), json!({"amount": 1, "cost": 3})).await,
            400,
            "bad_body",
        ),
        (
            post(key(), json!({"amount": 1, "note": "x".repeat(5000)})).await,
            413,
            "payload_too_large",
        ),
    ];
    for (answer, status, code) in &cases {
        assert_eq!(
            (answer.status.as_u16(), answer.body["code"].as_str()),
            (*status, Some(*code)),
            "{}",
            answer.body
        );
    }

    let unknown = call(
        &state,
        "GET",
        "/v1/accounts/kinde/kc_nobody",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        (unknown.status, unknown.body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_customer"))
    );
    let nowhere = debit(&state, "kc_nobody", "k-x", json!({"amount": 1})).await;
    assert_eq!(nowhere.body["code"], "unknown_customer");
    let source = call(
        &state,
        "GET",
        "/v1/accounts/paddle/kc_bad",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        (source.status, source.body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_source"))
    );
    let route = call(
        &state,
        "GET",
        "/v1/customers/kc_bad",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(route.status, StatusCode::NOT_FOUND);
    let method = call(
        &state,
        "DELETE",
        "/v1/accounts/kinde/kc_bad",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(method.status, StatusCode::METHOD_NOT_ALLOWED);
    let limit = call(
        &state,
        "GET",
        &format!("{path}?limit=500"),
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(limit.body["code"], "bad_limit");
    let connect = call(
        &state,
        "GET",
        "/v1/accounts/kinde/kc_bad?stripe_account=acct_1",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(connect.body["code"], "bad_stripe_account");

    let read = call(
        &state,
        "GET",
        "/v1/accounts/kinde/kc_bad",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(read.body["used"], 0);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn usage_pages_follow_their_cursor_oldest_first(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_pages").await;
    let state = api_state(&pool);
    for i in 0..5 {
        let answer = debit(
            &state,
            "kc_pages",
            &format!("page-{i}"),
            json!({"amount": i + 1}),
        )
        .await;
        assert_eq!(answer.status, StatusCode::OK);
    }
    let mut keys = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let query = match &after {
            Some(cursor) => format!("?limit=2&after={cursor}"),
            None => "?limit=2".to_owned(),
        };
        let page = call(
            &state,
            "GET",
            &format!("{}{query}", usage_path("kc_pages")),
            Some(APP_KEY),
            &[],
            None,
        )
        .await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        assert_eq!(page.body["used"], 15);
        for line in page.body["usage"].as_array().unwrap() {
            keys.push(line["idempotency_key"].as_str().unwrap().to_owned());
        }
        match page.body["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(keys, ["page-0", "page-1", "page-2", "page-3", "page-4"]);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_connect_customer_is_read_by_its_provider_id_beside_its_account(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let mut event = stripe_event("evt_connect_1", "cus_shared", Utc::now().timestamp());
    event["account"] = json!("acct_1Conn");
    let (status, answer) = app.post("stripe", &stripe_delivery(&event)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.run_worker().await;
    let state = api_state(&pool);

    let read = call(
        &state,
        "GET",
        "/v1/accounts/stripe/cus_shared?stripe_account=acct_1Conn",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    assert_eq!(read.body["customer_id"], "cus_shared");
    assert_eq!(read.body["stripe_account"], "acct_1Conn");
    assert_eq!(read.body["plan"], "pro");
    // The platform's own cus_shared is another account, which has no events.
    let platform = call(
        &state,
        "GET",
        "/v1/accounts/stripe/cus_shared",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(platform.body["code"], "unknown_customer");
    // The account and the customer are named apart: neither id may hold the '/' the store
    // joins them with.
    for (path, code) in [
        (
            "cus_shared?stripe_account=acct_1Conn%2Fx",
            "bad_stripe_account",
        ),
        ("cus_shared?stripe_account=ba_1Conn", "bad_stripe_account"),
        ("acct_1Conn%2Fcus_shared", "bad_customer"),
    ] {
        let refused = call(
            &state,
            "GET",
            &format!("/v1/accounts/stripe/{path}"),
            Some(APP_KEY),
            &[],
            None,
        )
        .await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(refused.body["code"], code, "{path}: {}", refused.body);
    }
}

/// A customer that is an Account (Accounts v2: `customer_account`, `customer` null) is read by
/// its `acct_…` id (docs/api.md, docs/design.md §4.6a): the path names the customer, and
/// `?stripe_account=` the Connect platform's connected account it lives in, if any. The same
/// Account id in a connected account is another account, and a connected account is no
/// customer.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_customer_that_is_an_account_is_read_by_its_account_id(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let now = Utc::now().timestamp();
    let mut own = stripe_event("evt_acct_own_1", "unused", now - 60);
    own["data"]["object"]["customer"] = Value::Null;
    own["data"]["object"]["customer_account"] = json!("acct_cust");
    let mut connected = own.clone();
    connected["id"] = json!("evt_acct_conn_1");
    connected["account"] = json!("acct_platformconnected");
    connected["data"]["object"]["id"] = json!("sub_conn");
    connected["data"]["object"]["status"] = json!("past_due");
    for event in [&own, &connected] {
        let (status, answer) = app.post("stripe", &stripe_delivery(event)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    app.run_worker().await;
    let state = api_state(&pool);
    let get = |path: String| {
        let state = &state;
        async move { call(state, "GET", &path, Some(APP_KEY), &[], None).await }
    };

    let read = get("/v1/accounts/stripe/acct_cust".into()).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    assert_eq!(read.body["customer_id"], "acct_cust");
    assert_eq!(read.body.get("stripe_account"), None);
    assert_eq!(read.body["plan"], "pro");
    assert_eq!(read.body["subscriptions"][0]["id"], "sub_1");

    let read =
        get("/v1/accounts/stripe/acct_cust?stripe_account=acct_platformconnected".into()).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    assert_eq!(read.body["customer_id"], "acct_cust");
    assert_eq!(read.body["stripe_account"], "acct_platformconnected");
    assert_eq!(read.body["subscriptions"][0]["id"], "sub_conn");
    assert_eq!(read.body["subscriptions"][0]["status"], "past_due");

    // Its feature check, its log and its why take the same names.
    for path in [
        "/v1/accounts/stripe/acct_cust/features/sso",
        "/v1/accounts/stripe/acct_cust/events",
        "/v1/accounts/stripe/acct_cust/why",
        "/v1/accounts/stripe/acct_cust/events?stripe_account=acct_platformconnected",
    ] {
        let answer = get(path.into()).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}: {}", answer.body);
    }
    let log = get("/v1/accounts/stripe/acct_cust/events".into()).await;
    assert_eq!(
        log.body["events"][0]["provider_event_id"], "evt_acct_own_1",
        "{}",
        log.body
    );

    // The connected account is not a customer, of the platform or of itself.
    for path in [
        "/v1/accounts/stripe/acct_platformconnected",
        "/v1/accounts/stripe/acct_platformconnected?stripe_account=acct_platformconnected",
    ] {
        let answer = get(path.into()).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(answer.body["code"], "unknown_customer", "{path}");
    }
    // Nor is the stored key a path: the two ids are named apart.
    let joined = get("/v1/accounts/stripe/acct_platformconnected%2Facct_cust".into()).await;
    assert_eq!(joined.status, StatusCode::BAD_REQUEST);
    assert_eq!(joined.body["code"], "bad_customer");
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_deleted_customer_has_nothing_to_spend(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let now = Utc::now().timestamp();
    app.post(
        "stripe",
        &stripe_delivery(&stripe_event("evt_del_1", "cus_gone", now - 60)),
    )
    .await;
    // Stripe's customer.deleted carries the deleted customer object.
    let deleted = json!({
        "id": "evt_del_2", "object": "event", "api_version": "2024-06-20", "created": now,
        "livemode": false, "pending_webhooks": 1,
        "request": {"id": "req_del", "idempotency_key": null},
        "type": "customer.deleted",
        "data": {"object": {"id": "cus_gone", "object": "customer", "created": now - 600,
                            "email": null, "livemode": false, "metadata": {}}}
    });
    app.post("stripe", &stripe_delivery(&deleted)).await;
    app.run_worker().await;
    let state = api_state(&pool);

    let read = call(
        &state,
        "GET",
        "/v1/accounts/stripe/cus_gone",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    assert_eq!(
        (read.body["deleted"].as_bool(), read.body["plan"].as_str()),
        (Some(true), Some("free"))
    );
    let spend = call(
        &state,
        "POST",
        "/v1/accounts/stripe/cus_gone/usage",
        Some(APP_KEY),
        &[("idempotency-key", "after-delete")],
        Some(json!({"amount": 1})),
    )
    .await;
    assert_eq!(
        (spend.status, spend.body["code"].as_str()),
        (StatusCode::CONFLICT, Some("customer_deleted"))
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_keys_can_live_in_a_secret_that_holds_only_their_hashes(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_secret").await;
    let name = format!(
        "billing-inbox/test/api-keys-{}",
        uuid::Uuid::new_v4().simple()
    );
    shared::platform::secrets::client()
        .await
        .create_secret()
        .name(&name)
        .secret_string(serde_json::to_string(&keys()).unwrap())
        .send()
        .await
        .expect("the local server serves Secrets Manager (scripts/test starts it)");
    let url = pool.connect_options().as_ref().clone();
    let database_url = format!(
        "postgres://postgres@127.0.0.1:{}/{}",
        url.get_port(),
        url.get_database().unwrap()
    );
    let env = |var: &str| {
        match var {
        "DATABASE_URL" => Some(database_url.clone()),
        "INBOX_SOURCES" => Some(r#"[{"name":"kinde","kind":"kinde","jwks_url":"https://kinde.example/.well-known/jwks"}]"#.to_owned()),
        "INBOX_PLANS" => Some(PLANS.to_owned()),
        "INBOX_API_KEYS" => Some(json!({"secret_id": name}).to_string()),
        _ => None,
    }
    };
    let config =
        <shared::platform::config::ApiConfig as shared::platform::config::FromEnv>::from_lookup(
            env,
        )
        .unwrap();
    let state = ApiState::from_config(&config).await.unwrap();

    let read = call(
        &state,
        "GET",
        "/v1/accounts/kinde/kc_secret",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    assert_eq!(read.body["plan"], "pro");

    // A secret that holds something else stops the function at start, naming the secret.
    let missing = json!({"secret_id": "billing-inbox/test/no-such-secret"}).to_string();
    let env = |var: &str| match var {
        "INBOX_API_KEYS" => Some(missing.clone()),
        other => env(other),
    };
    let config =
        <shared::platform::config::ApiConfig as shared::platform::config::FromEnv>::from_lookup(
            env,
        )
        .unwrap();
    let error = ApiState::from_config(&config)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("INBOX_API_KEYS") && error.contains("no-such-secret"),
        "{error}"
    );
}

/// Sends a GET of `path` with the app's key to the handler, with `until` as the invocation's
/// deadline; the answer is checked against the OpenAPI document.
async fn get_until(state: &ApiState, path: &str, until: tokio::time::Instant) -> Answer {
    let request = http::Request::builder()
        .method("GET")
        .uri(format!("https://example.test{path}"))
        .header("authorization", format!("Bearer {APP_KEY}"))
        .body(Body::Empty)
        .unwrap();
    let response = api::handle(state, request, Some(until)).await;
    let status = response.status();
    let retry_after = response.headers().get("retry-after").cloned();
    let body: Value = match response.body() {
        Body::Text(t) => serde_json::from_str(t).unwrap(),
        other => panic!("a JSON body, not {other:?}"),
    };
    conforms("GET", path, status, &body);
    assert!(retry_after.is_some(), "a 503 says when to retry: {body}");
    Answer {
        status,
        body,
        replayed_header: false,
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_answer_that_cannot_come_before_the_deadline_is_a_503_timeout(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_late").await;
    let state = api_state(&pool);
    // The invocation ends now: no statement can be answered within it.
    let late = get_until(
        &state,
        "/v1/accounts/kinde/kc_late",
        tokio::time::Instant::now(),
    )
    .await;
    assert_eq!(
        (late.status, late.body["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("timeout"))
    );
    // The connection the cut-off statement left behind is not reused: the next request,
    // with time, is answered on a new one.
    let read = call(
        &state,
        "GET",
        "/v1/accounts/kinde/kc_late",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        (read.status, read.body["plan"].as_str()),
        (StatusCode::OK, Some("pro"))
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_database_that_cannot_be_reached_is_a_503_with_retry_after(pool: PgPool) {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut state = api_state(&pool);
    state.conn = Held::new(
        pool.connect_options()
            .as_ref()
            .clone()
            .host("127.0.0.1")
            .port(closed),
    );
    let in_time = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    let answer = get_until(&state, "/v1/accounts/kinde/kc_any", in_time).await;
    assert_eq!(
        (answer.status, answer.body["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable"))
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_debit_retried_across_midnight_gets_its_first_answer(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro_at(&app, "kc_night", "2026-11-30T10:00:00Z").await;
    let clock = api::SetClock::at("2026-11-30T23:59:59.900Z".parse().unwrap());
    let mut state = api_state(&pool);
    state.clock = api::Clock::Set(clock.clone());
    let asked = json!({"amount": 3, "note": "nightly export"});

    // The answer to this one is lost on its way back to the app.
    let first = debit(&state, "kc_night", "export-1130", asked.clone()).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!(first.body["period"], "2026-11");

    clock.set("2026-12-01T00:00:01Z".parse().unwrap());
    let retry = debit(&state, "kc_night", "export-1130", asked.clone()).await;
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.body);
    assert_eq!(
        (
            &retry.body["usage_id"],
            &retry.body["period"],
            &retry.body["used"],
            &retry.body["remaining"],
            &retry.body["replayed"]
        ),
        (
            &first.body["usage_id"],
            &json!("2026-11"),
            &json!(3),
            &json!(497),
            &json!(true)
        ),
        "the same request, answered as the first: in the first one's month"
    );
    assert!(retry.replayed_header);

    // Naming a month is another request than naming none, whichever month it names.
    for period in ["2026-11", "2026-12"] {
        let named = debit(
            &state,
            "kc_night",
            "export-1130",
            json!({"amount": 3, "note": "nightly export", "period": period}),
        )
        .await;
        assert_eq!(
            (named.status, named.body["code"].as_str()),
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                Some("idempotency_conflict")
            ),
            "{period}"
        );
    }
    // A new key naming no month spends the month it arrives in: December has no grant.
    let december = debit(&state, "kc_night", "export-1201", json!({"amount": 3})).await;
    assert_eq!(
        (december.status, december.body["code"].as_str()),
        (StatusCode::CONFLICT, Some("allowance_exhausted"))
    );
    let november = call(
        &state,
        "GET",
        "/v1/accounts/kinde/kc_night/usage?period=2026-11",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        (
            &november.body["used"],
            november.body["usage"].as_array().map(Vec::len)
        ),
        (&json!(3), Some(1)),
        "debited once: {}",
        november.body
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_request_the_contract_does_not_describe_is_refused_with_its_own_code(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_strict").await;
    on_pro(&app, "kc_other").await;
    let state = api_state(&pool);
    let path = usage_path("kc_strict");
    let post = |path: String, headers: Vec<(&'static str, &'static str)>, body: Value| {
        let state = &state;
        async move { call(state, "POST", &path, Some(APP_KEY), &headers, Some(body)).await }
    };
    let key = || vec![("idempotency-key", "k-strict")];
    let get = |path: String| {
        let state = &state;
        async move { call(state, "GET", &path, Some(APP_KEY), &[], None).await }
    };
    let spent = debit(&state, "kc_strict", "k-spent", json!({"amount": 2})).await;
    assert_eq!(spent.status, StatusCode::OK);
    let spent_id = spent.body["usage_id"].as_str().unwrap().to_owned();
    let month = spent.body["period"].as_str().unwrap().to_owned();

    let cases = [
        // serde reads an array as a struct's fields in order: it debited 3.
        (
            post(path.clone(), key(), json!([3, "2026-12", "note"])).await,
            "body_not_object",
        ),
        (post(path.clone(), key(), json!(3)).await, "body_not_object"),
        (
            post(path.clone(), key(), json!({"amount": 3, "note": null})).await,
            "null_field",
        ),
        (
            post(path.clone(), key(), json!({"amount": 3, "period": null})).await,
            "null_field",
        ),
        // Postgres stores no NUL: this was a 503 the app would retry forever.
        (
            post(path.clone(), key(), json!({"amount": 3, "note": "a\u{0}b"})).await,
            "bad_note",
        ),
        (
            post(
                path.clone(),
                key(),
                json!({"amount": 3, "note": "\u{1b}[2J"}),
            )
            .await,
            "bad_note",
        ),
        (
            post(
                path.clone(),
                vec![("idempotency-key", "k-one"), ("idempotency-key", "k-two")],
                json!({"amount": 3}),
            )
            .await,
            "bad_idempotency_key",
        ),
        // The period of a debit is in its body; in the query it was ignored.
        (
            post(
                format!("{path}?period=2026-01"),
                key(),
                json!({"amount": 3}),
            )
            .await,
            "unknown_parameter",
        ),
        (
            get("/v1/accounts/kinde/kc_strict?perod=2026-01".into()).await,
            "unknown_parameter",
        ),
        (
            get(format!("{path}?limit=1&limit=2")).await,
            "repeated_parameter",
        ),
        (get(format!("{path}?after=garbage")).await, "bad_cursor"),
        (get(format!("{path}?after=")).await, "bad_cursor"),
        // No parameter's value holds a control character (a NUL would fail the statement).
        (get(format!("{path}?after=use_%00")).await, "bad_parameter"),
        (
            get(format!("{path}?period=2026-%0001")).await,
            "bad_parameter",
        ),
        // A cursor of another period's list (or another account's) is no cursor of this one.
        (
            get(format!("{path}?period=2026-01&after={spent_id}")).await,
            "bad_cursor",
        ),
        (
            get(format!("{}?after={spent_id}", usage_path("kc_other"))).await,
            "bad_cursor",
        ),
    ];
    for (answer, code) in &cases {
        assert_eq!(
            (answer.status, answer.body["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some(*code)),
            "{}",
            answer.body
        );
    }
    let control = get("/v1/accounts/kinde/kc%07strict".into()).await;
    assert_eq!(control.body["code"], "bad_customer");
    assert!(
        control.body["detail"]
            .as_str()
            .unwrap()
            .contains("control characters"),
        "{}",
        control.body
    );

    // Nothing was debited, and the key is still free.
    let page = get(format!("{path}?after={spent_id}&period={month}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert_eq!(page.body["usage"], json!([]));
    let read = get("/v1/accounts/kinde/kc_strict".into()).await;
    assert_eq!(read.body["used"], 2);
    let fresh = post(path.clone(), key(), json!({"amount": 1})).await;
    assert_eq!(
        (fresh.status, fresh.body["replayed"].as_bool()),
        (StatusCode::OK, Some(false))
    );
}

/// Two `Idempotency-Key` headers name no one key: the debit is refused and nothing is spent,
/// in both shapes they reach the function. Sent as two headers; and behind API Gateway,
/// whose HTTP API joins them into one: "Duplicate headers are combined with commas and
/// included in the headers field" (AWS, "Create AWS Lambda proxy integrations for HTTP APIs
/// in API Gateway", payload format 2.0), so `k1,k2` is one header there and a comma is no
/// part of a key.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn two_idempotency_keys_as_two_headers_or_joined_by_api_gateway_debit_nothing(pool: PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_two_keys").await;
    let state = api_state(&pool);
    let path = usage_path("kc_two_keys");
    let body = json!({"amount": 1});
    let two = call(
        &state,
        "POST",
        &path,
        Some(APP_KEY),
        &[("idempotency-key", "k1"), ("idempotency-key", "k2")],
        Some(body.clone()),
    )
    .await;
    let joined = call(
        &state,
        "POST",
        &path,
        Some(APP_KEY),
        &[("idempotency-key", "k1,k2")],
        Some(body.clone()),
    )
    .await;
    // The event API Gateway's HTTP API (payload v2) sends for a request with two headers.
    let event = json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": "",
        "headers": {
            "authorization": format!("Bearer {APP_KEY}"),
            "content-type": "application/json",
            "idempotency-key": "k1,k2"
        },
        "requestContext": {
            "accountId": "123456789012", "apiId": "api", "domainName": "api.example.test",
            "domainPrefix": "api", "requestId": "req-1", "routeKey": "$default",
            "stage": "$default", "time": "01/Jan/2026:00:00:00 +0000", "timeEpoch": 1767225600000u64,
            "http": {"method": "POST", "path": path, "protocol": "HTTP/1.1",
                     "sourceIp": "203.0.113.1", "userAgent": "app/1.0"}
        },
        "body": body.to_string(),
        "isBase64Encoded": false
    });
    let request = lambda_http::request::from_str(&event.to_string()).unwrap();
    let response = api::handle(&state, request, None).await;
    let gateway_status = response.status();
    let gateway: Value = match response.body() {
        Body::Text(t) => serde_json::from_str(t).unwrap(),
        other => panic!("a JSON body, not {other:?}"),
    };
    for (status, answer) in [
        (two.status, &two.body),
        (joined.status, &joined.body),
        (gateway_status, &gateway),
    ] {
        assert_eq!(
            (status, answer["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("bad_idempotency_key")),
            "{answer}"
        );
    }
    let read = call(
        &state,
        "GET",
        "/v1/accounts/kinde/kc_two_keys",
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(read.body["used"], 0, "nothing debited");
}
