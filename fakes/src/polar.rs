//! A fake Polar: the parts of Polar's API the project calls (docs/design.md §4.13, §6.3), over
//! the subscriptions a test seeds and the events it ingests, each behaviour beside the page of
//! Polar's documentation or source (polarsource/polar) that says so; every request checked
//! against Polar's OpenAPI description (testdata/openapi/polar.json):
//!
//! - `GET /v1/subscriptions/`: pages by `page` and `limit` (10 by default, at most 100), the
//!   most recently started first, `pagination.total_count` and `pagination.max_page`;
//! - `GET /v1/subscriptions/{id}`: the object, or `ResourceNotFound`;
//! - `POST /v1/events/ingest`, the route a Polar source's meter reports use (docs/design.md
//!   §4.13): one event kept per `external_id` for good (no time window), a repeat counted in
//!   `duplicates`; a `timestamp` ahead of Polar's clock refused with a 422, the whole body
//!   with it; no idempotency layer besides `external_id`;
//! - `GET /v1/meters/`, `GET /v1/meters/{id}/quantities`: the meters a test seeds, and each
//!   one's buckets summed from the events it kept (or took from another client,
//!   [`FakePolar::takes`]), within the range Polar allows an interval;
//! - the rate limit (500 requests a minute in production, 100 in the sandbox), answered 429
//!   with `Retry-After`;
//! - errors as Polar shapes them: `{"error": <name>, "detail": <message>}`, and FastAPI's
//!   `{"detail": [{loc, msg, type}]}` for a request that fails validation.
//!
//! A test adds faults on top ([`Fault`]): queued in turn ([`FakePolar::then`]) or decided per
//! request by its own decider ([`FakePolar::deciding`], a simulation's dice), before Polar takes
//! anything or after (the "held" case), or an answer after the client gave up. Polar's time
//! (the ingestion's "must be in the past", the rate limit's minute) is the wall clock's, or the
//! test's ([`FakePolar::clocked`]).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, Request, Respond, ResponseTemplate};

use crate::described::{ProviderServer, POLAR};
use crate::traffic::{Clock, Fault, Metered, Traffic};

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
    meters: Vec<Value>,
    events: Vec<Value>,
    external_ids: HashSet<String>,
    /// Ingest requests that reached the route (faulted ones included), and events in them
    /// answered as duplicates.
    ingests: u32,
    duplicates: u32,
    /// Polar's time: the wall clock's unless a test set it.
    clock: Option<Clock>,
    /// One line per ingest request: what it answered and why (`FakePolar::take_said`).
    said: Vec<String>,
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

    /// Holds `meter` (Polar's Meter: `id`, `name`, `filter: {conjunction, clauses: [{property,
    /// operator, value}]}`, `aggregation: {func, property}`, `archived_at`).
    pub fn meter(&self, meter: Value) -> &Self {
        self.state.lock().unwrap().meters.push(meter);
        self
    }

    /// Reads Polar's time on `clock` from now on (a simulation's, ahead of the wall clock): the
    /// ingestion's "must be in the past" and the rate limit's minute.
    pub fn clocked(&self, clock: Clock) -> &Self {
        self.traffic.lock().unwrap().set_clock(clock.clone());
        self.state.lock().unwrap().clock = Some(clock);
        self
    }

    /// Asks `decider` what goes wrong with each request once no fault queued by
    /// [`FakePolar::then`] is left: given the path and, for an ingestion, the first event's
    /// `external_id` (empty for the other routes).
    pub fn deciding(
        &self,
        decider: impl FnMut(&str, &str) -> Option<Fault> + Send + 'static,
    ) -> &Self {
        self.traffic
            .lock()
            .unwrap()
            .deciding(Some(Box::new(decider)));
        self
    }

    /// Stops asking the decider: every request from now on goes as Polar would have it.
    pub fn no_more_faults(&self) {
        self.traffic.lock().unwrap().deciding(None);
    }

    /// Ingest requests that reached the route, and the events in them answered as duplicates.
    pub fn ingests(&self) -> (u32, u32) {
        let state = self.state.lock().unwrap();
        (state.ingests, state.duplicates)
    }

    /// What it answered each ingest request since the last call, one line each.
    pub fn take_said(&self) -> Vec<String> {
        std::mem::take(&mut self.state.lock().unwrap().said)
    }

    /// The events Polar kept, in the order ingested.
    pub fn events(&self) -> Vec<Value> {
        self.state.lock().unwrap().events.clone()
    }

    /// Takes an event `name` of `value` (`metadata.value`) for `customer`, timed `at`, as if
    /// another of the organization's clients had ingested it: what Polar counts beyond what a
    /// store sent (no `external_id`, so never a duplicate).
    pub fn takes(&self, name: &str, customer: &str, at: DateTime<Utc>, value: f64) -> &Self {
        self.state.lock().unwrap().events.push(json!({
            "name": name, "customer_id": customer,
            "timestamp": at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "metadata": {"value": value}}));
        self
    }

    /// What a meter summing `metadata.value` over `name` counts for `customer`.
    pub fn total(&self, name: &str, customer: &str) -> f64 {
        self.events()
            .iter()
            .filter(|e| e["name"] == name && e["customer_id"] == customer)
            .filter_map(|e| e["metadata"]["value"].as_f64())
            .sum()
    }

    /// Served as Polar's API, every request checked against Polar's published description. A
    /// test's own mock of a route comes first.
    pub async fn serve(&self) -> ProviderServer {
        let server = ProviderServer::start(&POLAR).await;
        self.mount(&server).await;
        server
    }

    /// Mounts its routes on `server` (one of `inboxctl fakes`'s, say).
    pub async fn mount(&self, server: &wiremock::MockServer) {
        Mock::given(method("GET"))
            .and(path_regex(
                r"^/v1/(subscriptions/([^/]+)?|meters/|meters/[^/]+/quantities)$",
            ))
            .respond_with(self.clone())
            .with_priority(10)
            .mount(server)
            .await;
        Mock::given(method("POST"))
            .and(path("/v1/events/ingest"))
            .respond_with(self.clone())
            .with_priority(10)
            .mount(server)
            .await;
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
        let ingest = path == "/v1/events/ingest";
        // The key a decider is asked with: the first ingested event's `external_id`.
        let key = match ingest {
            true => serde_json::from_slice::<Value>(&request.body)
                .ok()
                .and_then(|b| b.pointer("/events/0/external_id").cloned())
                .and_then(|id| id.as_str().map(str::to_owned))
                .unwrap_or_default(),
            false => String::new(),
        };
        let (taken, fault) = {
            let mut traffic = self.traffic.lock().unwrap();
            (traffic.arrive(), traffic.fault_for(&path, &key))
        };
        let what = format!("polar event {}", &key[..key.len().min(11)]);
        let refused = match (&taken, &fault) {
            (Err(refused), _) => Some(refused.retry_after),
            (_, Some(Fault::RateLimited(secs))) => Some(*secs),
            _ => None,
        };
        let mut state = self.state.lock().unwrap();
        if let Some(retry_after) = refused {
            if ingest {
                state.said.push(format!("{what}…: 429, nothing taken"));
            }
            // "If you exceed the rate limit, you will receive a 429 Too Many Requests response.
            // The response will include a Retry-After header indicating how long you should wait
            // before making another request." (introduction.mdx, Rate Limits)
            return error(429, "TooManyRequests", "Rate limit exceeded")
                .insert_header("Retry-After", retry_after.to_string().as_str());
        }
        if ingest {
            state.ingests += 1;
        }
        let (answer, said, delay) = match fault {
            Some(Fault::Fails(status)) => (
                error(status, name_of(status), "An error occurred"),
                format!("{status}, nothing taken"),
                None,
            ),
            Some(Fault::TakesThenFails(status)) => {
                let (_, taken) = state.answer(&path, request);
                (
                    error(status, name_of(status), "An error occurred"),
                    format!("{taken} then answered {status}"),
                    None,
                )
            }
            Some(Fault::Slow(delay)) => {
                let (answer, taken) = state.answer(&path, request);
                (
                    answer,
                    format!("{taken}, answered after {delay:?}"),
                    Some(delay),
                )
            }
            Some(Fault::RateLimited(_)) | None => {
                let (answer, taken) = state.answer(&path, request);
                (answer, taken, None)
            }
        };
        if ingest {
            state.said.push(format!("{what}…: {said}"));
        }
        match delay {
            Some(delay) => answer.set_delay(delay),
            None => answer,
        }
    }
}

impl State {
    fn now(&self) -> DateTime<Utc> {
        self.clock.as_ref().map_or_else(Utc::now, |clock| clock())
    }

    /// A route's answer, and a line saying what it did.
    fn answer(&mut self, path: &str, request: &Request) -> (ResponseTemplate, String) {
        if path == "/v1/events/ingest" {
            return self.ingest(request);
        }
        (self.read(path, request), "read".to_owned())
    }

    fn read(&mut self, path: &str, request: &Request) -> ResponseTemplate {
        if path == "/v1/meters/" {
            return page_of(&self.meters.iter().collect::<Vec<_>>(), request);
        }
        if let Some(id) = path
            .strip_prefix("/v1/meters/")
            .and_then(|p| p.strip_suffix("/quantities"))
        {
            return match self.meters.iter().find(|m| m["id"] == id) {
                Some(meter) => self.quantities(meter, request),
                None => error(404, "ResourceNotFound", "Not found"),
            };
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
        page_of(&listed, request)
    }

    /// A meter's quantities: a bucket at each `interval` from `start_timestamp` to
    /// `end_timestamp` included, each the whole hour or day from its start, its `quantity` the
    /// meter's aggregation over the customer's events in it, and their `total`
    /// (Polar's `get_quantities`, a `generate_series` of `date_trunc(interval, …)` buckets, as
    /// the meter audit reads it in shared/src/providers/standard_webhooks/meter.rs; the
    /// description's `MeterQuantities`).
    /// Only what the project's meters use is modelled: `name eq` clauses and a `sum` or `count`.
    fn quantities(&self, meter: &Value, request: &Request) -> ResponseTemplate {
        let query: Vec<(String, String)> = request.url.query_pairs().into_owned().collect();
        let get = |name: &str| {
            query
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let time = |name: &str| {
            get(name)
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&Utc))
        };
        let (Some(start), Some(end)) = (time("start_timestamp"), time("end_timestamp")) else {
            return validation(vec![
                json!({"type": "missing", "loc": ["query", "start_timestamp"],
                                          "msg": "Field required"}),
            ]);
        };
        // The longest range each interval may cover, on the dates (`is_under_limits`,
        // polarsource/polar `server/polar/kit/time_queries.py`: an hour's buckets over at most
        // a week, a day's over at most a year and a day); past it Polar refuses the request.
        let (step, max_days) = match get("interval") {
            Some("hour") => (chrono::TimeDelta::hours(1), 7),
            Some("day") => (chrono::TimeDelta::days(1), 366),
            other => {
                return validation(vec![json!({"type": "enum", "loc": ["query", "interval"],
                                              "msg": format!("not modelled: {other:?}")})])
            }
        };
        if start > end || (end.date_naive() - start.date_naive()).num_days() > max_days {
            return validation(vec![json!({"type": "value_error", "loc": ["query"],
                "msg": "The interval is too small for the given date range. Use a larger interval or reduce the date range."})]);
        }
        // `timezone` (the description's default `UTC`) names the zone the buckets are cut in;
        // only UTC's, the one the project asks for, is modelled.
        if get("timezone").is_some_and(|zone| zone != "UTC") {
            return validation(vec![json!({"type": "enum", "loc": ["query", "timezone"],
                                          "msg": "not modelled: a zone other than UTC"})]);
        }
        let truncate = |t: DateTime<Utc>| {
            let secs = t.timestamp();
            let unit = step.num_seconds();
            DateTime::from_timestamp(secs - secs.rem_euclid(unit), 0).unwrap_or(t)
        };
        let customer = get("customer_id");
        let counted: Vec<(DateTime<Utc>, f64)> = self
            .events
            .iter()
            .filter(|e| customer.is_none_or(|c| e["customer_id"] == c))
            .filter(|e| selects(meter, e))
            .filter_map(|e| {
                let at = e["timestamp"]
                    .as_str()
                    .and_then(|t| DateTime::parse_from_rfc3339(t).ok())?
                    .with_timezone(&Utc);
                let value = match meter["aggregation"]["func"].as_str() {
                    Some("count") => 1.0,
                    _ => {
                        let property = meter["aggregation"]["property"].as_str().unwrap_or("value");
                        e["metadata"][property].as_f64().unwrap_or_default()
                    }
                };
                Some((at, value))
            })
            .collect();
        let mut quantities = Vec::new();
        let mut bucket = truncate(start);
        let mut total = 0.0;
        while bucket <= end {
            let quantity: f64 = counted
                .iter()
                .filter(|(at, _)| *at >= bucket && *at < bucket + step)
                .map(|(_, v)| v)
                .sum();
            total += quantity;
            quantities.push(json!({"timestamp": bucket.to_rfc3339(), "quantity": quantity}));
            bucket += step;
        }
        ResponseTemplate::new(200).set_body_json(json!({"quantities": quantities, "total": total}))
    }

    /// `POST /v1/events/ingest`: each event is kept once per `external_id`, a repeat skipped
    /// and counted (`EventsIngestResponse`: "inserted: Number of events inserted", "duplicates:
    /// Number of duplicate events skipped", polarsource/polar `server/polar/event/schemas.py`),
    /// with no time window (the project relies on it: shared/src/providers/standard_webhooks/meter.rs).
    /// A timestamp ahead of Polar's clock is refused: "Timestamp must be in the past." (ibid.,
    /// the event's timestamp validator), a 422 in FastAPI's validation shape.
    fn ingest(&mut self, request: &Request) -> (ResponseTemplate, String) {
        let Ok(body) = serde_json::from_slice::<Value>(&request.body) else {
            let refused = validation(vec![json!({"type": "json_invalid", "loc": ["body"],
                                                 "msg": "JSON decode error"})]);
            return (refused, "422 JSON decode error".to_owned());
        };
        let events = body["events"].as_array().cloned().unwrap_or_default();
        let now = self.now();
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
        // A body that fails validation is refused whole (FastAPI's 422), nothing inserted.
        if !faults.is_empty() {
            return (
                validation(faults),
                "422 a timestamp in the future".to_owned(),
            );
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
        self.duplicates += duplicates;
        let answer = json!({"inserted": inserted, "duplicates": duplicates});
        (
            ResponseTemplate::new(200).set_body_json(&answer),
            format!("200 {answer}"),
        )
    }
}

/// Whether `meter`'s filter takes `event`: each clause `name eq <value>` (the only clauses the
/// project's meters have), joined by the filter's `conjunction`.
fn selects(meter: &Value, event: &Value) -> bool {
    let clauses = meter["filter"]["clauses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let holds =
        |c: &Value| c["property"] == "name" && c["operator"] == "eq" && event["name"] == c["value"];
    match meter["filter"]["conjunction"].as_str() {
        Some("or") => clauses.iter().any(holds),
        _ => clauses.iter().all(holds),
    }
}

/// One page of `listed`: `page` and `limit` (10 by default, a larger `limit` served as 100),
/// with `pagination.total_count` and `pagination.max_page` (introduction.mdx, Pagination).
fn page_of(listed: &[&Value], request: &Request) -> ResponseTemplate {
    let query: Vec<(String, String)> = request.url.query_pairs().into_owned().collect();
    let get = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.parse::<usize>().ok())
    };
    let page = get("page").unwrap_or(1).max(1);
    let limit = get("limit").unwrap_or(LIMIT).clamp(1, MAX_LIMIT);
    let total = listed.len();
    let items: Vec<&&Value> = listed.iter().skip((page - 1) * limit).take(limit).collect();
    ResponseTemplate::new(200).set_body_json(json!({
        "items": items,
        "pagination": {"total_count": total, "max_page": total.div_ceil(limit)}}))
}

/// FastAPI's answer to a request its schema refuses: 422, `{"detail": [{type, loc, msg}]}`.
fn validation(detail: Vec<Value>) -> ResponseTemplate {
    ResponseTemplate::new(422).set_body_json(json!({"detail": detail}))
}

impl Metered for FakePolar {
    fn traffic(&self) -> &Mutex<Traffic> {
        &self.traffic
    }
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

    /// The rate limit's minute is Polar's clock's, as every other time of the fake: a test or a
    /// simulation that moves the clock on a minute frees the window, whatever the wall clock
    /// did meanwhile.
    #[tokio::test]
    async fn its_rate_limit_counts_a_minute_of_polars_clock() {
        let fake = FakePolar::default();
        let server = fake.serve().await;
        let start = Utc::now() - chrono::TimeDelta::hours(1);
        let polar_now = Arc::new(Mutex::new(start));
        let read = polar_now.clone();
        fake.clocked(Arc::new(move || *read.lock().unwrap()))
            .rate_limit(1);
        assert_eq!(ingest(&server, "bi_1", start).await.0, 200);
        assert_eq!(ingest(&server, "bi_2", start).await.0, 429);
        *polar_now.lock().unwrap() = start + chrono::TimeDelta::seconds(61);
        assert_eq!(
            ingest(&server, "bi_2", start).await.0,
            200,
            "a minute of Polar's clock later, the window has a place"
        );
        assert_eq!((fake.over_limit(), fake.peak_per_minute()), (1, 2));
    }

    #[tokio::test]
    async fn an_external_id_is_kept_for_good_on_polars_clock_and_faults_come_before_or_after() {
        let fake = FakePolar::default();
        let server = fake.serve().await;
        let now = Utc::now() - chrono::TimeDelta::minutes(1);
        assert_eq!(ingest(&server, "bi_1", now).await.0, 200);
        // A year later by Polar's clock, the same external id is still a duplicate, and a time
        // the wall clock calls the future is Polar's past.
        let later = now + chrono::TimeDelta::days(365);
        fake.clocked(Arc::new(move || later));
        assert_eq!(
            ingest(&server, "bi_1", now).await,
            (200, json!({"inserted": 0, "duplicates": 1}))
        );
        assert_eq!(
            ingest(&server, "bi_2", now + chrono::TimeDelta::days(100))
                .await
                .0,
            200
        );
        let (status, _) = ingest(&server, "bi_3", later + chrono::TimeDelta::days(1)).await;
        assert_eq!(status, 422, "ahead of Polar's clock");
        // A fault before the ingestion takes nothing; one after it takes the event. The
        // decider is asked with the first event's external id.
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = asked.clone();
        let mut faults = vec![Fault::TakesThenFails(500), Fault::Fails(503)];
        fake.deciding(move |path: &str, key: &str| {
            seen.lock().unwrap().push((path.to_owned(), key.to_owned()));
            faults.pop()
        });
        assert_eq!(ingest(&server, "bi_4", now).await.0, 503);
        assert_eq!(ingest(&server, "bi_4", now).await.0, 500);
        assert_eq!(
            ingest(&server, "bi_4", now).await,
            (200, json!({"inserted": 0, "duplicates": 1}))
        );
        assert_eq!(
            asked.lock().unwrap()[0],
            ("/v1/events/ingest".to_owned(), "bi_4".to_owned())
        );
        fake.no_more_faults();
        let events = fake.events();
        let kept: Vec<&str> = events
            .iter()
            .filter_map(|e| e["external_id"].as_str())
            .collect();
        assert_eq!(kept, ["bi_1", "bi_2", "bi_4"]);
        assert_eq!(
            fake.ingests(),
            (7, 2),
            "every request that reached the route"
        );
        assert_eq!(fake.take_said().len(), 7);
    }

    #[tokio::test]
    async fn a_meters_quantities_are_the_events_it_kept_in_whole_buckets() {
        let fake = FakePolar::default();
        fake.meter(json!({"id": "mtr_1", "name": "API calls",
                          "filter": {"conjunction": "and",
                                     "clauses": [{"property": "name", "operator": "eq", "value": "api_calls"}]},
                          "aggregation": {"func": "sum", "property": "value"}, "archived_at": null}));
        let server = fake.serve().await;
        let hour = |h: i64| {
            DateTime::parse_from_rfc3339("2026-12-01T00:00:00Z")
                .unwrap()
                .with_timezone(&Utc)
                + chrono::TimeDelta::minutes(h * 60 + 30)
        };
        ingest(&server, "bi_a", hour(0)).await;
        ingest(&server, "bi_b", hour(2)).await;
        let answer: Value = reqwest::Client::new()
            .get(format!("{}/v1/meters/mtr_1/quantities", server.uri()))
            .query(&[
                ("start_timestamp", "2026-12-01T00:00:00Z"),
                ("end_timestamp", "2026-12-01T01:00:00Z"),
                ("interval", "hour"),
                ("timezone", "UTC"),
                ("customer_id", CUSTOMER),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            answer["quantities"].as_array().unwrap().len(),
            2,
            "{answer}"
        );
        assert_eq!(
            answer["total"], 3.0,
            "the 02:30 event is past the last bucket"
        );
        let meters: Value = reqwest::get(format!("{}/v1/meters/?page=1&limit=100", server.uri()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(meters["items"][0]["id"], "mtr_1");
        // An hour's buckets over more than a week are refused (`is_under_limits`).
        let status = reqwest::Client::new()
            .get(format!("{}/v1/meters/mtr_1/quantities", server.uri()))
            .query(&[
                ("start_timestamp", "2026-12-01T00:00:00Z"),
                ("end_timestamp", "2026-12-09T00:00:00Z"),
                ("interval", "hour"),
            ])
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 422);
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
