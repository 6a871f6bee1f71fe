//! A fake Polar: the parts of Polar's API the project calls (docs/design.md §4.13, §6.3), over
//! the subscriptions a test seeds and the events it ingests, each behaviour beside the page of
//! Polar's documentation or source (polarsource/polar) that says so; every request checked
//! against Polar's OpenAPI description (testdata/openapi/polar.json):
//!
//! - `GET /v1/subscriptions/`: pages by `page` and `limit` (10 by default, at most 100), the
//!   most recently started first, `pagination.total_count` and `pagination.max_page`;
//! - `GET /v1/subscriptions/{id}`: the object, or `ResourceNotFound`;
//! - `POST /v1/events/ingest`: one event kept per `external_id`, a repeat counted in
//!   `duplicates`; a `timestamp` in the future refused with a 422;
//! - the rate limit (500 requests a minute in production, 100 in the sandbox), answered 429
//!   with `Retry-After`;
//! - errors as Polar shapes them: `{"error": <name>, "detail": <message>}`, and FastAPI's
//!   `{"detail": [{loc, msg, type}]}` for a request that fails validation.
//!
//! A test adds faults on top ([`Fault`]).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, Request, Respond, ResponseTemplate};

use crate::described::{ProviderServer, POLAR};
use crate::traffic::{Fault, Traffic};

/// "Production: 500 requests per minute per organization/customer or OAuth2 Client. Sandbox:
/// 100 requests per minute" (polarsource/polar `docs/api-reference/2026-10/introduction.mdx`,
/// Rate Limits).
pub const RATE_LIMIT: u32 = 500;
pub const SANDBOX_RATE_LIMIT: u32 = 100;
/// `limit`: "Default 10, Max 100" (ibid., Pagination; `API_PAGINATION_MAX_LIMIT = 100` in
/// `server/polar/config.py`, a larger `limit` served as 100).
const LIMIT: usize = 10;
const MAX_LIMIT: usize = 100;

#[derive(Default)]
struct State {
    subscriptions: Vec<Value>,
    events: Vec<Value>,
    external_ids: HashSet<String>,
}

/// A fake Polar organization; clones share it.
#[derive(Clone)]
pub struct FakePolar {
    state: Arc<Mutex<State>>,
    traffic: Arc<Mutex<Traffic>>,
}

impl Default for FakePolar {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            traffic: Arc::new(Mutex::new(Traffic::new(Some(RATE_LIMIT)))),
        }
    }
}

impl FakePolar {
    /// One of Polar's sandbox, whose limit is [`SANDBOX_RATE_LIMIT`].
    pub fn sandbox() -> Self {
        let fake = Self::default();
        fake.rate_limit(SANDBOX_RATE_LIMIT);
        fake
    }

    /// Holds `subscription` (Polar's Subscription object, `id` its key); one of the same id is
    /// replaced.
    pub fn subscription(&self, subscription: Value) -> &Self {
        let mut state = self.state.lock().unwrap();
        let id = subscription["id"].clone();
        state.subscriptions.retain(|s| s["id"] != id);
        state.subscriptions.push(subscription);
        self
    }

    /// The rate limit per minute (a test may lower it to reach it).
    pub fn rate_limit(&self, per_minute: u32) -> &Self {
        self.traffic.lock().unwrap().set_limit(Some(per_minute));
        self
    }

    /// What goes wrong with the next request to `path` (any when `None`), in turn.
    pub fn then(&self, path: Option<&str>, fault: Fault) -> &Self {
        self.traffic.lock().unwrap().then(path, fault);
        self
    }

    /// The events Polar kept, in the order ingested.
    pub fn events(&self) -> Vec<Value> {
        self.state.lock().unwrap().events.clone()
    }

    /// What a meter summing `metadata.value` over `name` counts for `customer`.
    pub fn total(&self, name: &str, customer: &str) -> f64 {
        self.events()
            .iter()
            .filter(|e| e["name"] == name && e["customer_id"] == customer)
            .filter_map(|e| e["metadata"]["value"].as_f64())
            .sum()
    }

    /// Requests refused for the rate limit.
    pub fn over_limit(&self) -> u32 {
        self.traffic.lock().unwrap().over_limit()
    }

    /// The most requests that arrived within one minute.
    pub fn peak_per_minute(&self) -> u32 {
        self.traffic.lock().unwrap().peak_per_minute()
    }

    /// Requests that reached it.
    pub fn requests(&self) -> u32 {
        self.traffic.lock().unwrap().requests()
    }

    /// Served as Polar's API, every request checked against Polar's published description. A
    /// test's own mock of a route comes first.
    pub async fn serve(&self) -> ProviderServer {
        let server = ProviderServer::start(&POLAR).await;
        Mock::given(method("GET"))
            .and(path_regex(r"^/v1/subscriptions/([^/]+)?$"))
            .respond_with(self.clone())
            .with_priority(10)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/v1/events/ingest"))
            .respond_with(self.clone())
            .with_priority(10)
            .mount(&server)
            .await;
        server
    }
}

/// Polar's own errors: `{"error": <the exception's name>, "detail": <its message>}`
/// (polarsource/polar `server/polar/exceptions.py`, `PolarError`, and its handler in
/// `server/polar/exception_handlers.py`), e.g. `ResourceNotFound` 404 "Not found".
fn error(status: u16, name: &str, detail: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(json!({"error": name, "detail": detail}))
}

fn name_of(status: u16) -> &'static str {
    match status {
        401 => "Unauthorized",
        403 => "NotPermitted",
        404 => "ResourceNotFound",
        429 => "TooManyRequests",
        _ => "InternalServerError",
    }
}

impl Respond for FakePolar {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let path = request.url.path().to_owned();
        let (taken, fault) = {
            let mut traffic = self.traffic.lock().unwrap();
            (traffic.arrive(), traffic.fault(&path))
        };
        let refused = match (&taken, &fault) {
            (Err(refused), _) => Some(refused.retry_after),
            (_, Some(Fault::RateLimited(secs))) => Some(*secs),
            _ => None,
        };
        if let Some(retry_after) = refused {
            // "If you exceed the rate limit, you will receive a 429 Too Many Requests response.
            // The response will include a Retry-After header indicating how long you should wait
            // before making another request." (introduction.mdx, Rate Limits)
            return error(429, "TooManyRequests", "Rate limit exceeded")
                .insert_header("Retry-After", retry_after.to_string().as_str());
        }
        let mut state = self.state.lock().unwrap();
        let (answer, delay) = match fault {
            Some(Fault::Fails(status)) => {
                return error(status, name_of(status), "An error occurred")
            }
            Some(Fault::TakesThenFails(status)) => {
                state.answer(&path, request);
                return error(status, name_of(status), "An error occurred");
            }
            Some(Fault::Slow(delay)) => (state.answer(&path, request), Some(delay)),
            Some(Fault::RateLimited(_)) | None => (state.answer(&path, request), None),
        };
        match delay {
            Some(delay) => answer.set_delay(delay),
            None => answer,
        }
    }
}

impl State {
    fn answer(&mut self, path: &str, request: &Request) -> ResponseTemplate {
        if path == "/v1/events/ingest" {
            return self.ingest(request);
        }
        match path
            .strip_prefix("/v1/subscriptions/")
            .filter(|id| !id.is_empty())
        {
            Some(id) => match self.subscriptions.iter().find(|s| s["id"] == id) {
                Some(subscription) => ResponseTemplate::new(200).set_body_json(subscription),
                None => error(404, "ResourceNotFound", "Not found"),
            },
            None => self.list(request),
        }
    }

    /// "The `page` parameter works as a window offset. For example, `page=2&limit=10` means the
    /// API will skip the first 10 elements and return the next 10"; the answer's `pagination`
    /// has `total_count` and `max_page`, "Total number of pages available, given the current
    /// `limit` value" (introduction.mdx, Pagination). Sorted by `sorting`, `-started_at` by
    /// default (the description's `SubscriptionSortProperty`).
    fn list(&self, request: &Request) -> ResponseTemplate {
        let query: Vec<(String, String)> = request.url.query_pairs().into_owned().collect();
        let get = |name: &str| {
            query
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let page = get("page")
            .and_then(|p| p.parse::<usize>().ok())
            .unwrap_or(1)
            .max(1);
        let limit = get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .unwrap_or(LIMIT)
            .clamp(1, MAX_LIMIT);
        let customers: Vec<&str> = query
            .iter()
            .filter(|(k, _)| k == "customer_id")
            .map(|(_, v)| v.as_str())
            .collect();
        let mut listed: Vec<&Value> = self
            .subscriptions
            .iter()
            .filter(|s| {
                customers.is_empty() || customers.contains(&s["customer_id"].as_str().unwrap_or(""))
            })
            .collect();
        let started = |s: &Value| s["started_at"].as_str().unwrap_or_default().to_owned();
        listed.sort_by_key(|s| std::cmp::Reverse(started(s)));
        if get("sorting") == Some("started_at") {
            listed.reverse();
        }
        let total = listed.len();
        let items: Vec<&Value> = listed
            .into_iter()
            .skip((page - 1) * limit)
            .take(limit)
            .collect();
        ResponseTemplate::new(200).set_body_json(json!({
            "items": items,
            "pagination": {"total_count": total, "max_page": total.div_ceil(limit)}}))
    }

    /// `POST /v1/events/ingest`: each event is kept once per `external_id`, a repeat skipped
    /// and counted (`EventsIngestResponse`: "inserted: Number of events inserted", "duplicates:
    /// Number of duplicate events skipped", polarsource/polar `server/polar/event/schemas.py`),
    /// with no time window (the project relies on it: shared/src/providers/standard_webhooks/meter.rs).
    /// A timestamp ahead of Polar's clock is refused: "Timestamp must be in the past." (ibid.,
    /// the event's timestamp validator), a 422 in FastAPI's validation shape.
    fn ingest(&mut self, request: &Request) -> ResponseTemplate {
        let Ok(body) = serde_json::from_slice::<Value>(&request.body) else {
            return validation(vec![json!({"type": "json_invalid", "loc": ["body"],
                                          "msg": "JSON decode error"})]);
        };
        let events = body["events"].as_array().cloned().unwrap_or_default();
        let now = Utc::now();
        let faults: Vec<Value> = events
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e["timestamp"]
                    .as_str()
                    .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                    .is_some_and(|t| t > now)
            })
            .map(|(i, e)| {
                json!({"type": "value_error", "loc": ["body", "events", i, "timestamp"],
                       "msg": "Value error, Timestamp must be in the past.",
                       "input": e["timestamp"]})
            })
            .collect();
        if !faults.is_empty() {
            return validation(faults);
        }
        let (mut inserted, mut duplicates) = (0, 0);
        for event in events {
            if let Some(external_id) = event["external_id"].as_str() {
                if !self.external_ids.insert(external_id.to_owned()) {
                    duplicates += 1;
                    continue;
                }
            }
            self.events.push(event);
            inserted += 1;
        }
        ResponseTemplate::new(200)
            .set_body_json(json!({"inserted": inserted, "duplicates": duplicates}))
    }
}

/// FastAPI's answer to a request its schema refuses: 422, `{"detail": [{type, loc, msg}]}`.
fn validation(detail: Vec<Value>) -> ResponseTemplate {
    ResponseTemplate::new(422).set_body_json(json!({"detail": detail}))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CUSTOMER: &str = "992fae2a-2a17-4b7a-8d9e-e287cf90131b";

    async fn ingest(server: &ProviderServer, external_id: &str, at: DateTime<Utc>) -> (u16, Value) {
        let answer = reqwest::Client::new()
            .post(format!("{}/v1/events/ingest", server.uri()))
            .bearer_auth("polar_oat")
            .json(
                &json!({"events": [{"name": "api_calls", "customer_id": CUSTOMER,
                                      "external_id": external_id,
                                      "timestamp": at.to_rfc3339(),
                                      "metadata": {"value": 3}}]}),
            )
            .send()
            .await
            .unwrap();
        (answer.status().as_u16(), answer.json().await.unwrap())
    }

    #[tokio::test]
    async fn an_event_is_kept_once_per_external_id_and_a_future_one_is_refused() {
        let fake = FakePolar::default();
        let server = fake.serve().await;
        let at = Utc::now() - chrono::TimeDelta::minutes(1);
        assert_eq!(
            ingest(&server, "bi_1", at).await,
            (200, json!({"inserted": 1, "duplicates": 0}))
        );
        assert_eq!(
            ingest(&server, "bi_1", at).await,
            (200, json!({"inserted": 0, "duplicates": 1}))
        );
        let (status, body) =
            ingest(&server, "bi_2", Utc::now() + chrono::TimeDelta::hours(1)).await;
        assert_eq!(status, 422);
        assert!(body["detail"][0]["msg"]
            .as_str()
            .unwrap()
            .contains("must be in the past"));
        assert_eq!(fake.total("api_calls", CUSTOMER), 3.0);
    }

    #[tokio::test]
    async fn subscriptions_are_listed_newest_started_first_in_pages_with_max_page() {
        let fake = FakePolar::default();
        for (id, day) in [("s1", 1), ("s2", 3), ("s3", 2)] {
            fake.subscription(json!({"id": id, "started_at": format!("2026-01-0{day}T00:00:00Z")}));
        }
        fake.rate_limit(3);
        let server = fake.serve().await;
        let get = |target: &'static str| {
            let url = format!("{}{target}", server.uri());
            async move {
                let answer = reqwest::Client::new().get(url).send().await.unwrap();
                let status = answer.status().as_u16();
                let retry = answer.headers().get("retry-after").cloned();
                (status, retry, answer.json::<Value>().await.unwrap())
            }
        };
        let (_, _, page) = get("/v1/subscriptions/?page=1&limit=2").await;
        assert_eq!(page["items"][0]["id"], "s2");
        assert_eq!(page["items"][1]["id"], "s3");
        assert_eq!(page["pagination"], json!({"total_count": 3, "max_page": 2}));
        let (status, _, body) = get("/v1/subscriptions/s9").await;
        assert_eq!(
            (status, body),
            (
                404,
                json!({"error": "ResourceNotFound", "detail": "Not found"})
            )
        );
        get("/v1/subscriptions/s1").await;
        let (status, retry, _) = get("/v1/subscriptions/s1").await;
        assert_eq!(status, 429);
        assert!(retry.is_some());
        assert_eq!(fake.over_limit(), 1);
    }
}
