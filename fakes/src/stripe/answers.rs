//! What both sides of the fake Stripe answer alike: the faults a test scripts on top of the
//! faithful answer, Stripe's 429, and the `Request-Id` every answer carries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use wiremock::ResponseTemplate;

/// A request that reached an endpoint, as a [`Faults`] decider sees it.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    /// `/v1/billing/meter_events`, `/v1/billing/meter_event_adjustments`, or a read's path
    /// (`/v1/subscriptions/sub_1`, `/v1/entitlements/active_entitlements`).
    pub endpoint: &'a str,
    /// The meter event's `identifier`, or the one an adjustment cancels; a read's query
    /// (`customer=cus_1`, empty when it has none).
    pub identifier: &'a str,
    pub idempotency_key: Option<&'a str>,
    /// The event a read is made for, as the client names it (`Stripe-Request-Trigger:
    /// event=evt_…`, sent with a thin event's read); `None` for a request that names none.
    pub trigger: Option<&'a str>,
}

/// What goes wrong with a request that reaches an endpoint, decided per request by a test or a
/// simulation (after any fault queued by `FakeStripe::then` or `FakeStripe::read_fails`).
pub trait Faults: Send {
    fn decide(&mut self, asked: &Asked<'_>) -> Option<Fault>;
}

impl<F: FnMut(&Asked<'_>) -> Option<Fault> + Send> Faults for F {
    fn decide(&mut self, asked: &Asked<'_>) -> Option<Fault> {
        self(asked)
    }
}

/// What goes wrong with the next request that reaches an endpoint (not one Stripe answers from
/// its saved answers).
#[derive(Debug, Clone)]
pub enum Fault {
    /// Stripe fails before taking anything, with this status and body (a 5xx is saved under
    /// the key, as every answer once the endpoint began).
    Fails(u16, Value),
    /// Stripe takes it, then answers this status and body (saved under the key). A read takes
    /// nothing: it answers so.
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

/// "Each API request has an associated request identifier. You can find this value in the
/// response headers, under `Request-Id`." (docs.stripe.com/api/request_ids): one count for
/// the whole account, both sides.
#[derive(Clone, Default)]
pub(super) struct RequestIds(Arc<AtomicU64>);

impl RequestIds {
    pub(super) fn next(&self) -> String {
        let n = self.0.fetch_add(1, Ordering::Relaxed) + 1;
        format!("req_fake{n:010}")
    }

    /// `answer` with the next `Request-Id`.
    pub(super) fn on(&self, answer: ResponseTemplate) -> ResponseTemplate {
        answer.insert_header("Request-Id", self.next().as_str())
    }
}
