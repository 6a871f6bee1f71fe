//! The fake Stripe's read side and its front door (docs/design.md §6.6): the objects a test
//! seeds, read back as Stripe's API serves them, and the limiter every request meets first.
//! It holds its own state; the clock and the request ids are the account's, shared with the
//! meter side.
//!
//! - object reads: `GET /v1/{subscriptions,invoices,invoice_payments,customers,payment_intents,
//!   charges,events}/{id}` and `GET /v2/core/events/{id}`, each in the account its
//!   `Stripe-Account` (or `Stripe-Context`) names; an object it does not hold is a 404
//!   `resource_missing` shaped as Stripe shapes errors;
//! - lists: `GET /v1/events` (`created[…]`, `types[]`, `type` with `*`, `delivery_success`),
//!   `GET /v1/subscriptions` (`status`, `customer`, `test_clock`), `GET /v1/invoice_payments` (`invoice`,
//!   `payment[…]`), `GET /v1/entitlements/active_entitlements` (`customer`): `limit` 1 to 100
//!   (10 by default), `starting_after`/`ending_before`, `has_more`, `url`, newest first;
//! - the rate limiter, before anything else (idempotency included): Stripe's global limit for
//!   the key's mode, per-endpoint limits, the live meter events' own; counted per second of the
//!   fake's clock, with what came over the limit and the peak rate kept for a test to read;
//! - a `Request-Id` on every answer;
//! - what a test scripts on top ([`On`], with [`Fault`]): a 5xx, a slow answer (a timeout, to
//!   a client that gives up first), a 429 of its own; or, per request, a decider's ([`Faults`],
//!   a simulation's dice) once nothing scripted is left.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{json, Value};
use wiremock::matchers::{method, path_regex};
use wiremock::{Match, Mock, Request, Respond, ResponseTemplate};

use super::answers::{rate_limited, Asked, Fault, Faults, RequestIds};
use super::clock::Time;
use super::credits;
use super::lists::{created, error, get, missing, page};

/// Where the read routes are: the v1 objects and lists the project reads, and v2 events.
const READ_ROUTES: &str = r"^(/v1/(events|subscriptions|invoices|invoice_payments|customers|payment_intents|charges)(/[^/]+)?|/v1/entitlements/active_entitlements|/v1/billing/(credit_grants(/[^/]+)?|credit_balance_summary)|/v2/core/events/[^/]+)$";

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

/// The read side's state: objects, scripted faults, the limiter.
#[derive(Default)]
struct Reads {
    objects: Vec<Held>,
    events: Vec<Held>,
    v2_events: Vec<Held>,
    /// A customer's active entitlements, by (context, customer).
    entitlements: HashMap<(Option<String>, String), Vec<Value>>,
    faults: Vec<(On, Fault, usize)>,
    /// The test's own per-request decider, after the scripted faults.
    decider: Option<Box<dyn Faults>>,
    /// Objects to delete once the read being answered is answered (a decider's, which runs
    /// while this state is held, through [`Forgets`]).
    forgotten: Forgets,
    /// Read requests so far (for [`On::Nth`]).
    reads: usize,
    /// The mode of a request whose key names none.
    mode: Mode,
    /// The account's clock, which the meter side reads too.
    clock: Time,
    ids: RequestIds,
    limiter: Limiter,
}

impl Reads {
    fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    fn request_id(&mut self) -> String {
        self.ids.next()
    }
}

/// Deletions asked for while the read side answers (by a decider, which runs under its lock):
/// each object named is deleted as soon as the read being answered, if any, is answered, so
/// the read that deletes it still finds it and every later one is a 404. Clones share it.
#[derive(Clone, Default)]
pub struct Forgets(Arc<Mutex<Vec<String>>>);

impl Forgets {
    /// The account deletes the object `id` once the read being answered is answered.
    pub fn forget(&self, id: &str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id.to_owned());
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The read side of one Stripe account; clones share it.
#[derive(Clone)]
pub(super) struct ReadSide(Arc<Mutex<Reads>>);

impl ReadSide {
    /// The read side reading the account's clock, numbering its answers with the account's
    /// request ids.
    pub(super) fn new(clock: Time, ids: RequestIds) -> Self {
        Self(Arc::new(Mutex::new(Reads {
            clock,
            ids,
            ..Reads::default()
        })))
    }

    fn reads(&self) -> MutexGuard<'_, Reads> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The operation a request names, as the rate limiter counts it: its method and path with the
/// ids taken out (`GET /v1/subscriptions/{id}`).
fn endpoint(request: &Request) -> String {
    const LITERAL: [&str; 21] = [
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
        "credit_grants",
        "credit_balance_summary",
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

/// The rate limiter's front door: every request meets it first (after the description's
/// check, which answers nothing). A request over a limit is answered 429 here, before any
/// endpoint or idempotency layer sees it: "rate limiters run before the API's idempotency
/// layer" (docs.stripe.com/error-low-level).
struct Limited(ReadSide);

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

/// "Each API request has an associated request identifier. You can find this value in the
/// response headers, under `Request-Id`." (docs.stripe.com/api/request_ids)
impl Respond for ReadSide {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let mut reads = self.reads();
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

impl ReadSide {
    /// Mounts the limiter (in front of every route) and the read routes on `server`; the meter
    /// side's own routes are mounted beside them.
    pub(super) async fn mount(&self, server: &wiremock::MockServer) {
        Mock::given(Limited(self.clone()))
            .respond_with(Limited(self.clone()))
            .with_priority(2)
            .named("Stripe's rate limiter")
            .mount(server)
            .await;
        // A test's own mock of a read comes first (the default priority, 5).
        Mock::given(method("GET"))
            .and(path_regex(READ_ROUTES))
            .respond_with(self.clone())
            .with_priority(10)
            .mount(server)
            .await;
    }
}

impl Reads {
    /// The answer to a read, then the deletions asked for meanwhile.
    fn answer(&mut self, request: &Request) -> Answered {
        self.delete_forgotten();
        let answered = self.answer_now(request);
        self.delete_forgotten();
        answered
    }

    fn delete_forgotten(&mut self) {
        for id in self.forgotten.take() {
            self.objects.retain(|h| h.object["id"] != id.as_str());
        }
    }

    fn answer_now(&mut self, request: &Request) -> Answered {
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
        let scripted = scripted.map(|(_, fault, left)| {
            *left -= 1;
            fault.clone()
        });
        let decided = match scripted {
            Some(fault) => Some(fault),
            None => {
                let query = request.url.query().unwrap_or_default();
                let trigger = request
                    .headers
                    .get("stripe-request-trigger")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("event="));
                let asked = Asked {
                    endpoint: &path,
                    identifier: query,
                    idempotency_key: None,
                    trigger,
                };
                self.decider.as_mut().and_then(|d| d.decide(&asked))
            }
        };
        let mut delay = None;
        if let Some(fault) = decided {
            match fault {
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
                // A customer the account deleted ("Permanently deletes a customer. It cannot
                // be undone.", docs.stripe.com/api/customers/delete) is no longer one a list
                // can name: `resource_missing`, "No such customer" (the fake's reading: the
                // list's page does not say).
                let deleted = self.objects.iter().any(|h| {
                    h.context == context
                        && h.object["id"] == customer
                        && h.object["object"] == "customer"
                        && h.object["deleted"] == true
                });
                if deleted {
                    return missing("customer", customer, "customer");
                }
                let listed = self
                    .entitlements
                    .get(&(context, customer.to_owned()))
                    .cloned()
                    .unwrap_or_default();
                page(path, listed, &query)
            }
            ["v1", "events"] => self.list_events(path, &context, &query),
            ["v1", "billing", "credit_grants"] => {
                let held = self.held_in(&context);
                credits::list_grants(path, &held, &query)
            }
            ["v1", "billing", "credit_grants", id] => {
                let held = self.held_in(&context);
                credits::retrieve_grant(&held, id)
            }
            ["v1", "billing", "credit_balance_summary"] => {
                let held = self.held_in(&context);
                credits::balance_summary(&held, &query, self.now().timestamp())
            }
            ["v1", "subscriptions"] => {
                let status = get(&query, "status");
                let customer = get(&query, "customer");
                let test_clock = get(&query, "test_clock");
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
                    // "`test_clock`: Filter for subscriptions that are associated with the
                    // specified test clock. The response will not include subscriptions with
                    // test clocks if this and the customer parameter is not set."
                    // (stripe/openapi, `GET /v1/subscriptions`' `test_clock`)
                    let on_clock = s.get("test_clock").and_then(Value::as_str);
                    let clock_fits = match (test_clock, customer) {
                        (Some(wanted), _) => on_clock == Some(wanted),
                        (None, Some(_)) => true,
                        (None, None) => on_clock.is_none(),
                    };
                    status_fits
                        && clock_fits
                        && customer.is_none_or(|c| s.get("customer") == Some(&json!(c)))
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

    /// The objects the account (or connected account) `context` holds.
    fn held_in(&self, context: &Option<String>) -> Vec<&Value> {
        self.objects
            .iter()
            .filter(|h| h.context == *context)
            .map(|h| &h.object)
            .collect()
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

impl ReadSide {
    /// The account (`None`) or the connected account (or context) `context` holds `object`
    /// (a v1 object with its `id` and `object`), replacing one of its id.
    pub(super) fn holds_in(&self, context: Option<&str>, object: Value) {
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
    }

    /// The account no longer holds the object `id` (deleted: reads of it are 404s).
    pub(super) fn forgets(&self, id: &str) {
        self.reads().objects.retain(|h| h.object["id"] != id);
    }

    /// The account's event (`GET /v1/events`, `/v1/events/{id}`), of the context its
    /// `account` names, delivered to every endpoint.
    pub(super) fn has_event(&self, event: Value) {
        self.add_event(event, true)
    }

    /// An event Stripe failed to deliver (`delivery_success=false` lists it).
    pub(super) fn has_undelivered_event(&self, event: Value) {
        self.add_event(event, false)
    }

    fn add_event(&self, event: Value, delivered: bool) {
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
    }

    /// A v2 event (`GET /v2/core/events/{id}`), read in the context it names.
    pub(super) fn has_v2_event(&self, event: Value) {
        let context = event
            .get("context")
            .and_then(Value::as_str)
            .map(str::to_owned);
        self.reads().v2_events.push(Held {
            context,
            object: event,
            delivered: true,
        });
    }

    /// `customer`'s active entitlements in `context` (`GET
    /// /v1/entitlements/active_entitlements?customer=…`), in list order: each
    /// `{id, object: "entitlements.active_entitlement", feature, livemode, lookup_key}`
    /// (stripe-node `Entitlements.ActiveEntitlement`).
    pub(super) fn entitles(&self, context: Option<&str>, customer: &str, lookup_keys: &[&str]) {
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
    }

    /// `customer`'s active entitlements in `context`, as given (each an
    /// `entitlements.active_entitlement` with its `id`), in list order.
    pub(super) fn entitlements_of(
        &self,
        context: Option<&str>,
        customer: &str,
        listed: Vec<Value>,
    ) {
        self.reads()
            .entitlements
            .insert((context.map(str::to_owned), customer.to_owned()), listed);
    }

    /// The next `times` reads `on` go wrong as `fault` says (a 5xx, a slow answer, a 429), in
    /// the order scripted.
    pub(super) fn read_fails(&self, on: On, fault: Fault, times: usize) {
        self.reads().faults.push((on, fault, times));
    }

    /// Asks `faults` what goes wrong with each read once no scripted fault is left.
    pub(super) fn deciding(&self, faults: Option<Box<dyn Faults>>) {
        self.reads().decider = faults;
    }

    /// Where a decider asks for objects to be deleted.
    pub(super) fn forgetting(&self) -> Forgets {
        self.reads().forgotten.clone()
    }

    /// The mode of a request whose key names none (`sk_live_…`/`sk_test_…` name theirs).
    pub(super) fn in_mode(&self, mode: Mode) {
        self.reads().mode = mode;
    }

    /// What the rate limiter saw so far.
    pub(super) fn rate_seen(&self) -> RateSeen {
        self.reads().limiter.seen.clone()
    }

    /// Read requests answered by the read routes so far.
    pub(super) fn read_count(&self) -> usize {
        self.reads().reads
    }
}
