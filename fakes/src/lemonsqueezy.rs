//! A fake Lemon Squeezy: the parts of its API the project reads (docs/design.md §6.5), over the
//! subscriptions a test seeds, each behaviour beside the page of Lemon Squeezy's API reference
//! that says so (Lemon Squeezy publishes no OpenAPI description; testdata/openapi/lemonsqueezy.json
//! is the routes written from the same pages):
//!
//! - `GET /v1/subscriptions`: JSON:API pages by `page[number]` and `page[size]` (at most 100),
//!   `meta.page` and `links.next`; filtered by `filter[status]` and `filter[store_id]`;
//! - `GET /v1/subscriptions/{id}`: the resource, or a JSON:API 404;
//! - the rate limit (300 calls a minute), with `X-Ratelimit-Limit` and `X-Ratelimit-Remaining`
//!   on successful answers, and 429 past it;
//! - every error as a JSON:API `errors` array of `{status, title, detail}`.
//!
//! A test adds faults on top ([`Fault`]).

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use wiremock::matchers::{method, path_regex};
use wiremock::{Mock, Request, Respond, ResponseTemplate};

use crate::described::{ProviderServer, LEMONSQUEEZY};
use crate::traffic::{Fault, Metered, Traffic};

/// "There is a limit of 300 API calls per minute." (docs.lemonsqueezy.com/api/getting-started,
/// Rate limiting)
pub const RATE_LIMIT: u32 = 300;
/// "`page[size]` … between 1 and 100", 10 when not given (docs.lemonsqueezy.com/api/getting-started/requests,
/// Pagination; the example answer of docs.lemonsqueezy.com/api/getting-started/responses has
/// `perPage: 10`).
const PAGE_SIZE: usize = 10;
const MAX_PAGE_SIZE: usize = 100;
/// The address the links name.
const BASE: &str = "https://api.lemonsqueezy.com";

/// A fake Lemon Squeezy store; clones share it.
#[derive(Clone)]
pub struct FakeLemonSqueezy {
    subscriptions: Arc<Mutex<Vec<Value>>>,
    traffic: Arc<Mutex<Traffic>>,
}

impl Default for FakeLemonSqueezy {
    fn default() -> Self {
        Self {
            subscriptions: Arc::default(),
            traffic: Arc::new(Mutex::new(Traffic::new(Some(RATE_LIMIT)))),
        }
    }
}

impl FakeLemonSqueezy {
    /// Holds `subscription`, a JSON:API resource (`{type: "subscriptions", id, attributes}`);
    /// one of the same id is replaced. Listed in the order held.
    pub fn subscription(&self, subscription: Value) -> &Self {
        let mut held = self.subscriptions.lock().unwrap();
        let id = subscription["id"].clone();
        held.retain(|s| s["id"] != id);
        held.push(subscription);
        self
    }

    /// Served as Lemon Squeezy's API, every request checked against the routes' description. A
    /// test's own mock of a route comes first.
    pub async fn serve(&self) -> ProviderServer {
        let server = ProviderServer::start(&LEMONSQUEEZY).await;
        self.mount(&server).await;
        server
    }

    /// Mounts its routes on `server` (one of `inboxctl fakes`'s, say).
    pub async fn mount(&self, server: &wiremock::MockServer) {
        Mock::given(method("GET"))
            .and(path_regex(r"^/v1/subscriptions(/[^/]+)?$"))
            .respond_with(self.clone())
            .with_priority(10)
            .mount(server)
            .await;
    }
}

/// "A 4xx error will always contain valid JSON:API errors array in the response. Each error
/// object will usually contain several fields that explain the error, including `detail`,
/// `status`, `title`" (docs.lemonsqueezy.com/api/getting-started/responses, Errors).
fn error(status: u16, title: &str, detail: &str) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .insert_header("content-type", "application/vnd.api+json")
        .set_body_json(json!({
            "jsonapi": {"version": "1.0"},
            "errors": [{"detail": detail, "status": status.to_string(), "title": title}]}))
}

fn title_of(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        429 => "Too Many Requests",
        503 => "Service Unavailable",
        _ => "Server Error",
    }
}

impl Respond for FakeLemonSqueezy {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let path = request.url.path().to_owned();
        let (taken, fault) = {
            let mut traffic = self.traffic.lock().unwrap();
            (traffic.arrive(), traffic.fault(&path))
        };
        let taken = match (taken, &fault) {
            (Ok(_), Some(Fault::RateLimited(_))) => {
                return error(429, "Too Many Requests", "Too Many Attempts.")
            }
            (Ok(taken), _) => taken,
            // "If you exceed the limit you will receive a 429 Too Many Requests response."
            // (docs.lemonsqueezy.com/api/getting-started, Rate limiting): no Retry-After is
            // documented, so none is sent.
            (Err(_), _) => return error(429, "Too Many Requests", "Too Many Attempts."),
        };
        let delay = match fault {
            Some(Fault::Fails(status) | Fault::TakesThenFails(status)) => {
                return error(status, title_of(status), "An error occurred.")
            }
            Some(Fault::Slow(delay)) => Some(delay),
            Some(Fault::RateLimited(_)) | None => None,
        };
        let held = self.subscriptions.lock().unwrap();
        let answer = match path.strip_prefix("/v1/subscriptions/") {
            Some(id) => match held.iter().find(|s| s["id"] == id) {
                Some(subscription) => ok(json!({
                    "jsonapi": {"version": "1.0"},
                    "links": {"self": format!("{BASE}/v1/subscriptions/{id}")},
                    "data": subscription})),
                None => error(
                    404,
                    "Not Found",
                    "The requested resource could not be found.",
                ),
            },
            None => list(&held, request),
        };
        // "we add the following HTTP headers on our successful responses: X-Ratelimit-Limit,
        // X-Ratelimit-Remaining" (docs.lemonsqueezy.com/api/getting-started, Rate limiting).
        let answer = match (taken.limit, taken.remaining) {
            (Some(limit), Some(remaining)) => answer
                .insert_header("X-Ratelimit-Limit", limit.to_string().as_str())
                .insert_header("X-Ratelimit-Remaining", remaining.to_string().as_str()),
            _ => answer,
        };
        match delay {
            Some(delay) => answer.set_delay(delay),
            None => answer,
        }
    }
}

fn ok(body: Value) -> ResponseTemplate {
    ResponseTemplate::new(200)
        .insert_header("content-type", "application/vnd.api+json")
        .set_body_json(body)
}

/// One page of the subscriptions: "`page[number]` … `page[size]`", answered with `meta.page`
/// (`currentPage`, `from`, `lastPage`, `perPage`, `to`, `total`) and `links` `first`, `last`
/// and, between them, `prev` and `next` (docs.lemonsqueezy.com/api/getting-started/requests,
/// Pagination; …/responses; JSON:API 1.0 §Pagination).
fn list(held: &[Value], request: &Request) -> ResponseTemplate {
    let query: Vec<(String, String)> = request.url.query_pairs().into_owned().collect();
    let get = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let size = match get("page[size]").map(str::parse::<usize>) {
        None => PAGE_SIZE,
        Some(Ok(n)) if (1..=MAX_PAGE_SIZE).contains(&n) => n,
        Some(_) => {
            return error(
                400,
                "Bad Request",
                &format!("The page[size] must be between 1 and {MAX_PAGE_SIZE}."),
            )
        }
    };
    let number = get("page[number]")
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1);
    // "filter[status]", "filter[store_id]" (docs.lemonsqueezy.com/api/subscriptions/list-all-subscriptions)
    let listed: Vec<&Value> = held
        .iter()
        .filter(|s| {
            get("filter[status]").is_none_or(|w| s["attributes"]["status"].as_str() == Some(w))
        })
        .filter(|s| {
            get("filter[store_id]")
                .is_none_or(|w| s["attributes"]["store_id"].to_string().trim_matches('"') == w)
        })
        .collect();
    let total = listed.len();
    let last = total.div_ceil(size).max(1);
    let page: Vec<&Value> = listed
        .iter()
        .skip((number - 1) * size)
        .take(size)
        .copied()
        .collect();
    let link =
        |n: usize| format!("{BASE}/v1/subscriptions?page%5Bnumber%5D={n}&page%5Bsize%5D={size}");
    let mut links = json!({"first": link(1), "last": link(last)});
    if number > 1 {
        links["prev"] = link(number - 1).into();
    }
    if number < last {
        links["next"] = link(number + 1).into();
    }
    let from = (number - 1) * size + 1;
    ok(json!({
        "meta": {"page": {"currentPage": number, "from": if page.is_empty() { Value::Null } else { from.into() },
                          "lastPage": last, "perPage": size,
                          "to": if page.is_empty() { Value::Null } else { (from + page.len() - 1).into() },
                          "total": total}},
        "jsonapi": {"version": "1.0"},
        "links": links,
        "data": page,
    }))
}

impl Metered for FakeLemonSqueezy {
    fn traffic(&self) -> &Mutex<Traffic> {
        &self.traffic
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subscription(id: u32) -> Value {
        json!({"type": "subscriptions", "id": id.to_string(),
               "attributes": {"store_id": 1, "status": "active"}})
    }

    async fn get(
        server: &ProviderServer,
        target: &str,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let answer = reqwest::Client::new()
            .get(format!("{}{target}", server.uri()))
            .header("accept", "application/vnd.api+json")
            .bearer_auth("ls_key")
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        let headers = answer.headers().clone();
        (status, headers, answer.json().await.unwrap_or(Value::Null))
    }

    #[tokio::test]
    async fn subscriptions_are_paged_with_meta_page_and_links_next() {
        let fake = FakeLemonSqueezy::default();
        for id in 1..=3 {
            fake.subscription(subscription(id));
        }
        let server = fake.serve().await;
        let (status, headers, first) =
            get(&server, "/v1/subscriptions?page[number]=1&page[size]=2").await;
        assert_eq!(status, 200);
        assert_eq!(first["meta"]["page"]["lastPage"], 2);
        assert_eq!(first["data"].as_array().unwrap().len(), 2);
        assert!(first["links"]["next"]
            .as_str()
            .unwrap()
            .contains("page%5Bnumber%5D=2"));
        assert_eq!(headers["x-ratelimit-limit"], "300");
        assert_eq!(headers["x-ratelimit-remaining"], "299");
        let (_, _, second) = get(&server, "/v1/subscriptions?page[number]=2&page[size]=2").await;
        assert_eq!(second["data"][0]["id"], "3");
        assert!(second["links"].get("next").is_none());
        let (status, _, body) = get(&server, "/v1/subscriptions/9").await;
        assert_eq!(
            (status, body["errors"][0]["title"].as_str()),
            (404, Some("Not Found"))
        );
    }

    #[tokio::test]
    async fn past_300_calls_a_minute_lemon_squeezy_answers_429() {
        let fake = FakeLemonSqueezy::default();
        fake.rate_limit(2);
        let server = fake.serve().await;
        for _ in 0..2 {
            assert_eq!(get(&server, "/v1/subscriptions").await.0, 200);
        }
        let (status, _, body) = get(&server, "/v1/subscriptions").await;
        assert_eq!(status, 429);
        assert_eq!(body["errors"][0]["status"], "429");
        assert_eq!((fake.over_limit(), fake.peak_per_minute()), (1, 3));
    }
}
