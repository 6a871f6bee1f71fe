//! A fake Stripe: a small copy of the parts of Stripe's API that meter reports use (docs/design.md
//! §4.13, §4.13a), served in process by wiremock, each behaviour beside the sentence of Stripe's
//! documentation that says so. It keeps what it took and answers from it, so a test sees what
//! Stripe would count, not what a test hoped it would:
//!
//! - `POST /v1/billing/meter_events`, `POST /v1/billing/meter_event_adjustments`: Stripe's
//!   idempotency layer (the first answer per `Idempotency-Key` saved and replayed, 500s
//!   included; the same key with other parameters refused; a key still executing refused), the
//!   meter event's own dedupe by `identifier` and its time limits, cancels within 24 hours;
//! - `GET /v1/billing/meters`, `GET /v1/billing/meters/{id}/event_summaries`: the meters, and
//!   their totals summed from the events it took.
//!
//! A test scripts what goes wrong ([`Fault`]): a failure before or after the event is taken,
//! or an answer that comes after the client gave up — queued in turn ([`FakeStripe::then`]) or
//! decided per request by the test's own [`Faults`] (a simulation's seeded dice). Every window
//! (a saved key's 24 hours, an identifier's, the cancel window, a `timestamp`'s 35 days past
//! and 5 minutes ahead) is read on the fake's [`Clock`]: the wall clock, or one a simulation
//! runs ahead of it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{json, Value};
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// How long Stripe keeps a saved answer: "You can remove keys from the system automatically
/// after they're at least 24 hours old. We generate a new request if a key is reused after
/// the original is pruned." (docs.stripe.com/api/idempotent_requests)
const KEY_KEPT: TimeDelta = TimeDelta::hours(24);
/// An `identifier`'s uniqueness: "We'll enforce uniqueness within a rolling 24 hour period."
/// (docs.stripe.com/api/billing/meter-event/create, `identifier`)
const IDENTIFIER_KEPT: TimeDelta = TimeDelta::hours(24);
/// "You can only cancel events within 24 hours of Stripe receiving them." (stripe-node
/// `types/Billing/MeterEventAdjustmentsResource.d.ts`, `cancel.identifier`)
const CANCEL_WINDOW: TimeDelta = TimeDelta::hours(24);

/// The time as the fake reads it.
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// A request that reached an endpoint, as a [`Faults`] decider sees it.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    /// `/v1/billing/meter_events` or `/v1/billing/meter_event_adjustments`.
    pub endpoint: &'a str,
    /// The meter event's `identifier`, or the one an adjustment cancels.
    pub identifier: &'a str,
    pub idempotency_key: Option<&'a str>,
}

/// What goes wrong with a request that reaches an endpoint, decided per request by a test or a
/// simulation (after any fault queued by [`FakeStripe::then`]).
pub trait Faults: Send {
    fn decide(&mut self, asked: &Asked<'_>) -> Option<Fault>;
}

impl<F: FnMut(&Asked<'_>) -> Option<Fault> + Send> Faults for F {
    fn decide(&mut self, asked: &Asked<'_>) -> Option<Fault> {
        self(asked)
    }
}

/// The meters this Stripe account has: `(id, event_name)`.
const METERS: [(&str, &str); 2] = [("mtr_seats", "seats"), ("mtr_api", "api_calls")];

/// What goes wrong with the next request that reaches an endpoint (not one Stripe answers from
/// its saved answers).
#[derive(Debug, Clone)]
pub enum Fault {
    /// Stripe fails before taking anything, with this status and body (a 5xx is saved under
    /// the key, as every answer once the endpoint began).
    Fails(u16, Value),
    /// Stripe takes it, then answers this status and body (saved under the key).
    TakesThenFails(u16, Value),
    /// Stripe takes it and answers after this long: the key is executing until then.
    Slow(Duration),
    /// Stripe's rate limiter refuses it before anything runs (see [`rate_limited`]), with a
    /// `Retry-After` of so many seconds when given.
    RateLimited(Option<u32>),
}

/// Stripe's answer past its rate limit: "If you send many requests in quick succession, you
/// might see error responses with status code 429" (docs.stripe.com/rate-limits); "rate
/// limiters run before the API's idempotency layer", so nothing is saved under the key
/// (docs.stripe.com/error-low-level); the `Stripe-Should-Retry` header tells a client whether
/// to retry (ibid., and read by Stripe's SDKs, stripe-php #755), and `rate_limit` is the
/// error's code (docs.stripe.com/error-codes).
pub fn rate_limited() -> ResponseTemplate {
    ResponseTemplate::new(429)
        .insert_header("Stripe-Should-Retry", "true")
        .set_body_json(json!({"error": {
            "type": "invalid_request_error",
            "code": "rate_limit",
            "message": "Too many requests hit the API too quickly. We recommend an exponential backoff of your requests."}}))
}

/// A meter event Stripe took.
#[derive(Debug, Clone)]
pub struct MeterEvent {
    pub form: HashMap<String, String>,
    /// The connected account it was made as (`Stripe-Account`), if any.
    pub account: Option<String>,
    pub received_at: DateTime<Utc>,
    pub cancelled: bool,
}

/// A meter event adjustment Stripe took (a cancel), with the `Idempotency-Key` it came under.
#[derive(Debug, Clone)]
pub struct Adjustment {
    pub form: HashMap<String, String>,
    pub idempotency_key: Option<String>,
    pub account: Option<String>,
}

impl MeterEvent {
    fn value(&self) -> f64 {
        self.form
            .get("payload[value]")
            .and_then(|v| v.parse().ok())
            .unwrap_or_default()
    }
}

/// An answer saved under an `Idempotency-Key`.
struct Saved {
    /// The first request's method, path and parameters.
    request: String,
    status: u16,
    body: Value,
    saved_at: DateTime<Utc>,
    /// The first request is still executing until then (its answer is late).
    executing_until: Option<Instant>,
}

#[derive(Default)]
struct State {
    saved: HashMap<String, Saved>,
    events: Vec<MeterEvent>,
    /// The latest event taken under each `(account, identifier)`: its place in `events`.
    latest: HashMap<(Option<String>, String), usize>,
    adjustments: Vec<Adjustment>,
    posts: u32,
    /// Answers given from a saved answer, and identifiers answered "already exists".
    replayed: u32,
    repeats: u32,
    faults: VecDeque<Fault>,
    /// The test's own per-request decider, after the queued faults.
    decider: Option<Box<dyn Faults>>,
    clock: Option<Clock>,
    /// One line per POST that reached it: what it answered and why (`FakeStripe::take_said`).
    said: Vec<String>,
    /// Every request that reaches an endpoint fails so (`FakeStripe::failing`).
    always: Option<(u16, Value)>,
    /// How long the event summaries take to answer.
    summaries_delay: Duration,
    /// Each event summaries request's query, in order.
    summaries_asked: Vec<HashMap<String, String>>,
}

/// A fake Stripe; clones share one account. Its read side and rate limiter are
/// `stripe_reads.rs`'s.
#[derive(Clone, Default)]
pub struct FakeStripe(
    Arc<Mutex<State>>,
    pub(crate) Arc<Mutex<crate::stripe_reads::Reads>>,
);

impl FakeStripe {
    /// One whose every request that reaches an endpoint fails with `status` and `body`.
    pub fn failing(status: u16, body: Value) -> Self {
        let fake = Self::default();
        fake.0.lock().unwrap().always = Some((status, body));
        fake
    }

    /// What goes wrong with the next request that reaches an endpoint (in turn).
    pub fn then(&self, fault: Fault) -> &Self {
        self.0.lock().unwrap().faults.push_back(fault);
        self
    }

    /// Reads time on `clock` from now on (a simulation's, ahead of the wall clock).
    pub fn clocked(&self, clock: Clock) -> &Self {
        self.0.lock().unwrap().clock = Some(clock);
        self
    }

    /// Asks `faults` what goes wrong with each request that reaches an endpoint (once no
    /// fault queued by [`FakeStripe::then`] is left).
    pub fn deciding(&self, faults: impl Faults + 'static) -> &Self {
        self.0.lock().unwrap().decider = Some(Box::new(faults));
        self
    }

    /// Stops asking the decider: every request from now on goes as Stripe would have it.
    pub fn no_more_faults(&self) {
        self.0.lock().unwrap().decider = None;
    }

    /// The event summaries answer after `delay` (requests made together overlap).
    pub fn summaries_after(&self, delay: Duration) {
        self.0.lock().unwrap().summaries_delay = delay;
    }

    /// Moves everything it took and saved `by` into the past (a test's "a day later").
    pub fn age(&self, by: TimeDelta) {
        let mut state = self.0.lock().unwrap();
        for event in &mut state.events {
            event.received_at -= by;
        }
        for saved in state.saved.values_mut() {
            saved.saved_at -= by;
        }
    }

    /// Served as Stripe's API, every request checked against Stripe's published description.
    #[cfg(feature = "described")]
    pub async fn serve(&self) -> crate::described::ProviderServer {
        let server = crate::described::ProviderServer::start(&crate::described::STRIPE).await;
        self.mount(&server).await;
        server
    }

    /// Mounts its routes on `server` (again, after the server's `reset`): the rate limiter
    /// and the read routes (stripe_reads.rs), and the meter routes.
    pub async fn mount(&self, server: &MockServer) {
        crate::stripe_reads::mount(self, server).await;
        self.mount_meters(server).await;
    }

    /// Served as Stripe's meter routes alone, without the description's checks or the rate
    /// limiter (`inboxctl bench`, which measures the sender, not the fake).
    pub async fn serve_unchecked(&self) -> MockServer {
        let server = MockServer::builder()
            .disable_request_recording()
            .start()
            .await;
        self.mount_meters(&server).await;
        server
    }

    /// The meter routes: meter events and adjustments, the meters and their event summaries.
    async fn mount_meters(&self, server: &MockServer) {
        for endpoint in [
            "/v1/billing/meter_events",
            "/v1/billing/meter_event_adjustments",
        ] {
            Mock::given(method("POST"))
                .and(path(endpoint))
                .respond_with(crate::stripe_reads::WithRequestId(self.clone()))
                .mount(server)
                .await;
        }
        // A test's own mock of these reads comes first.
        Mock::given(method("GET"))
            .and(path_regex(r"^/v1/billing/meters(/[^/]+/event_summaries)?$"))
            .respond_with(crate::stripe_reads::WithRequestId(self.clone()))
            .with_priority(10)
            .mount(server)
            .await;
    }

    /// POST requests that reached it, answered from a saved answer or not.
    pub fn posts(&self) -> u32 {
        self.0.lock().unwrap().posts
    }

    /// The meter events it holds, by identifier (the latest taken under each).
    pub fn held(&self) -> HashMap<String, HashMap<String, String>> {
        let state = self.0.lock().unwrap();
        state
            .events
            .iter()
            .map(|e| (e.form["identifier"].clone(), e.form.clone()))
            .collect()
    }

    /// Every meter event it took, in order (an identifier taken again after its 24 hours is
    /// two).
    pub fn events(&self) -> Vec<MeterEvent> {
        self.0.lock().unwrap().events.clone()
    }

    /// The meter event adjustments it took, as sent.
    pub fn adjustments(&self) -> Vec<HashMap<String, String>> {
        let state = self.0.lock().unwrap();
        state.adjustments.iter().map(|a| a.form.clone()).collect()
    }

    /// The meter event adjustments it took, each with the key it came under.
    pub fn cancels(&self) -> Vec<Adjustment> {
        self.0.lock().unwrap().adjustments.clone()
    }

    /// POST requests answered from a saved answer (`Idempotent-Replayed`), and meter events
    /// answered "already exists".
    pub fn resends(&self) -> (u32, u32) {
        let state = self.0.lock().unwrap();
        (state.replayed, state.repeats)
    }

    /// What it answered each POST since the last call, one line each.
    pub fn take_said(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap().said)
    }

    /// What the meter `api_calls` counts per customer of the platform's account: the events
    /// it took, less those cancelled.
    pub fn totals(&self) -> HashMap<String, f64> {
        let state = self.0.lock().unwrap();
        let mut totals: HashMap<String, f64> = HashMap::new();
        for event in state
            .events
            .iter()
            .filter(|e| !e.cancelled && e.account.is_none())
        {
            let customer = event.form["payload[stripe_customer_id]"].clone();
            *totals.entry(customer).or_default() += event.value();
        }
        totals
    }

    /// Takes a meter event of `value` on `api_calls` for `customer`, timed `at`, as if another
    /// of the account's clients had sent it: what Stripe counts beyond what a store sent.
    pub fn takes(&self, customer: &str, at: DateTime<Utc>, value: f64) {
        let mut state = self.0.lock().unwrap();
        let identifier = format!("elsewhere_{}", state.events.len());
        let form = HashMap::from([
            ("event_name".to_owned(), "api_calls".to_owned()),
            ("identifier".to_owned(), identifier),
            ("timestamp".to_owned(), at.timestamp().to_string()),
            (
                "payload[stripe_customer_id]".to_owned(),
                customer.to_owned(),
            ),
            ("payload[value]".to_owned(), value.to_string()),
        ]);
        let received_at = state.now();
        state.events.push(MeterEvent {
            form,
            account: None,
            received_at,
            cancelled: false,
        });
    }

    /// The event summaries asked of it, each request's query, in order.
    pub fn summaries_asked(&self) -> Vec<HashMap<String, String>> {
        self.0.lock().unwrap().summaries_asked.clone()
    }

    /// What the meter `api_calls` counts for `customer` (of the platform's account): the
    /// events it took, less those cancelled.
    pub fn total(&self, customer: &str) -> f64 {
        let state = self.0.lock().unwrap();
        state
            .events
            .iter()
            .filter(|e| !e.cancelled && e.account.is_none())
            .filter(|e| e.form["payload[stripe_customer_id]"] == customer)
            .map(MeterEvent::value)
            .sum()
    }
}

impl Respond for FakeStripe {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let mut state = self.0.lock().unwrap();
        if request.method.as_str() == "GET" {
            return state.read(request);
        }
        state.posts += 1;
        let form: HashMap<String, String> = url::form_urlencoded::parse(&request.body)
            .into_owned()
            .collect();
        let header = |name: &str| {
            request
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let key = header("idempotency-key");
        let account = header("stripe-account");
        let now = state.now();
        let endpoint = request.url.path();
        let identifier = form
            .get("identifier")
            .or_else(|| form.get("cancel[identifier]"))
            .cloned()
            .unwrap_or_default();
        let what = format!(
            "{} {}",
            if endpoint.ends_with("adjustments") {
                "cancel of"
            } else {
                "event"
            },
            &identifier[..identifier.len().min(11)]
        );
        // "Stripe's idempotency works by saving the resulting status code and body of the first
        // request made for any given idempotency key, regardless of whether it succeeds or
        // fails. Subsequent requests with the same key return the same result, including 500
        // errors." (docs.stripe.com/api/idempotent_requests)
        let asked = format!(
            "POST {} {:?} {}",
            endpoint,
            account,
            String::from_utf8_lossy(&request.body)
        );
        // A key is pruned once 24 hours old (`KEY_KEPT`): reused after that, it is a new request.
        let saved = key
            .as_ref()
            .and_then(|k| state.saved.get(k))
            .filter(|s| now - s.saved_at < KEY_KEPT)
            .map(|s| {
                let executing = s.executing_until.is_some_and(|t| Instant::now() < t);
                (s.request == asked, executing, s.status, s.body.clone())
            });
        if let (Some(key), Some((same, executing, status, body))) = (&key, saved) {
            // "The idempotency layer compares incoming parameters to those of the original
            // request and errors if they're not the same to prevent accidental misuse."
            // (ibid.): a 400 `idempotency_error`, nothing executed, nothing saved.
            if !same {
                state
                    .said
                    .push(format!("{what}…: 400 idempotency_error (key reused)"));
                return ResponseTemplate::new(400).set_body_json(json!({"error": {
                    "type": "idempotency_error",
                    "message": format!("Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '{key}' if you meant to execute a different request.")}}));
            }
            // "If ... the request conflicts with another that's executing concurrently, no
            // idempotent result is saved" (ibid.); a 409 "The request conflicts with another
            // request (perhaps due to using the same idempotent key)"
            // (docs.stripe.com/api/errors, HTTP status codes).
            if executing {
                state
                    .said
                    .push(format!("{what}…: 409, its key still executing"));
                return ResponseTemplate::new(409).set_body_json(json!({"error": {
                    "type": "idempotency_error",
                    "message": "There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through): please try again later."}}));
            }
            state.replayed += 1;
            state.said.push(format!(
                "{what}…: {status} replayed (the key's saved answer)"
            ));
            return ResponseTemplate::new(status)
                .insert_header("Idempotent-Replayed", "true")
                .set_body_json(body);
        }
        let fault = match &state.always {
            Some((status, body)) => Some(Fault::Fails(*status, body.clone())),
            None => match state.faults.pop_front() {
                Some(fault) => Some(fault),
                None => {
                    let asked = Asked {
                        endpoint,
                        identifier: &identifier,
                        idempotency_key: key.as_deref(),
                    };
                    state.decider.as_mut().and_then(|d| d.decide(&asked))
                }
            },
        };
        let (status, body, delay) = match fault {
            Some(Fault::RateLimited(retry_after)) => {
                state.said.push(format!("{what}…: 429, nothing taken"));
                let answer = rate_limited();
                return match retry_after {
                    Some(secs) => answer.insert_header("Retry-After", secs.to_string().as_str()),
                    None => answer,
                };
            }
            Some(Fault::Fails(status, body)) => {
                state.said.push(format!("{what}…: {status}, nothing taken"));
                (status, body, None)
            }
            Some(Fault::TakesThenFails(status, body)) => {
                let (taken, _) = state.execute(endpoint, &form, key.clone(), account, now);
                state
                    .said
                    .push(format!("{what}…: {taken} then answered {status}"));
                (status, body, None)
            }
            Some(Fault::Slow(delay)) => {
                let (status, body) = state.execute(endpoint, &form, key.clone(), account, now);
                state
                    .said
                    .push(format!("{what}…: {status}, answered after {delay:?}"));
                (status, body, Some(delay))
            }
            None => {
                let (status, body) = state.execute(endpoint, &form, key.clone(), account, now);
                state.said.push(format!("{what}…: {status}"));
                (status, body, None)
            }
        };
        // "We save results only after the execution of an endpoint begins. If incoming
        // parameters fail validation, or the request conflicts with another that's executing
        // concurrently, no idempotent result is saved" (docs.stripe.com/api/idempotent_requests):
        // a 4xx of the rate or the key (401, 403, 429) never began; a 5xx and an endpoint's own
        // answer did.
        let began = !matches!(status, 401 | 403 | 429);
        if let (Some(key), true) = (key, began) {
            state.saved.insert(
                key,
                Saved {
                    request: asked,
                    status,
                    body: body.clone(),
                    saved_at: now,
                    executing_until: delay.map(|d| Instant::now() + d),
                },
            );
        }
        let answer = ResponseTemplate::new(status).set_body_json(body);
        match delay {
            Some(delay) => answer.set_delay(delay),
            None => answer,
        }
    }
}

fn invalid(message: String) -> (u16, Value) {
    (
        400,
        json!({"error": {"type": "invalid_request_error", "message": message}}),
    )
}

impl State {
    fn now(&self) -> DateTime<Utc> {
        self.clock.as_ref().map_or_else(Utc::now, |clock| clock())
    }

    /// An endpoint's own work: the answer it gives.
    fn execute(
        &mut self,
        endpoint: &str,
        form: &HashMap<String, String>,
        key: Option<String>,
        account: Option<String>,
        now: DateTime<Utc>,
    ) -> (u16, Value) {
        if endpoint == "/v1/billing/meter_event_adjustments" {
            return self.cancel(form, key, account, now);
        }
        let identifier = form.get("identifier").cloned().unwrap_or_default();
        let timestamp: i64 = form
            .get("timestamp")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| now.timestamp());
        // "The time of the event. Must be within the past 35 calendar days or up to 5 minutes
        // in the future." (docs.stripe.com/api/billing/meter-event/create, `timestamp`)
        if timestamp < (now - TimeDelta::days(35)).timestamp()
            || timestamp > (now + TimeDelta::minutes(5)).timestamp()
        {
            return invalid(format!(
                "The timestamp {timestamp} must be within the past 35 days and no more than 5 minutes in the future."
            ));
        }
        // The identifier's uniqueness, within a rolling 24 hours (`IDENTIFIER_KEPT`); a repeat
        // is answered "An event already exists with identifier …" (docs/design.md §4.13).
        let slot = (account.clone(), identifier.clone());
        let repeat = self
            .latest
            .get(&slot)
            .is_some_and(|&at| now - self.events[at].received_at < IDENTIFIER_KEPT);
        if repeat {
            self.repeats += 1;
            return invalid(format!(
                "An event already exists with identifier {identifier}."
            ));
        }
        self.latest.insert(slot, self.events.len());
        self.events.push(MeterEvent {
            form: form.clone(),
            account,
            received_at: now,
            cancelled: false,
        });
        (
            200,
            json!({
                "object": "billing.meter_event", "created": now.timestamp(),
                "event_name": form.get("event_name"), "identifier": identifier,
                "livemode": false,
                "payload": {"stripe_customer_id": form.get("payload[stripe_customer_id]"),
                            "value": form.get("payload[value]")},
                "timestamp": timestamp}),
        )
    }

    /// A meter event adjustment, answered as stripe-node `Billing.MeterEventAdjustment`.
    fn cancel(
        &mut self,
        form: &HashMap<String, String>,
        key: Option<String>,
        account: Option<String>,
        now: DateTime<Utc>,
    ) -> (u16, Value) {
        let identifier = form.get("cancel[identifier]").cloned().unwrap_or_default();
        let found = self
            .latest
            .get(&(account.clone(), identifier.clone()))
            .map(|&at| &mut self.events[at]);
        let answer = json!({
            "object": "billing.meter_event_adjustment", "livemode": false,
            "status": "pending", "type": form.get("type"),
            "event_name": form.get("event_name"),
            "cancel": {"identifier": identifier}});
        // A cancel names its event by identifier, and an event is cancelled once: Stripe takes
        // an adjustment to process it after (`status` "pending": "The event adjustment is still
        // being processed", docs.stripe.com/api/billing/meter-event-adjustment/object) and
        // documents no refusal of a second one, so the fake answers it as the first and takes
        // nothing more back.
        if let Some(event) = found.as_ref().filter(|e| e.cancelled) {
            if now - event.received_at < CANCEL_WINDOW {
                self.adjustments.push(Adjustment {
                    form: form.clone(),
                    idempotency_key: key,
                    account,
                });
                return (200, answer);
            }
        }
        // Stripe documents no answer for an event it does not hold: this fake refuses it, as
        // a request it cannot carry out.
        let Some(event) = found.filter(|e| !e.cancelled) else {
            return invalid(format!(
                "No meter event with identifier {identifier} to cancel."
            ));
        };
        if now - event.received_at >= CANCEL_WINDOW {
            return invalid(format!(
                "The meter event {identifier} can no longer be cancelled: events can only be cancelled within 24 hours of Stripe receiving them."
            ));
        }
        event.cancelled = true;
        self.adjustments.push(Adjustment {
            form: form.clone(),
            idempotency_key: key,
            account,
        });
        (200, answer)
    }

    /// `GET /v1/billing/meters` and a meter's event summaries.
    fn read(&mut self, request: &Request) -> ResponseTemplate {
        let account = request
            .headers
            .get("stripe-account")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if request.url.path() == "/v1/billing/meters" {
            let data: Vec<Value> = METERS
                .iter()
                .map(|(id, name)| {
                    json!({"id": id, "object": "billing.meter",
                    "event_name": name, "status": "active"})
                })
                .collect();
            return ResponseTemplate::new(200).set_body_json(json!({
                "object": "list", "url": "/v1/billing/meters", "has_more": false,
                "data": data}));
        }
        let meter = request.url.path().split('/').nth(4).unwrap_or_default();
        let Some((_, event_name)) = METERS.iter().find(|(id, _)| *id == meter) else {
            return ResponseTemplate::new(404).set_body_json(json!({"error": {
                "type": "invalid_request_error", "code": "resource_missing",
                "message": format!("No such billing meter: '{meter}'")}}));
        };
        let query: HashMap<String, String> = request.url.query_pairs().into_owned().collect();
        self.summaries_asked.push(query.clone());
        let (Some(customer), Some(start), Some(end)) = (
            query.get("customer"),
            query.get("start_time").and_then(|t| t.parse::<i64>().ok()),
            query.get("end_time").and_then(|t| t.parse::<i64>().ok()),
        ) else {
            return invalid("customer, start_time and end_time are required".into())
                .into_template();
        };
        // "start_time ... Must be aligned with minute boundaries", likewise `end_time`
        // (docs.stripe.com/api/billing/meter/event-summaries).
        if start % 60 != 0 || end % 60 != 0 {
            return invalid(
                "start_time and end_time must be aligned with minute boundaries".into(),
            )
            .into_template();
        }
        // Without `value_grouping_window`, one summary over the range: the events taken (less
        // those cancelled) whose `timestamp` is in `[start_time, end_time)`.
        let aggregated: f64 = self
            .events
            .iter()
            .filter(|e| !e.cancelled && e.account == account)
            .filter(|e| e.form.get("event_name").map(String::as_str) == Some(*event_name))
            .filter(|e| e.form.get("payload[stripe_customer_id]") == Some(customer))
            .filter(|e| {
                let at: i64 = e.form["timestamp"].parse().unwrap_or_default();
                start <= at && at < end
            })
            .map(MeterEvent::value)
            .sum();
        ResponseTemplate::new(200)
            .set_body_json(json!({
                "object": "list", "has_more": false,
                "url": format!("/v1/billing/meters/{meter}/event_summaries"),
                "data": [{"id": "mtrusg_fake", "object": "billing.meter_event_summary",
                          "aggregated_value": aggregated, "start_time": start,
                          "end_time": end, "livemode": false, "meter": meter}]}))
            .set_delay(self.summaries_delay)
    }
}

trait IntoTemplate {
    fn into_template(self) -> ResponseTemplate;
}

impl IntoTemplate for (u16, Value) {
    fn into_template(self) -> ResponseTemplate {
        ResponseTemplate::new(self.0).set_body_json(self.1)
    }
}

/// The fake itself, asked directly: each behaviour as Stripe's pages say.
#[cfg(all(test, feature = "described"))]
mod behaviour {
    use super::*;

    async fn post(
        server: &wiremock::MockServer,
        endpoint: &str,
        key: &str,
        form: &[(&str, &str)],
    ) -> (u16, Value) {
        let answer = reqwest::Client::new()
            .post(format!("{}{endpoint}", server.uri()))
            .header("Idempotency-Key", key)
            .form(form)
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    fn event<'a>(identifier: &'a str, value: &'a str, at: &'a str) -> Vec<(&'a str, &'a str)> {
        vec![
            ("event_name", "api_calls"),
            ("identifier", identifier),
            ("timestamp", at),
            ("payload[stripe_customer_id]", "cus_fake"),
            ("payload[value]", value),
        ]
    }

    #[tokio::test]
    async fn the_fake_replays_saved_answers_and_dedupes_identifiers_as_stripe_does() {
        let fake = FakeStripe::default();
        let server = fake.serve().await;
        let minute = (Utc::now().timestamp() / 60 - 1) * 60;
        let at = (minute + 5).to_string();
        let events = "/v1/billing/meter_events";

        // A 500 is saved: the same key gets it again, though Stripe is well now.
        fake.then(Fault::Fails(500, json!({"error": {"type": "api_error"}})));
        assert_eq!(
            post(&server, events, "k1", &event("bi_1", "3", &at))
                .await
                .0,
            500
        );
        assert_eq!(
            post(&server, events, "k1", &event("bi_1", "3", &at))
                .await
                .0,
            500
        );
        // Another key reaches the endpoint.
        assert_eq!(
            post(&server, events, "k2", &event("bi_1", "3", &at))
                .await
                .0,
            200
        );
        // The same key with other parameters: 400 idempotency_error.
        let (status, body) = post(&server, events, "k2", &event("bi_1", "4", &at)).await;
        assert_eq!(
            (status, body["error"]["type"].as_str()),
            (400, Some("idempotency_error"))
        );
        // The identifier again under a new key: "already exists".
        let (status, body) = post(&server, events, "k3", &event("bi_1", "3", &at)).await;
        assert_eq!(status, 400);
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already exists"));
        // After 24 hours the identifier is new again, and the old key pruned.
        fake.age(TimeDelta::hours(25));
        assert_eq!(
            post(&server, events, "k3", &event("bi_1", "3", &at))
                .await
                .0,
            200
        );
        assert_eq!(fake.events().len(), 2);
        // Out of its window: refused.
        let old = (Utc::now() - TimeDelta::days(36)).timestamp().to_string();
        assert_eq!(
            post(&server, events, "k4", &event("bi_2", "1", &old))
                .await
                .0,
            400
        );

        // A key still executing: 409, and the first request's answer is saved when it ends.
        fake.then(Fault::Slow(Duration::from_millis(600)));
        let slow = {
            let server_uri = server.uri();
            let form: Vec<(String, String)> = event("bi_3", "2", &at)
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            tokio::spawn(async move {
                reqwest::Client::new()
                    .post(format!("{server_uri}{events}"))
                    .header("Idempotency-Key", "k5")
                    .form(&form)
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        };
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(
            post(&server, events, "k5", &event("bi_3", "2", &at))
                .await
                .0,
            409
        );
        assert_eq!(slow.await.unwrap(), 200);
        assert_eq!(
            post(&server, events, "k5", &event("bi_3", "2", &at))
                .await
                .0,
            200
        );

        // The summaries count what it took: 3 (twice, a day apart) and 2 in that minute.
        let summary: Value = reqwest::Client::new()
            .get(format!(
                "{}/v1/billing/meters/mtr_api/event_summaries",
                server.uri()
            ))
            .query(&[
                ("customer", "cus_fake"),
                ("start_time", &minute.to_string()),
                ("end_time", &(minute + 60).to_string()),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(summary["data"][0]["aggregated_value"], 8.0);

        // A cancel within 24 hours of receipt takes an event out; after, it is refused.
        let adjustments = "/v1/billing/meter_event_adjustments";
        let cancel = [
            ("event_name", "api_calls"),
            ("type", "cancel"),
            ("cancel[identifier]", "bi_3"),
        ];
        assert_eq!(post(&server, adjustments, "k6", &cancel).await.0, 200);
        assert_eq!(fake.total("cus_fake"), 6.0);
        let too_late = [
            ("event_name", "api_calls"),
            ("type", "cancel"),
            ("cancel[identifier]", "bi_1"),
        ];
        fake.age(TimeDelta::hours(25));
        assert_eq!(post(&server, adjustments, "k7", &too_late).await.0, 400);
    }

    #[tokio::test]
    async fn the_fake_reads_every_window_on_its_clock_and_asks_its_decider_per_request() {
        let fake = FakeStripe::default();
        let ahead = Utc::now() + TimeDelta::days(400);
        let clock = Arc::new(Mutex::new(ahead));
        let read = clock.clone();
        fake.clocked(Arc::new(move || *read.lock().unwrap()));
        let server = fake.serve().await;
        let events = "/v1/billing/meter_events";
        // A timestamp of the fake's time is taken, 400 days ahead of the wall clock; one of the
        // wall clock's is more than 35 days past.
        let at = ahead.timestamp().to_string();
        assert_eq!(
            post(&server, events, "k1", &event("bi_1", "2", &at))
                .await
                .0,
            200
        );
        let wall = Utc::now().timestamp().to_string();
        assert_eq!(
            post(&server, events, "k2", &event("bi_2", "2", &wall))
                .await
                .0,
            400
        );
        // 25 hours on by its clock, the identifier is new again.
        *clock.lock().unwrap() = ahead + TimeDelta::hours(25);
        assert_eq!(
            post(&server, events, "k3", &event("bi_1", "2", &at))
                .await
                .0,
            200
        );

        // The decider is asked for each request that reaches an endpoint, never for one
        // answered from a saved key.
        let asked = Arc::new(Mutex::new(Vec::new()));
        let (seen, mut first) = (asked.clone(), true);
        fake.deciding(move |a: &Asked<'_>| {
            let key = a.idempotency_key.map(str::to_owned);
            seen.lock().unwrap().push((a.identifier.to_owned(), key));
            std::mem::take(&mut first)
                .then(|| Fault::TakesThenFails(500, json!({"error": {"type": "api_error"}})))
        });
        assert_eq!(
            post(&server, events, "k4", &event("bi_3", "1", &at))
                .await
                .0,
            500
        );
        assert_eq!(
            post(&server, events, "k4", &event("bi_3", "1", &at))
                .await
                .0,
            500,
            "the saved 500"
        );
        let (status, body) = post(&server, events, "k5", &event("bi_3", "1", &at)).await;
        assert_eq!(status, 400);
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already exists"));
        assert_eq!(
            *asked.lock().unwrap(),
            [
                ("bi_3".to_owned(), Some("k4".to_owned())),
                ("bi_3".to_owned(), Some("k5".to_owned()))
            ]
        );
        assert_eq!(fake.resends(), (1, 1), "one replay, one repeat");

        // A cancel is kept with the key it came under.
        fake.no_more_faults();
        let cancel = [
            ("event_name", "api_calls"),
            ("type", "cancel"),
            ("cancel[identifier]", "bi_3"),
        ];
        assert_eq!(
            post(
                &server,
                "/v1/billing/meter_event_adjustments",
                "k6",
                &cancel
            )
            .await
            .0,
            200
        );
        let cancels = fake.cancels();
        assert_eq!(cancels.len(), 1);
        assert_eq!(cancels[0].idempotency_key.as_deref(), Some("k6"));
        assert_eq!(fake.totals()["cus_fake"], 4.0, "bi_1 twice, bi_3 cancelled");
    }
}
