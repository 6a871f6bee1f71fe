//! The api function behind a REST API (docs/deploy.md, "The console and the admin API behind
//! AWS WAF"): with `ConsoleFirewall` on, API Gateway hands the console's and the admin API's
//! requests to the function as a REST API's Lambda proxy event (payload 1.0), not as the HTTP
//! API's (payload 2.0). Each test sends both events, through the same adapter `lambda_http::run`
//! puts before the handler, and shows the answers are the same, but for the stage the REST
//! API's URL carries (`/ops/console/…`), which the console's links keep.

use http::StatusCode;
use lambda_http::request::LambdaRequest;
use lambda_http::{service_fn, Adapter, Context, LambdaEvent, Service};
use serde_json::{json, Map, Value};
use shared::handlers::api::{self, ApiState};
use sqlx::PgPool;

use crate::app_api::{api_state, ADMIN_KEY, READER_KEY};
use crate::helpers::*;

/// The REST API's stage, as template.yaml names it (`ConsoleApi`'s `StageName`).
const STAGE: &str = "ops";

/// What API Gateway made of the function's answer: status, headers (lower-case names, one
/// value each) and body.
#[derive(Debug, PartialEq)]
struct Answer {
    status: StatusCode,
    headers: Vec<(String, String)>,
    body: String,
}

/// Invokes the api function with a Lambda event as API Gateway sends it, and reads its answer
/// back as API Gateway does: `lambda_http::run` deserializes the event into a `LambdaRequest`
/// and serializes the answer in the shape of the event's origin, through this adapter.
async fn invoke(state: &ApiState, event: Value) -> (Answer, Value) {
    // As the runtime hands it over: text (`LambdaRequest` reads it as a raw JSON value).
    let request: LambdaRequest = serde_json::from_str(&event.to_string())
        .expect("lambda_http reads the event API Gateway sends");
    let mut adapter = Adapter::from(service_fn(|request| async move {
        Ok::<_, std::convert::Infallible>(api::handle(state, request, None).await)
    }));
    let response = adapter
        .call(LambdaEvent::new(request, Context::default()))
        .await
        .unwrap();
    let sent = serde_json::to_value(response).unwrap();
    let mut headers: Vec<(String, String)> = Vec::new();
    // A REST API reads `multiValueHeaders` (and `headers`), an HTTP API `headers` alone.
    for field in ["headers", "multiValueHeaders"] {
        for (name, value) in sent[field].as_object().into_iter().flatten() {
            let values = match value {
                Value::Array(values) => values.clone(),
                one => vec![one.clone()],
            };
            for value in values {
                headers.push((name.to_lowercase(), value.as_str().unwrap().to_owned()));
            }
        }
    }
    headers.sort();
    let answer = Answer {
        status: StatusCode::from_u16(sent["statusCode"].as_u64().unwrap() as u16).unwrap(),
        headers,
        body: sent["body"].as_str().unwrap_or_default().to_owned(),
    };
    (answer, sent)
}

/// The event an HTTP API sends for `GET {path}?{query}` on its `$default` stage (payload 2.0,
/// AWS, "Create AWS Lambda proxy integrations for HTTP APIs in API Gateway").
fn http_api_event(path: &str, query: &[(&str, &str)], key: Option<&str>) -> Value {
    let raw_query = query
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let mut headers = json!({
        "accept": "*/*",
        "host": "h7ttp4pi01.execute-api.us-east-1.amazonaws.com",
        "user-agent": "Mozilla/5.0",
        "x-forwarded-for": "203.0.113.7",
        "x-forwarded-port": "443",
        "x-forwarded-proto": "https"
    });
    if let Some(key) = key {
        headers["authorization"] = json!(format!("Bearer {key}"));
    }
    let mut event = json!({
        "version": "2.0",
        "routeKey": "GET /console/{proxy+}",
        "rawPath": path,
        "rawQueryString": raw_query,
        "headers": headers,
        "requestContext": {
            "accountId": "123456789012", "apiId": "h7ttp4pi01",
            "domainName": "h7ttp4pi01.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": "h7ttp4pi01", "requestId": "JKJaXmPLvHcESHA=",
            "routeKey": "GET /console/{proxy+}", "stage": "$default",
            "time": "06/Dec/2026:08:00:00 +0000", "timeEpoch": 1796544000000u64,
            "http": {"method": "GET", "path": path, "protocol": "HTTP/1.1",
                     "sourceIp": "203.0.113.7", "userAgent": "Mozilla/5.0"}
        },
        "isBase64Encoded": false
    });
    if !query.is_empty() {
        let params: Map<String, Value> = query
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        event["queryStringParameters"] = Value::Object(params);
    }
    event
}

/// The event a REST API's Lambda proxy integration sends for `GET {path}?{query}` on the
/// `resource` it matched, at its execute-api URL `…/{STAGE}{path}` (AWS, "Lambda proxy
/// integrations in API Gateway", "Input format of a Lambda function for proxy integration"):
/// `path` is the path without the stage, `requestContext.path` with it, `resource` the
/// resource's template and `pathParameters` its variables; every header and query parameter
/// also in its `multiValue…` map; `body` null for a GET.
fn rest_api_event(
    resource: &str,
    path: &str,
    path_parameters: Value,
    query: &[(&str, &str)],
    key: Option<&str>,
) -> Value {
    let mut headers: Vec<(&str, String)> = vec![
        ("Accept", "*/*".into()),
        (
            "Host",
            "r3st4pi001.execute-api.us-east-1.amazonaws.com".into(),
        ),
        ("User-Agent", "Mozilla/5.0".into()),
        (
            "X-Amzn-Trace-Id",
            "Root=1-6752af40-1d2b3c4d5e6f708192a3b4c5".into(),
        ),
        ("X-Forwarded-For", "203.0.113.7".into()),
        ("X-Forwarded-Port", "443".into()),
        ("X-Forwarded-Proto", "https".into()),
    ];
    if let Some(key) = key {
        headers.push(("Authorization", format!("Bearer {key}")));
    }
    let single: Map<String, Value> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let multi: Map<String, Value> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), json!([v])))
        .collect();
    let (query_single, query_multi) = match query {
        [] => (Value::Null, Value::Null),
        pairs => (
            Value::Object(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), json!(v)))
                    .collect(),
            ),
            Value::Object(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), json!([v])))
                    .collect(),
            ),
        ),
    };
    json!({
        "resource": resource,
        "path": path,
        "httpMethod": "GET",
        "headers": single,
        "multiValueHeaders": multi,
        "queryStringParameters": query_single,
        "multiValueQueryStringParameters": query_multi,
        "pathParameters": path_parameters,
        "stageVariables": null,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "r3st4pi001",
            "authorizer": null,
            "domainName": "r3st4pi001.execute-api.us-east-1.amazonaws.com",
            "domainPrefix": "r3st4pi001",
            "extendedRequestId": "CjhPXFmPLvHcEWg=",
            "httpMethod": "GET",
            "identity": {
                "accessKey": null, "accountId": null, "caller": null, "cognitoAuthenticationProvider": null,
                "cognitoAuthenticationType": null, "cognitoIdentityId": null, "cognitoIdentityPoolId": null,
                "principalOrgId": null, "sourceIp": "203.0.113.7", "user": null,
                "userAgent": "Mozilla/5.0", "userArn": null
            },
            "path": format!("/{STAGE}{path}"),
            "protocol": "HTTP/1.1",
            "requestId": "c6af9ac6-7b61-11e6-9a41-93e8deadbeef",
            "requestTime": "06/Dec/2026:08:00:00 +0000",
            "requestTimeEpoch": 1796544000000u64,
            "resourceId": "a1b2c3",
            "resourcePath": resource,
            "stage": STAGE
        },
        "body": null,
        "isBase64Encoded": false
    })
}

/// A page's links as through the HTTP API: without the REST API's stage before them.
fn unstaged(body: &str) -> String {
    body.replace(&format!("\"/{STAGE}/"), "\"/")
}

/// One stored, applied event, so that the pages and the admin API have something to show.
async fn one_event(pool: &PgPool) {
    let app = TestApp::spawn(pool.clone()).await;
    let claims = json!({
        "type": "customer.plan_changed", "event_id": "ev_rest_api",
        "event_timestamp": chrono::Utc::now().to_rfc3339(), "source": "api",
        "data": {"customer_id": "kc_rest_api", "plan": {"key": "pro", "name": "Pro"}}
    });
    let (status, _) = app
        .post("kinde", &kinde_delivery("wh_rest_api", &claims))
        .await;
    assert_eq!(status, StatusCode::OK);
    app.run_worker().await;
}

/// The console through the REST API: the shell without a key, a page's fragment without a
/// key, with a key that lacks `admin`, and with an admin key, each answered as through the
/// HTTP API (status, headers, the same page), with the stage kept in the links.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_console_answers_a_rest_api_event_as_through_the_http_api(pool: PgPool) {
    one_event(&pool).await;
    let state = api_state(&pool);
    let through_both = |path: &'static str, proxy: &'static str, key: Option<&'static str>| {
        let state = &state;
        async move {
            let (http, http_sent) = invoke(state, http_api_event(path, &[], key)).await;
            let (rest, rest_sent) = invoke(
                state,
                rest_api_event("/console/{proxy+}", path, json!({"proxy": proxy}), &[], key),
            )
            .await;
            // Each is answered in its own payload's shape.
            assert!(rest_sent.get("multiValueHeaders").is_some(), "{rest_sent}");
            assert!(http_sent.get("cookies").is_some(), "{http_sent}");
            (http, rest)
        }
    };

    let (http, rest) = through_both("/console/", "", None).await;
    assert_eq!((http.status, rest.status), (StatusCode::OK, StatusCode::OK));
    assert!(
        rest.body.contains("/ops/console/assets/console.js")
            && http.body.contains("\"/console/assets/console.js"),
        "the shell's links keep the stage: {}",
        rest.body
    );
    assert_eq!(unstaged(&rest.body), http.body);
    assert_eq!(rest.headers, http.headers);

    for (key, status) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some(READER_KEY), StatusCode::FORBIDDEN),
        (Some(ADMIN_KEY), StatusCode::OK),
    ] {
        let (http, rest) = through_both("/console/fragment/events", "fragment/events", key).await;
        assert_eq!(http.status, status, "{key:?}: {}", http.body);
        assert_eq!(
            Answer {
                body: unstaged(&rest.body),
                ..rest
            },
            http,
            "{key:?}"
        );
        if key == Some(ADMIN_KEY) {
            assert!(http.body.contains("customer.plan_changed"), "{}", http.body);
            // The admin API's forms post to the REST API's stage too, where ConsoleApi
            // serves /v1/admin.
            assert!(rest.body.contains("action=\"/ops/v1/admin/events/replay\""));
        }
    }
}

/// The admin API through the REST API, its query given as the REST API gives it (parameter
/// maps, no raw query string): without a key, with a key that lacks `admin`, and with an
/// admin key, each the same answer as through the HTTP API.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_admin_api_answers_a_rest_api_event_as_through_the_http_api(pool: PgPool) {
    one_event(&pool).await;
    let state = api_state(&pool);
    let query = [("status", "applied"), ("limit", "5")];
    for (key, status) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some(READER_KEY), StatusCode::FORBIDDEN),
        (Some(ADMIN_KEY), StatusCode::OK),
    ] {
        let (http, _) = invoke(&state, http_api_event("/v1/admin/events", &query, key)).await;
        let (rest, _) = invoke(
            &state,
            rest_api_event(
                "/v1/admin/{proxy+}",
                "/v1/admin/events",
                json!({"proxy": "events"}),
                &query,
                key,
            ),
        )
        .await;
        assert_eq!(http.status, status, "{key:?}: {}", http.body);
        assert_eq!(rest, http, "{key:?}");
        if key == Some(ADMIN_KEY) {
            let listed: Value = serde_json::from_str(&rest.body).unwrap();
            let events = listed["events"].as_array().expect("a list of events");
            assert_eq!(events.len(), 1, "{listed}");
            assert_eq!(events[0]["type"], "customer.plan_changed");
        }
    }
    // A route the admin API does not have is its own 404, not the REST API's.
    let (missing, _) = invoke(
        &state,
        rest_api_event(
            "/v1/admin/{proxy+}",
            "/v1/admin/nothing",
            json!({"proxy": "nothing"}),
            &[],
            Some(ADMIN_KEY),
        ),
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.body);
}
