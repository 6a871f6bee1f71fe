//! The fake Stripe's meter side (docs/design.md §4.13, §4.13a): what meter reports use, kept
//! and answered from what it took, so a test sees what Stripe would count, not what a test
//! hoped it would:
//!
//! - `POST /v1/billing/meter_events`, `POST /v1/billing/meter_event_adjustments`: Stripe's
//!   idempotency layer (the first answer per `Idempotency-Key` saved and replayed, 500s
//!   included; the same key with other parameters refused; a key still executing refused), the
//!   meter event's own dedupe by `identifier` and its time limits, cancels within 24 hours;
//! - `GET /v1/billing/meters`, `GET /v1/billing/meters/{id}/event_summaries`: the meters, and
//!   their totals summed from the events it took.
//!
//! A test scripts what goes wrong ([`Fault`]): a failure before or after the event is taken,
//! or an answer that comes after the client gave up — queued in turn or decided per request by
//! the test's own [`Faults`] (a simulation's seeded dice). Every window (a saved key's 24
//! hours, an identifier's, the cancel window, a `timestamp`'s 35 days past and 5 minutes
//! ahead) is read on the account's one clock ([`Time`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{json, Value};
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use super::answers::{rate_limited, Asked, Fault, Faults, RequestIds};
use super::clock::Time;

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

/// The meters this Stripe account has: `(id, event_name)`.
const METERS: [(&str, &str); 2] = [("mtr_seats", "seats"), ("mtr_api", "api_calls")];

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
    /// The account's clock, which the read side reads too.
    clock: Time,
    /// The account's request ids.
    ids: RequestIds,
    /// One line per POST that reached it: what it answered and why (`FakeStripe::take_said`).
    said: Vec<String>,
    /// Every request that reaches an endpoint fails so (`FakeStripe::failing`).
    always: Option<(u16, Value)>,
    /// How long the event summaries take to answer.
    summaries_delay: Duration,
    /// Each event summaries request's query, in order.
    summaries_asked: Vec<HashMap<String, String>>,
}

/// The meter side of one Stripe account; clones share it.
#[derive(Clone)]
pub(super) struct MeterSide(Arc<Mutex<State>>);

impl MeterSide {
    /// The meter side reading the account's clock, numbering its answers with the account's
    /// request ids.
    pub(super) fn new(clock: Time, ids: RequestIds) -> Self {
        Self(Arc::new(Mutex::new(State {
            clock,
            ids,
            ..State::default()
        })))
    }

    /// Every request that reaches an endpoint fails with `status` and `body`.
    pub(super) fn always_fails(&self, status: u16, body: Value) {
        self.0.lock().unwrap().always = Some((status, body));
    }

    /// What goes wrong with the next request that reaches an endpoint (in turn).
    pub(super) fn then(&self, fault: Fault) {
        self.0.lock().unwrap().faults.push_back(fault);
    }

    /// Asks `faults` what goes wrong with each request that reaches an endpoint (once no
    /// fault queued by [`MeterSide::then`] is left).
    pub(super) fn deciding(&self, faults: Box<dyn Faults>) {
        self.0.lock().unwrap().decider = Some(faults);
    }

    /// Stops asking the decider: every request from now on goes as Stripe would have it.
    pub(super) fn no_more_faults(&self) {
        self.0.lock().unwrap().decider = None;
    }

    /// The event summaries answer after `delay` (requests made together overlap).
    pub(super) fn summaries_after(&self, delay: Duration) {
        self.0.lock().unwrap().summaries_delay = delay;
    }

    /// Moves everything it took and saved `by` into the past (a test's "a day later").
    pub(super) fn age(&self, by: TimeDelta) {
        let mut state = self.0.lock().unwrap();
        for event in &mut state.events {
            event.received_at -= by;
        }
        for saved in state.saved.values_mut() {
            saved.saved_at -= by;
        }
    }

    /// The meter routes: meter events and adjustments, the meters and their event summaries.
    pub(super) async fn mount(&self, server: &MockServer) {
        for endpoint in [
            "/v1/billing/meter_events",
            "/v1/billing/meter_event_adjustments",
        ] {
            Mock::given(method("POST"))
                .and(path(endpoint))
                .respond_with(self.clone())
                .mount(server)
                .await;
        }
        // A test's own mock of these reads comes first.
        Mock::given(method("GET"))
            .and(path_regex(r"^/v1/billing/meters(/[^/]+/event_summaries)?$"))
            .respond_with(self.clone())
            .with_priority(10)
            .mount(server)
            .await;
    }

    /// POST requests that reached it, answered from a saved answer or not.
    pub(super) fn posts(&self) -> u32 {
        self.0.lock().unwrap().posts
    }

    /// The meter events it holds, by identifier (the latest taken under each).
    pub(super) fn held(&self) -> HashMap<String, HashMap<String, String>> {
        let state = self.0.lock().unwrap();
        state
            .events
            .iter()
            .map(|e| (e.form["identifier"].clone(), e.form.clone()))
            .collect()
    }

    /// Every meter event it took, in order (an identifier taken again after its 24 hours is
    /// two).
    pub(super) fn events(&self) -> Vec<MeterEvent> {
        self.0.lock().unwrap().events.clone()
    }

    /// The meter event adjustments it took, as sent.
    pub(super) fn adjustments(&self) -> Vec<HashMap<String, String>> {
        let state = self.0.lock().unwrap();
        state.adjustments.iter().map(|a| a.form.clone()).collect()
    }

    /// The meter event adjustments it took, each with the key it came under.
    pub(super) fn cancels(&self) -> Vec<Adjustment> {
        self.0.lock().unwrap().adjustments.clone()
    }

    /// POST requests answered from a saved answer (`Idempotent-Replayed`), and meter events
    /// answered "already exists".
    pub(super) fn resends(&self) -> (u32, u32) {
        let state = self.0.lock().unwrap();
        (state.replayed, state.repeats)
    }

    /// What it answered each POST since the last call, one line each.
    pub(super) fn take_said(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap().said)
    }

    /// What the meter `api_calls` counts per customer of the platform's account: the events
    /// it took, less those cancelled.
    pub(super) fn totals(&self) -> HashMap<String, f64> {
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
    pub(super) fn takes(&self, customer: &str, at: DateTime<Utc>, value: f64) {
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
    pub(super) fn summaries_asked(&self) -> Vec<HashMap<String, String>> {
        self.0.lock().unwrap().summaries_asked.clone()
    }

    /// What the meter `api_calls` counts for `customer` (of the platform's account): the
    /// events it took, less those cancelled.
    pub(super) fn total(&self, customer: &str) -> f64 {
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

impl Respond for MeterSide {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let answer = self.answer(request);
        let ids = self.0.lock().unwrap().ids.clone();
        ids.on(answer)
    }
}

impl MeterSide {
    fn answer(&self, request: &Request) -> ResponseTemplate {
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
                        trigger: None,
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
        self.clock.now()
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
