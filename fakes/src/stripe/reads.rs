//! The fake Stripe's read side and its front door (docs/design.md §6.6): the objects a test
//! seeds, read back as Stripe's API serves them, and the limiter every request meets first.
//!
//! - object reads: `GET /v1/{subscriptions,invoices,invoice_payments,customers,payment_intents,
//!   charges,events}/{id}` and `GET /v2/core/events/{id}`, each in the account its
//!   `Stripe-Account` (or `Stripe-Context`) names; an object it does not hold is a 404
//!   `resource_missing` shaped as Stripe shapes errors;
//! - lists: `GET /v1/events` (`created[…]`, `types[]`, `type` with `*`, `delivery_success`),
//!   `GET /v1/subscriptions` (`status`, `customer`), `GET /v1/invoice_payments` (`invoice`,
//!   `payment[…]`), `GET /v1/entitlements/active_entitlements` (`customer`): `limit` 1 to 100
//!   (10 by default), `starting_after`/`ending_before`, `has_more`, `url`, newest first;
//! - the rate limiter, before anything else (idempotency included): Stripe's global limit for
//!   the key's mode, per-endpoint limits, the live meter events' own; counted per second of the
//!   fake's clock, with what came over the limit and the peak rate kept for a test to read;
//! - a `Request-Id` on every answer;
//! - what a test scripts on top ([`On`], with the meter side's [`Fault`]): a 5xx, a slow answer
//!   (a timeout, to a client that gives up first), a 429 of its own.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{json, Value};
use wiremock::matchers::{method, path_regex};
use wiremock::{Match, Mock, Request, Respond, ResponseTemplate};

use crate::stripe::{rate_limited, FakeStripe, Fault};

/// Where the read routes are: the v1 objects and lists the project reads, and v2 events.
const READ_ROUTES: &str = r"^(/v1/(events|subscriptions|invoices|invoice_payments|customers|payment_intents|charges)(/[^/]+)?|/v1/entitlements/active_entitlements|/v2/core/events/[^/]+)$";

/// "Limit can range between 1 and 100, and the default is 10." (stripe/openapi, every list's
/// `limit` parameter; docs.stripe.com/api/pagination)
const DEFAULT_LIMIT: usize = 10;
const MAX_LIMIT: usize = 100;

/// "List events, going back up to 30 days." (docs.stripe.com/api/events/list); "we only
/// guarantee access to events through the Retrieve Event API for 30 days"
/// (docs.stripe.com/api/events).
const EVENTS_KEPT: TimeDelta = TimeDelta::days(30);

/// "The basic rate limiter restricts the number of API requests per second as follows: Live
/// mode: 100 operations; Sandbox: 25 operations" (docs.stripe.com/rate-limits).
const GLOBAL_LIVE: u32 = 100;
const GLOBAL_SANDBOX: u32 = 25;
/// "Calls to individual resources have stricter limits, and also count against global limits.
/// API endpoints have a default limit of 25 requests per second." Stripe "considers each named
/// API operation a separate endpoint (for example, `POST /v1/payment_intents` and `GET
/// /v1/payment_intents/{id}` are separate endpoints). Requests to `GET
/// /v1/payment_intents/{id}` for different PaymentIntent IDs count against the same endpoint
/// limit." (ibid.)
const PER_ENDPOINT: u32 = 25;
/// "Calls to the Meter events endpoint in live mode are subject to a separate rate limit, and
/// don't count against the basic limits. The limit is 1000 calls per second per Stripe
/// account." (stripe.com/docs/rate-limits)
const METER_EVENTS_LIVE: u32 = 1000;
const METER_EVENTS: &str = "POST /v1/billing/meter_events";

/// A Stripe account's mode: its keys say which (`sk_live_…`, `sk_test_…`; restricted keys
/// `rk_live_…`, `rk_test_…`: docs.stripe.com/keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    Live,
    #[default]
    Sandbox,
}

impl Mode {
    /// The mode a key names, if it names one.
    fn of_key(key: &str) -> Option<Self> {
        if key.starts_with("sk_live_") || key.starts_with("rk_live_") {
            Some(Self::Live)
        } else if key.starts_with("sk_test_") || key.starts_with("rk_test_") {
            Some(Self::Sandbox)
        } else {
            None
        }
    }

    fn global(self) -> u32 {
        match self {
            Self::Live => GLOBAL_LIVE,
            Self::Sandbox => GLOBAL_SANDBOX,
        }
    }
}

/// Which read requests a scripted fault hits.
#[derive(Debug, Clone)]
pub enum On {
    /// Requests to this path (`/v1/subscriptions/sub_1`, `/v1/events`).
    Path(String),
    /// The read request with this number, counting from 1 (every read route counts).
    Nth(usize),
    /// Every read.
    Any,
}

/// What the rate limiter saw, for a test that asks whether anything went over the limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateSeen {
    /// Requests that reached the fake.
    pub requests: u32,
    /// Requests the limiter refused (429).
    pub over_limit: u32,
    /// The most requests of one second of the fake's clock, counted against the global limit
    /// (refused ones included: each was sent).
    pub peak_per_second: u32,
    /// The same for the busiest endpoint (`GET /v1/subscriptions/{id}`).
    pub peak_endpoint: u32,
}

/// An object the account holds, in the account (`Stripe-Account` / `Stripe-Context`) named.
#[derive(Debug, Clone)]
struct Held {
    context: Option<String>,
    object: Value,
    /// Events only: whether Stripe delivered it (`delivery_success`).
    delivered: bool,
}

#[derive(Default)]
struct Limiter {
    /// The second of the fake's clock being counted, and its counts.
    second: i64,
    global: u32,
    endpoints: HashMap<String, u32>,
    seen: RateSeen,
    /// Why the last request the limiter refused was refused (the 429's reason header).
    refused: Option<&'static str>,
}

/// The read side's state: objects, scripted faults, the limiter, the clock.
#[derive(Default)]
pub(crate) struct Reads {
    objects: Vec<Held>,
    events: Vec<Held>,
    v2_events: Vec<Held>,
    /// A customer's active entitlements, by (context, customer).
    entitlements: HashMap<(Option<String>, String), Vec<Value>>,
    faults: Vec<(On, Fault, usize)>,
    /// Read requests so far (for [`On::Nth`]).
    reads: usize,
    /// The mode of a request whose key names none.
    mode: Mode,
    /// The fake's clock: the wall clock's unless a test set it.
    clock: Clock,
    limiter: Limiter,
    request_ids: u64,
}

/// The fake's clock.
#[derive(Default, Clone, Copy)]
enum Clock {
    #[default]
    Wall,
    /// Stopped at a time (a test moves it).
    Stopped(DateTime<Utc>),
    /// Running from a time, set at an instant of the wall clock.
    Running(DateTime<Utc>, std::time::Instant),
}

impl Reads {
    fn now(&self) -> DateTime<Utc> {
        match self.clock {
            Clock::Wall => Utc::now(),
            Clock::Stopped(at) => at,
            Clock::Running(from, set) => {
                from + TimeDelta::from_std(set.elapsed()).unwrap_or_default()
            }
        }
    }

    fn request_id(&mut self) -> String {
        self.request_ids += 1;
        format!("req_fake{:010}", self.request_ids)
    }
}

/// The operation a request names, as the rate limiter counts it: its method and path with the
/// ids taken out (`GET /v1/subscriptions/{id}`).
fn endpoint(request: &Request) -> String {
    const LITERAL: [&str; 19] = [
        "v1",
        "v2",
        "core",
        "events",
        "billing",
        "meters",
        "meter_events",
        "meter_event_adjustments",
        "event_summaries",
        "subscriptions",
        "invoices",
        "invoice_payments",
        "customers",
        "payment_intents",
        "charges",
        "entitlements",
        "active_entitlements",
        "search",
        "",
    ];
    let path: Vec<&str> = request
        .url
        .path()
        .split('/')
        .map(|s| if LITERAL.contains(&s) { s } else { "{id}" })
        .collect();
    format!("{} {}", request.method, path.join("/"))
}

fn bearer(request: &Request) -> Option<&str> {
    request
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// The account a request is made as: `Stripe-Account` (a connected account, v1), else
/// `Stripe-Context` (docs.stripe.com/context).
fn context_of(request: &Request) -> Option<String> {
    ["stripe-account", "stripe-context"]
        .iter()
        .find_map(|h| request.headers.get(*h))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Stripe's error body: "`{"error": {type, code, doc_url, message, param}}`"
/// (docs.stripe.com/api/errors: `type` one of `api_error`, `card_error`, `idempotency_error`,
/// `invalid_request_error`; `doc_url` "a URL to more information about the error code
/// reported").
fn error(status: u16, code: Option<&str>, message: String, param: Option<&str>) -> (u16, Value) {
    let mut error = json!({"type": "invalid_request_error", "message": message});
    if let Some(code) = code {
        error["code"] = json!(code);
        error["doc_url"] = json!(format!(
            "https://stripe.com/docs/error-codes/{}",
            code.replace('_', "-")
        ));
    }
    if let Some(param) = param {
        error["param"] = json!(param);
    }
    (status, json!({ "error": error }))
}

/// "resource_missing: The ID provided is not valid. Either the resource does not exist, or an
/// ID for a different resource has been provided." (docs.stripe.com/error-codes), a 404 "The
/// requested resource doesn't exist." (docs.stripe.com/api/errors); the message as Stripe
/// words it ("No such subscription: 'sub_…'").
fn missing(noun: &str, id: &str, param: &str) -> (u16, Value) {
    error(
        404,
        Some("resource_missing"),
        format!("No such {noun}: '{id}'"),
        Some(param),
    )
}

/// The rate limiter's front door: every request meets it first (after the description's
/// check, which answers nothing). A request over a limit is answered 429 here, before any
/// endpoint or idempotency layer sees it: "rate limiters run before the API's idempotency
/// layer" (docs.stripe.com/error-low-level).
struct Limited(FakeStripe);

impl Match for Limited {
    fn matches(&self, request: &Request) -> bool {
        let mut reads = self.0.reads();
        let now = reads.now().timestamp();
        let mode = bearer(request).and_then(Mode::of_key).unwrap_or(reads.mode);
        let endpoint = endpoint(request);
        let limiter = &mut reads.limiter;
        // "rate limits are measured in API requests per second, per Stripe account"
        // (docs.stripe.com/rate-limits): one count per second of the clock.
        if limiter.second != now {
            limiter.second = now;
            limiter.global = 0;
            limiter.endpoints.clear();
        }
        limiter.seen.requests += 1;
        let meter_live = mode == Mode::Live && endpoint == METER_EVENTS;
        let (global_limit, endpoint_limit) = match meter_live {
            true => (None, METER_EVENTS_LIVE),
            false => (Some(mode.global()), PER_ENDPOINT),
        };
        if global_limit.is_some() {
            limiter.global += 1;
        }
        let at_endpoint = limiter.endpoints.entry(endpoint).or_default();
        *at_endpoint += 1;
        let at_endpoint = *at_endpoint;
        limiter.seen.peak_per_second = limiter.seen.peak_per_second.max(limiter.global);
        limiter.seen.peak_endpoint = limiter.seen.peak_endpoint.max(at_endpoint);
        // The reason a 429 names (`Stripe-Rate-Limited-Reason`: `global-rate`,
        // `endpoint-rate`, …; docs.stripe.com/rate-limits).
        limiter.refused = if global_limit.is_some_and(|l| limiter.global > l) {
            Some("global-rate")
        } else if at_endpoint > endpoint_limit {
            Some("endpoint-rate")
        } else {
            None
        };
        if limiter.refused.is_some() {
            limiter.seen.over_limit += 1;
        }
        limiter.refused.is_some()
    }
}

impl Respond for Limited {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let mut reads = self.0.reads();
        let reason = reads.limiter.refused.unwrap_or("global-rate");
        let id = reads.request_id();
        rate_limited()
            .insert_header("Stripe-Rate-Limited-Reason", reason)
            .insert_header("Request-Id", id.as_str())
    }
}

/// An answer of the meter side, with its `Request-Id`.
pub(crate) struct WithRequestId(pub(crate) FakeStripe);

impl Respond for WithRequestId {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let answer = self.0.respond(request);
        let id = self.0.reads().request_id();
        answer.insert_header("Request-Id", id.as_str())
    }
}

/// "Each API request has an associated request identifier. You can find this value in the
/// response headers, under `Request-Id`." (docs.stripe.com/api/request_ids)
struct ReadSide(FakeStripe);

impl Respond for ReadSide {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let mut reads = self.0.reads();
        let id = reads.request_id();
        let answer = match reads.answer(request) {
            Answered::Is(status, body, delay) => {
                let answer = ResponseTemplate::new(status).set_body_json(body);
                match delay {
                    Some(delay) => answer.set_delay(delay),
                    None => answer,
                }
            }
            // A 429 the test scripts, as the limiter answers one, with a `Retry-After` when
            // given (read by Stripe's SDKs, stripe-php #755).
            Answered::RateLimited(retry_after) => {
                let answer =
                    rate_limited().insert_header("Stripe-Rate-Limited-Reason", "global-rate");
                match retry_after {
                    Some(secs) => answer.insert_header("Retry-After", secs.to_string().as_str()),
                    None => answer,
                }
            }
        };
        answer.insert_header("Request-Id", id.as_str())
    }
}

/// A read's answer: its status, body and how late it comes, or a scripted 429.
enum Answered {
    Is(u16, Value, Option<Duration>),
    RateLimited(Option<u32>),
}

/// Mounts the limiter (in front of every route) and the read routes on `server`; the meter
/// side's own routes are mounted beside them by [`FakeStripe::serve`].
pub(crate) async fn mount(fake: &FakeStripe, server: &wiremock::MockServer) {
    Mock::given(Limited(fake.clone()))
        .respond_with(Limited(fake.clone()))
        .with_priority(2)
        .named("Stripe's rate limiter")
        .mount(server)
        .await;
    // A test's own mock of a read comes first (the default priority, 5).
    Mock::given(method("GET"))
        .and(path_regex(READ_ROUTES))
        .respond_with(ReadSide(fake.clone()))
        .with_priority(10)
        .mount(server)
        .await;
}

impl Reads {
    /// The answer to a read.
    fn answer(&mut self, request: &Request) -> Answered {
        self.reads += 1;
        let path = request.url.path().to_owned();
        let n = self.reads;
        let scripted = self.faults.iter_mut().find(|(on, _, left)| {
            *left > 0
                && match on {
                    On::Path(p) => *p == path,
                    On::Nth(at) => *at == n,
                    On::Any => true,
                }
        });
        let mut delay = None;
        if let Some((_, fault, left)) = scripted {
            *left -= 1;
            match fault.clone() {
                Fault::Fails(status, body) | Fault::TakesThenFails(status, body) => {
                    return Answered::Is(status, body, None)
                }
                Fault::RateLimited(retry_after) => return Answered::RateLimited(retry_after),
                Fault::Slow(after) => delay = Some(after),
            }
        }
        // "All API requests must be made over HTTPS. Calls made over plain HTTP will fail. API
        // requests without authentication will also fail." (docs.stripe.com/api/authentication)
        let (status, body) = if bearer(request).is_none_or(str::is_empty) {
            let (_, mut body) = error(401, None, "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').".into(), None);
            body["error"]["type"] = json!("authentication_error");
            (401, body)
        } else {
            self.route(request, &path)
        };
        Answered::Is(status, body, delay)
    }

    fn route(&self, request: &Request, path: &str) -> (u16, Value) {
        let context = context_of(request);
        let query: Vec<(String, String)> = request.url.query_pairs().into_owned().collect();
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match segments.as_slice() {
            ["v2", "core", "events", id] => match self.find(&self.v2_events, &context, id) {
                Some(event) => (200, event.clone()),
                None => missing("event", id, "id"),
            },
            ["v1", "entitlements", "active_entitlements"] => {
                let Some(customer) = get(&query, "customer") else {
                    return error(
                        400,
                        Some("parameter_missing"),
                        "Missing required param: customer.".into(),
                        Some("customer"),
                    );
                };
                let listed = self
                    .entitlements
                    .get(&(context, customer.to_owned()))
                    .cloned()
                    .unwrap_or_default();
                page(path, listed, &query)
            }
            ["v1", "events"] => self.list_events(path, &context, &query),
            ["v1", "subscriptions"] => {
                let status = get(&query, "status");
                let customer = get(&query, "customer");
                let listed = self.newest_first(&self.objects, &context, "subscription", |s| {
                    let is = s.get("status").and_then(Value::as_str).unwrap_or_default();
                    // "If no value is supplied, all subscriptions that have not been canceled
                    // are returned." `ended` is "subscriptions that are canceled and
                    // subscriptions that are expired due to incomplete payment"; `all`, every
                    // status (docs.stripe.com/api/subscriptions/list, `status`).
                    let status_fits = match status {
                        None => is != "canceled",
                        Some("all") => true,
                        Some("ended") => is == "canceled" || is == "incomplete_expired",
                        Some(wanted) => is == wanted,
                    };
                    status_fits && customer.is_none_or(|c| s.get("customer") == Some(&json!(c)))
                });
                page(path, listed, &query)
            }
            ["v1", "invoice_payments"] => {
                let fits = |p: &Value| {
                    query.iter().all(|(k, v)| match k.as_str() {
                        "invoice" => p.get("invoice") == Some(&json!(v)),
                        "payment[type]" => p.pointer("/payment/type") == Some(&json!(v)),
                        "payment[payment_intent]" => {
                            p.pointer("/payment/payment_intent") == Some(&json!(v))
                        }
                        _ => true,
                    })
                };
                let listed = self.newest_first(&self.objects, &context, "invoice_payment", fits);
                page(path, listed, &query)
            }
            ["v1", collection, id] => {
                let (kind, noun) = match *collection {
                    "subscriptions" => ("subscription", "subscription"),
                    "invoices" => ("invoice", "invoice"),
                    "invoice_payments" => ("invoice_payment", "invoice payment"),
                    "customers" => ("customer", "customer"),
                    "payment_intents" => ("payment_intent", "payment_intent"),
                    "charges" => ("charge", "charge"),
                    "events" => {
                        let kept = self.now() - EVENTS_KEPT;
                        return match self.find(&self.events, &context, id) {
                            Some(e) if created(e) >= kept.timestamp() => (200, e.clone()),
                            _ => missing("event", id, "id"),
                        };
                    }
                    _ => return missing("object", id, "id"),
                };
                let found = self.objects.iter().rev().find(|h| {
                    h.context == context && h.object["id"] == *id && h.object["object"] == kind
                });
                match found {
                    Some(held) => (200, held.object.clone()),
                    None => missing(noun, id, "id"),
                }
            }
            _ => missing("object", path, "id"),
        }
    }

    fn find<'a>(&self, held: &'a [Held], context: &Option<String>, id: &str) -> Option<&'a Value> {
        held.iter()
            .rev()
            .find(|h| h.context == *context && h.object["id"] == id)
            .map(|h| &h.object)
    }

    /// The objects of `kind` in `context` that `fits`, "in reverse chronological order"
    /// (docs.stripe.com/api/pagination: a list is "a single page in a reverse chronological
    /// stream of objects"); of one second, the later seeded first.
    fn newest_first(
        &self,
        held: &[Held],
        context: &Option<String>,
        kind: &str,
        fits: impl Fn(&Value) -> bool,
    ) -> Vec<Value> {
        let mut listed: Vec<(usize, &Value)> = held
            .iter()
            .enumerate()
            .filter(|(_, h)| h.context == *context && h.object["object"] == kind && fits(&h.object))
            .map(|(n, h)| (n, &h.object))
            .collect();
        listed.sort_by_key(|(n, o)| std::cmp::Reverse((created(o), *n)));
        listed.into_iter().map(|(_, o)| o.clone()).collect()
    }

    /// `GET /v1/events`: the events of the last 30 days, newest first, filtered.
    fn list_events(
        &self,
        path: &str,
        context: &Option<String>,
        query: &[(String, String)],
    ) -> (u16, Value) {
        let kept = (self.now() - EVENTS_KEPT).timestamp();
        let types: Vec<&str> = query
            .iter()
            .filter(|(k, _)| k == "types[]" || k.starts_with("types["))
            .map(|(_, v)| v.as_str())
            .collect();
        // "`type`: A string containing a specific event name, or group of events using * as a
        // wildcard. The list will be filtered to include only events with a matching event
        // property." "`types`: An array of up to 20 strings containing specific event names.
        // The list will be filtered to include only events with a matching event property. You
        // may pass either `type` or `types`, but not both." (docs.stripe.com/api/events/list)
        let one_type = get(query, "type");
        if one_type.is_some() && !types.is_empty() {
            return error(
                400,
                None,
                "You may pass either `type` or `types`, but not both.".into(),
                Some("types"),
            );
        }
        let delivery = get(query, "delivery_success").map(|v| v == "true");
        let Some(range) = Created::of(query) else {
            return error(
                400,
                None,
                "Invalid integer for created.".into(),
                Some("created"),
            );
        };
        let held: Vec<Held> = self
            .events
            .iter()
            .filter(|h| delivery.is_none_or(|d| h.delivered == d))
            .cloned()
            .collect();
        let listed = self.newest_first(&held, context, "event", |e| {
            let at = created(e);
            let kind = e["type"].as_str().unwrap_or_default();
            at >= kept
                && range.holds(at)
                && (types.is_empty() || types.contains(&kind))
                && one_type.is_none_or(|t| type_fits(t, kind))
        });
        page(path, listed, query)
    }
}

/// Whether event type `kind` is `pattern`, `*` standing for any run of characters.
fn type_fits(pattern: &str, kind: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == kind,
        Some((head, tail)) => {
            kind.len() >= head.len() + tail.len() && kind.starts_with(head) && kind.ends_with(tail)
        }
    }
}

fn get<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn created(object: &Value) -> i64 {
    object
        .get("created")
        .and_then(Value::as_i64)
        .unwrap_or_default()
}

/// A list's `created` filter: "`created`: Only return events that were created during the
/// given date interval", an integer or a map of `gt`, `gte`, `lt`, `lte`
/// (docs.stripe.com/api/events/list).
struct Created {
    from: i64,
    until: i64,
}

impl Created {
    fn of(query: &[(String, String)]) -> Option<Self> {
        let mut range = Self {
            from: i64::MIN,
            until: i64::MAX,
        };
        for (k, v) in query {
            let bound = || v.parse::<i64>().ok();
            match k.as_str() {
                "created" => {
                    range.from = bound()?;
                    range.until = bound()?;
                }
                "created[gte]" => range.from = range.from.max(bound()?),
                "created[gt]" => range.from = range.from.max(bound()? + 1),
                "created[lte]" => range.until = range.until.min(bound()?),
                "created[lt]" => range.until = range.until.min(bound()? - 1),
                _ => {}
            }
        }
        Some(range)
    }

    fn holds(&self, at: i64) -> bool {
        (self.from..=self.until).contains(&at)
    }
}

/// One page of `listed` (already in list order) as Stripe's list object: "`object`: always
/// `list`", "`data`", "`has_more`: Whether or not there are more elements available after this
/// set", "`url`: The URL for accessing this list" (docs.stripe.com/api/pagination). `limit`
/// "can range between 1 and 100, and the default is 10"; `starting_after` "defines your place
/// in the list", the page the objects after it; `ending_before` the page before it (ibid.).
fn page(url: &str, listed: Vec<Value>, query: &[(String, String)]) -> (u16, Value) {
    let limit = match get(query, "limit").map(str::parse::<usize>) {
        None => DEFAULT_LIMIT,
        Some(Ok(limit)) if (1..=MAX_LIMIT).contains(&limit) => limit,
        Some(_) => {
            return error(
                400,
                None,
                "Invalid limit: must be between 1 and 100".into(),
                Some("limit"),
            )
        }
    };
    let position = |param: &str, id: &str| {
        listed
            .iter()
            .position(|o| o["id"] == id)
            .ok_or(param.to_owned())
    };
    let (from, until) = match (get(query, "starting_after"), get(query, "ending_before")) {
        (Some(_), Some(_)) => {
            return error(
                400,
                None,
                "You may only specify one of these parameters: ending_before, starting_after."
                    .into(),
                Some("ending_before"),
            )
        }
        (Some(after), None) => match position("starting_after", after) {
            Ok(at) => (at + 1, (at + 1 + limit).min(listed.len())),
            // A cursor the list does not hold: Stripe names the object it cannot find.
            Err(param) => return missing("object", after, &param),
        },
        (None, Some(before)) => match position("ending_before", before) {
            Ok(at) => (at.saturating_sub(limit), at),
            Err(param) => return missing("object", before, &param),
        },
        (None, None) => (0, limit.min(listed.len())),
    };
    // `has_more` is more in the direction the page was read: after it, or before it for an
    // `ending_before` page.
    let has_more = match get(query, "ending_before") {
        Some(_) => from > 0,
        None => until < listed.len(),
    };
    (
        200,
        json!({"object": "list", "url": url, "has_more": has_more,
               "data": listed[from..until].to_vec()}),
    )
}

impl FakeStripe {
    /// The account holds `object` (a v1 object with its `id` and `object`: a subscription,
    /// invoice, invoice payment, customer, payment intent, charge), replacing one of its id.
    pub fn holds(&self, object: Value) -> &Self {
        self.holds_in(None, object)
    }

    /// The connected account (or context) `context` holds `object`.
    pub fn holds_in(&self, context: Option<&str>, object: Value) -> &Self {
        assert!(
            object.get("id").is_some() && object.get("object").is_some(),
            "an object Stripe holds has its id and object: {object}"
        );
        let mut reads = self.reads();
        let context = context.map(str::to_owned);
        reads
            .objects
            .retain(|h| h.context != context || h.object["id"] != object["id"]);
        reads.objects.push(Held {
            context,
            object,
            delivered: true,
        });
        self
    }

    /// The account no longer holds the object `id` (deleted: reads of it are 404s).
    pub fn forgets(&self, id: &str) -> &Self {
        self.reads().objects.retain(|h| h.object["id"] != id);
        self
    }

    /// The account's event (`GET /v1/events`, `/v1/events/{id}`), of the context its
    /// `account` names, delivered to every endpoint.
    pub fn has_event(&self, event: Value) -> &Self {
        self.add_event(event, true)
    }

    /// An event Stripe failed to deliver (`delivery_success=false` lists it).
    pub fn has_undelivered_event(&self, event: Value) -> &Self {
        self.add_event(event, false)
    }

    fn add_event(&self, event: Value, delivered: bool) -> &Self {
        let context = event
            .get("account")
            .and_then(Value::as_str)
            .map(str::to_owned);
        // Listed with `Stripe-Account` as the account's own. Listed by the platform too: its
        // pages say only that Connect platforms "receive event notifications that occur in
        // their connected accounts" (docs.stripe.com/api/events), not whether the platform's
        // `GET /v1/events` lists them; reconciliation's walk relies on it, so the fake does,
        // until Stripe's answer is known (docs/design.md §6.6).
        let mut reads = self.reads();
        reads.events.push(Held {
            context: None,
            object: event.clone(),
            delivered,
        });
        if context.is_some() {
            reads.events.push(Held {
                context,
                object: event,
                delivered,
            });
        }
        self
    }

    /// A v2 event (`GET /v2/core/events/{id}`), read in the context it names.
    pub fn has_v2_event(&self, event: Value) -> &Self {
        let context = event
            .get("context")
            .and_then(Value::as_str)
            .map(str::to_owned);
        self.reads().v2_events.push(Held {
            context,
            object: event,
            delivered: true,
        });
        self
    }

    /// `customer`'s active entitlements in `context` (`GET
    /// /v1/entitlements/active_entitlements?customer=…`), in list order: each
    /// `{id, object: "entitlements.active_entitlement", feature, livemode, lookup_key}`
    /// (stripe-node `Entitlements.ActiveEntitlement`).
    pub fn entitles(&self, context: Option<&str>, customer: &str, lookup_keys: &[&str]) -> &Self {
        let listed = lookup_keys
            .iter()
            .enumerate()
            .map(|(n, key)| {
                json!({"id": format!("ent_{customer}_{n}"), "object": "entitlements.active_entitlement",
                       "feature": format!("feat_{key}"), "livemode": false, "lookup_key": key})
            })
            .collect();
        self.reads()
            .entitlements
            .insert((context.map(str::to_owned), customer.to_owned()), listed);
        self
    }

    /// `customer`'s active entitlements in `context`, as given (each an
    /// `entitlements.active_entitlement` with its `id`), in list order.
    pub fn entitlements_of(
        &self,
        context: Option<&str>,
        customer: &str,
        listed: Vec<Value>,
    ) -> &Self {
        self.reads()
            .entitlements
            .insert((context.map(str::to_owned), customer.to_owned()), listed);
        self
    }

    /// The next `times` reads `on` go wrong as `fault` says (a 5xx, a slow answer, a 429), in
    /// the order scripted.
    pub fn read_fails(&self, on: On, fault: Fault, times: usize) -> &Self {
        self.reads().faults.push((on, fault, times));
        self
    }

    /// The mode of a request whose key names none (`sk_live_…`/`sk_test_…` name theirs).
    pub fn in_mode(&self, mode: Mode) -> &Self {
        self.reads().mode = mode;
        self
    }

    /// Stops the fake's clock (the rate limiter's seconds, the events' 30 days) at `at`.
    pub fn clock_at(&self, at: DateTime<Utc>) -> &Self {
        self.reads().clock = Clock::Stopped(at);
        self
    }

    /// Sets the fake's clock to `at`, running on from there (a corpus's day, say).
    pub fn clock_from(&self, at: DateTime<Utc>) -> &Self {
        self.reads().clock = Clock::Running(at, std::time::Instant::now());
        self
    }

    /// Moves the fake's clock on by `by` (stopped there).
    pub fn clock_advance(&self, by: TimeDelta) -> &Self {
        let mut reads = self.reads();
        let now = reads.now();
        reads.clock = Clock::Stopped(now + by);
        self
    }

    /// What the rate limiter saw so far.
    pub fn rate_seen(&self) -> RateSeen {
        self.reads().limiter.seen.clone()
    }

    /// Read requests answered by the read routes so far.
    pub fn read_count(&self) -> usize {
        self.reads().reads
    }
}

impl FakeStripe {
    pub(crate) fn reads(&self) -> std::sync::MutexGuard<'_, Reads> {
        self.1.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The read side, asked directly: each behaviour as Stripe's pages say.
#[cfg(all(test, feature = "described"))]
mod behaviour {
    use super::*;
    use crate::described::ProviderServer;

    async fn get(
        server: &ProviderServer,
        key: &str,
        path: &str,
        query: &[(&str, &str)],
        context: Option<&str>,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let mut request = reqwest::Client::new()
            .get(format!("{}{path}", server.uri()))
            .bearer_auth(key)
            .query(query);
        if let Some(account) = context {
            request = request.header("Stripe-Account", account);
        }
        let answer = request.send().await.unwrap();
        let status = answer.status().as_u16();
        let headers = answer.headers().clone();
        (status, answer.json().await.unwrap_or(Value::Null), headers)
    }

    fn event(id: &str, created: i64, kind: &str) -> Value {
        json!({"id": id, "object": "event", "type": kind, "created": created,
               "livemode": false, "data": {"object": {"id": "sub_1", "object": "subscription"}}})
    }

    fn ids(body: &Value) -> Vec<&str> {
        body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["id"].as_str().unwrap())
            .collect()
    }

    #[tokio::test]
    async fn lists_page_newest_first_with_stripes_cursors_limits_and_filters() {
        let fake = FakeStripe::default();
        let now = Utc::now();
        fake.clock_at(now);
        let t = now.timestamp() - 3_600;
        for n in 0..5 {
            fake.has_event(event(
                &format!("evt_{n}"),
                t + n,
                "customer.subscription.updated",
            ));
        }
        fake.has_event(event("evt_paid", t + 10, "invoice.paid"));
        fake.has_undelivered_event(event("evt_lost", t + 20, "invoice.paid"));
        fake.has_event(event(
            "evt_old",
            (now - TimeDelta::days(31)).timestamp(),
            "invoice.paid",
        ));
        let server = fake.serve().await;
        let key = "sk_test_fake";

        let (status, all, headers) = get(&server, key, "/v1/events", &[], None).await;
        assert_eq!(status, 200);
        assert!(headers.get("request-id").is_some());
        assert_eq!(
            ids(&all),
            ["evt_lost", "evt_paid", "evt_4", "evt_3", "evt_2", "evt_1", "evt_0"],
            "newest first, 30 days"
        );
        assert_eq!(
            (all["object"].as_str(), all["url"].as_str()),
            (Some("list"), Some("/v1/events"))
        );
        assert_eq!(all["has_more"], false);

        let (_, first, _) = get(
            &server,
            key,
            "/v1/events",
            &[("limit", "2"), ("types[]", "customer.subscription.updated")],
            None,
        )
        .await;
        assert_eq!(
            (ids(&first), first["has_more"].as_bool()),
            (vec!["evt_4", "evt_3"], Some(true))
        );
        let (_, next, _) = get(
            &server,
            key,
            "/v1/events",
            &[
                ("limit", "2"),
                ("types[]", "customer.subscription.updated"),
                ("starting_after", "evt_3"),
            ],
            None,
        )
        .await;
        assert_eq!(ids(&next), ["evt_2", "evt_1"]);
        let (_, before, _) = get(
            &server,
            key,
            "/v1/events",
            &[("limit", "2"), ("ending_before", "evt_2")],
            None,
        )
        .await;
        assert_eq!(
            (ids(&before), before["has_more"].as_bool()),
            (vec!["evt_4", "evt_3"], Some(true))
        );
        let gte = (t + 3).to_string();
        let lt = (t + 10).to_string();
        let (_, window, _) = get(
            &server,
            key,
            "/v1/events",
            &[("created[gte]", gte.as_str()), ("created[lt]", lt.as_str())],
            None,
        )
        .await;
        assert_eq!(ids(&window), ["evt_4", "evt_3"]);
        let (_, wildcard, _) =
            get(&server, key, "/v1/events", &[("type", "invoice.*")], None).await;
        assert_eq!(ids(&wildcard), ["evt_lost", "evt_paid"]);
        let (_, lost, _) = get(
            &server,
            key,
            "/v1/events",
            &[("delivery_success", "false")],
            None,
        )
        .await;
        assert_eq!(ids(&lost), ["evt_lost"]);
        let (status, _, _) = get(&server, key, "/v1/events/evt_old", &[], None).await;
        assert_eq!(status, 404, "an event past 30 days is gone");

        // Out of range: refused by the description (limit 1-100) and by the fake alike.
        let checked = server.refused();
        assert!(checked.is_empty(), "{checked:?}");
    }

    #[tokio::test]
    async fn objects_are_read_in_their_account_and_a_missing_one_is_stripes_404() {
        let fake = FakeStripe::default();
        fake.holds(
            json!({"id": "sub_1", "object": "subscription", "status": "active", "created": 1}),
        );
        fake.holds_in(
            Some("acct_1"),
            json!({"id": "sub_2", "object": "subscription", "status": "active", "created": 2}),
        );
        fake.holds(
            json!({"id": "sub_3", "object": "subscription", "status": "canceled", "created": 3}),
        );
        let server = fake.serve().await;
        let key = "sk_test_fake";

        let (status, sub, _) = get(&server, key, "/v1/subscriptions/sub_1", &[], None).await;
        assert_eq!((status, sub["status"].as_str()), (200, Some("active")));
        let (status, body, headers) = get(&server, key, "/v1/subscriptions/sub_2", &[], None).await;
        assert_eq!(status, 404, "another account's object");
        assert_eq!(
            body["error"],
            json!({"type": "invalid_request_error", "code": "resource_missing",
                   "message": "No such subscription: 'sub_2'", "param": "id",
                   "doc_url": "https://stripe.com/docs/error-codes/resource-missing"})
        );
        assert!(headers.get("request-id").is_some());
        let (status, _, _) =
            get(&server, key, "/v1/subscriptions/sub_2", &[], Some("acct_1")).await;
        assert_eq!(status, 200);
        let (_, listed, _) = get(&server, key, "/v1/subscriptions", &[], None).await;
        assert_eq!(ids(&listed), ["sub_1"], "canceled ones only with a status");
        let (_, listed, _) = get(
            &server,
            key,
            "/v1/subscriptions",
            &[("status", "all")],
            None,
        )
        .await;
        assert_eq!(ids(&listed), ["sub_3", "sub_1"]);
        let (status, body, _) = get(
            &server,
            key,
            "/v1/subscriptions",
            &[("starting_after", "sub_9")],
            None,
        )
        .await;
        assert_eq!(
            (status, body["error"]["param"].as_str()),
            (404, Some("starting_after"))
        );
        let (status, _, _) = get(&server, "", "/v1/subscriptions/sub_1", &[], None).await;
        assert_eq!(status, 401, "no key");
    }

    #[tokio::test]
    async fn the_limiter_answers_429_past_each_modes_limit_per_second_and_says_what_it_saw() {
        let fake = FakeStripe::default();
        let second = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        fake.clock_at(second);
        fake.holds(json!({"id": "sub_1", "object": "subscription", "created": 1}));
        fake.holds(json!({"id": "cus_1", "object": "customer", "created": 1}));
        let server = fake.serve().await;
        let path = "/v1/subscriptions/sub_1";

        // A sandbox: 25 a second, the 26th refused before anything runs.
        for _ in 0..25 {
            assert_eq!(get(&server, "sk_test_x", path, &[], None).await.0, 200);
        }
        let (status, body, headers) = get(&server, "sk_test_x", path, &[], None).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (429, Some("rate_limit"))
        );
        assert_eq!(headers["stripe-should-retry"], "true");
        assert_eq!(headers["stripe-rate-limited-reason"], "global-rate");
        assert_eq!(fake.read_count(), 25, "the endpoint never saw it");

        // The next second counts afresh; live mode takes 100, but one endpoint 25.
        fake.clock_advance(TimeDelta::seconds(1));
        for _ in 0..25 {
            assert_eq!(get(&server, "sk_live_x", path, &[], None).await.0, 200);
        }
        let (status, _, headers) = get(&server, "sk_live_x", path, &[], None).await;
        assert_eq!(
            (status, &headers["stripe-rate-limited-reason"]),
            (429, &"endpoint-rate".parse().unwrap())
        );
        assert_eq!(
            get(&server, "sk_live_x", "/v1/customers/cus_1", &[], None)
                .await
                .0,
            200
        );

        assert_eq!(
            fake.rate_seen(),
            RateSeen {
                requests: 53,
                over_limit: 2,
                peak_per_second: 27,
                peak_endpoint: 26
            }
        );
    }

    #[tokio::test]
    async fn a_scripted_fault_comes_on_top_of_the_faithful_answer() {
        let fake = FakeStripe::default();
        fake.holds(json!({"id": "sub_1", "object": "subscription", "created": 1}));
        fake.read_fails(
            On::Nth(2),
            Fault::Fails(500, json!({"error": {"type": "api_error"}})),
            1,
        );
        fake.read_fails(
            On::Path("/v1/subscriptions/sub_1".into()),
            Fault::Slow(Duration::from_secs(2)),
            1,
        );
        let server = fake.serve().await;
        let path = "/v1/subscriptions/sub_1";
        let timed_out = reqwest::Client::new()
            .get(format!("{}{path}", server.uri()))
            .bearer_auth("sk_test_x")
            .timeout(Duration::from_millis(50))
            .send()
            .await;
        assert!(
            timed_out.unwrap_err().is_timeout(),
            "slow: the client gave up"
        );
        assert_eq!(get(&server, "sk_test_x", path, &[], None).await.0, 500);
        assert_eq!(get(&server, "sk_test_x", path, &[], None).await.0, 200);
        fake.read_fails(On::Any, Fault::RateLimited(Some(30)), 1);
        let (status, body, headers) = get(&server, "sk_test_x", path, &[], None).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (429, Some("rate_limit"))
        );
        assert_eq!(
            (&headers["retry-after"], &headers["stripe-should-retry"]),
            (&"30".parse().unwrap(), &"true".parse().unwrap())
        );
        assert_eq!(get(&server, "sk_test_x", path, &[], None).await.0, 200);
    }
}
