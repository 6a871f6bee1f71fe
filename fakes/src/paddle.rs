//! A fake Paddle Billing: the parts of Paddle's API the project reads (docs/design.md §6.4),
//! over the events, notifications and subscriptions a test seeds, each behaviour beside the page
//! of Paddle's documentation or its OpenAPI description (PaddleHQ/paddle-openapi `v1/openapi.yaml`,
//! pinned in testdata/openapi/paddle.json) that says so:
//!
//! - `GET /events`, `GET /notifications`: lists ordered by id, paged by `per_page` and `after`,
//!   `meta.pagination.next` / `has_more`; filtered by `event_type`, `status` and `from`;
//! - `GET /subscriptions/{subscription_id}`: the object, or Paddle's `not_found`;
//! - the rate limit (240 requests a minute per IP address), answered as Paddle's 429;
//! - every error in Paddle's shape, `{"error": {type, code, detail, documentation_url},
//!   "meta": {request_id}}`.
//!
//! A test adds faults on top ([`Fault`]).

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use wiremock::matchers::{method, path_regex};
use wiremock::{Mock, Request, Respond, ResponseTemplate};

use crate::described::{ProviderServer, PADDLE};
use crate::traffic::{Fault, Metered, Traffic};

/// "Most operations are limited to 240 requests per minute" and "It works by putting a cap on
/// the number of requests that an IP address can make in a certain timeframe"
/// (developer.paddle.com/api-reference/about/rate-limiting).
pub const RATE_LIMIT: u32 = 240;
/// `per_page`: default 50, maximum 200 (paddle-openapi, `per_page_query`); the answer's
/// `per_page` "May differ from the number requested if the requested number is greater than
/// the maximum" (developer.paddle.com/api-reference/about/pagination).
const PER_PAGE: usize = 50;
const MAX_PER_PAGE: usize = 200;

#[derive(Default)]
struct State {
    events: Vec<Value>,
    notifications: Vec<Value>,
    subscriptions: Vec<Value>,
    requests: u64,
}

/// A fake Paddle; clones share one account.
#[derive(Clone)]
pub struct FakePaddle {
    state: Arc<Mutex<State>>,
    traffic: Arc<Mutex<Traffic>>,
}

impl Default for FakePaddle {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            traffic: Arc::new(Mutex::new(Traffic::new(Some(RATE_LIMIT)))),
        }
    }
}

impl FakePaddle {
    /// Lists `event` (an event as Paddle's `GET /events` shows it: `event_id`, `event_type`,
    /// `occurred_at`, `data`).
    pub fn event(&self, event: Value) -> &Self {
        self.state.lock().unwrap().events.push(event);
        self
    }

    /// Lists `notification` (`id`, `status`, `occurred_at`, `payload`: its event).
    pub fn notification(&self, notification: Value) -> &Self {
        self.state.lock().unwrap().notifications.push(notification);
        self
    }

    /// Holds `subscription` (a Paddle subscription object, its `id` the key).
    pub fn subscription(&self, subscription: Value) -> &Self {
        let mut state = self.state.lock().unwrap();
        let id = subscription["id"].clone();
        state.subscriptions.retain(|s| s["id"] != id);
        state.subscriptions.push(subscription);
        self
    }

    /// Served as Paddle's API, every request checked against Paddle's published description. A
    /// test's own mock of a route comes first.
    pub async fn serve(&self) -> ProviderServer {
        let server = ProviderServer::start(&PADDLE).await;
        self.mount(&server).await;
        server
    }

    /// Mounts its routes on `server` (one of `inboxctl fakes`'s, say).
    pub async fn mount(&self, server: &wiremock::MockServer) {
        Mock::given(method("GET"))
            .and(path_regex(r"^/(events|notifications|subscriptions/[^/]+)$"))
            .respond_with(self.clone())
            .with_priority(10)
            .mount(server)
            .await;
    }
}

/// An error as Paddle shapes every one: "the API returns an `error` object rather than a `data`
/// object or array", `{type, code, detail, documentation_url}`, with `meta.request_id`
/// (developer.paddle.com/api-reference/about/errors; the examples of
/// developer.paddle.com/errors/shared/…).
fn error(status: u16, code: &str, detail: &str, request_id: &str) -> ResponseTemplate {
    let kind = if status >= 500 || status == 429 {
        "api_error"
    } else {
        "request_error"
    };
    ResponseTemplate::new(status).set_body_json(json!({
        "error": {"type": kind, "code": code, "detail": detail,
                  "documentation_url": format!("https://developer.paddle.com/errors/shared/{code}")},
        "meta": {"request_id": request_id}}))
}

/// A status's code in Paddle's shared errors (developer.paddle.com/errors/shared/…).
fn code_of(status: u16) -> &'static str {
    match status {
        400 => "bad_request",
        401 => "authentication_missing",
        403 => "forbidden",
        404 => "not_found",
        409 => "conflict",
        429 => "too_many_requests",
        503 => "service_unavailable",
        _ => "internal_error",
    }
}

impl Respond for FakePaddle {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let path = request.url.path().to_owned();
        let (taken, fault) = {
            let mut traffic = self.traffic.lock().unwrap();
            (traffic.arrive(), traffic.fault(&path))
        };
        let mut state = self.state.lock().unwrap();
        state.requests += 1;
        let request_id = format!("00000000-0000-4000-8000-{:012}", state.requests);
        let refused = match (&taken, &fault) {
            (Err(refused), _) => Some(refused.retry_after),
            (_, Some(Fault::RateLimited(secs))) => Some(*secs),
            _ => None,
        };
        if let Some(retry_after) = refused {
            // "429 - Too Many Requests … IP address exceeded the allowed rate limit. Retry
            // after the number of seconds in the Retry-After header."
            // (developer.paddle.com/errors/shared/too_many_requests)
            return error(
                429,
                "too_many_requests",
                "IP address exceeded the allowed rate limit. Retry after the number of seconds in the Retry-After header.",
                &request_id,
            )
            .insert_header("Retry-After", retry_after.to_string().as_str());
        }
        let failed = |status: u16| {
            error(
                status,
                code_of(status),
                "An internal error occurred.",
                &request_id,
            )
        };
        let answer = match fault {
            Some(Fault::Fails(status)) => return failed(status),
            Some(Fault::TakesThenFails(status)) => return failed(status),
            Some(Fault::Slow(delay)) => Some(delay),
            Some(Fault::RateLimited(_)) | None => None,
        };
        let query: Vec<(String, String)> = request.url.query_pairs().into_owned().collect();
        let answer_of = |template: ResponseTemplate| match answer {
            Some(delay) => template.set_delay(delay),
            None => template,
        };
        if let Some(id) = path.strip_prefix("/subscriptions/") {
            return answer_of(match state.subscriptions.iter().find(|s| s["id"] == id) {
                Some(subscription) => ResponseTemplate::new(200).set_body_json(
                    json!({"data": subscription, "meta": {"request_id": request_id}}),
                ),
                // 404 `not_found`, "%s %s not found." (developer.paddle.com/errors/shared/not_found)
                None => error(
                    404,
                    "not_found",
                    &format!("Subscription {id} not found."),
                    &request_id,
                ),
            });
        }
        let get = |name: &str| {
            query
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let per_page = get("per_page")
            .and_then(|p| p.parse::<usize>().ok())
            .unwrap_or(PER_PAGE)
            .clamp(1, MAX_PER_PAGE);
        let (listed, id_key): (Vec<&Value>, &str) = if path == "/notifications" {
            // `status` and `from`: "Return entities that match the specified status",
            // "Return entities from a specific time" (paddle-openapi, `status_notification_query`,
            // `from_query`).
            let statuses: Vec<&str> = get("status").map_or(Vec::new(), |s| s.split(',').collect());
            let from = get("from").and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
            let listed = state
                .notifications
                .iter()
                .filter(|n| {
                    statuses.is_empty()
                        || statuses.contains(&n["status"].as_str().unwrap_or_default())
                })
                .filter(|n| {
                    let at = n["occurred_at"]
                        .as_str()
                        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
                    from.is_none_or(|from| at.is_none_or(|at| at >= from))
                })
                .collect();
            (listed, "id")
        } else {
            // `event_type`: "Return entities that match the specified event type. Use a
            // comma-separated list to specify multiple event types." (paddle-openapi, GET /events)
            let types: Vec<&str> = get("event_type").map_or(Vec::new(), |s| s.split(',').collect());
            let listed = state
                .events
                .iter()
                .filter(|e| {
                    types.is_empty()
                        || types.contains(&e["event_type"].as_str().unwrap_or_default())
                })
                .collect();
            (listed, "event_id")
        };
        let id_of = |item: &Value| item[id_key].as_str().unwrap_or_default().to_owned();
        let mut listed = listed;
        // Paddle IDs sort in the order they were made; `order_by` "Order returned entities by
        // the specified field and direction ([ASC] or [DESC])", default `id[DESC]`
        // (paddle-openapi, `order_by_query`).
        listed.sort_by_key(|item| id_of(item));
        let order = get("order_by").unwrap_or("id[DESC]").to_ascii_lowercase();
        if order == "id[desc]" {
            listed.reverse();
        }
        // `after`: "Return entities after the specified Paddle ID when working with paginated
        // endpoints." (paddle-openapi, `after_query`)
        let start = match get("after") {
            Some(after) => listed
                .iter()
                .position(|item| id_of(item) == after)
                .map_or(listed.len(), |i| i + 1),
            None => 0,
        };
        let page: Vec<&Value> = listed.iter().skip(start).take(per_page).copied().collect();
        let has_more = start + page.len() < listed.len();
        // "`meta.pagination`: `per_page`, `next` (URL containing the query parameters of the
        // original request, along with the `after` parameter that marks the starting point of
        // the next page), `has_more`, `estimated_total`"
        // (developer.paddle.com/api-reference/about/pagination).
        let mut next = request.url.clone();
        let last = page.last().map(|item| id_of(item)).unwrap_or_default();
        next.query_pairs_mut()
            .clear()
            .extend_pairs(query.iter().filter(|(k, _)| k != "after"))
            .append_pair("after", &last);
        answer_of(ResponseTemplate::new(200).set_body_json(json!({
            "data": page,
            "meta": {"request_id": request_id,
                     "pagination": {"per_page": per_page, "next": next.as_str(),
                                    "has_more": has_more, "estimated_total": listed.len()}}
        })))
    }
}

impl Metered for FakePaddle {
    fn traffic(&self) -> &Mutex<Traffic> {
        &self.traffic
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(
        server: &ProviderServer,
        target: &str,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let answer = reqwest::Client::new()
            .get(format!("{}{target}", server.uri()))
            .bearer_auth("pdl_key")
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        let headers = answer.headers().clone();
        (status, headers, answer.json().await.unwrap_or(Value::Null))
    }

    #[tokio::test]
    async fn events_are_paged_by_after_until_has_more_is_false() {
        let fake = FakePaddle::default();
        for i in 1..=5 {
            fake.event(
                json!({"event_id": format!("evt_0{i}"), "event_type": "subscription.updated",
                              "occurred_at": "2026-01-01T00:00:00Z", "data": {}}),
            );
        }
        fake.event(
            json!({"event_id": "evt_09", "event_type": "customer.updated",
                          "occurred_at": "2026-01-01T00:00:00Z", "data": {}}),
        );
        let server = fake.serve().await;
        let (_, _, first) = get(
            &server,
            "/events?order_by=id[desc]&event_type=subscription.updated&per_page=2",
        )
        .await;
        let ids = |page: &Value| -> Vec<String> {
            page["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["event_id"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(ids(&first), ["evt_05", "evt_04"]);
        assert_eq!(first["meta"]["pagination"]["has_more"], true);
        let next = first["meta"]["pagination"]["next"].as_str().unwrap();
        assert!(next.ends_with("after=evt_04"), "{next}");
        let (_, _, last) = get(
            &server,
            "/events?order_by=id[desc]&event_type=subscription.updated&per_page=2&after=evt_02",
        )
        .await;
        assert_eq!(ids(&last), ["evt_01"]);
        assert_eq!(last["meta"]["pagination"]["has_more"], false);
    }

    #[tokio::test]
    async fn an_unknown_subscription_is_not_found_and_the_limit_answers_429_with_retry_after() {
        let fake = FakePaddle::default();
        fake.rate_limit(1);
        let server = fake.serve().await;
        let (status, _, body) = get(&server, "/subscriptions/sub_missing").await;
        assert_eq!(status, 404);
        assert_eq!(body["error"]["code"], "not_found");
        assert!(body["meta"]["request_id"].is_string());
        let (status, headers, body) = get(&server, "/subscriptions/sub_missing").await;
        assert_eq!(status, 429);
        assert_eq!(body["error"]["code"], "too_many_requests");
        let wait: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&wait), "{wait}");
        assert_eq!((fake.over_limit(), fake.peak_per_minute()), (1, 2));
    }
}
