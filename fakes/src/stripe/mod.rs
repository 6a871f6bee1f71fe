//! A fake Stripe (docs/design.md §6.6): a small copy of the parts of Stripe's API the project
//! calls, served in process by wiremock, each behaviour beside the sentence of Stripe's
//! documentation that says so, every request checked against Stripe's published description.
//! One account, in layers that point one way:
//!
//! - `clock.rs`, `answers.rs`: what both sides share — the account's one settable clock, the
//!   faults a test scripts or a decider decides, Stripe's 429, the request ids;
//! - `meter.rs`: the meter side (meter events and adjustments with Stripe's idempotency layer,
//!   the meters and their event summaries);
//! - `credits.rs`: Billing Credits read back (grants listed or retrieved, balance summaries), summed from the
//!   grants and transactions the read side holds;
//! - `reads.rs`: the read side (the objects, lists and v2 events a test seeds) and the rate
//!   limiter every request meets first;
//! - this file: the account, [`FakeStripe`], which holds both and serves them.

mod answers;
mod clock;
mod credits;
mod lists;
mod meter;
mod reads;

#[cfg(all(test, feature = "described"))]
mod behaviour;

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::Value;
use wiremock::MockServer;

pub use answers::{rate_limited, Asked, Fault, Faults};
pub use clock::Clock;
pub use meter::{Adjustment, MeterEvent};
pub use reads::{Forgets, Mode, On, RateSeen};

use answers::RequestIds;
use clock::Time;
use meter::MeterSide;
use reads::ReadSide;

/// A fake Stripe account; clones share it. Its two sides read one clock.
#[derive(Clone)]
pub struct FakeStripe {
    clock: Time,
    meter: MeterSide,
    reads: ReadSide,
}

impl Default for FakeStripe {
    fn default() -> Self {
        let (clock, ids) = (Time::default(), RequestIds::default());
        Self {
            meter: MeterSide::new(clock.clone(), ids.clone()),
            reads: ReadSide::new(clock.clone(), ids),
            clock,
        }
    }
}

/// Serving it.
impl FakeStripe {
    /// Served as Stripe's API, every request checked against Stripe's published description.
    #[cfg(feature = "described")]
    pub async fn serve(&self) -> crate::described::ProviderServer {
        let server = crate::described::ProviderServer::start(&crate::described::STRIPE).await;
        self.mount(&server).await;
        server
    }

    /// Mounts its routes on `server` (again, after the server's `reset`): the rate limiter
    /// and the read routes, and the meter routes.
    pub async fn mount(&self, server: &MockServer) {
        self.reads.mount(server).await;
        self.meter.mount(server).await;
    }

    /// Served as Stripe's meter routes alone, without the description's checks or the rate
    /// limiter (`inboxctl bench`, which measures the sender, not the fake).
    pub async fn serve_unchecked(&self) -> MockServer {
        let server = MockServer::builder()
            .disable_request_recording()
            .start()
            .await;
        self.meter.mount(&server).await;
        server
    }
}

/// The account's clock, which every window of both sides is read on.
impl FakeStripe {
    /// Reads time on `clock` from now on (a simulation's, ahead of the wall clock).
    pub fn clocked(&self, clock: Clock) -> &Self {
        self.clock.read_from(clock);
        self
    }

    /// Stops the clock at `at`.
    pub fn clock_at(&self, at: DateTime<Utc>) -> &Self {
        self.clock.stop_at(at);
        self
    }

    /// Sets the clock to `at`, running on from there (a corpus's day, say).
    pub fn clock_from(&self, at: DateTime<Utc>) -> &Self {
        self.clock.run_from(at);
        self
    }

    /// Moves the clock on by `by` (stopped there).
    pub fn clock_advance(&self, by: TimeDelta) -> &Self {
        self.clock.advance(by);
        self
    }

    /// The account's time.
    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }
}

/// What goes wrong, a test's choice on top of the faithful answers.
impl FakeStripe {
    /// One whose every request that reaches a meter endpoint fails with `status` and `body`.
    pub fn failing(status: u16, body: Value) -> Self {
        let fake = Self::default();
        fake.meter.always_fails(status, body);
        fake
    }

    /// What goes wrong with the next request that reaches a meter endpoint (in turn).
    pub fn then(&self, fault: Fault) -> &Self {
        self.meter.then(fault);
        self
    }

    /// Asks `faults` what goes wrong with each request that reaches a meter endpoint (once no
    /// fault queued by [`FakeStripe::then`] is left).
    pub fn deciding(&self, faults: impl Faults + 'static) -> &Self {
        self.meter.deciding(Box::new(faults));
        self
    }

    /// Asks `faults` what goes wrong with each read (once no fault scripted by
    /// [`FakeStripe::read_fails`] is left): [`Asked::endpoint`] is the read's path,
    /// [`Asked::identifier`] its query.
    pub fn deciding_reads(&self, faults: impl Faults + 'static) -> &Self {
        self.reads.deciding(Some(Box::new(faults)));
        self
    }

    /// Where a read decider (which runs while the read side is held) deletes objects: each
    /// deleted once the read being answered is answered ([`Forgets::forget`]), so a simulation
    /// can delete its test data after so many reads.
    pub fn forgetting(&self) -> Forgets {
        self.reads.forgetting()
    }

    /// Stops asking the deciders: every request from now on goes as Stripe would have it.
    pub fn no_more_faults(&self) {
        self.meter.no_more_faults();
        self.reads.deciding(None);
    }

    /// The next `times` reads `on` go wrong as `fault` says (a 5xx, a slow answer, a 429), in
    /// the order scripted.
    pub fn read_fails(&self, on: On, fault: Fault, times: usize) -> &Self {
        self.reads.read_fails(on, fault, times);
        self
    }

    /// The event summaries answer after `delay` (requests made together overlap).
    pub fn summaries_after(&self, delay: Duration) {
        self.meter.summaries_after(delay);
    }

    /// The mode of a request whose key names none (`sk_live_…`/`sk_test_…` name theirs).
    pub fn in_mode(&self, mode: Mode) -> &Self {
        self.reads.in_mode(mode);
        self
    }
}

/// What the account holds, seeded by a test.
impl FakeStripe {
    /// The account holds `object` (a v1 object with its `id` and `object`: a subscription,
    /// invoice, invoice payment, customer, payment intent, charge), replacing one of its id.
    pub fn holds(&self, object: Value) -> &Self {
        self.reads.holds_in(None, object);
        self
    }

    /// The connected account (or context) `context` holds `object`.
    pub fn holds_in(&self, context: Option<&str>, object: Value) -> &Self {
        self.reads.holds_in(context, object);
        self
    }

    /// The account no longer holds the object `id` (deleted: reads of it are 404s).
    pub fn forgets(&self, id: &str) -> &Self {
        self.reads.forgets(id);
        self
    }

    /// The account's event (`GET /v1/events`, `/v1/events/{id}`), of the context its
    /// `account` names, delivered to every endpoint.
    pub fn has_event(&self, event: Value) -> &Self {
        self.reads.has_event(event);
        self
    }

    /// An event Stripe failed to deliver (`delivery_success=false` lists it).
    pub fn has_undelivered_event(&self, event: Value) -> &Self {
        self.reads.has_undelivered_event(event);
        self
    }

    /// A v2 event (`GET /v2/core/events/{id}`), read in the context it names.
    pub fn has_v2_event(&self, event: Value) -> &Self {
        self.reads.has_v2_event(event);
        self
    }

    /// `customer`'s active entitlements in `context`, each lookup key a feature.
    pub fn entitles(&self, context: Option<&str>, customer: &str, lookup_keys: &[&str]) -> &Self {
        self.reads.entitles(context, customer, lookup_keys);
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
        self.reads.entitlements_of(context, customer, listed);
        self
    }

    /// Takes a meter event of `value` on `api_calls` for `customer`, timed `at`, as if another
    /// of the account's clients had sent it: what Stripe counts beyond what a store sent.
    pub fn takes(&self, customer: &str, at: DateTime<Utc>, value: f64) {
        self.meter.takes(customer, at, value);
    }

    /// Moves every meter event it took and every answer it saved `by` into the past (a test's
    /// "a day later").
    pub fn age(&self, by: TimeDelta) {
        self.meter.age(by);
    }
}

/// What the account saw and took, for a test to read.
impl FakeStripe {
    /// POST requests that reached the meter side, answered from a saved answer or not.
    pub fn posts(&self) -> u32 {
        self.meter.posts()
    }

    /// The meter events it holds, by identifier (the latest taken under each).
    pub fn held(&self) -> HashMap<String, HashMap<String, String>> {
        self.meter.held()
    }

    /// Every meter event it took, in order (an identifier taken again after its 24 hours is
    /// two).
    pub fn events(&self) -> Vec<MeterEvent> {
        self.meter.events()
    }

    /// The meter event adjustments it took, as sent.
    pub fn adjustments(&self) -> Vec<HashMap<String, String>> {
        self.meter.adjustments()
    }

    /// The meter event adjustments it took, each with the key it came under.
    pub fn cancels(&self) -> Vec<Adjustment> {
        self.meter.cancels()
    }

    /// POST requests answered from a saved answer (`Idempotent-Replayed`), and meter events
    /// answered "already exists".
    pub fn resends(&self) -> (u32, u32) {
        self.meter.resends()
    }

    /// What it answered each POST since the last call, one line each.
    pub fn take_said(&self) -> Vec<String> {
        self.meter.take_said()
    }

    /// What the meter `api_calls` counts per customer of the platform's account.
    pub fn totals(&self) -> HashMap<String, f64> {
        self.meter.totals()
    }

    /// What the meter `api_calls` counts for `customer` (of the platform's account).
    pub fn total(&self, customer: &str) -> f64 {
        self.meter.total(customer)
    }

    /// The event summaries asked of it, each request's query, in order.
    pub fn summaries_asked(&self) -> Vec<HashMap<String, String>> {
        self.meter.summaries_asked()
    }

    /// What the rate limiter saw so far.
    pub fn rate_seen(&self) -> RateSeen {
        self.reads.rate_seen()
    }

    /// Read requests answered by the read routes so far.
    pub fn read_count(&self) -> usize {
        self.reads.read_count()
    }
}
