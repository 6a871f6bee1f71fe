//! Deterministic simulation of the pipeline (docs/design.md §10): the real intake, worker
//! and scheduler code against real Postgres, driven one action at a time by a schedule that a
//! single `u64` seed decides — the workload (Kinde, Stripe and Polar events over a few customers,
//! same-second ties, late events, copies, unknown plans, refunds; Stripe subscription changes
//! sent as thin events, with or without their snapshot twins, whose objects a fake Stripe API
//! serves as it shows them at the read, now and then answering 500, timing out or 404; Stripe
//! entitlement summaries, some saying `has_more`, whose complete lists the same API serves;
//! Polar benefit grants granted and revoked out of order; Stripe's notices that it failed to
//! generate events, whose sweeps list every subscription Stripe shows, the registers already
//! matching or not; a catalog whose plans carry features)
//! and every fault: a queue
//! that drops, duplicates, delays and redelivers messages; a crash at any point between two
//! steps of the intake, the worker (each statement boundary of its transaction, and between
//! its commit and the acknowledgement) and the rescue (between mark and send); Postgres
//! connections terminated inside the worker's transaction; a lease that expires mid-apply
//! while a second worker takes the event. Time is simulated: the clock every statement reads
//! (`inbox_now()`) and the queue's clock move only when the schedule moves them, so days of
//! retries take milliseconds.
//!
//! The app spends the allowance meanwhile (debits, retried keys, a key reused with another
//! amount, lost answers) and now and then reverses one of its accepted debits (asked again
//! too, and some while the dispatcher holds the debit's meter report between its send and its
//! record, when a correction taken meanwhile must wait), on its own dice so the pipeline's
//! schedule stays the seed's. It debits the credits customers' Stripe grants and packs too, at
//! seconds of their events' timeline among the deliveries, each answer checked at once against
//! an oracle of burn order version 1 computed apart from the fold, and at rest the balances, the
//! derived allocations and the low and depleted crossings. Every allowance debit is told to
//! a meter through the faithful fakes of `provider_fakes` on the simulated clock: Stripe's
//! (its idempotency layer replaying each key's first answer, 5xx included; an identifier kept
//! 24 hours; a timestamp within 35 days past and 5 minutes ahead; cancels by meter event
//! adjustment within 24 hours of receipt) for the Kinde and Stripe sources, Polar's event
//! ingestion (an `external_id` kept for good) for the Polar source, whose corrections
//! compensate; each fails now and then before or after taking a request, or answers late.
//!
//! After every step the monotonic invariants are checked (a period's balance never goes
//! down and always equals its largest grant; accepted used never passes the allowance, never
//! goes below 0 and never goes down but by the amounts of the debits reversed since; a key
//! answers as it first did; a reversal answers as it first did, `replayed` when asked again);
//! at quiescence, the rest: no key debited twice, used equal to the sum of the accepted debits
//! not reversed (and to what the same debits leave on the canonical fold's accounts); at the
//! meter, an accepted debit not reversed held once, a reversed one withdrawn (never held) or
//! held once and taken back once by its correction (cancelled or compensated), none for a
//! refused debit, and each customer's net total the sum of its accepted debits not reversed;
//! one exhaustion told per period that ran out, one `billing.usage_reversed` per reversed
//! debit naming what became of its report, every event final,
//! one row per event (and one read per thin event applied), each event's copy count equal to
//! its deliveries, one ledger row per entry key, every thin event applied by its read or
//! ignored for its twin or a gone object (never read once its twin was stored), each
//! subscription a read was applied to as Stripe shows it, each summary that said `has_more`
//! applied only as its complete list read and each Stripe customer's summary register the
//! whole list Stripe shows, every account's features the fold's (and the last features
//! effect's), and the billing state
//! equal to the canonical fold of the same stored events, the reads included (each once, in
//! provider-time order). A
//! failing run prints its seed, its step-by-step trace and the one line that replays it:
//! `SIM_SEED=<seed> cargo test -p billing-inbox --test api sim::one_seed -- --nocapture`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use proptest::prelude::Rng;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{json, Value};
use shared::billing::credits::{self, Quantity};
use shared::domain::retry::RETRY;
use shared::handlers::scheduler::{self, SchedulerState};
use shared::handlers::worker::{handle_batch, WorkerState};
use shared::inbox::DEFAULT_LEASE;
use shared::platform::queue::Queue;
use shared::platform::sim::{with_interrupts, Bug, Interrupts, Point, SimQueue};
use shared::providers::{
    EventFeed, FeedPage, Fetched, Reads, Reconciliation, SubscriptionNow, Window,
};
use shared::reconcile::Reconciler;
use shared::BoxFuture;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::sync::Notify;

use crate::helpers::*;
use crate::order::{self, case_strategy, Case, Event};
use crate::order_credits::{self, CreditsEvent};
use provider_fakes::stripe::{Asked as MeterRequest, FakeStripe, Fault as MeterFault, Forgets};
use provider_fakes::traffic::Fault as PolarFault;
use provider_fakes::{FakePolar, ProviderServer};

/// How long a received message stays invisible (shorter than the lease, as it may be when a
/// function's timeout is set short: the message comes back while the lease still holds).
const VISIBILITY_MS: i64 = 5_000;
/// Faults of any kind one event may suffer: fewer than its attempts, so none dies of them.
const MAX_FAULTS_PER_EVENT: u32 = 3;
/// Quiescence: rounds of (time +20 min, a scheduler run, the queue drained) before a pending
/// row counts as stranded.
const QUIET_ROUNDS: usize = 20;

/// The simulator's catalog: the tests' plans, each with features (docs/design.md §4.12), so
/// that a plan change moves the catalog's features. Its keys meet the providers': `sso` (a flag
/// Stripe's summaries and Polar's benefits give too), `seats` (a number Polar's benefits give at
/// 5 and 20), `export` (a string here, a flag in Stripe's summaries), `audit-log`.
const CATALOG: &str = r#"{
    "free": {"plan": "free", "monthly_allowance": 10, "features": {"seats": 1},
             "credits_low": {"usd": 500, "credits": 300}},
    "pro": {"plan": "pro", "monthly_allowance": 500,
            "features": {"sso": true, "seats": 10, "export": "csv"}},
    "price_pro": {"plan": "pro", "monthly_allowance": 500,
                  "features": {"sso": true, "seats": 10, "export": "csv"}},
    "prod_pro": {"plan": "pro", "monthly_allowance": 500,
                 "features": {"sso": true, "seats": 10, "export": "csv"}},
    "team": {"plan": "team", "monthly_allowance": 2000,
             "features": {"sso": true, "seats": 50, "export": "pdf", "audit-log": true}},
    "price_team": {"plan": "team", "monthly_allowance": 2000,
                   "features": {"sso": true, "seats": 50, "export": "pdf", "audit-log": true}},
    "prod_team": {"plan": "team", "monthly_allowance": 2000,
                  "features": {"sso": true, "seats": 50, "export": "pdf", "audit-log": true}},
    "101": {"plan": "pro", "monthly_allowance": 500,
            "features": {"sso": true, "seats": 10, "export": "csv"}},
    "102": {"plan": "team", "monthly_allowance": 2000,
            "features": {"sso": true, "seats": 50, "export": "pdf", "audit-log": true}},
    "price_pack": {"credits": {"amount": 500, "unit": "credits", "expires_after_days": 30}}
}"#;

/// The seeded source of every decision.
struct Dice(TestRng);

impl Dice {
    fn new(seed: u64) -> Self {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        Self(TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The simulated clock: milliseconds since the run began, beside real time.
#[derive(Clone, Default)]
struct Clock(Arc<AtomicI64>);

impl Clock {
    fn ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }

    /// The setting `inbox_now()` reads.
    fn offset(&self) -> String {
        format!("{}", self.ms() as f64 / 1000.0)
    }

    fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// The simulated time, as `inbox_now()` reads it.
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::Utc::now() + chrono::TimeDelta::milliseconds(self.ms())
    }
}

struct Message {
    id: u64,
    event_id: i64,
    visible_at: i64,
}

/// The queue in memory; send-time faults come from its own dice, so the order in which the
/// actors send decides them.
struct SimulatedQueue {
    clock: Clock,
    state: Mutex<QueueState>,
}

struct QueueState {
    dice: Dice,
    messages: Vec<Message>,
    next_id: u64,
    faults: bool,
    trace: Vec<String>,
}

impl SimQueue for SimulatedQueue {
    fn send(&self, event_ids: &[i64]) -> Vec<i64> {
        let now = self.clock.ms();
        let mut q = self.state.lock().unwrap();
        let mut refused = Vec::new();
        for &event_id in event_ids {
            let (refuse, drop, copy, delay) = match q.faults {
                true => (
                    q.dice.chance(3),
                    q.dice.chance(5),
                    q.dice.chance(8),
                    q.dice.chance(10),
                ),
                false => (false, false, false, false),
            };
            if refuse {
                q.trace.push(format!("queue refused event {event_id}"));
                refused.push(event_id);
                continue;
            }
            if drop {
                q.trace.push(format!("queue lost event {event_id}"));
                continue;
            }
            let delay_ms = match delay {
                true => 1_000 * (1 + q.dice.below(120) as i64),
                false => 0,
            };
            for _ in 0..(1 + u8::from(copy)) {
                let id = q.next_id;
                q.next_id += 1;
                q.messages.push(Message {
                    id,
                    event_id,
                    visible_at: now + delay_ms,
                });
            }
            if copy || delay {
                q.trace.push(format!(
                    "queue sent event {event_id}{}{}",
                    if copy { " twice" } else { "" },
                    if delay {
                        format!(" after {} s", delay_ms / 1000)
                    } else {
                        String::new()
                    }
                ));
            }
        }
        refused
    }
}

impl SimulatedQueue {
    /// Up to ten visible messages, hidden for the visibility timeout.
    fn receive(&self) -> Vec<(u64, i64)> {
        let now = self.clock.ms();
        let mut q = self.state.lock().unwrap();
        let mut taken = Vec::new();
        for m in q.messages.iter_mut() {
            if m.visible_at <= now && taken.len() < 10 {
                m.visible_at = now + VISIBILITY_MS;
                taken.push((m.id, m.event_id));
            }
        }
        taken
    }

    /// Deletes acknowledged messages; now and then SQS keeps one and delivers it again.
    fn delete(&self, ids: &[u64]) {
        let now = self.clock.ms();
        let mut q = self.state.lock().unwrap();
        for id in ids {
            let again = q.faults && q.dice.chance(4);
            if again {
                if let Some(m) = q.messages.iter_mut().find(|m| m.id == *id) {
                    m.visible_at = now + 5_000;
                    let event_id = m.event_id;
                    q.trace
                        .push(format!("queue will deliver event {event_id} again"));
                    continue;
                }
            }
            q.messages.retain(|m| m.id != *id);
        }
    }

    fn visible(&self) -> usize {
        let now = self.clock.ms();
        let q = self.state.lock().unwrap();
        q.messages.iter().filter(|m| m.visible_at <= now).count()
    }

    fn len(&self) -> usize {
        self.state.lock().unwrap().messages.len()
    }

    fn take_trace(&self) -> Vec<String> {
        std::mem::take(&mut self.state.lock().unwrap().trace)
    }

    fn set_faults(&self, on: bool) {
        self.state.lock().unwrap().faults = on;
    }
}

/// Stripe's event feed as the simulation serves it: the events Stripe failed to deliver
/// (`delivery_success=false`), three to a page, with seeded faults — an error, a timeout,
/// a page out of order, a page that repeats the one before. The time-window walk finds
/// nothing: the workload's events are older than its first window.
#[derive(Clone)]
struct SimFeed(Arc<Mutex<FeedState>>);

struct FeedState {
    dice: Dice,
    /// Stripe's list, newest first, as (event id, body).
    undelivered: Vec<(String, Vec<u8>)>,
    faults: bool,
    trace: Vec<String>,
}

impl SimFeed {
    fn page_after(&self, after: Option<&str>) -> anyhow::Result<FeedPage> {
        let mut feed = self.0.lock().unwrap();
        if feed.faults {
            match feed.dice.below(100) {
                0..=5 => {
                    feed.trace.push("the provider API answered 500".into());
                    anyhow::bail!("GET /v1/events answered 500 Internal Server Error");
                }
                6..=9 => {
                    feed.trace.push("the provider API timed out".into());
                    anyhow::bail!("GET /v1/events: operation timed out");
                }
                _ => {}
            }
        }
        let start = match after {
            Some(id) => feed
                .undelivered
                .iter()
                .position(|(e, _)| e == id)
                .map_or(0, |i| i + 1),
            None => 0,
        };
        // A page that starts one early repeats an event; one shuffled is out of order.
        let start = match feed.faults && start > 0 && feed.dice.chance(10) {
            true => {
                feed.trace.push("the provider API repeated an event".into());
                start - 1
            }
            false => start,
        };
        let end = (start + 3).min(feed.undelivered.len());
        let mut page: Vec<(String, Vec<u8>)> = feed.undelivered[start..end].to_vec();
        if feed.faults && page.len() > 1 && feed.dice.chance(20) {
            feed.trace
                .push("the provider API served a page out of order".into());
            page.reverse();
        }
        let last = page.iter().map(|(e, _)| e.clone()).max_by_key(|e| {
            feed.undelivered
                .iter()
                .position(|(id, _)| id == e)
                .unwrap_or(0)
        });
        let next = match end < feed.undelivered.len() {
            true => last,
            false => None,
        };
        let events = page
            .into_iter()
            .map(|(_, body)| {
                let event = shared::providers::stripe::parse_event(&body, chrono::Utc::now());
                Fetched { body, event }
            })
            .collect();
        Ok(FeedPage { events, next })
    }
}

impl EventFeed for SimFeed {
    fn page<'a>(
        &'a self,
        _window: Window,
        _after: Option<&'a str>,
    ) -> BoxFuture<'a, anyhow::Result<FeedPage>> {
        Box::pin(std::future::ready(Ok(FeedPage {
            events: Vec::new(),
            next: None,
        })))
    }

    fn undelivered<'a>(
        &'a self,
        _since: chrono::DateTime<chrono::Utc>,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, anyhow::Result<FeedPage>> {
        Box::pin(std::future::ready(self.page_after(after)))
    }
}

/// How a Stripe subscription change is sent (docs/design.md §6.2): as a snapshot event only,
/// as a thin event whose snapshot twin is delivered too (a migration from snapshot to thin
/// events, both destinations running), or as a thin event only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sent {
    Snapshot,
    ThinAndTwin,
    ThinOnly,
}

/// One thing the provider delivers: event `index` of the case, or the thin event of it, or
/// event `index` of the seed's credits events ([`World::credits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Item {
    index: usize,
    thin: bool,
    credits: bool,
}

/// The id of the thin event of change `index`; its twin is the change's snapshot event.
fn thin_id(index: usize, ns: &str) -> String {
    format!("evt_thin{index:02}_{ns}")
}

/// The thin event of the Stripe subscription change `event`, shaped as the corpus's
/// (`testdata/providers/stripe/thin/`): the related object to read and, when the snapshot
/// destination runs too, the twin's id in `snapshot_event`; its time is the change's, moved
/// back `shift` seconds as the seed's Stripe times are ([`stripe_shift`]).
fn thin_payload(index: usize, event: &Event, ns: &str, twin: bool, shift: i64) -> Value {
    let Event::StripeSubscription {
        customer, sub, at, ..
    } = event
    else {
        unreachable!("only subscription changes are sent thin")
    };
    let sub_id = format!("sub{customer}{sub}_{ns}");
    json!({
        "id": thin_id(index, ns), "object": "v2.core.event",
        "type": "v1.customer.subscription.updated", "livemode": false,
        "created": (order::time(*at) - chrono::Duration::seconds(shift))
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "context": null,
        "reason": {"type": "request", "request": {"id": format!("req{index:02}_{ns}"), "idempotency_key": null}},
        "related_object": {"id": sub_id, "type": "subscription", "url": format!("/v1/subscriptions/{sub_id}")},
        "snapshot_event": twin.then(|| format!("e{index:02}_{ns}")),
    })
}

/// How the thin events of the seeds run so far ended: applied as their read, carried by their
/// twin, their object gone (printed by `sim::seeds`).
static THIN_READ: AtomicUsize = AtomicUsize::new(0);
static THIN_TWIN: AtomicUsize = AtomicUsize::new(0);
static THIN_GONE: AtomicUsize = AtomicUsize::new(0);
/// Reads that answered 500 or timed out.
static READ_FAULTS: AtomicUsize = AtomicUsize::new(0);
/// Invoices' subscription reads stored and applied, and those made for a change 2 s before a
/// month began (printed by `sim::seeds`).
static INVOICE_READS: AtomicUsize = AtomicUsize::new(0);
/// Of those, the reads made for a Paddle renewal and for a Lemon Squeezy invoice.
static PADDLE_READS: AtomicUsize = AtomicUsize::new(0);
static LEMONSQUEEZY_READS: AtomicUsize = AtomicUsize::new(0);
static READS_ACROSS_A_MONTH: AtomicUsize = AtomicUsize::new(0);
/// Stripe summaries that came whole, and of those that said `has_more`, how many were applied
/// as the complete list read and how many found their customer gone; list reads that answered
/// 500 or timed out; Polar benefit-grant events (printed by `sim::seeds`).
static SUMMARIES_WHOLE: AtomicUsize = AtomicUsize::new(0);
static SUMMARIES_READ: AtomicUsize = AtomicUsize::new(0);
static SUMMARIES_GONE: AtomicUsize = AtomicUsize::new(0);
static LIST_READ_FAULTS: AtomicUsize = AtomicUsize::new(0);
static GRANT_EVENTS: AtomicUsize = AtomicUsize::new(0);
/// Subscriptions Stripe's notices of events it failed to generate swept (printed by
/// `sim::seeds`).
static SWEPT: AtomicUsize = AtomicUsize::new(0);
static SWEPT_MATCHING: AtomicUsize = AtomicUsize::new(0);
/// Reads still stored once the seed's events were purged past the retention, and of those
/// Lemon Squeezy's (printed by `sim::seeds`).
static READS_KEPT: AtomicUsize = AtomicUsize::new(0);
static LEMONSQUEEZY_READS_KEPT: AtomicUsize = AtomicUsize::new(0);

/// Credits events delivered and grants (Stripe's and packs) checked at rest (printed by
/// `sim::seeds`).
static CREDITS_EVENTS: AtomicUsize = AtomicUsize::new(0);
static CREDITS_GRANTS: AtomicUsize = AtomicUsize::new(0);
/// The app's debits of credits: accepted, refused, and of the accepted those whose derived
/// allocation at rest is not what they were answered (a grant told later came first, or an
/// application told later took what they spent); low and depleted crossings at rest.
static CREDIT_DEBITS_ACCEPTED: AtomicUsize = AtomicUsize::new(0);
static CREDIT_DEBITS_REFUSED: AtomicUsize = AtomicUsize::new(0);
static CREDIT_DEBITS_MOVED: AtomicUsize = AtomicUsize::new(0);
static CREDIT_DEBITS_UNFUNDED: AtomicUsize = AtomicUsize::new(0);
static CREDIT_CROSSINGS: AtomicUsize = AtomicUsize::new(0);
/// Time the credits debits and the credits checks at rest took, in microseconds.
static CREDITS_MICROS: AtomicUsize = AtomicUsize::new(0);

/// Fetch faults one thin event may suffer: with the schedule's three, fewer than its attempts.
const MAX_READ_FAULTS: u32 = 2;
/// The worker's client gives up on a read after this; a read that times out answers three
/// times later (long enough for a loaded machine's ordinary answer to come well before it).
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The providers' APIs as the worker's reads meet them. Stripe's is the faithful fake Stripe's
/// read side (`provider_fakes`, docs/design.md §6.6), served in process and checked against
/// Stripe's description; what it holds, and what goes wrong, is the simulation's, decided here
/// on the dice this state keeps ([`SimReads::stripe_read`]). Paddle's and Lemon Squeezy's are
/// served here ([`SimReads::read`]).
///
/// A thin event's object is the subscription as Stripe shows it at the read: the workload's
/// changes all happened before the run (their times are months before its clock; the deliveries
/// are a backlog), so that is each subscription's latest change. The read stands for its thin
/// event (stamped with the thin event's time), so every read is made in a later month than the
/// change it stands for. An invoice's subscription that no event names (`subinv…`) is read the
/// same way, on dice of its own; it is on a test clock, so a list that names no customer
/// leaves it out, as Stripe's does. On its own dice a read answers 500 or times out; a few
/// subscriptions are deleted after a number of reads (their test data removed) and answer 404
/// from then on. A tie's read answers what Stripe shows, the subscription's latest change, which
/// settles the tie as the provider's word (docs/design.md §4.2). A summary that says `has_more`
/// reads its customer's active entitlements, which Stripe lists as they are at the read: its
/// latest summary's whole list (404 for a customer Stripe deleted), with faults on dice of
/// their own.
#[derive(Clone)]
struct SimReads(Arc<Mutex<ReadsState>>);

struct ReadsState {
    dice: Dice,
    /// The faults of Stripe's thin events' reads.
    /// The faults of invoices' subscription reads (every provider's), apart from the thin events' dice.
    invoice_dice: Dice,
    /// The faults of entitlement list reads, apart from the others.
    list_dice: Dice,
    /// What each provider shows per subscription id (Stripe's in the shape of the pinned
    /// version, basil; the fake Stripe holds those not deleted yet).
    objects: HashMap<String, Value>,
    /// What Stripe lists per customer id: its latest summary (its case index) and that
    /// summary's whole list of active entitlements.
    entitlements: BTreeMap<String, (usize, Vec<Value>)>,
    /// Subscriptions deleted after this many more reads.
    gone_after: HashMap<String, u32>,
    /// Fetch faults suffered per thin event.
    faulted: HashMap<String, u32>,
    faults: bool,
    trace: Vec<String>,
}

impl SimReads {
    /// `GET path` of Paddle's or Lemon Squeezy's subscription `thin`, read for an invoice
    /// that came before it, on the invoices' dice.
    fn read(&self, thin: &str, path: &str) -> anyhow::Result<Option<Value>> {
        let mut reads = self.0.lock().unwrap();
        let faulted = reads.faulted.get(thin).copied().unwrap_or_default();
        if reads.faults && faulted < MAX_READ_FAULTS {
            let fault = match reads.invoice_dice.below(100) {
                0..=7 => Some("answered 500 Internal Server Error"),
                8..=12 => Some("timed out"),
                _ => None,
            };
            if let Some(fault) = fault {
                reads.faulted.insert(thin.to_owned(), faulted + 1);
                READ_FAULTS.fetch_add(1, Ordering::Relaxed);
                reads.trace.push(format!("GET {path} for {thin} {fault}"));
                anyhow::bail!("GET {path}: {fault}");
            }
        }
        let id = path.strip_prefix("/v1/subscriptions/").unwrap_or_default();
        if let Some(left) = reads.gone_after.get_mut(id) {
            if *left == 0 {
                reads
                    .trace
                    .push(format!("GET {path} for {thin} answered 404 (deleted)"));
                return Ok(None);
            }
            *left -= 1;
        }
        let object = reads.objects.get(id).cloned();
        let shown = object
            .as_ref()
            .and_then(|o| o["status"].as_str().or(o["attributes"]["status"].as_str()))
            .unwrap_or("404");
        reads
            .trace
            .push(format!("GET {path} for {thin} shows {shown}"));
        Ok(object)
    }

    /// What goes wrong with a read at the fake Stripe (its decider, asked while its read side
    /// is held), on the dice the reads were always drawn on: a thin event's read and a
    /// summary's list read (each names its event, `Stripe-Request-Trigger`) on their own dice,
    /// an invoice's subscription read (`subinv…`) on the invoices' (shared with Paddle's and
    /// Lemon Squeezy's), at most [`MAX_READ_FAULTS`] for each; a tie's read, a sweep's list and
    /// any other read draw nothing. A subscription deleted after so many reads is deleted
    /// (`forgets`) once the last read it answers is answered.
    fn stripe_read(&self, asked: &MeterRequest<'_>, forgets: &Forgets) -> Option<MeterFault> {
        use shared::providers::stripe::entitlements::LIST_PATH;
        #[derive(PartialEq)]
        enum Drawn {
            Thin,
            Invoice,
            List,
        }
        let path = asked.endpoint;
        let subscription = path.strip_prefix("/v1/subscriptions/");
        let (key, drawn) = match (asked.trigger, subscription) {
            (Some(event), _) if path == LIST_PATH => (event, Drawn::List),
            (Some(event), _) => (event, Drawn::Thin),
            (None, Some(id)) if id.starts_with("subinv") => (id, Drawn::Invoice),
            _ => return None,
        };
        let mut reads = self.0.lock().unwrap();
        let faulted = reads.faulted.get(key).copied().unwrap_or_default();
        if reads.faults && faulted < MAX_READ_FAULTS {
            let dice = match drawn {
                Drawn::Thin => &mut reads.dice,
                Drawn::Invoice => &mut reads.invoice_dice,
                Drawn::List => &mut reads.list_dice,
            };
            let fault = match dice.below(100) {
                0..=7 => Some((
                    "answered 500 Internal Server Error",
                    MeterFault::Fails(
                        500,
                        json!({"error": {"type": "api_error", "message": "An unknown error occurred"}}),
                    ),
                )),
                8..=12 => Some(("timed out", MeterFault::Slow(READ_TIMEOUT * 3))),
                _ => None,
            };
            if let Some((said, fault)) = fault {
                reads.faulted.insert(key.to_owned(), faulted + 1);
                match drawn {
                    Drawn::List => LIST_READ_FAULTS.fetch_add(1, Ordering::Relaxed),
                    _ => READ_FAULTS.fetch_add(1, Ordering::Relaxed),
                };
                reads.trace.push(format!("GET {path} for {key} {said}"));
                return Some(fault);
            }
        }
        if let Some(id) = subscription {
            if let Some(left) = reads.gone_after.get_mut(id) {
                if *left == 0 {
                    reads
                        .trace
                        .push(format!("GET {path} for {key} answered 404 (deleted)"));
                    return None;
                }
                *left -= 1;
                if *left == 0 {
                    forgets.forget(id);
                }
            }
        }
        let line = match drawn {
            Drawn::List => format!("GET {path}?{} for {key}", asked.identifier),
            _ => format!("GET {path} for {key}"),
        };
        reads.trace.push(line);
        None
    }
}

impl Reads for SimReads {
    fn subscription<'a>(
        &'a self,
        _customer: &'a shared::domain::CustomerId,
        _id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<SubscriptionNow>>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    fn subscription_object<'a>(
        &'a self,
        _customer: &'a shared::domain::CustomerId,
        id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<Value>>> {
        let path = format!("/v1/subscriptions/{id}");
        Box::pin(std::future::ready(self.read(id, &path)))
    }
}

/// The simulation's Stripe meter: the event name its debits are reported under.
const METER: &str = "api_calls";
/// The dispatcher's client gives up on a send after this; a slow answer comes three times later.
const METER_TIMEOUT: Duration = Duration::from_millis(100);
/// Faults the fake meter injects per identifier at most: with a crash or a kill at each of
/// three more attempts, fewer than a report's six attempts.
const MAX_METER_FAULTS: u32 = 2;

static METER_SENDS: AtomicUsize = AtomicUsize::new(0);
static METER_RESENDS: AtomicUsize = AtomicUsize::new(0);
static METER_REPLAYED: AtomicUsize = AtomicUsize::new(0);
static METER_FAULTS: AtomicUsize = AtomicUsize::new(0);
/// Requests the fake Stripe's rate limiter refused (reads and meter reports together).
static STRIPE_OVER_LIMIT: AtomicUsize = AtomicUsize::new(0);
/// Requests the fake Stripe answered (reads and meter reports together).
static STRIPE_REQUESTS: AtomicUsize = AtomicUsize::new(0);
static METER_HELD: AtomicUsize = AtomicUsize::new(0);
static METER_CANCELLED: AtomicUsize = AtomicUsize::new(0);
static METER_COMPENSATED: AtomicUsize = AtomicUsize::new(0);
static REVERSALS: AtomicUsize = AtomicUsize::new(0);
static REVERSALS_AGAIN: AtomicUsize = AtomicUsize::new(0);
static REVERSED_WITHDRAWN: AtomicUsize = AtomicUsize::new(0);
static REVERSED_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// The simulation's faults at the meters (docs/design.md §10), on their own dice, asked by the
/// faithful fakes (`provider_fakes`) for each request that reaches an endpoint: 6% fail before
/// anything is taken (503), 3% are taken and then answered 500, 4% are taken and answered only
/// after the client gave up; at most [`MAX_METER_FAULTS`] an identifier (an adjustment's: its
/// `Idempotency-Key`, each attempt's own). What a fault leaves behind is the fake's: Stripe
/// saves a 5xx under the request's key and replays it to every later request with that key.
fn meter_faults(dice: Dice) -> impl FnMut(&MeterRequest<'_>) -> Option<MeterFault> + Send {
    let mut dice = dice;
    let mut faulted: HashMap<String, u32> = HashMap::new();
    move |asked: &MeterRequest<'_>| {
        let id = match asked.endpoint {
            "/v1/billing/meter_event_adjustments" => asked.idempotency_key.unwrap_or_default(),
            _ => asked.identifier,
        };
        let count = faulted.get(id).copied().unwrap_or_default();
        let roll = dice.below(100);
        if count >= MAX_METER_FAULTS || roll >= 13 {
            return None;
        }
        *faulted.entry(id.to_owned()).or_default() += 1;
        METER_FAULTS.fetch_add(1, Ordering::Relaxed);
        Some(match roll {
            0..=5 => MeterFault::Fails(
                503,
                json!({"error": {"type": "api_error", "message": "Service unavailable"}}),
            ),
            6..=8 => MeterFault::TakesThenFails(
                500,
                json!({"error": {"type": "api_error", "message": "An unknown error occurred"}}),
            ),
            _ => MeterFault::Slow(METER_TIMEOUT * 3),
        })
    }
}

/// The same faults at Polar's event ingestion, on the same draws: asked per request with the
/// first ingested event's `external_id`, each answered in Polar's own error shape (its other
/// routes draw nothing).
fn polar_faults(dice: Dice) -> impl FnMut(&str, &str) -> Option<PolarFault> + Send {
    let mut stripe = meter_faults(dice);
    move |path: &str, external_id: &str| {
        if path != "/v1/events/ingest" {
            return None;
        }
        let asked = MeterRequest {
            endpoint: path,
            identifier: external_id,
            idempotency_key: None,
            trigger: None,
        };
        stripe(&asked).map(|fault| match fault {
            MeterFault::Fails(status, _) => PolarFault::Fails(status),
            MeterFault::TakesThenFails(status, _) => PolarFault::TakesThenFails(status),
            MeterFault::Slow(delay) => PolarFault::Slow(delay),
            MeterFault::RateLimited(secs) => PolarFault::RateLimited(secs.unwrap_or(1).into()),
        })
    }
}

/// The dispatcher's client for a provider's meter: it gives up after [`METER_TIMEOUT`].
fn meter_api(server: &wiremock::MockServer) -> shared::providers::Api {
    let http = reqwest::Client::builder()
        .timeout(METER_TIMEOUT)
        .build()
        .unwrap();
    shared::providers::Api {
        base_url: server.uri(),
        key: shared::platform::secrets::ApiKey::Known("sk_test_sim".into()),
        client_id: None,
        http,
        budget: None,
    }
}

/// The worker's client for Stripe's reads: it gives up after [`READ_TIMEOUT`].
fn read_api(server: &wiremock::MockServer) -> shared::providers::Api {
    shared::providers::Api {
        http: reqwest::Client::builder()
            .timeout(READ_TIMEOUT)
            .build()
            .unwrap(),
        ..meter_api(server)
    }
}

/// What one actor's run meets at its points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// The process dies at the n-th point it passes.
    Crash(usize),
    /// Every other connection to the database is terminated at the n-th point.
    Kill(usize),
    /// The run stops at the n-th point until released (another worker goes meanwhile).
    Pause(usize),
}

/// The interrupts of one actor's run.
struct Plan {
    fault: Option<Fault>,
    bugs: HashSet<Bug>,
    passed: AtomicUsize,
    /// Faults already suffered per event: the plan leaves an event alone after the maximum.
    faults_seen: Arc<Mutex<HashMap<i64, u32>>>,
    admin: PgPool,
    crashed: Notify,
    paused: Notify,
    release: Arc<Notify>,
    hit: Mutex<Option<String>>,
}

impl Plan {
    fn new(
        fault: Option<Fault>,
        bugs: &HashSet<Bug>,
        faults_seen: &Arc<Mutex<HashMap<i64, u32>>>,
        admin: &PgPool,
    ) -> Arc<Self> {
        Arc::new(Self {
            fault,
            bugs: bugs.clone(),
            passed: AtomicUsize::new(0),
            faults_seen: faults_seen.clone(),
            admin: admin.clone(),
            crashed: Notify::new(),
            paused: Notify::new(),
            release: Arc::new(Notify::new()),
            hit: Mutex::new(None),
        })
    }
}

impl Interrupts for Plan {
    fn at(&self, point: Point, id: i64) -> Option<BoxFuture<'static, ()>> {
        let n = self.passed.fetch_add(1, Ordering::SeqCst);
        let fault = self.fault?;
        let (Fault::Crash(at) | Fault::Kill(at) | Fault::Pause(at)) = fault;
        if n != at {
            return None;
        }
        {
            let mut seen = self.faults_seen.lock().unwrap();
            let count = seen.entry(id).or_default();
            if *count >= MAX_FAULTS_PER_EVENT {
                return None;
            }
            *count += 1;
        }
        *self.hit.lock().unwrap() = Some(format!("{fault:?} at {point} (row {id})"));
        match fault {
            Fault::Crash(_) => {
                self.crashed.notify_one();
                Some(Box::pin(std::future::pending()))
            }
            Fault::Kill(_) => {
                let admin = self.admin.clone();
                Some(Box::pin(async move {
                    sqlx::query(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                         WHERE datname = current_database() AND pid <> pg_backend_pid()",
                    )
                    .execute(&admin)
                    .await
                    .unwrap();
                }))
            }
            Fault::Pause(_) => {
                self.paused.notify_one();
                let release = self.release.clone();
                Some(Box::pin(async move { release.notified().await }))
            }
        }
    }

    fn planted(&self, bug: Bug) -> bool {
        self.bugs.contains(&bug)
    }
}

/// How one actor's run ended.
enum Ran<T> {
    Done(T),
    Crashed,
}

/// One simulated world: the pools, the queue, the clock, the actors' states, the workload.
struct World {
    seed: u64,
    dice: Dice,
    clock: Clock,
    queue: Arc<SimulatedQueue>,
    app: TestApp,
    worker: Arc<WorkerState>,
    scheduler: SchedulerState,
    /// A second scheduler, for two runs at once.
    other_scheduler: SchedulerState,
    feed: SimFeed,
    reads: SimReads,
    /// How each event of the case is sent (`Snapshot` for all but Stripe subscriptions).
    sent: Vec<Sent>,
    /// The dedupe key each event of the case is stored under (`e{index}_{ns}`, or what a
    /// Lemon Squeezy body makes).
    keys: Vec<String>,
    /// The invoices (by index) that name a subscription no event names: its plan is known
    /// only by the provider read the worker makes for the invoice.
    invoice_reads: HashMap<usize, String>,
    /// How many seconds this seed's Stripe times are moved back ([`stripe_shift`]).
    shift: i64,
    /// The (source, customer, period) of every event of the workload: a grant lands in one of
    /// them, whenever a read made for it happens.
    periods: HashSet<(String, String, String)>,
    pool: PgPool,
    admin: PgPool,
    bugs: HashSet<Bug>,
    faults_seen: Arc<Mutex<HashMap<i64, u32>>>,
    trace: Vec<String>,
    /// The highest balance seen per (source, customer, period).
    high: BTreeMap<(String, String, String), i64>,
    /// The app's side: its own dice (so that debits leave the pipeline's schedule as the
    /// seed always decided it), the debits it asked for, and the highest `used` seen.
    spender: Dice,
    asked: Vec<Asked>,
    used_high: BTreeMap<(String, String, String), i64>,
    /// The app's reversals, on dice of their own (so that its debits are drawn as before
    /// reversals existed): each reversed debit's first answer heard (`None` while every
    /// answer was lost).
    reverser: Dice,
    reversed: BTreeMap<String, Option<shared::billing::usage::Reversal>>,
    /// The faithful fakes of Stripe's meter API and Polar's (its event ingestion; clocked on the
    /// simulated time, faulted on their own dice), their servers, the dispatcher's meters and the
    /// dispatcher's own dice (so that sending reports leaves the other dice as they were).
    meter: FakeStripe,
    _meter_server: ProviderServer,
    polar: FakePolar,
    _polar_server: ProviderServer,
    meters: Arc<shared::meters::Meters>,
    dispatcher: Dice,
    ns: String,
    /// The seed's Stripe credits events (`order_credits`'s: grant snapshots, their
    /// transactions, packs paid and refunded), delivered among the rest.
    credits: Vec<CreditsEvent>,
    /// The app's debits of the credits customers, on dice of their own: the second the next
    /// one is made at (on the credits events' timeline), and those accepted, in order.
    credit_spender: Dice,
    credits_clock: i64,
    credit_debits: Vec<order_credits::oracle::AppDebit>,
    credit_keys: usize,
    /// What each accepted one was answered it took, by usage id.
    credit_answered: HashMap<String, Vec<(String, i64)>>,
    /// The credits events (by index) the store has applied so far: once applied, what an
    /// event wrote stays (a replay only applies it again).
    credits_applied: BTreeSet<usize>,
}

/// A debit the simulated app asked for, and the first answer it heard for its key.
#[derive(Debug, Clone)]
struct Asked {
    source: &'static str,
    customer: String,
    key: String,
    amount: i64,
    period: &'static str,
    heard: Option<shared::billing::usage::Debit>,
}

/// A failed invariant, with what the run did.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) seed: u64,
    pub(crate) what: String,
    pub(crate) trace: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "simulation seed {} failed: {}", self.seed, self.what)?;
        writeln!(
            f,
            "replay: SIM_SEED={} cargo test -p billing-inbox --test api sim::one_seed -- --nocapture",
            self.seed
        )?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// A pool whose every connection reads the simulated clock: `inbox.clock_offset_secs` is set
/// when a connection opens and on each acquire (a new connection is not "acquired").
async fn clocked_pool(base: &PgPool, clock: &Clock, max: u32) -> PgPool {
    let options = base.connect_options().as_ref().clone();
    let (on_connect, on_acquire) = (clock.clone(), clock.clone());
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        .after_connect(move |conn, _| {
            let offset = on_connect.offset();
            Box::pin(async move { set_clock(conn, offset).await })
        })
        .before_acquire(move |conn, _| {
            let offset = on_acquire.offset();
            Box::pin(async move { set_clock(conn, offset).await.map(|()| true) })
        })
        .connect_with(options)
        .await
        .unwrap()
}

async fn set_clock(conn: &mut sqlx::PgConnection, offset: String) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT set_config('inbox.clock_offset_secs', $1, false)")
        .bind(offset)
        .execute(conn)
        .await
        .map(|_| ())
}

impl World {
    async fn new(base: &PgPool, seed: u64, bugs: HashSet<Bug>) -> Self {
        let clock = Clock::default();
        // Each seed starts at its own point of simulated time, past everything before it.
        clock.advance(seed as i64 % 1_000 * 86_400_000);
        let queue = Arc::new(SimulatedQueue {
            clock: clock.clone(),
            state: Mutex::new(QueueState {
                dice: Dice::new(seed ^ 0x5157_5155_4555),
                messages: Vec::new(),
                next_id: 0,
                faults: true,
                trace: Vec::new(),
            }),
        });
        let pool = clocked_pool(base, &clock, 6).await;
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(base.connect_options().as_ref().clone())
            .await
            .unwrap();
        let sim_queue = Queue::simulated(queue.clone());
        let mut app = TestApp::with_parts(
            pool.clone(),
            pool.clone(),
            sqs_client().await,
            String::new(),
            sim_queue.clone(),
        )
        .await;
        // The intake's held connection reads the simulated clock too.
        let held_clock = clock.clone();
        app.state.conn = shared::platform::db::Held::new(pool.connect_options().as_ref().clone())
            .before_use(Arc::new(move |conn| {
                let offset = held_clock.offset();
                Box::pin(set_clock(conn, offset))
            }));
        let mut worker = test_worker(pool.clone());
        worker.catalog = shared::domain::Catalog::parse(CATALOG).unwrap();
        // The Stripe source has an API key: thin events read their object (docs/design.md §6.2).
        let reads = SimReads(Arc::new(Mutex::new(ReadsState {
            dice: Dice::new(seed ^ 0x7EAD),
            invoice_dice: Dice::new(seed ^ 0x1A7E_7EAD),
            list_dice: Dice::new(seed ^ 0x5EA7_7EAD),
            objects: HashMap::new(),
            entitlements: BTreeMap::new(),
            gone_after: HashMap::new(),
            faulted: HashMap::new(),
            faults: true,
            trace: Vec::new(),
        })));
        // One fake Stripe account: the worker's reads and the dispatcher's meter reports. Its
        // windows (a key's and an identifier's 24 hours, a cancel's, a timestamp's 35 days past
        // and 5 minutes ahead, the rate limiter's seconds) are the simulation's time, not the
        // wall clock's; its faults are the simulation's dice.
        let fake_clock: provider_fakes::stripe::Clock = {
            let clock = clock.clone();
            Arc::new(move || clock.now())
        };
        let meter = FakeStripe::default();
        let forgets = meter.forgetting();
        let decides = reads.clone();
        meter
            .clocked(fake_clock.clone())
            .deciding(meter_faults(Dice::new(seed ^ 0x003E_7E12)))
            .deciding_reads(move |asked: &MeterRequest<'_>| decides.stripe_read(asked, &forgets));
        let meter_server = meter.serve().await;
        worker.sources.insert(
            "stripe".into(),
            shared::handlers::worker::WorkerSource {
                kind: shared::domain::SourceKind::Stripe,
                livemode: None,
                reads: Some(Box::new(shared::providers::stripe::StripeReads::new(
                    read_api(&meter_server),
                ))),
            },
        );
        // So do Paddle's and Lemon Squeezy's: a payment before its subscription reads it.
        for (name, kind) in [
            ("paddle", shared::domain::SourceKind::Paddle),
            ("lemonsqueezy", shared::domain::SourceKind::LemonSqueezy),
        ] {
            worker.sources.insert(
                name.into(),
                shared::handlers::worker::WorkerSource {
                    kind,
                    livemode: None,
                    reads: Some(Box::new(reads.clone())),
                },
            );
        }
        worker.retry = RETRY;
        worker.lease = DEFAULT_LEASE;
        // Effects are written under every fault; no dispatcher runs, so they stay pending.
        worker.effects = Some(sim_queue.clone());
        // A provider read the worker stores is sent after the commit, under the queue's faults.
        worker.events = Some(sim_queue.clone());
        let feed = SimFeed(Arc::new(Mutex::new(FeedState {
            dice: Dice::new(seed ^ 0xFEED),
            undelivered: Vec::new(),
            faults: true,
            trace: Vec::new(),
        })));
        // In one seed of four the scheduler audits as deployed (a few accounts a run, the
        // seed's touched ones first): checked points are kept at many cuts while events still
        // arrive out of order, and the audit at rest goes on from them (§4.11). Not in every
        // seed, for the time it takes; no dice are drawn for it, so a seed's schedule is the
        // same either way.
        let audit_sources = crate::helpers::audit_sources(&worker);
        let audits = seed.is_multiple_of(4);
        let scheduler_with = |feed: &SimFeed| SchedulerState {
            pool: pool.clone(),
            queue: sim_queue.clone(),
            reconcilers: vec![Reconciler::new(
                "stripe",
                Reconciliation::Feed(Box::new(feed.clone())),
            )],
            sources: vec![],
            retention: Duration::from_secs(30 * 86_400),
            effects: None,
            outbox: None,
            budget: Duration::from_secs(30),
            database: None,
            audit: audits.then(|| scheduler::Audit {
                max: 2,
                ..scheduler::Audit::new(audit_sources.clone(), worker.catalog.clone())
            }),
        };
        let scheduler = scheduler_with(&feed);
        let other_scheduler = scheduler_with(&feed);
        // Polar reads the simulated time too: its "must be in the past" and its rate limit's
        // minute are the simulation's.
        let polar = FakePolar::default();
        polar
            .clocked(fake_clock)
            .deciding(polar_faults(Dice::new(seed ^ 0x9014_7E12)));
        let polar_server = polar.serve().await;
        // The Kinde and Stripe sources' debits are told to Stripe's meter (the identifiers
        // differ by source), the Polar source's to Polar's ingestion: Stripe's corrections
        // cancel within its window, Polar's compensate (it has no adjustment).
        let meters = ["kinde", "stripe", "polar"]
            .into_iter()
            .map(|source| {
                let meter: Box<dyn shared::providers::meter::Meter> = match source {
                    "polar" => Box::new(
                        shared::providers::standard_webhooks::meter::PolarMeter::new(
                            meter_api(&polar_server),
                            METER,
                        ),
                    ),
                    _ => Box::new(shared::providers::stripe::meter::StripeMeter::new(
                        meter_api(&meter_server),
                        METER,
                    )),
                };
                (source.to_owned(), METER.to_owned(), meter)
            })
            .collect();
        Self {
            seed,
            dice: Dice::new(seed),
            clock,
            queue,
            app,
            worker: Arc::new(worker),
            scheduler,
            other_scheduler,
            feed,
            reads,
            sent: Vec::new(),
            keys: Vec::new(),
            invoice_reads: HashMap::new(),
            shift: stripe_shift(seed),
            periods: HashSet::new(),
            pool,
            admin,
            bugs,
            faults_seen: Arc::default(),
            trace: Vec::new(),
            high: BTreeMap::new(),
            spender: Dice::new(seed ^ 0xDEB1_7000),
            asked: Vec::new(),
            used_high: BTreeMap::new(),
            reverser: Dice::new(seed ^ 0x2E7E_25E0),
            reversed: BTreeMap::new(),
            meter,
            _meter_server: meter_server,
            polar,
            _polar_server: polar_server,
            meters: Arc::new(meters),
            dispatcher: Dice::new(seed ^ 0xD15_9A7C),
            ns: format!("s{seed}x"),
            credits: Vec::new(),
            credit_spender: Dice::new(seed ^ 0xC2ED_17DE),
            credits_clock: order_credits::time(0).timestamp(),
            credit_debits: Vec::new(),
            credit_keys: 0,
            credit_answered: HashMap::new(),
            credits_applied: BTreeSet::new(),
        }
    }

    /// Event `index` as its provider sends it: the order test's payload, with this seed's
    /// Stripe times moved back ([`stripe_shift`]) and an invoice naming its subscription when
    /// the seed has it read ([`invoice_reads`]).
    fn payload(&self, index: usize, event: &Event) -> (&'static str, Value) {
        let (source, mut payload, _) = order::payload(index, event, &self.ns);
        if source == "stripe" {
            payload["created"] = match &payload["created"] {
                // A v2 event's (a notice's) time is RFC 3339.
                Value::String(at) => {
                    let at = chrono::DateTime::parse_from_rfc3339(at).unwrap()
                        - chrono::Duration::seconds(self.shift);
                    json!(at
                        .to_utc()
                        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                }
                created => json!(created.as_i64().unwrap_or_default() - self.shift),
            };
            if let Some(sub) = self.invoice_reads.get(&index) {
                payload["data"]["object"]["subscription"] = json!(sub);
            }
        }
        if let Some(sub) = self.invoice_reads.get(&index) {
            match source {
                "paddle" => payload["data"]["subscription_id"] = json!(sub),
                "lemonsqueezy" => payload["data"]["attributes"]["subscription_id"] = json!(sub),
                _ => {}
            }
        }
        (source, payload)
    }

    fn note(&mut self, line: String) {
        let fed = std::mem::take(&mut self.feed.0.lock().unwrap().trace);
        let read = std::mem::take(&mut self.reads.0.lock().unwrap().trace);
        let metered = (self.meter.take_said().into_iter())
            .chain(self.polar.take_said())
            .map(|line| format!("meter {line}"));
        for queued in self
            .queue
            .take_trace()
            .into_iter()
            .chain(fed)
            .chain(read)
            .chain(metered)
        {
            self.trace
                .push(format!("t+{:>7.1}s   {queued}", self.elapsed_secs()));
        }
        self.trace
            .push(format!("t+{:>7.1}s {line}", self.elapsed_secs()));
    }

    fn elapsed_secs(&self) -> f64 {
        (self.clock.ms() - self.seed as i64 % 1_000 * 86_400_000) as f64 / 1000.0
    }

    fn fail(&self, what: impl Into<String>) -> Failure {
        Failure {
            seed: self.seed,
            what: what.into(),
            trace: self.trace.clone(),
        }
    }

    /// A fault for the next actor run, or none (most runs have none).
    fn pick_fault(&mut self, points: u64, allow_pause: bool) -> Option<Fault> {
        match self.dice.below(100) {
            0..=11 => Some(Fault::Crash(self.dice.below(points) as usize)),
            12..=17 => Some(Fault::Kill(self.dice.below(points) as usize)),
            18..=23 if allow_pause => Some(Fault::Pause(self.dice.below(points) as usize)),
            _ => None,
        }
    }

    /// A plan for an actor with one point (the intake, the rescue): now and then a crash there.
    fn crash_plan(&mut self, faults: bool) -> Arc<Plan> {
        let fault = match faults {
            true => self
                .pick_fault(1, false)
                .filter(|f| matches!(f, Fault::Crash(_))),
            false => None,
        };
        self.plan(fault)
    }

    fn plan(&self, fault: Option<Fault>) -> Arc<Plan> {
        Plan::new(fault, &self.bugs, &self.faults_seen, &self.admin)
    }

    /// Runs `task` with the seed's planted bugs and no fault: the fold and the audit run the
    /// library's code as the worker does, so a bug planted in code they share (a provider's
    /// `decide`) is in both, as it would be in a release.
    async fn with_bugs<T>(&self, task: impl std::future::Future<Output = T>) -> T {
        let interrupts: Arc<dyn Interrupts> = self.plan(None);
        with_interrupts(interrupts, task).await
    }

    /// Runs `task` under `plan`; a crash ends it where it stood.
    async fn run<T>(&self, plan: &Arc<Plan>, task: impl std::future::Future<Output = T>) -> Ran<T> {
        let interrupts: Arc<dyn Interrupts> = plan.clone();
        let task = with_interrupts(interrupts, task);
        tokio::select! {
            out = task => Ran::Done(out),
            _ = plan.crashed.notified() => Ran::Crashed,
        }
    }

    /// Delivers one webhook through the intake; a crash before the answer means the provider
    /// delivers it again later.
    async fn deliver(&mut self, case: &Case, pending: &mut Vec<Item>, faults: bool) {
        let pick = self.dice.below(pending.len() as u64) as usize;
        let item = pending.remove(pick);
        let index = item.index;
        let (source, payload, key) = match item.thin {
            _ if item.credits => {
                let payload = order_credits::payload(index, &self.credits[index], &self.ns);
                let key = payload["id"].as_str().unwrap_or_default().to_owned();
                ("stripe", payload, key)
            }
            true => {
                let twin = self.sent[index] == Sent::ThinAndTwin;
                let event = &case.events[index];
                let payload = thin_payload(index, event, &self.ns, twin, self.shift);
                ("stripe", payload, thin_id(index, &self.ns))
            }
            false => {
                let (source, payload) = self.payload(index, &case.events[index]);
                (source, payload, self.keys[index].clone())
            }
        };
        let delivery = match source {
            "kinde" => kinde_delivery(&key, &payload),
            "polar" => polar_delivery(&key, &payload),
            "paddle" => paddle_delivery(&payload),
            "lemonsqueezy" => lemonsqueezy_delivery(&payload),
            _ => stripe_delivery(&payload),
        };
        let plan = self.crash_plan(faults);
        let answered = self.run(&plan, self.app.post(source, &delivery)).await;
        match answered {
            Ran::Done((status, body)) => {
                self.note(format!(
                    "deliver {key} ({source}) -> {} {}",
                    status.as_u16(),
                    body["status"].as_str().unwrap_or("?")
                ));
            }
            Ran::Crashed => {
                self.note(format!(
                    "deliver {key} ({source}) -> intake died after the store ({}); the provider will retry",
                    plan.hit.lock().unwrap().clone().unwrap_or_default()
                ));
                pending.push(item);
            }
        }
    }

    /// One batch of visible messages through the worker, as the event source mapping hands
    /// it; what the worker reports failed, and everything if it died, comes back later.
    async fn work(&mut self, faults: bool) -> bool {
        let batch = self.queue.receive();
        if batch.is_empty() {
            return false;
        }
        let fault = match faults {
            true => self.pick_fault(6 * batch.len() as u64, true),
            false => None,
        };
        let plan = self.plan(fault);
        let ids: Vec<i64> = batch.iter().map(|(_, e)| *e).collect();
        let event = sqs_event(&batch);
        let worker = self.worker.clone();
        let interrupts: Arc<dyn Interrupts> = plan.clone();
        let task = tokio::spawn(with_interrupts(interrupts, async move {
            handle_batch(&worker, event).await
        }));
        tokio::pin!(task);
        let outcome = tokio::select! {
            out = &mut task => Some(out.unwrap()),
            _ = plan.crashed.notified() => None,
            _ = plan.paused.notified() => {
                // The lease runs out while this worker is stopped; another one takes over. It
                // may wait on a lock the first holds: after a while the first goes on too.
                self.clock.advance(DEFAULT_LEASE.as_millis() as i64 + 1_000);
                let other: Arc<dyn Interrupts> = self.plan(None);
                let worker = self.worker.clone();
                let ids = ids.clone();
                let mut second = tokio::spawn(with_interrupts(other, async move {
                    for id in ids {
                        let _ = shared::handlers::worker::process_event(&worker, id).await;
                    }
                }));
                let second_done =
                    tokio::time::timeout(Duration::from_secs(2), &mut second).await.is_ok();
                plan.release.notify_one();
                let first = tokio::select! {
                    out = &mut task => Some(out.unwrap()),
                    _ = plan.crashed.notified() => None,
                };
                if !second_done {
                    second.await.unwrap();
                }
                first
            }
        };
        let hit = plan.hit.lock().unwrap().clone();
        match outcome {
            Some(response) => {
                let failed: HashSet<String> = response
                    .batch_item_failures
                    .iter()
                    .map(|f| f.item_identifier.clone())
                    .collect();
                let acked: Vec<u64> = batch
                    .iter()
                    .map(|(m, _)| *m)
                    .filter(|m| !failed.contains(&m.to_string()))
                    .collect();
                self.queue.delete(&acked);
                self.note(format!(
                    "worker took {ids:?}: {} acknowledged, {} back to the queue{}",
                    acked.len(),
                    failed.len(),
                    hit.map(|h| format!(" ({h})")).unwrap_or_default()
                ));
            }
            None => {
                task.abort();
                self.note(format!(
                    "worker took {ids:?} and died ({})",
                    hit.unwrap_or_default()
                ));
            }
        }
        true
    }

    /// One scheduler run; it may die between marking rows and sending them.
    async fn schedule(&mut self, faults: bool) {
        let plan = self.crash_plan(faults);
        match self.run(&plan, scheduler::run(&self.scheduler)).await {
            Ran::Done(report) => {
                let found: i32 = report.reconciliation.iter().map(|r| r.stored_new).sum();
                let line = format!(
                    "scheduler: rescued {:?}, reconciliation found {found} new, purged {}{}",
                    report.rescued,
                    report.purged,
                    match report.errors.is_empty() {
                        true => String::new(),
                        false => format!(", errors {:?}", report.errors),
                    }
                );
                self.note(line);
            }
            Ran::Crashed => {
                let hit = plan.hit.lock().unwrap().clone().unwrap_or_default();
                self.note(format!("scheduler died ({hit})"));
            }
        }
    }

    /// Two scheduler runs at once (two invocations overlapping).
    async fn schedule_twice(&mut self) {
        let plan = self.plan(None);
        let both = async {
            tokio::join!(
                scheduler::run(&self.scheduler),
                scheduler::run(&self.other_scheduler)
            )
        };
        if let Ran::Done((a, b)) = self.run(&plan, both).await {
            self.note(format!(
                "two schedulers at once: rescued {:?} and {:?}",
                a.rescued, b.rescued
            ));
        }
    }

    /// An operator replays a finished event.
    async fn replay(&mut self) {
        let finished: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM inbox_events WHERE dedupe_key LIKE '%\\_' || $1 || '%' AND status IN ('applied', 'ignored')
             ORDER BY id",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        if finished.is_empty() {
            return;
        }
        // What the replayed event wrote stays: the credits debits' oracle counts it.
        self.note_credits_applied().await;
        let id = finished[self.dice.below(finished.len() as u64) as usize];
        let plan = self.plan(None);
        let queue = self.scheduler.queue.clone();
        let pool = self.pool.clone();
        let replayed = self
            .run(&plan, async move {
                shared::inbox::replay::replay(&pool, &queue, &[id]).await
            })
            .await;
        if let Ran::Done(result) = replayed {
            self.note(format!("operator replayed {:?}", result.unwrap()));
        }
    }

    /// Balances never go down, and each equals its period's largest grant.
    async fn check_balances(&mut self) -> Result<(), Failure> {
        let rows: Vec<(String, String, String, i64, i64)> = sqlx::query_as(
            "SELECT source, customer_id, period, sum(delta)::bigint, max(allowance)::bigint
             FROM ledger WHERE customer_id LIKE '%\\_' || $1 || '%' GROUP BY 1, 2, 3",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        for (source, customer, period, balance, largest) in rows {
            // A read stands for the event it was made for: the grant it decides is in that
            // event's month, not the month the read was made in (months later, here).
            if !self
                .periods
                .contains(&(source.clone(), customer.clone(), period.clone()))
            {
                return Err(self.fail(format!(
                    "{source}/{customer} {period}: granted {balance} in a month no event of the account happened in"
                )));
            }
            if balance != largest {
                return Err(self.fail(format!(
                    "{source}/{customer} {period}: balance {balance} is not the largest grant {largest}"
                )));
            }
            let key = (source.clone(), customer.clone(), period.clone());
            let high = self.high.get(&key).copied().unwrap_or_default();
            if balance < high {
                return Err(self.fail(format!(
                    "{source}/{customer} {period}: balance went down from {high} to {balance}"
                )));
            }
            self.high.insert(key, balance);
        }
        Ok(())
    }

    /// The app spends: a new debit of one of the customers (some unknown yet, some deleted
    /// later), a retry of an earlier key (its answer was lost, or the app asks again), or an
    /// earlier key with another amount (a conflict). Some answers are lost on the way back.
    async fn spend(&mut self) -> Result<(), Failure> {
        use shared::billing::usage::{self, Debit, DebitRequest};
        let choice = self.spender.below(100);
        let before = self.asked.len();
        let (asked, conflicting) = match choice {
            0..=29 if !self.asked.is_empty() => {
                let pick = self.spender.below(self.asked.len() as u64) as usize;
                (self.asked[pick].clone(), false)
            }
            30..=34 if !self.asked.is_empty() => {
                let pick = self.spender.below(self.asked.len() as u64) as usize;
                let mut other = self.asked[pick].clone();
                other.amount += 1;
                (other, true)
            }
            _ => {
                let sources = ["kinde", "stripe", "polar"];
                let mut source = sources[self.spender.below(3) as usize];
                let mut customer =
                    order::customer_id(self.spender.below(order::CUSTOMERS.into()) as u8, &self.ns);
                let mut period = order::PERIODS[self.spender.below(3) as usize];
                // Most debits go where something was granted, so that many are accepted.
                let granted: Vec<(String, String, String)> = sqlx::query_as(
                    "SELECT DISTINCT source, customer_id, period FROM ledger
                     WHERE customer_id LIKE '%\\_' || $1 || '%' ORDER BY 1, 2, 3",
                )
                .bind(&self.ns)
                .fetch_all(&self.admin)
                .await
                .unwrap();
                if !granted.is_empty() && self.spender.chance(70) {
                    let (s, c, p) = &granted[self.spender.below(granted.len() as u64) as usize];
                    source = sources.into_iter().find(|k| k == s).unwrap_or(source);
                    customer = c.clone();
                    period = order::PERIODS
                        .into_iter()
                        .find(|k| k == p)
                        .unwrap_or(period);
                }
                let asked = Asked {
                    source,
                    customer,
                    key: format!("u{}_{}", self.asked.len(), self.ns),
                    amount: 1 + self.spender.below(80) as i64,
                    period,
                    heard: None,
                };
                self.asked.push(asked.clone());
                (asked, false)
            }
        };
        let customer = shared::domain::CustomerId::parse(&asked.customer).unwrap();
        let worker = self.worker.clone();
        let request = DebitRequest {
            source: asked.source,
            customer: &customer,
            key: &asked.key,
            amount: asked.amount,
            period: usage::DebitPeriod::Named(shared::domain::Period::parse(asked.period).unwrap()),
            note: None,
            effects: Some(&worker.catalog),
            // Every debit is told to the meter (§4.13).
            meter: Some(METER),
            unit: shared::billing::credits::ALLOWANCE_UNIT,
        };
        let fresh = self.asked.len() > before;
        if fresh && self.bugs.contains(&Bug::ReportSentBeforeCommit) {
            return self.spend_reporting_first(&request).await;
        }
        let mut conn = self.pool.acquire().await.unwrap();
        let debited = usage::debit(&mut conn, &request)
            .await
            .map_err(|e| self.fail(format!("debit {}: {e}", asked.key)))?;
        drop(conn);
        let lost = self.spender.chance(10);
        self.note(format!(
            "app debits {} of {}/{} for {} under {}{} -> {:?}{}",
            asked.amount,
            asked.source,
            asked.customer,
            asked.period,
            asked.key,
            if conflicting { " (another amount)" } else { "" },
            debited.debit,
            if lost { " (the answer is lost)" } else { "" }
        ));
        let stored: Option<(bool, i64, i64, i64, String)> = sqlx::query_as(
            "SELECT accepted, amount, used, remaining, usage_id FROM usage_debits
             WHERE source = $1 AND customer_id = $2 AND idempotency_key = $3",
        )
        .bind(asked.source)
        .bind(&asked.customer)
        .bind(&asked.key)
        .fetch_optional(&self.admin)
        .await
        .unwrap();
        let same = |a: &Debit, b: &Debit| match (a, b) {
            (
                Debit::Accepted {
                    usage_id,
                    used,
                    remaining,
                    ..
                },
                Debit::Accepted {
                    usage_id: u2,
                    used: x2,
                    remaining: r2,
                    ..
                },
            ) => usage_id == u2 && used == x2 && remaining == r2,
            (Debit::Exhausted { remaining, .. }, Debit::Exhausted { remaining: r2, .. }) => {
                remaining == r2
            }
            (a, b) => a == b,
        };
        // The stored row is the key's decision: a request like it gets that answer, another
        // one a conflict (the first request decided may have been either).
        match (&debited.debit, &stored) {
            (Debit::KeyConflict, Some((_, amount, ..))) if *amount != asked.amount => {}
            (
                Debit::Accepted {
                    usage_id,
                    used,
                    remaining,
                    ..
                },
                Some((true, amount, u, r, id)),
            ) if *amount == asked.amount && usage_id == id && used == u && remaining == r => {}
            (Debit::Exhausted { remaining, .. }, Some((false, amount, _, r, _)))
                if *amount == asked.amount && remaining == r => {}
            (Debit::UnknownCustomer | Debit::CustomerDeleted, None) => {}
            (answer, stored) => {
                return Err(self.fail(format!(
                    "{} ({}): answered {answer:?} but stored {stored:?}",
                    asked.key, asked.amount
                )))
            }
        }
        let decided = matches!(
            debited.debit,
            Debit::Accepted { .. } | Debit::Exhausted { .. }
        );
        if lost || !decided {
            return Ok(());
        }
        let Some(first) = self.asked.iter_mut().find(|a| a.key == asked.key) else {
            return Ok(());
        };
        match (&first.heard, &debited.debit) {
            (None, answer) => first.heard = Some(answer.clone()),
            (Some(heard), answer) if same(heard, answer) => {}
            (Some(heard), answer) => {
                let what = format!("{}: answered {heard:?}, then {answer:?}", asked.key);
                return Err(self.fail(what));
            }
        }
        Ok(())
    }

    /// `Bug::ReportSentBeforeCommit`: the app debits in a transaction of its own, sends the
    /// accepted debit's report to the meter itself before the commit, and then three times in
    /// ten the transaction fails and rolls back; the app asks again later under a new key.
    async fn spend_reporting_first(
        &mut self,
        request: &shared::billing::usage::DebitRequest<'_>,
    ) -> Result<(), Failure> {
        use shared::billing::usage::{self, Debit};
        let mut tx = self.pool.begin().await.unwrap();
        let debited = usage::debit(&mut tx, request)
            .await
            .map_err(|e| self.fail(format!("debit {}: {e}", request.key)))?;
        if let Debit::Accepted { .. } = debited.debit {
            let report = shared::domain::meter::MeterReport {
                id: shared::domain::meter::report_id(),
                source: request.source.to_owned(),
                customer: request.customer.clone(),
                identifier: shared::domain::meter::identifier(
                    request.source,
                    request.customer,
                    request.key,
                ),
                meter: METER.to_owned(),
                value: request.amount,
                occurred_at: self.clock.now(),
                first_sent_at: None,
                unanswered: false,
                take_back: None,
                send_key: None,
            };
            let meter = self
                .meters
                .each()
                .find(|(source, ..)| *source == request.source);
            let sent = match meter {
                Some((_, _, meter)) => meter.send(&report).await,
                None => shared::providers::meter::Sent::NotTaken("no meter".into()),
            };
            if self.spender.chance(30) {
                drop(tx);
                let retry_key = format!("{}r", request.key);
                if let Some(last) = self.asked.last_mut() {
                    last.key = retry_key;
                }
                self.note(format!(
                    "app sent the report of {} ({sent:?}), then its debit rolled back; it will ask under a new key",
                    request.key
                ));
                return Ok(());
            }
        }
        tx.commit().await.unwrap();
        self.note(format!(
            "app debits {} under {} -> {:?} (its report sent before the commit)",
            request.amount, request.key, debited.debit
        ));
        let decided = matches!(
            debited.debit,
            Debit::Accepted { .. } | Debit::Exhausted { .. }
        );
        if let Some(first) = self.asked.iter_mut().find(|a| a.key == request.key) {
            if decided && first.heard.is_none() {
                first.heard = Some(debited.debit);
            }
        }
        Ok(())
    }

    /// Counts the credits events final now among those the store has applied
    /// ([`World::credits_applied`]); an event leaves a final status only by a replay, which
    /// counts them first.
    async fn note_credits_applied(&mut self) {
        let keys: Vec<String> = (0..self.credits.len())
            .map(|i| credits_key(i, &self.ns))
            .collect();
        let applied: Vec<String> = sqlx::query_scalar(
            "SELECT dedupe_key FROM inbox_events
             WHERE source = 'stripe' AND dedupe_key = ANY($1) AND status IN ('applied', 'ignored')",
        )
        .bind(&keys)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        let now_final = (0..keys.len()).filter(|i| applied.contains(&keys[*i]));
        self.credits_applied.extend(now_final);
    }

    /// The app spends credits (docs/design.md §4.14): a debit of one of the credits customers
    /// in `usd` (Stripe's grants) or in `credits` (the catalog's packs), made at the next second
    /// of the credits events' timeline (the store's clock reads it for the call), so that
    /// debits fall before and after grants are effective, voided and expired, and across
    /// month boundaries, interleaved with the deliveries of the events that make the grants.
    /// Its answer must be what the oracle decides from the credits events the store has
    /// applied at that moment and the debits accepted before it
    /// (`order_credits::oracle::decide`, apart from the fold): accepted with the allocation of
    /// burn order version 1, or refused saying what each grant had left.
    async fn spend_credits(&mut self) -> Result<(), Failure> {
        use order_credits::oracle::{self, AppDebit};
        use shared::billing::usage::{self, Debit, DebitRequest};
        // Past every end, nothing changes any more: no debit is drawn.
        if self.credits_clock > order_credits::time(40).timestamp() {
            return Ok(());
        }
        let unit_secs = order_credits::UNIT_SECS;
        let mut at =
            self.credits_clock + 1 + self.credit_spender.below(3 * unit_secs as u64) as i64;
        // Never on a grant's own second (the events' times are whole units): the debit's
        // crossing is compared before and after it at its second (docs/design.md §9).
        if (at - order_credits::time(0).timestamp()) % unit_secs == 0 {
            at += 1;
        }
        self.credits_clock = at;
        let customer = self.credit_spender.below(order_credits::CUSTOMERS.into()) as u8;
        let (unit, most) = match self.credit_spender.chance(50) {
            true => ("usd", 400),
            false => (credits::ALLOWANCE_UNIT, 300),
        };
        let amount = 1 + self.credit_spender.below(most) as i64;
        let key = format!("c{}_{}", self.credit_keys, self.ns);
        self.credit_keys += 1;
        // What the store knows as the app debits: the credits events applied by now (no other
        // actor runs during the call).
        self.note_credits_applied().await;
        let known: Vec<CreditsEvent> = (self.credits_applied.iter())
            .map(|i| self.credits[*i].clone())
            .collect();
        let customer_id = order_credits::customer_id(customer, &self.ns);
        let id = shared::domain::CustomerId::parse(&customer_id).unwrap();
        let month = chrono::DateTime::from_timestamp(at, 0)
            .unwrap()
            .format("%Y-%m");
        let worker = self.worker.clone();
        let request = DebitRequest {
            source: "stripe",
            customer: &id,
            key: &key,
            amount,
            period: usage::DebitPeriod::Named(
                shared::domain::Period::parse(&month.to_string()).unwrap(),
            ),
            note: None,
            unit,
            effects: Some(&worker.catalog),
            meter: None,
        };
        let mut conn = self.pool.acquire().await.unwrap();
        let offset = (at * 1_000 + 500 - chrono::Utc::now().timestamp_millis()) as f64 / 1_000.0;
        set_clock(&mut conn, offset.to_string()).await.unwrap();
        let debited = usage::debit(&mut conn, &request)
            .await
            .map_err(|e| self.fail(format!("debit {key}: {e}")))?;
        drop(conn);
        let stored: Option<i64> = sqlx::query_scalar(
            "SELECT inbox_secs(recorded_at) FROM usage_debits
             WHERE source = 'stripe' AND customer_id = $1 AND idempotency_key = $2",
        )
        .bind(&customer_id)
        .bind(&key)
        .fetch_optional(&self.admin)
        .await
        .unwrap();
        self.note(format!(
            "app debits {amount} {unit} of stripe/{customer_id} at {} under {key} ({} credits events applied) -> {:?}",
            chrono::DateTime::from_timestamp(at, 0).unwrap().to_rfc3339(),
            known.len(),
            debited.debit
        ));
        // The second the store decided it at (a loaded machine may take the call past `at`).
        let at = stored.unwrap_or(at);
        self.credits_clock = self.credits_clock.max(at);
        let grants = oracle::grants(&known);
        let before: Vec<AppDebit> = (self.credit_debits.iter())
            .filter(|d| d.customer == customer && d.unit == unit)
            .cloned()
            .collect();
        let debit = AppDebit {
            usage_id: String::new(),
            customer,
            unit: unit.to_owned(),
            amount,
            at,
        };
        let decided = oracle::decide(&grants, &before, &debit);
        let ns = format!("_{}", self.ns);
        let plain = |id: &str| id.replace(&ns, "_");
        let whole = |q: &str| Quantity::parse(q).ok();
        let as_quantities = |list: &[(String, i64)]| -> Vec<(String, Option<Quantity>)> {
            list.iter()
                .map(|(id, q)| (id.clone(), Some(Quantity::whole(*q))))
                .collect()
        };
        let right = match (&debited.debit, &decided) {
            (
                Debit::Accepted {
                    usage_id,
                    allocation: Some(a),
                    ..
                },
                Ok(take),
            ) => {
                let answered: Vec<(String, Option<Quantity>)> = (a.from_grants.iter())
                    .map(|g| (plain(&g.grant_id), whole(&g.amount)))
                    .collect();
                let right = a.from_allowance == 0 && answered == as_quantities(take);
                if right {
                    CREDIT_DEBITS_ACCEPTED.fetch_add(1, Ordering::Relaxed);
                    self.credit_answered.insert(usage_id.clone(), take.clone());
                    self.credit_debits.push(AppDebit {
                        usage_id: usage_id.clone(),
                        ..debit
                    });
                }
                right
            }
            (
                Debit::Exhausted {
                    remains: Some(r), ..
                },
                Err(left),
            ) => {
                CREDIT_DEBITS_REFUSED.fetch_add(1, Ordering::Relaxed);
                let answered: Vec<(String, Option<Quantity>)> = (r.grants.iter())
                    .map(|g| (plain(&g.grant_id), whole(&g.remaining)))
                    .collect();
                r.remaining_allowance == 0 && answered == as_quantities(left)
            }
            // No event of the customer applied yet: no account, nothing to spend.
            (Debit::UnknownCustomer, Err(left)) => {
                left.is_empty() && !grants.iter().any(|g| g.customer == customer)
            }
            _ => false,
        };
        if !right {
            return Err(self.fail(format!(
                "{key}: {amount} {unit} of {customer_id} at {at} answered {:?}; from the {} credits events applied and the debits accepted before it, burn order version 1 gives {decided:?}",
                debited.debit,
                known.len()
            )));
        }
        Ok(())
    }

    /// The dispatcher sends one pending meter report of this seed (§4.13) with a short client
    /// timeout; now and then it dies, or every other connection is killed, after the attempt
    /// and before its record: the hold expires and the next attempt resends under the
    /// report's identifier. Now and then, on the app's dice, the app reverses the report's
    /// debit while the dispatcher holds it, between its send and its record.
    async fn dispatch(&mut self, faults: bool) -> Result<bool, Failure> {
        let pending: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM meter_reports
             WHERE customer_id LIKE '%\\_' || $1 || '%' AND status = 'pending' ORDER BY id",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        if pending.is_empty() {
            return Ok(false);
        }
        let id = pending[self.dispatcher.below(pending.len() as u64) as usize].clone();
        let fault = match (faults, self.dispatcher.below(100)) {
            (true, 0..=9) => Some(Fault::Crash(0)),
            (true, 10..=15) => Some(Fault::Kill(0)),
            _ => None,
        };
        let in_flight = match (faults, fault) {
            (true, None) if self.reverser.chance(15) => self.known_debit_of(&id).await,
            _ => None,
        };
        let plan = self.plan(in_flight.as_ref().map(|_| Fault::Pause(0)).or(fault));
        let (pool, meters, sent_id) = (self.pool.clone(), self.meters.clone(), id.clone());
        let send = async move {
            let lease = shared::meters::outbox::SEND_LEASE;
            shared::meters::send(&pool, &meters, &sent_id, lease, &RETRY).await
        };
        let ran = match &in_flight {
            None => self.run(&plan, send).await,
            Some(usage_id) => {
                let interrupts: Arc<dyn Interrupts> = plan.clone();
                let send = with_interrupts(interrupts, send);
                tokio::pin!(send);
                let done = tokio::select! {
                    out = &mut send => Some(out),
                    _ = plan.paused.notified() => None,
                };
                match done {
                    Some(out) => {
                        self.note(format!("dispatcher sent {id}: {out:?}"));
                        self.reverse_debit(usage_id, "after its report's send")
                            .await?;
                        return Ok(true);
                    }
                    None => {
                        self.note(format!("dispatcher sent {id}, its record not yet made"));
                        self.reverse_debit(usage_id, "while its report is in flight")
                            .await?;
                        if self.reverser.chance(50) {
                            self.correct_in_flight(usage_id).await?;
                        }
                        plan.release.notify_one();
                        Ran::Done(send.await)
                    }
                }
            }
        };
        let line = match ran {
            Ran::Done(Ok(reported)) => format!("dispatcher sent {id}: {reported:?}"),
            Ran::Done(Err(error)) => format!(
                "dispatcher sent {id} and could not record it: {error} ({})",
                plan.hit.lock().unwrap().clone().unwrap_or_default()
            ),
            Ran::Crashed => format!(
                "dispatcher sent {id} and died before its record ({})",
                plan.hit.lock().unwrap().clone().unwrap_or_default()
            ),
        };
        self.note(line);
        Ok(true)
    }

    /// Another dispatcher takes the correction of `usage_id` while the report it corrects is
    /// in flight (sent, its record not yet made): the correction waits for it (docs/design.md
    /// §4.13), never sent before the report is settled, nor dead for waiting.
    async fn correct_in_flight(&mut self, usage_id: &str) -> Result<(), Failure> {
        let correction: Option<String> = sqlx::query_scalar(
            "SELECT id FROM meter_reports
             WHERE usage_id = $1 AND kind = 'correction' AND status = 'pending'",
        )
        .bind(usage_id)
        .fetch_optional(&self.admin)
        .await
        .unwrap();
        let Some(id) = correction else {
            return Ok(());
        };
        let lease = shared::meters::outbox::SEND_LEASE;
        let sent = shared::meters::send(&self.pool, &self.meters, &id, lease, &RETRY).await;
        self.note(format!(
            "another dispatcher takes the correction {id} meanwhile: {sent:?}"
        ));
        // Not due yet (a debit reversed before, whose correction waits its retry) is skipped.
        match sent {
            Ok(shared::meters::Reported::Skipped)
            | Ok(shared::meters::Reported::Failed {
                status: shared::meters::outbox::ReportStatus::Pending,
                ..
            }) => Ok(()),
            other => Err(self.fail(format!(
                "the correction {id} was taken while its report was in flight: {other:?}"
            ))),
        }
    }

    /// The debit whose report `report` is, when the app heard it accepted (and so knows its
    /// usage id).
    async fn known_debit_of(&self, report: &str) -> Option<String> {
        let usage_id: Option<String> = sqlx::query_scalar(
            "SELECT usage_id FROM meter_reports WHERE id = $1 AND kind = 'report'",
        )
        .bind(report)
        .fetch_optional(&self.admin)
        .await
        .unwrap();
        usage_id.filter(|id| self.heard_accepted(id).is_some())
    }

    /// The debit the app heard accepted under `usage_id`.
    fn heard_accepted(&self, usage_id: &str) -> Option<&Asked> {
        self.asked.iter().find(|a| {
            matches!(&a.heard, Some(shared::billing::usage::Debit::Accepted { usage_id: u, .. }) if u == usage_id)
        })
    }

    /// The app takes back a debit it was answered accepted (docs/design.md §4.10): one it has
    /// not reversed yet, or one it has (a retry: its answer was lost, or the app asks again).
    async fn reverse(&mut self) -> Result<(), Failure> {
        let known: Vec<String> = self
            .asked
            .iter()
            .filter_map(|a| match &a.heard {
                Some(shared::billing::usage::Debit::Accepted { usage_id, .. }) => {
                    Some(usage_id.clone())
                }
                _ => None,
            })
            .collect();
        let again: Vec<String> = self.reversed.keys().cloned().collect();
        let fresh: Vec<&String> = known
            .iter()
            .filter(|u| !self.reversed.contains_key(*u))
            .collect();
        let usage_id = match self.reverser.below(100) {
            0..=29 if !again.is_empty() => {
                again[self.reverser.below(again.len() as u64) as usize].clone()
            }
            _ if !fresh.is_empty() => {
                fresh[self.reverser.below(fresh.len() as u64) as usize].clone()
            }
            _ => return Ok(()),
        };
        self.reverse_debit(&usage_id, "").await
    }

    /// One reversal as the API makes it (`usage::reverse`, effects on), its answer checked
    /// against what is stored and against the first answer heard; one answer in ten is lost
    /// on the way back. The period's used goes down by the amount once, never below 0.
    async fn reverse_debit(&mut self, usage_id: &str, when: &str) -> Result<(), Failure> {
        use shared::billing::usage::{self, Reversal};
        let Some(asked) = self.heard_accepted(usage_id).cloned() else {
            return Ok(());
        };
        // The debit as it was answered: its key's first request decided may have asked
        // another amount than the one the app sent first (that one was answered "unknown").
        let Some(usage::Debit::Accepted {
            amount: debited,
            period,
            ..
        }) = asked.heard.clone()
        else {
            return Ok(());
        };
        let customer = shared::domain::CustomerId::parse(&asked.customer).unwrap();
        let report: Option<(String, bool)> = sqlx::query_as(
            "SELECT status, first_sent_at IS NOT NULL FROM meter_reports
             WHERE usage_id = $1 AND kind = 'report'",
        )
        .bind(usage_id)
        .fetch_optional(&self.admin)
        .await
        .unwrap();
        let worker = self.worker.clone();
        let mut conn = self.pool.acquire().await.unwrap();
        let account = (asked.source, &customer);
        let catalog = Some(&worker.catalog);
        let reversed = usage::reverse(&mut conn, account, usage_id, catalog, &period)
            .await
            .map_err(|e| self.fail(format!("reversal of {usage_id}: {e}")))?;
        drop(conn);
        let lost = self.reverser.chance(10);
        let before = self.reversed.contains_key(usage_id);
        self.note(format!(
            "app reverses {} ({} of {}/{} for {}){}{}, its report {} -> {:?}{}{}",
            usage_id,
            debited,
            asked.source,
            asked.customer,
            period,
            if when.is_empty() { "" } else { " " },
            when,
            match &report {
                Some((status, true)) => format!("{status} (sent once)"),
                Some((status, false)) => status.clone(),
                None => "none".to_owned(),
            },
            reversed.reversal,
            reversed
                .correction
                .as_ref()
                .map(|c| format!(", correction {c}"))
                .unwrap_or_default(),
            if lost { " (the answer is lost)" } else { "" }
        ));
        let Reversal::Reversed {
            usage_id: answered,
            amount,
            period: reversed_period,
            used,
            remaining,
            reversed_at,
            replayed,
        } = &reversed.reversal
        else {
            return Err(self.fail(format!(
                "{usage_id}, accepted, reversed: {:?}",
                reversed.reversal
            )));
        };
        let stored: (
            Option<chrono::DateTime<chrono::Utc>>,
            Option<i64>,
            Option<i64>,
            i64,
        ) = sqlx::query_as(
            "SELECT d.reversed_at, d.reversed_used, d.reversed_remaining, p.used
             FROM usage_debits d JOIN usage_periods p USING (source, customer_id, period)
             WHERE d.usage_id = $1",
        )
        .bind(usage_id)
        .fetch_one(&self.admin)
        .await
        .unwrap();
        let answer = (Some(*reversed_at), Some(*used), Some(*remaining));
        let right = answered == usage_id
            && *amount == debited
            && reversed_period == &period
            && (stored.0, stored.1, stored.2) == answer
            && *used >= 0
            && *replayed == before
            // Nothing else moved the period since: its used is the answer's.
            && (*replayed || stored.3 == *used);
        if !right {
            return Err(self.fail(format!(
                "{usage_id} ({} for {}, reversed before: {before}): answered {:?}, stored {stored:?}",
                debited, period, reversed.reversal
            )));
        }
        if let Some(Some(Reversal::Reversed {
            used: u,
            remaining: r,
            reversed_at: at,
            ..
        })) = self.reversed.get(usage_id)
        {
            if (u, r, at) != (used, remaining, reversed_at) {
                let first = self.reversed[usage_id].clone();
                return Err(self.fail(format!(
                    "{usage_id}: its reversal answered {first:?}, then {:?}",
                    reversed.reversal
                )));
            }
        }
        REVERSALS.fetch_add(1, Ordering::Relaxed);
        if *replayed {
            REVERSALS_AGAIN.fetch_add(1, Ordering::Relaxed);
        } else {
            // The one decrease the period's used may take: the debit's amount, once.
            let key = (
                asked.source.to_owned(),
                asked.customer.clone(),
                period.as_str().to_owned(),
            );
            *self.used_high.entry(key).or_default() -= amount;
            if report.is_some() && reversed.correction.is_none() {
                REVERSED_WITHDRAWN.fetch_add(1, Ordering::Relaxed);
            }
            if when.starts_with("while") {
                REVERSED_IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
            }
        }
        let heard = self.reversed.entry(usage_id.to_owned()).or_default();
        if !lost && heard.is_none() {
            *heard = Some(reversed.reversal);
        }
        Ok(())
    }

    /// At rest, without faults: every pending report sent, rounds of time moving past holds
    /// and retry waits.
    async fn drain_reports(&mut self) -> Result<(), Failure> {
        self.meter.no_more_faults();
        self.polar.no_more_faults();
        for _ in 0..QUIET_ROUNDS {
            let mut any = false;
            while self.dispatch(false).await? {
                any = true;
                let left: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM meter_reports WHERE customer_id LIKE '%\\_' || $1 || '%'
                       AND status = 'pending'
                       AND (locked_until IS NULL OR locked_until < inbox_now())
                       AND (next_attempt_at IS NULL OR next_attempt_at <= inbox_now())",
                )
                .bind(&self.ns)
                .fetch_one(&self.pool)
                .await
                .unwrap();
                if left == 0 {
                    break;
                }
            }
            if !any {
                return Ok(());
            }
            self.clock.advance(20 * 60_000);
            self.note("time +20 min".into());
        }
        Err(self.fail(format!(
            "meter reports still pending after {QUIET_ROUNDS} rounds of sending"
        )))
    }

    /// At rest, per debit at the fake meter: an accepted debit not reversed has one report,
    /// sent, whose identifier the meter holds once with the debit's customer and amount; a
    /// reversed one's report was either withdrawn (the meter never held it, no correction) or
    /// held once and taken back once by its correction, sent: cancelled by the correction's
    /// adjustment, or compensated by a report of the negative amount under the correction's
    /// identifier. The meter holds and cancels nothing else (no refused or rolled-back debit
    /// is reported), and its net total per customer is the sum of the customer's accepted
    /// debits not reversed. (The credits customers' debits name no meter: they are made on the
    /// credits events' timeline, months before the meters' clock.)
    async fn check_meter_reports(&mut self) -> Result<(), Failure> {
        #[derive(sqlx::FromRow)]
        struct Told {
            source: String,
            customer_id: String,
            idempotency_key: String,
            usage_id: String,
            amount: i64,
            accepted: bool,
            reversed: bool,
            reports: i64,
            identifier: Option<String>,
            status: Option<String>,
            corrections: i64,
            correction: Option<String>,
            correction_status: Option<String>,
            how: Option<String>,
            correction_id: Option<String>,
        }
        let debits: Vec<Told> = sqlx::query_as(
            "SELECT d.source, d.customer_id, d.idempotency_key, d.usage_id, d.amount, d.accepted,
                    d.reversed_at IS NOT NULL AS reversed,
                    (SELECT count(*) FROM meter_reports r
                     WHERE r.usage_id = d.usage_id AND r.kind = 'report') AS reports,
                    r.identifier, r.status,
                    (SELECT count(*) FROM meter_reports c
                     WHERE c.usage_id = d.usage_id AND c.kind = 'correction') AS corrections,
                    c.identifier AS correction, c.status AS correction_status, c.how,
                    c.id AS correction_id
             FROM usage_debits d
             LEFT JOIN meter_reports r ON r.usage_id = d.usage_id AND r.kind = 'report'
             LEFT JOIN meter_reports c ON c.usage_id = d.usage_id AND c.kind = 'correction'
             WHERE d.customer_id LIKE '%\\_' || $1 || '%' AND d.customer_id NOT LIKE 'cus\\_crd%'
             ORDER BY d.seq",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        let (held, cancelled, totals) = match self.at_the_meters() {
            Ok(at) => at,
            Err(what) => return Err(self.fail(what)),
        };
        let mut expected: BTreeMap<String, i64> = BTreeMap::new();
        let mut told: HashSet<String> = HashSet::new();
        let mut taken_back: HashSet<String> = HashSet::new();
        for d in &debits {
            let customer = shared::domain::CustomerId::parse(&d.customer_id).unwrap();
            let identifier =
                shared::domain::meter::identifier(&d.source, &customer, &d.idempotency_key);
            let undo =
                shared::domain::meter::correction_identifier(&d.source, &customer, &d.usage_id);
            let at_meter = |id: &str| (held.get(id), cancelled.get(id));
            let account = format!("{}/{} {}", d.source, d.customer_id, d.idempotency_key);
            if !d.accepted {
                if d.reports + d.corrections != 0 || at_meter(&identifier) != (None, None) {
                    return Err(self.fail(format!(
                        "{account}: refused, yet reported ({} reports; at the meter {:?})",
                        d.reports + d.corrections,
                        at_meter(&identifier)
                    )));
                }
                continue;
            }
            let mine = d.reports == 1 && d.identifier.as_deref() == Some(identifier.as_str());
            let full = (d.customer_id.clone(), d.amount);
            let negative = (d.customer_id.clone(), -d.amount);
            let correction_sent = d.corrections == 1
                && d.correction.as_deref() == Some(undo.as_str())
                && d.correction_status.as_deref() == Some("sent");
            let ok = match (d.reversed, d.status.as_deref()) {
                (false, Some("sent")) => {
                    d.corrections == 0 && at_meter(&identifier) == (Some(&full), None)
                }
                // Withdrawn before it went out: never at the meter, nothing to take back.
                (true, Some("withdrawn")) => {
                    d.corrections == 0 && at_meter(&identifier) == (None, None)
                }
                // Held once, taken back once: cancelled, or compensated.
                (true, Some("sent")) => {
                    // Cancelled by an attempt of the correction: its `Idempotency-Key` is the
                    // correction's id and the attempt's number.
                    let by_correction = cancelled.get(&identifier).is_some_and(|key| {
                        d.correction_id
                            .as_deref()
                            .is_some_and(|id| key.starts_with(&format!("{id}-")))
                    });
                    let cancel = d.how.as_deref() == Some("cancel")
                        && held.get(&identifier) == Some(&full)
                        && by_correction
                        && at_meter(&undo) == (None, None);
                    let compensate = d.how.as_deref() == Some("compensate")
                        && at_meter(&identifier) == (Some(&full), None)
                        && at_meter(&undo) == (Some(&negative), None);
                    correction_sent && (cancel || compensate)
                }
                _ => false,
            };
            if !(mine && ok) {
                return Err(self.fail(format!(
                    "{account} (accepted, {}, reversed: {}): {} report(s), status {:?}; {} correction(s) {:?}, status {:?}, {:?}; the meter holds {:?} and of the correction {:?}",
                    d.amount,
                    d.reversed,
                    d.reports,
                    d.status,
                    d.corrections,
                    d.correction,
                    d.correction_status,
                    d.how,
                    at_meter(&identifier),
                    at_meter(&undo),
                )));
            }
            if !d.reversed {
                *expected.entry(d.customer_id.clone()).or_default() += d.amount;
            }
            told.insert(identifier.clone());
            if d.reversed && d.status.as_deref() == Some("sent") {
                told.insert(undo);
                taken_back.insert(identifier);
            }
        }
        if let Some((identifier, (customer, value))) =
            held.iter().find(|(id, _)| !told.contains(id.as_str()))
        {
            return Err(self.fail(format!(
                "the meter holds {identifier} ({customer}, {value}), the report of no accepted debit"
            )));
        }
        if let Some((identifier, by)) = cancelled.iter().find(|(id, _)| !taken_back.contains(*id)) {
            return Err(self.fail(format!(
                "the meter cancelled {identifier} (by {by}), the report of no reversed debit"
            )));
        }
        // The net total: a customer whose reports were all taken back counts 0, as none.
        let totals: BTreeMap<String, i64> = totals.into_iter().filter(|(_, v)| *v != 0).collect();
        expected.retain(|_, v| *v != 0);
        if totals != expected {
            return Err(self.fail(format!(
                "the meter's net totals {totals:?} are not the accepted, unreversed debits' {expected:?}"
            )));
        }
        METER_HELD.fetch_add(held.len(), Ordering::Relaxed);
        let seen = self.meter.rate_seen();
        STRIPE_REQUESTS.fetch_add(seen.requests as usize, Ordering::Relaxed);
        STRIPE_OVER_LIMIT.fetch_add(seen.over_limit as usize, Ordering::Relaxed);
        METER_CANCELLED.fetch_add(cancelled.len(), Ordering::Relaxed);
        METER_COMPENSATED.fetch_add(
            held.values().filter(|(_, value)| *value < 0).count(),
            Ordering::Relaxed,
        );
        let (stripe_posts, (polar_posts, duplicates)) = (self.meter.posts(), self.polar.ingests());
        let (replayed, repeats) = self.meter.resends();
        METER_SENDS.fetch_add((stripe_posts + polar_posts) as usize, Ordering::Relaxed);
        METER_RESENDS.fetch_add((repeats + duplicates) as usize, Ordering::Relaxed);
        METER_REPLAYED.fetch_add(replayed as usize, Ordering::Relaxed);
        Ok(())
    }

    /// What the meters hold at rest: each identifier Stripe or Polar took with its customer
    /// and value, each identifier an adjustment cancelled with the adjustment's key, and the
    /// net total per customer. An identifier taken twice (Stripe's 24 hours passed between
    /// two sends, a report sent to both) is said, as counted twice.
    #[allow(clippy::type_complexity)]
    fn at_the_meters(
        &self,
    ) -> Result<
        (
            BTreeMap<String, (String, i64)>,
            BTreeMap<String, String>,
            BTreeMap<String, i64>,
        ),
        String,
    > {
        let mut held: BTreeMap<String, (String, i64)> = BTreeMap::new();
        let stripe = self.meter.events().into_iter().map(|e| {
            let value = e.form["payload[value]"].parse::<i64>().unwrap_or_default();
            let customer = e.form["payload[stripe_customer_id]"].clone();
            (e.form["identifier"].clone(), customer, value)
        });
        let polar = self.polar.events().into_iter().map(|e| {
            let id = e["external_id"].as_str().unwrap_or_default().to_owned();
            let customer = e["customer_id"].as_str().unwrap_or_default().to_owned();
            (
                id,
                customer,
                e["metadata"]["value"].as_f64().unwrap_or_default() as i64,
            )
        });
        for (identifier, customer, value) in stripe.chain(polar) {
            if let Some(first) = held.insert(identifier.clone(), (customer, value)) {
                return Err(format!(
                    "the meters took {identifier} twice ({first:?}, then {:?})",
                    held[&identifier]
                ));
            }
        }
        // An event is cancelled once, by the first adjustment that named it; a later one (a
        // cancel sent again after an answer that did not say) takes nothing more back.
        let mut cancelled: BTreeMap<String, String> = BTreeMap::new();
        for adjustment in self.meter.cancels() {
            let identifier = adjustment.form["cancel[identifier]"].clone();
            let key = adjustment.idempotency_key.unwrap_or_default();
            cancelled.entry(identifier).or_insert(key);
        }
        let mut totals: BTreeMap<String, i64> = BTreeMap::new();
        for (id, (customer, value)) in &held {
            if !cancelled.contains_key(id) {
                *totals.entry(customer.clone()).or_default() += value;
            }
        }
        Ok((held, cancelled, totals))
    }

    /// What the app spent: within the allowance at every step (the period's grants; a
    /// deletion afterwards takes the allowance, not what was spent), never below 0, and never
    /// less than before but by the amounts of the debits reversed since.
    async fn check_usage(&mut self) -> Result<(), Failure> {
        let rows: Vec<(String, String, String, i64, i64)> = sqlx::query_as(
            "SELECT u.source, u.customer_id, u.period, u.used,
                    COALESCE((SELECT sum(delta) FROM ledger l
                              WHERE (l.source, l.customer_id, l.period) = (u.source, u.customer_id, u.period)), 0)::bigint
             FROM usage_periods u WHERE u.customer_id LIKE '%\\_' || $1 || '%'
               AND u.customer_id NOT LIKE 'cus\\_crd%'",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        // (The credits customers' debits spend grants past the allowance: `used` counts
        // them, and `check_credit_debit` checks each against the grants.)
        for (source, customer, period, used, granted) in rows {
            if used < 0 {
                return Err(self.fail(format!(
                    "{source}/{customer} {period}: used {used} is below 0"
                )));
            }
            if used > granted {
                return Err(self.fail(format!(
                    "{source}/{customer} {period}: used {used} is past the allowance {granted}"
                )));
            }
            let key = (source.clone(), customer.clone(), period.clone());
            let high = self.used_high.get(&key).copied().unwrap_or_default();
            if used < high {
                return Err(self.fail(format!(
                    "{source}/{customer} {period}: used went down to {used}, below {high} (the highest seen less the debits reversed since)"
                )));
            }
            self.used_high.insert(key, used);
        }
        Ok(())
    }

    /// At rest: each key debited once, each period's used the sum of its accepted debits not
    /// reversed, one exhaustion told per period that ran out, and the same debits spent on
    /// the canonical fold's accounts leave the same used (the state is a function of the
    /// events and the accepted debits not reversed).
    async fn check_usage_at_rest(
        &mut self,
        sources: &shared::audit::Sources,
    ) -> Result<(), Failure> {
        self.check_usage().await?;
        let twice: Vec<String> = sqlx::query_scalar(
            "SELECT idempotency_key FROM usage_debits WHERE customer_id LIKE '%\\_' || $1 || '%'
             GROUP BY source, customer_id, idempotency_key HAVING count(*) > 1",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        if !twice.is_empty() {
            return Err(self.fail(format!("keys debited twice: {twice:?}")));
        }
        let off: Vec<(String, String, String, i64, i64)> = sqlx::query_as(
            "SELECT u.source, u.customer_id, u.period, u.used,
                    COALESCE((SELECT sum(d.amount) FROM usage_debits d
                              WHERE (d.source, d.customer_id, d.period) = (u.source, u.customer_id, u.period)
                                AND d.accepted AND d.reversed_at IS NULL
                                AND d.unit = 'credits'), 0)::bigint AS summed
             FROM usage_periods u WHERE u.customer_id LIKE '%\\_' || $1 || '%'",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        if let Some((source, customer, period, used, summed)) =
            off.iter().find(|(.., used, summed)| used != summed)
        {
            return Err(self.fail(format!(
                "{source}/{customer} {period}: used {used}, accepted debits not reversed sum to {summed}"
            )));
        }
        let told: Vec<(String, String, String, i64)> = sqlx::query_as(
            "SELECT p.source, p.customer_id, p.period,
                    (SELECT count(*) FROM effects f
                     WHERE (f.source, f.customer_id) = (p.source, p.customer_id)
                       AND f.kind = 'billing.allowance_exhausted'
                       AND f.body #>> '{data,period}' = p.period)
             FROM (SELECT DISTINCT source, customer_id, period FROM usage_debits
                   WHERE customer_id LIKE '%\\_' || $1 || '%' AND (NOT accepted OR remaining = 0)) p",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        if let Some((source, customer, period, n)) = told.iter().find(|t| t.3 != 1) {
            return Err(self.fail(format!(
                "{source}/{customer} {period} ran out and was told {n} times"
            )));
        }
        // Each reversed debit told once (`billing.usage_reversed`, §11.1), with the period's
        // used after it and what became of its meter report; no other debit told reversed.
        #[derive(sqlx::FromRow)]
        struct Told {
            usage_id: String,
            reversed: bool,
            told: i64,
            used: Option<i64>,
            told_used: Option<i64>,
            meter_as_it_is: bool,
        }
        let reversals: Vec<Told> = sqlx::query_as(
            "SELECT d.usage_id, d.reversed_at IS NOT NULL AS reversed,
                    (SELECT count(*) FROM effects f
                     WHERE f.kind = 'billing.usage_reversed'
                       AND f.body #>> '{data,usage,usage_id}' = d.usage_id) AS told,
                    d.reversed_used AS used,
                    (SELECT (f.body #>> '{data,account,used}')::bigint FROM effects f
                     WHERE f.kind = 'billing.usage_reversed'
                       AND f.body #>> '{data,usage,usage_id}' = d.usage_id LIMIT 1) AS told_used,
                    COALESCE((SELECT CASE f.body #>> '{data,meter,correction}'
                                     WHEN 'withdrawn' THEN r.status = 'withdrawn'
                                     WHEN 'correcting' THEN c.id = f.body #>> '{data,meter,correction_id}'
                                     ELSE false END
                              FROM effects f
                              WHERE f.kind = 'billing.usage_reversed'
                                AND f.body #>> '{data,usage,usage_id}' = d.usage_id LIMIT 1),
                             d.reversed_at IS NULL) AS meter_as_it_is
             FROM usage_debits d
             LEFT JOIN meter_reports r ON r.usage_id = d.usage_id AND r.kind = 'report'
             LEFT JOIN meter_reports c ON c.usage_id = d.usage_id AND c.kind = 'correction'
             WHERE d.customer_id LIKE '%\\_' || $1 || '%' AND d.accepted",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        if let Some(wrong) = reversals
            .iter()
            .find(|r| r.told != i64::from(r.reversed) || r.used != r.told_used || !r.meter_as_it_is)
        {
            return Err(self.fail(format!(
                "{} (reversed: {}, used after it {:?}) was told reversed {} times, used {:?}, its meter as it is: {}",
                wrong.usage_id, wrong.reversed, wrong.used, wrong.told, wrong.told_used, wrong.meter_as_it_is
            )));
        }
        // The accepted debits not reversed, in the order they were decided, spent on the
        // fold's live accounts: each one fits in the period's allowance the fold gives (a
        // reversed one only left more room to those decided after it). The credits customers'
        // debits spend grants past the allowance; the credits oracle checks them.
        let accepted: Vec<(String, String, String, i64, String)> = sqlx::query_as(
            "SELECT d.source, d.customer_id, d.period, d.amount, d.idempotency_key
             FROM usage_debits d JOIN accounts a USING (source, customer_id)
             WHERE d.customer_id LIKE '%\\_' || $1 || '%' AND d.accepted AND d.reversed_at IS NULL
               AND a.deleted_at IS NULL AND d.customer_id NOT LIKE 'cus\\_crd%'
             ORDER BY d.seq",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        let mut conn = self.pool.acquire().await.unwrap();
        let mut spent: HashMap<(String, String, String), i64> = HashMap::new();
        let mut folds = HashMap::new();
        for (source, customer, period, amount, key) in &accepted {
            let id = shared::domain::CustomerId::parse(customer).unwrap();
            if let std::collections::hash_map::Entry::Vacant(slot) = folds.entry((source, customer))
            {
                let cut = shared::audit::Cut::default();
                let account = (source.as_str(), &id);
                let catalog = &self.worker.catalog;
                let fold = shared::audit::fold_account(&mut conn, sources, catalog, account, cut);
                let fold = self
                    .with_bugs(fold)
                    .await
                    .map_err(|e| self.fail(format!("folding {source}/{customer}: {e}")))?;
                slot.insert(fold);
            }
            let fold = &folds[&(source, customer)];
            let month = shared::domain::Period::parse(period).unwrap();
            let state = fold.folded.state(&id, &month, &self.worker.catalog);
            let used = spent
                .entry((source.clone(), customer.clone(), period.clone()))
                .or_default();
            *used += amount;
            if *used > state.balance {
                return Err(self.fail(format!(
                    "{source}/{customer} {period}: {key} accepted here, but it takes used to {used}, past the fold's allowance {}",
                    state.balance
                )));
            }
        }
        Ok(())
    }

    /// Drives the world to rest without faults: the provider's remaining deliveries, then
    /// rounds of time, the scheduler and the worker until nothing is pending.
    async fn quiesce(&mut self, case: &Case, pending: &mut Vec<Item>) -> Result<(), Failure> {
        self.queue.set_faults(false);
        self.feed.0.lock().unwrap().faults = false;
        self.reads.0.lock().unwrap().faults = false;
        let sent = self.sent_keys().len();
        while !pending.is_empty() {
            self.deliver(case, pending, false).await;
        }
        for _ in 0..QUIET_ROUNDS {
            while self.work(false).await {}
            let left: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM inbox_events
                 WHERE dedupe_key LIKE '%\\_' || $1 || '%' AND status NOT IN ('applied', 'ignored', 'unprocessable', 'dead')",
            )
            .bind(&self.ns)
            .fetch_one(&self.admin)
            .await
            .unwrap();
            // The events sent that are stored: a thin event's read is no event sent.
            let stored: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM inbox_events WHERE dedupe_key LIKE '%\\_' || $1 || '%'
                   AND dedupe_key NOT LIKE 'read:%'",
            )
            .bind(&self.ns)
            .fetch_one(&self.admin)
            .await
            .unwrap();
            let all_found = stored as usize >= sent;
            if left == 0 && self.queue.len() == 0 && all_found {
                return Ok(());
            }
            self.clock.advance(20 * 60_000);
            self.note("time +20 min".into());
            self.schedule(false).await;
        }
        Err(self.fail(format!(
            "stranded: events still pending or never found after {QUIET_ROUNDS} rounds of rescue, reconciliation and work"
        )))
    }

    /// The dedupe keys the provider sends: each change's snapshot event (a twin, for a change
    /// sent thin too) and its thin event.
    fn sent_keys(&self) -> HashSet<String> {
        let mut keys = HashSet::new();
        for (index, sent) in self.sent.iter().enumerate() {
            if *sent != Sent::ThinOnly {
                keys.insert(self.keys[index].clone());
            }
            if *sent != Sent::Snapshot {
                keys.insert(thin_id(index, &self.ns));
            }
        }
        for index in 0..self.credits.len() {
            keys.insert(credits_key(index, &self.ns));
        }
        keys
    }

    /// What Stripe shows of each subscription: its latest change (ties by the case's order),
    /// in the pinned version's shape (basil: the period end on the items); some are deleted
    /// after a few reads. The fake Stripe holds Stripe's; the rest stays in [`SimReads`].
    fn show_provider_state(&mut self, seed: u64, case: &Case) {
        // What the fake Stripe is given to hold, once this state is let go (its decider locks
        // this state while its read side is held).
        let mut stripe_holds: Vec<Value> = Vec::new();
        let mut stripe_lists: Vec<(String, Vec<Value>)> = Vec::new();
        let mut dice = Dice::new(seed ^ 0x6013);
        let mut latest: BTreeMap<String, (u32, usize)> = BTreeMap::new();
        for (index, event) in case.events.iter().enumerate() {
            if let Event::StripeSubscription {
                customer, sub, at, ..
            } = event
            {
                let id = format!("sub{customer}{sub}_{}", self.ns);
                let newer = latest.get(&id).is_none_or(|held| (*at, index) >= *held);
                if newer {
                    latest.insert(id, (*at, index));
                }
            }
        }
        let mut reads = self.reads.0.lock().unwrap();
        for (id, (_, index)) in latest {
            let (_, payload, _) = order::payload(index, &case.events[index], &self.ns);
            let mut object = payload["data"]["object"].clone();
            if let Some(end) = object
                .as_object_mut()
                .and_then(|o| o.remove("current_period_end"))
            {
                object["items"]["data"][0]["current_period_end"] = end;
            }
            if dice.chance(10) {
                reads.gone_after.insert(id.clone(), dice.below(3) as u32);
            }
            if reads.gone_after.get(&id) != Some(&0) {
                stripe_holds.push(object.clone());
            }
            reads.objects.insert(id, object);
        }
        // Paddle's and Lemon Squeezy's subscriptions: the object of each one's latest event.
        let mut latest: BTreeMap<String, (chrono::DateTime<chrono::Utc>, usize, Value)> =
            BTreeMap::new();
        for (index, event) in case.events.iter().enumerate() {
            if !matches!(
                event,
                Event::PaddleSubscription { .. } | Event::LsSubscription { .. }
            ) {
                continue;
            }
            let m = order::materialize(index, event, &self.ns);
            let (_, payload, _) = order::payload(index, event, &self.ns);
            let Some(id) = payload["data"]["id"].as_str() else {
                continue;
            };
            let newer = latest
                .get(id)
                .is_none_or(|held| (m.at, index) >= (held.0, held.1));
            if newer {
                latest.insert(id.to_owned(), (m.at, index, payload["data"].clone()));
            }
        }
        for (id, (_, _, object)) in latest {
            if dice.chance(10) {
                reads.gone_after.insert(id.clone(), dice.below(3) as u32);
            }
            reads.objects.insert(id, object);
        }
        // The subscriptions only invoices name, as Stripe shows them; one in ten unknown (404).
        let mut dice = Dice::new(seed ^ 0x5AB5_1A7E);
        for (index, id) in &self.invoice_reads {
            let customer = match case.events[*index] {
                Event::StripeInvoicePaid { customer, .. } => customer,
                // Paddle's and Lemon Squeezy's, as their own subscription events shape them.
                Event::PaddleTransaction { customer, .. } | Event::LsInvoice { customer, .. } => {
                    let status = dice.below(5) as usize;
                    let shown = match case.events[*index] {
                        Event::PaddleTransaction { .. } => Event::PaddleSubscription {
                            customer,
                            sub: 1,
                            status: ["active", "trialing", "past_due", "paused", "canceled"]
                                [status],
                            price: ["pro", "team", "pri_legacy"][dice.below(3) as usize],
                            ends: dice.below(u64::from(order::ENDS)) as u8,
                            at: 0,
                        },
                        _ => Event::LsSubscription {
                            customer,
                            sub: dice.below(2) as u8,
                            status: ["active", "on_trial", "past_due", "cancelled", "expired"]
                                [status],
                            ends: dice.below(u64::from(order::ENDS)) as u8,
                            at: 0,
                        },
                    };
                    let (_, payload, _) = order::payload(*index, &shown, &self.ns);
                    let mut object = payload["data"].clone();
                    object["id"] = json!(id);
                    reads.objects.insert(id.clone(), object);
                    if dice.chance(10) {
                        reads.gone_after.insert(id.clone(), 0);
                    }
                    continue;
                }
                _ => continue,
            };
            let status =
                ["active", "active", "trialing", "past_due", "canceled"][dice.below(5) as usize];
            let price = ["price_pro", "price_team", "price_legacy"][dice.below(3) as usize];
            let period_end = order::time(0).timestamp() + 30 * 86_400;
            // On a test clock: a list that names no customer leaves it out, as a notice's sweep
            // does (`test_clock`, docs/design.md §6.6). A swept read of it stamped after its
            // invoice and applied before it would give the invoice a plan the fold, in
            // provider order, does not (§4.11, what the fold does not settle): the seeds keep to
            // what it settles.
            let object = json!({"id": id, "object": "subscription",
                   "customer": order::customer_id(customer, &self.ns), "status": status,
                   "cancel_at_period_end": false, "cancel_at": null, "trial_end": null,
                   "ended_at": null, "test_clock": format!("clock_{}", self.ns),
                   "items": {"data": [{"price": {"id": price}, "current_period_end": period_end}]}});
            reads.objects.insert(id.clone(), object.clone());
            if dice.chance(10) {
                reads.gone_after.insert(id.clone(), 0);
            } else {
                stripe_holds.push(object);
            }
        }
        // Each customer's active entitlements: its latest summary's whole list (by time, then
        // the case's order, as the dedupe keys sort); none for a customer Stripe deleted.
        let mut latest: BTreeMap<String, (u32, usize)> = BTreeMap::new();
        for (index, event) in case.events.iter().enumerate() {
            match *event {
                Event::StripeSummary { customer, at, .. } => {
                    let id = order::customer_id(customer, &self.ns);
                    if latest.get(&id).is_none_or(|held| (at, index) >= *held) {
                        latest.insert(id, (at, index));
                    }
                }
                Event::StripeCustomerDeleted { customer, .. } => {
                    let id = order::customer_id(customer, &self.ns);
                    stripe_holds.push(json!({"id": id, "object": "customer", "deleted": true}));
                }
                _ => {}
            }
        }
        for (id, (_, index)) in latest {
            let Event::StripeSummary { customer, keys, .. } = case.events[index] else {
                continue;
            };
            let listed = order::active_entitlements(customer, keys);
            stripe_lists.push((id.clone(), listed.clone()));
            reads.entitlements.insert(id, (index, listed));
        }
        drop(reads);
        for object in stripe_holds {
            self.meter.holds(object);
        }
        for (customer, listed) in stripe_lists {
            self.meter.entitlements_of(None, &customer, listed);
        }
    }

    /// The thin events at rest: none `unprocessable` (the source has a key); each applied by its
    /// read (stored, and finished `applied`) or ignored, because its twin carries the change or
    /// its object is gone; none read its object once its twin was stored (the twin carries the
    /// change: reading too would change the state twice and tell the app twice); and every
    /// subscription whose newest version is a read ends as Stripe shows it (a read stands at
    /// its event's time, so a snapshot event of the same second or later may hold the
    /// register instead).
    async fn check_thin(&mut self) -> Result<(), Failure> {
        #[derive(sqlx::FromRow)]
        struct Thin {
            id: i64,
            key: String,
            status: String,
            reason: Option<String>,
            read_id: Option<i64>,
            read_status: Option<String>,
            read_reason: Option<String>,
            twin_id: Option<i64>,
        }
        let thins: Vec<Thin> = sqlx::query_as(
            "SELECT t.id, t.dedupe_key AS key, t.status, t.reason, r.id AS read_id,
                    r.status AS read_status, r.reason AS read_reason, s.id AS twin_id
             FROM inbox_events t
             LEFT JOIN inbox_events r ON (r.source, r.dedupe_key) = (t.source, 'read:' || t.dedupe_key)
             LEFT JOIN inbox_events s ON (s.source, s.dedupe_key) = (t.source, inbox_payload(t.payload, t.raw_body, t.body_is_payload) ->> 'snapshot_event')
             WHERE t.dedupe_key LIKE '%\\_' || $1 || '%' AND t.type LIKE 'v1.%' ORDER BY t.id",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        for t in &thins {
            let (id, key) = (t.id, &t.key);
            let reason = t.reason.as_deref().unwrap_or_default();
            // With its read, a thin event ends as that snapshot event would (`ignored` when it
            // changes nothing), the read final; without, its twin or a 404 decided it.
            let outcome = match (t.status.as_str(), t.read_status.as_deref()) {
                ("applied" | "ignored", Some("applied" | "ignored")) => Some(&THIN_READ),
                ("ignored", None)
                    if t.twin_id.is_some() && reason.starts_with("its snapshot event ") =>
                {
                    Some(&THIN_TWIN)
                }
                ("ignored", None)
                    if reason.starts_with("the object no longer exists at the provider") =>
                {
                    Some(&THIN_GONE)
                }
                _ => None,
            };
            let fine = outcome.is_some();
            if let Some(counter) = outcome {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            if !fine {
                return Err(self.fail(format!(
                    "thin event {id} ({key}) ended {} ({reason}), its read {:?} ({:?})",
                    t.status, t.read_status, t.read_reason
                )));
            }
            if let (Some(read), Some(twin)) = (t.read_id, t.twin_id) {
                if twin < read {
                    return Err(self.fail(format!(
                        "thin event {id} ({key}) read its object (event {read}) though its snapshot twin (event {twin}) was stored"
                    )));
                }
            }
        }
        let shown: Vec<(String, String, Option<String>)> = sqlx::query_as(
            "SELECT inbox_payload(r.payload, r.raw_body, r.body_is_payload) #>> '{data,object,id}', inbox_payload(r.payload, r.raw_body, r.body_is_payload) #>> '{data,object,status}', s.status
             FROM inbox_events r
             JOIN accounts a ON (a.source, a.customer_id) = (r.source, r.customer_key)
             LEFT JOIN subscriptions s ON (s.source, s.subscription_id) = (r.source, inbox_payload(r.payload, r.raw_body, r.body_is_payload) #>> '{data,object,id}')
             WHERE r.dedupe_key LIKE 'read:%\\_' || $1 || '%' AND r.status = 'applied'
               AND inbox_payload(r.payload, r.raw_body, r.body_is_payload) #>> '{data,object,object}' = 'subscription'
               AND a.deleted_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM inbox_events o
                               WHERE o.source = r.source AND o.dedupe_key NOT LIKE 'read:%'
                                 AND inbox_payload(o.payload, o.raw_body, o.body_is_payload) #>> '{data,object,id}' = inbox_payload(r.payload, r.raw_body, r.body_is_payload) #>> '{data,object,id}'
                                 AND o.occurred_at >= r.occurred_at)",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        // What the seeds cover: invoices' subscription reads (not a sweep's), and reads of a
        // change made 2 s before a month began (each read is made months later, in the run).
        let (invoices, paddle, lemonsqueezy, across): (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE dedupe_key LIKE 'read:%:%'),
                    count(*) FILTER (WHERE dedupe_key LIKE 'read:%:%' AND source = 'paddle'),
                    count(*) FILTER (WHERE dedupe_key LIKE 'read:%:%' AND source = 'lemonsqueezy'),
                    count(*) FILTER (WHERE date_trunc('month', occurred_at + interval '2 seconds')
                                           = occurred_at + interval '2 seconds')
             FROM inbox_events r WHERE dedupe_key LIKE 'read:%\\_' || $1 || '%' AND status = 'applied'
               AND NOT EXISTS (SELECT 1 FROM inbox_events n WHERE n.id = r.made_for
                               AND n.type LIKE 'v2.core.health.%')",
        )
        .bind(&self.ns)
        .fetch_one(&self.admin)
        .await
        .unwrap();
        // Of the subscriptions the notices swept, those whose register already showed what
        // Stripe lists (stored as reads all the same, docs/design.md §6.2).
        let (listed, matched): (i64, i64) = sqlx::query_as(
            "SELECT COALESCE(sum(h.listed), 0)::bigint,
                    COALESCE(sum(h.listed - h.differing), 0)::bigint
             FROM health_sweeps h JOIN inbox_events n ON n.id = h.event_id
             WHERE n.dedupe_key LIKE '%\\_' || $1",
        )
        .bind(&self.ns)
        .fetch_one(&self.admin)
        .await
        .unwrap();
        SWEPT.fetch_add(listed as usize, Ordering::Relaxed);
        SWEPT_MATCHING.fetch_add(matched as usize, Ordering::Relaxed);
        INVOICE_READS.fetch_add(invoices as usize, Ordering::Relaxed);
        PADDLE_READS.fetch_add(paddle as usize, Ordering::Relaxed);
        LEMONSQUEEZY_READS.fetch_add(lemonsqueezy as usize, Ordering::Relaxed);
        READS_ACROSS_A_MONTH.fetch_add(across as usize, Ordering::Relaxed);
        if let Some((sub, read, held)) = shown
            .iter()
            .find(|(_, read, held)| held.as_ref() != Some(read))
        {
            return Err(self.fail(format!(
                "{sub}: Stripe shows it {read}, the register holds {held:?}"
            )));
        }
        Ok(())
    }

    /// Effects told each change once, whatever the faults: one grant effect per ledger
    /// entry that added to a balance, one deletion effect per deleted account, each
    /// account's effects numbered 1..n without a gap, and an app that follows the plan
    /// changes in sequence order ends on the account's plan, and one that follows the features
    /// changes (from the free plan's) on its features.
    /// The credits at rest: each grant's balances, read as the app reads them
    /// (`credits_read::read`, at a time before any void or expiry and once every end has
    /// passed), are what Stripe's ledger and the catalog's pack rule give the seed's credits
    /// events (`order_credits::expected`, computed apart from the fold); and what the credits
    /// tell is what the same events tell applied once each in provider-time order, every
    /// credits effect written with the body the complete set gives its id.
    async fn check_credits(&mut self) -> Result<(), Failure> {
        let canon = format!("k{}y", self.seed);
        let mut reference: Vec<_> = (self.credits.iter().enumerate())
            .map(|(i, e)| order::stripe_materialized(&order_credits::payload(i, e, &canon)))
            .collect();
        reference.sort_by(|a, b| (a.at, &a.dedupe_key).cmp(&(b.at, &b.dedupe_key)));
        // Applied as a task of its own, as the worker's batches are, under the seed's bugs.
        let (pool, worker) = (self.pool.clone(), self.worker.clone());
        let interrupts: Arc<dyn Interrupts> = self.plan(None);
        let applied = tokio::spawn(with_interrupts(interrupts, async move {
            for m in &reference {
                let id = order::store(&pool, m).await;
                order::process(&worker, id).await?;
            }
            Ok::<_, proptest::test_runner::TestCaseError>(())
        }));
        if let Err(e) = applied.await.unwrap() {
            return Err(self.fail(format!("the credits reference did not apply: {e}")));
        }
        let mut found = BTreeMap::new();
        let mut told = [BTreeSet::new(), BTreeSet::new()];
        let levels = self.worker.catalog.credits_low_of("free");
        let low = credits::low_levels(&levels);
        // Per customer and unit (in that order): each accepted debit's allocation as the store
        // derives it, and the low and depleted crossings the credits tell.
        type Allocated = (String, Vec<(String, Quantity)>, Quantity);
        type Crossed = (String, Option<Quantity>, i64, Quantity);
        let mut derived: Vec<Allocated> = Vec::new();
        let mut crossed: Vec<Crossed> = Vec::new();
        let units = ["usd", credits::ALLOWANCE_UNIT];
        for (n, ns) in [&self.ns, &canon].into_iter().enumerate() {
            for customer in 0..order_credits::CUSTOMERS {
                let id =
                    shared::domain::CustomerId::parse(&order_credits::customer_id(customer, ns))
                        .unwrap();
                let mut conn = self.pool.acquire().await.unwrap();
                let mid = order_credits::time(order_credits::MID);
                let end = order_credits::time(60);
                let read = shared::billing::credits_read::read(&mut conn, "stripe", &id, Some(mid));
                let Some(at_mid) = self.with_bugs(read).await.unwrap() else {
                    continue;
                };
                let read = shared::billing::credits_read::read(&mut conn, "stripe", &id, Some(end));
                let at_end = self.with_bugs(read).await.unwrap().unwrap();
                // The fold's balances, with the seed's bugs as the read's own fold has them.
                let (at_mid_balances, at_end_balances) = self
                    .with_bugs(async {
                        let mid = at_mid.credits.balances_at(mid.timestamp());
                        (mid, at_end.credits.balances_at(end.timestamp()))
                    })
                    .await;
                let available: BTreeMap<String, Quantity> = (at_mid_balances.into_iter())
                    .map(|b| (b.grant.grant_id.clone(), b.available()))
                    .collect();
                for b in at_end_balances {
                    if n == 0 {
                        let grant = b.grant.grant_id.replace(&format!("_{ns}"), "_");
                        let sums = [b.granted, b.used, b.expired, b.remaining];
                        found.insert(grant, (sums, available[&b.grant.grant_id]));
                    }
                }
                let suffix = format!("_{ns}");
                if n == 0 {
                    for unit in units {
                        let allocations =
                            shared::billing::usage::allocations(&mut conn, ("stripe", &id), unit);
                        let allocations = self
                            .with_bugs(allocations)
                            .await
                            .map_err(|e| self.fail(format!("allocations of {id}: {e}")))?;
                        derived.extend(allocations.into_iter().map(|a| {
                            let from = (a.allocation.from_grants.into_iter())
                                .map(|(g, q)| (g.replace(&suffix, "_"), q))
                                .collect();
                            (a.usage_id, from, a.unfunded)
                        }));
                        let thresholds = credits::watched(unit, &low);
                        let crossings = self
                            .with_bugs(async {
                                at_end.credits.crossings(unit, &thresholds, end.timestamp())
                            })
                            .await;
                        crossed.extend(crossings.into_iter().map(|x| {
                            let level = match x.threshold {
                                credits::Threshold::Low(level) => Some(level),
                                credits::Threshold::Depleted => None,
                            };
                            (x.unit, level, x.at, x.available)
                        }));
                    }
                }
                let account = ("stripe", id.as_str());
                let effects = self
                    .with_bugs(async {
                        credits::told(account, &at_end.credits, &low, end.timestamp())
                    })
                    .await;
                for e in effects {
                    let body = e.body.to_string().replace(&format!("_{ns}"), "_");
                    let mut body: Value = serde_json::from_str(&body).unwrap();
                    body.as_object_mut().unwrap().remove("id");
                    if n == 0 {
                        let written = order_credits::told_of(&self.admin, ns).await;
                        if let Some((kind, before)) = written.get(&e.id) {
                            if kind != e.kind.as_str() || *before != body {
                                return Err(self.fail(format!(
                                    "credits effect {} written as {kind} {before}, the complete set tells {} {body}",
                                    e.id,
                                    e.kind.as_str()
                                )));
                            }
                        }
                    }
                    // The canonical order applies the events alone; the app's debits move the
                    // crossings, which the oracle checks below.
                    let crossing = matches!(
                        e.kind.as_str(),
                        "billing.credits_low" | "billing.credits_depleted"
                    );
                    if !crossing {
                        told[n].insert(format!("{} {body}", e.kind.as_str()));
                    }
                }
            }
        }
        // The oracle: the grants the events make, the app's accepted debits spent on them in
        // burn order version 1, computed apart from the fold. Without the debits it is the
        // order property's `expected`, which checks the oracle itself.
        let grants = order_credits::oracle::grants(&self.credits);
        let ledger_only = order_credits::oracle::balances(&grants, &[]);
        if ledger_only != order_credits::expected(&self.credits) {
            return Err(self.fail(format!(
                "the credits oracle gives {ledger_only:?} without debits, order_credits::expected {:?}",
                order_credits::expected(&self.credits)
            )));
        }
        let expected: BTreeMap<String, ([Quantity; 4], Quantity)> =
            order_credits::oracle::balances(&grants, &self.credit_debits)
                .into_iter()
                .map(|(id, (sums, mid))| (id, (sums.map(Quantity::whole), Quantity::whole(mid))))
                .collect();
        if found != expected {
            return Err(self.fail(format!(
                "credits balances {found:?}, Stripe's ledger, the pack rule and the app's debits in burn order give {expected:?}"
            )));
        }
        let mut oracle_derived: Vec<Allocated> = Vec::new();
        let mut oracle_crossed: Vec<Crossed> = Vec::new();
        let low_oracle: BTreeMap<String, i64> =
            levels.iter().map(|(u, l)| (u.clone(), *l)).collect();
        for customer in 0..order_credits::CUSTOMERS {
            for unit in units {
                let debits: Vec<_> = (self.credit_debits.iter())
                    .filter(|d| d.customer == customer && d.unit == unit)
                    .cloned()
                    .collect();
                for t in order_credits::oracle::derive(&grants, &debits) {
                    if self.credit_answered.get(&t.usage_id) != Some(&t.from_grants) {
                        CREDIT_DEBITS_MOVED.fetch_add(1, Ordering::Relaxed);
                    }
                    if t.unfunded > 0 {
                        CREDIT_DEBITS_UNFUNDED.fetch_add(1, Ordering::Relaxed);
                    }
                    let from = (t.from_grants.into_iter())
                        .map(|(g, q)| (g, Quantity::whole(q)))
                        .collect();
                    oracle_derived.push((t.usage_id, from, Quantity::whole(t.unfunded)));
                }
            }
            let end = order_credits::time(60).timestamp();
            let crossings = order_credits::oracle::crossings(
                &grants,
                &self.credit_debits,
                customer,
                &low_oracle,
                end,
            );
            // In the store's order: by unit as asked (usd, then credits), then by time.
            for unit in units {
                oracle_crossed.extend(crossings.iter().filter(|x| x.0 == unit).map(
                    |(unit, level, at, available)| {
                        let level = level.map(Quantity::whole);
                        (unit.clone(), level, *at, Quantity::whole(*available))
                    },
                ));
            }
        }
        if derived != oracle_derived {
            return Err(self.fail(format!(
                "the debits' allocations are derived as {derived:?}; from the events and the accepted debits, burn order version 1 gives {oracle_derived:?}"
            )));
        }
        if crossed != oracle_crossed {
            return Err(self.fail(format!(
                "the credits cross {crossed:?}; the oracle's balances cross {oracle_crossed:?}"
            )));
        }
        CREDIT_CROSSINGS.fetch_add(crossed.len(), Ordering::Relaxed);
        if told[0] != told[1] {
            return Err(self.fail(format!(
                "the credits tell {:?} here, {:?} applied once in provider-time order",
                told[0], told[1]
            )));
        }
        CREDITS_EVENTS.fetch_add(self.credits.len(), Ordering::Relaxed);
        CREDITS_GRANTS.fetch_add(found.len(), Ordering::Relaxed);
        Ok(())
    }

    async fn check_effects(&mut self) -> Result<(), Failure> {
        let grants: Vec<(String, i64)> = sqlx::query_as(
            "SELECT l.entry_key, (SELECT count(*) FROM effects f
                                  WHERE f.kind = 'billing.allowance_granted'
                                    AND f.cause = 'ledger ' || l.entry_key)
             FROM ledger l WHERE l.customer_id LIKE '%\\_' || $1 || '%' AND l.delta > 0",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        if let Some((key, n)) = grants.iter().find(|(_, n)| *n != 1) {
            return Err(self.fail(format!("grant {key} has {n} effects")));
        }
        #[derive(sqlx::FromRow)]
        struct Told {
            source: String,
            customer: String,
            deleted: bool,
            seq: i64,
            count: i64,
            deletions: i64,
            told_plan: Option<String>,
            told_features: Option<Value>,
        }
        let accounts: Vec<Told> = sqlx::query_as(
            "SELECT a.source, a.customer_id AS customer, a.deleted_at IS NOT NULL AS deleted,
                    a.effect_seq AS seq,
                    (SELECT count(*) FROM effects f WHERE (f.source, f.customer_id) = (a.source, a.customer_id)) AS count,
                    (SELECT count(*) FROM effects f WHERE (f.source, f.customer_id) = (a.source, a.customer_id)
                       AND f.kind = 'billing.customer_deleted') AS deletions,
                    (SELECT f.body #>> '{data,plan}' FROM effects f
                     WHERE (f.source, f.customer_id) = (a.source, a.customer_id)
                       AND f.kind = 'billing.plan_changed' ORDER BY f.sequence DESC LIMIT 1) AS told_plan,
                    (SELECT f.body #> '{data,features}' FROM effects f
                     WHERE (f.source, f.customer_id) = (a.source, a.customer_id)
                       AND f.kind = 'billing.features_changed' ORDER BY f.sequence DESC LIMIT 1) AS told_features
             FROM accounts a WHERE a.customer_id LIKE '%\\_' || $1 || '%'",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        let period = shared::domain::Period::parse("2026-01").unwrap();
        for Told {
            source,
            customer,
            deleted,
            seq,
            count,
            deletions,
            told_plan,
            told_features,
        } in accounts
        {
            if seq != count {
                return Err(self.fail(format!(
                    "{source}/{customer}: {count} effects numbered up to {seq}"
                )));
            }
            if deletions != i64::from(deleted) {
                return Err(self.fail(format!(
                    "{source}/{customer}: deleted {deleted}, {deletions} deletion effects"
                )));
            }
            let mut conn = self.pool.acquire().await.unwrap();
            let id = shared::domain::CustomerId::parse(&customer).unwrap();
            let now = shared::billing::account::state(
                &mut conn,
                &source,
                &id,
                &period,
                &self.worker.catalog,
            )
            .await
            .unwrap();
            let told = told_plan.unwrap_or_else(|| shared::billing::FREE.to_owned());
            if told != now.plan {
                return Err(self.fail(format!(
                    "{source}/{customer} is on {} but its last plan effect says {told}",
                    now.plan
                )));
            }
            let free = || json!(self.worker.catalog.features_of(shared::billing::FREE));
            let told = told_features.unwrap_or_else(free);
            if told != json!(now.features) {
                return Err(self.fail(format!(
                    "{source}/{customer} has the features {} but its last features effect says {told}",
                    json!(now.features)
                )));
            }
        }
        Ok(())
    }

    /// Each live Stripe customer's summary register at rest holds the whole list of its latest
    /// summary (by time, then dedupe key) as Stripe lists it (docs/design.md §4.12), whichever
    /// of its summaries said `has_more`: a read shows the list as it is at the read, the latest.
    /// The fold takes the stored events as they are, so it would agree with a worker whose
    /// `decide` applied a partial list: only the provider's list tells.
    async fn check_summary_registers(&mut self) -> Result<(), Failure> {
        use shared::providers::stripe::entitlements::GRANT;
        let held: Vec<(String, Option<bool>, Option<Value>)> = sqlx::query_as(
            "SELECT a.customer_id, x.active, x.features
             FROM accounts a
             LEFT JOIN entitlements x
                    ON (x.source, x.customer_id, x.grant_id) = (a.source, a.customer_id, $2)
             WHERE a.source = 'stripe' AND a.customer_id LIKE '%\\_' || $1 || '%'
               AND a.deleted_at IS NULL
             ORDER BY 1",
        )
        .bind(&self.ns)
        .bind(GRANT)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        let listed = self.reads.0.lock().unwrap().entitlements.clone();
        let register =
            |active: bool, features: Value| json!({"active": active, "features": features});
        for (customer, active, features) in held {
            let holds = active.zip(features).map(|(a, f)| register(a, f));
            let (shown, latest) = match listed.get(&customer) {
                Some((index, entitlements)) => {
                    let keys = entitlements.iter().filter_map(|e| e["lookup_key"].as_str());
                    let flags = keys.map(|k| (k.to_owned(), json!(true))).collect();
                    let summary = format!("e{index:02}_{}", self.ns);
                    (Some(register(true, Value::Object(flags))), summary)
                }
                None => (None, "none".to_owned()),
            };
            if holds != shown {
                return Err(self.fail(format!(
                    "stripe/{customer}: the summary register holds {}, but Stripe shows {} (its latest summary: {latest})",
                    json!(holds),
                    json!(shown)
                )));
            }
        }
        Ok(())
    }

    /// Every Stripe summary that said `has_more` was settled by its read at rest: applied as
    /// the complete list read (the read's own row final), or unprocessable because Stripe no
    /// longer knows its customer (alerted; the features stay); never applied as it came
    /// (docs/design.md §6.2).
    async fn check_summaries(&mut self) -> Result<(), Failure> {
        use shared::providers::stripe::entitlements::SUMMARY_TYPE;
        #[derive(sqlx::FromRow)]
        struct Summary {
            id: i64,
            key: String,
            status: String,
            reason: Option<String>,
            has_more: bool,
            read: Option<String>,
        }
        let summaries: Vec<Summary> = sqlx::query_as(
            "SELECT e.id, e.dedupe_key AS key, e.status, e.reason,
                    COALESCE(inbox_payload(e.payload, e.raw_body, e.body_is_payload) #> '{data,object,entitlements,has_more}' = 'true', false) AS has_more,
                    r.status AS read
             FROM inbox_events e
             LEFT JOIN inbox_events r ON (r.source, r.dedupe_key) = (e.source, 'read:' || e.dedupe_key)
             WHERE e.dedupe_key LIKE '%\\_' || $1 || '%' AND e.dedupe_key NOT LIKE 'read:%'
               AND e.type = $2
             ORDER BY e.id",
        )
        .bind(&self.ns)
        .bind(SUMMARY_TYPE)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        for summary in &summaries {
            let Summary {
                id,
                key,
                status,
                reason,
                has_more,
                read,
            } = summary;
            let reason = reason.as_deref().unwrap_or_default();
            let counter = match (has_more, status.as_str(), read.as_deref()) {
                (false, ..) => &SUMMARIES_WHOLE,
                (true, "applied" | "ignored", Some("applied" | "ignored")) => &SUMMARIES_READ,
                (true, "unprocessable", None)
                    if reason.starts_with("Stripe does not find the customer's active entitlements") =>
                {
                    &SUMMARIES_GONE
                }
                (true, ..) => {
                    return Err(self.fail(format!(
                        "summary {id} ({key}) said has_more and ended {status} ({reason}), its read {read:?}: only the complete list read is applied"
                    )))
                }
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let grants: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM inbox_events
             WHERE dedupe_key LIKE '%\\_' || $1 || '%' AND type LIKE 'benefit\\_grant.%'",
        )
        .bind(&self.ns)
        .fetch_one(&self.admin)
        .await
        .unwrap();
        GRANT_EVENTS.fetch_add(grants as usize, Ordering::Relaxed);
        Ok(())
    }

    async fn check_at_rest(&mut self) -> Result<(), Failure> {
        let rows: Vec<(i64, String, String, i32, i64)> = sqlx::query_as(
            "SELECT e.id, e.dedupe_key, e.status, e.seen_count,
                    (SELECT count(*) FROM deliveries d WHERE d.event_id = e.id)
             FROM inbox_events e WHERE e.dedupe_key LIKE '%\\_' || $1 || '%' ORDER BY e.id",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        for (id, key, status, seen, deliveries) in &rows {
            if !["applied", "ignored", "unprocessable"].contains(&status.as_str()) {
                return Err(self.fail(format!("event {id} ({key}) ended {status}")));
            }
            if i64::from(*seen) != *deliveries {
                return Err(self.fail(format!(
                    "event {id} ({key}) counts {seen} copies but has {deliveries} deliveries"
                )));
            }
        }
        // One row per event sent, and besides them only the reads made for them (a thin
        // event's object, `read:<its key>`; an invoice's subscription, `read:<its key>:<id>`).
        let keys: HashSet<&str> = rows.iter().map(|r| r.1.as_str()).collect();
        let sent = self.sent_keys();
        let extra = keys.iter().any(|k| match k.strip_prefix("read:") {
            Some(read) => !sent.iter().any(|k| {
                read.strip_prefix(k.as_str())
                    .is_some_and(|id| id.is_empty() || id.starts_with(':'))
            }),
            None => !sent.contains(*k),
        });
        if extra || keys.len() != rows.len() || sent.iter().any(|k| !keys.contains(k.as_str())) {
            let mut stored: Vec<&str> = keys.into_iter().collect();
            stored.sort_unstable();
            return Err(self.fail(format!(
                "{} events were sent, {} rows stored: {stored:?}",
                sent.len(),
                rows.len(),
            )));
        }
        // Every event's work row says what its status says (docs/design.md §3.4): a row for
        // each event in flight or given up, with its stage, none for a finished one.
        let out_of_step: Vec<i64> = sqlx::query_scalar(
            "SELECT COALESCE(e.id, w.event_id)
             FROM (SELECT * FROM inbox_events
                   WHERE dedupe_key LIKE '%\\_' || $1 || '%' AND inbox_stage(status) IS NOT NULL) e
             FULL JOIN (SELECT w.* FROM inbox_work w JOIN inbox_events x
                          ON x.id = w.event_id AND x.month = w.month
                        WHERE x.dedupe_key LIKE '%\\_' || $1 || '%') w
               ON w.event_id = e.id AND w.month = e.month
             WHERE e.id IS NULL OR w.event_id IS NULL OR w.stage <> inbox_stage(e.status)
                OR w.alerted <> (e.alerted_at IS NOT NULL)",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        if !out_of_step.is_empty() {
            return Err(self.fail(format!(
                "events whose work row is not what their status says: {out_of_step:?}"
            )));
        }
        self.check_thin().await?;
        self.check_balances().await?;
        let doubled: Vec<String> = sqlx::query_scalar(
            "SELECT entry_key FROM ledger WHERE customer_id LIKE '%\\_' || $1 || '%'
             GROUP BY entry_key HAVING count(*) > 1",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        if !doubled.is_empty() {
            return Err(self.fail(format!("ledger entries written twice: {doubled:?}")));
        }
        self.check_effects().await?;
        self.check_summary_registers().await?;
        self.check_summaries().await?;

        // The canonical state: the library's fold of each account's kept events, each once,
        // in provider order, a thin event's stored read as the event (docs/design.md §4.11);
        // the audit compares it with every register, the ledger and the used of each period.
        let accounts: Vec<(String, String)> = sqlx::query_as(
            "SELECT source, customer_id FROM accounts WHERE customer_id LIKE '%\\_' || $1 || '%'
             ORDER BY 1, 2",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        let sources = crate::helpers::audit_sources(&self.worker);
        let mut conn = self.pool.acquire().await.unwrap();
        for (source, customer) in &accounts {
            let id = shared::domain::CustomerId::parse(customer).unwrap();
            let account = (source.as_str(), &id);
            let audit =
                shared::audit::audit_account(&mut conn, &sources, &self.worker.catalog, account);
            let audited = self.with_bugs(audit).await;
            match audited {
                Ok(shared::audit::Audited::Checked(found)) if found.is_empty() => {}
                other => {
                    let mut what = format!(
                        "the billing state of {source}/{customer} is not the fold of its events\n"
                    );
                    let _ = write!(what, "  {other:?}");
                    return Err(self.fail(what));
                }
            }
            // The account's features as the app reads them (the snapshot's statement) are
            // the fold's: its plan's in the catalog joined with its active grants' (§4.12).
            let catalog = &self.worker.catalog;
            let period = shared::domain::Period::parse(order::PERIODS[0]).unwrap();
            let read = shared::billing::account::snapshot(&mut conn, source, &id, &period, catalog)
                .await
                .unwrap()
                .map(|s| s.features);
            let cut = shared::audit::Cut::default();
            let fold = shared::audit::fold_account(&mut conn, &sources, catalog, account, cut);
            let folded = self
                .with_bugs(fold)
                .await
                .map_err(|e| self.fail(format!("folding {source}/{customer}: {e}")))?
                .folded
                .state(&id, &period, catalog)
                .features;
            if read.as_ref() != Some(&folded) {
                return Err(self.fail(format!(
                    "{source}/{customer} has the features {} but the fold of its events gives {}",
                    json!(read),
                    json!(folded)
                )));
            }
        }
        drop(conn);
        self.check_usage_at_rest(&sources).await
    }
}

impl World {
    /// Past the retention: the seed's events aged 40 days and purged as the scheduler purges
    /// them (30 days, docs/design.md §3.9), every account's registers are still the fold of
    /// what is kept: the purge keeps each read while the event it was made for is kept (a Lemon
    /// Squeezy invoice's or a Paddle renewal's subscription read, a thin event's object, a
    /// sweep's), and each event a register, a grant, an intent or a tombstone names.
    async fn check_after_the_retention(&mut self) -> Result<(), Failure> {
        sqlx::query(
            "UPDATE inbox_events SET received_at = received_at - interval '40 days'
             WHERE dedupe_key LIKE '%\\_' || $1 || '%'",
        )
        .bind(&self.ns)
        .execute(&self.admin)
        .await
        .unwrap();
        // Each read and the event it was made for, before the purge.
        let made: Vec<(i64, String, i64)> = sqlx::query_as(
            "SELECT id, dedupe_key, made_for FROM inbox_events
             WHERE dedupe_key LIKE 'read:%\\_' || $1 || '%' AND made_for IS NOT NULL",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        let retention = Duration::from_secs(30 * 86_400);
        let deadline = Instant::now() + Duration::from_secs(60);
        let purged = shared::inbox::purge::purge(&self.pool, retention, deadline)
            .await
            .map_err(|e| self.fail(format!("purging: {e:#}")))?;
        // A read is kept as long as the event it was made for.
        let ids: Vec<i64> = made.iter().flat_map(|(read, _, by)| [*read, *by]).collect();
        let kept: HashSet<i64> =
            sqlx::query_scalar::<_, i64>("SELECT id FROM inbox_events WHERE id = ANY($1)")
                .bind(&ids)
                .fetch_all(&self.admin)
                .await
                .unwrap()
                .into_iter()
                .collect();
        if let Some((read, key, by)) = made
            .iter()
            .find(|(read, _, by)| kept.contains(by) && !kept.contains(read))
        {
            return Err(self.fail(format!(
                "the purge took read {read} ({key}) while event {by}, which it was made for, is kept"
            )));
        }
        let (reads, lemonsqueezy): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE source = 'lemonsqueezy')
             FROM inbox_events WHERE dedupe_key LIKE 'read:%\\_' || $1 || '%'",
        )
        .bind(&self.ns)
        .fetch_one(&self.admin)
        .await
        .unwrap();
        READS_KEPT.fetch_add(reads as usize, Ordering::Relaxed);
        LEMONSQUEEZY_READS_KEPT.fetch_add(lemonsqueezy as usize, Ordering::Relaxed);
        self.note(format!(
            "40 days later: purged {purged} events, {reads} reads kept ({lemonsqueezy} Lemon Squeezy)"
        ));
        let accounts: Vec<(String, String)> = sqlx::query_as(
            "SELECT source, customer_id FROM accounts WHERE customer_id LIKE '%\\_' || $1 || '%'
             ORDER BY 1, 2",
        )
        .bind(&self.ns)
        .fetch_all(&self.admin)
        .await
        .unwrap();
        let sources = crate::helpers::audit_sources(&self.worker);
        let mut conn = self.pool.acquire().await.unwrap();
        for (source, customer) in &accounts {
            let id = shared::domain::CustomerId::parse(customer).unwrap();
            let audit = shared::audit::audit_account(
                &mut conn,
                &sources,
                &self.worker.catalog,
                (source.as_str(), &id),
            );
            match self.with_bugs(audit).await {
                Ok(shared::audit::Audited::Checked(found)) if found.is_empty() => {}
                other => {
                    return Err(self.fail(format!(
                        "after the purge, the billing state of {source}/{customer} is not the fold of its kept events\n  {other:?}"
                    )))
                }
            }
        }
        Ok(())
    }
}

/// An SQS event as the event source mapping builds it; the message id is the queue's.
fn sqs_event(batch: &[(u64, i64)]) -> SqsEvent {
    let mut event = SqsEvent::default();
    for (id, event_id) in batch {
        let mut record = SqsMessage::default();
        record.message_id = Some(id.to_string());
        record.body = Some(shared::platform::queue::message_body(*event_id));
        event.records.push(record);
    }
    event
}

/// The workload a seed decides: the order property test's events and deliveries, then the
/// entitlement events ([`order::entitlement_strategy`]), then Stripe's notices of events it
/// failed to generate ([`order::notice_cases`]), each drawn on a generator of its own and
/// numbered after the others, so that the events a seed drew before they joined are the same
/// events under the same keys.
fn workload(seed: u64) -> Case {
    let runner = |stream: u8| {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        bytes[8] = stream;
        TestRunner::new_with_rng(
            Config::default(),
            TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
        )
    };
    let mut case = case_strategy().new_tree(&mut runner(1)).unwrap().current();
    let entitlements = order::entitlement_strategy().new_tree(&mut runner(2));
    case.extend(entitlements.unwrap().current());
    let notices = order::notice_cases().new_tree(&mut runner(3));
    case.extend(notices.unwrap().current());
    // Every other seed crowds its events onto two instants: same-second ties everywhere.
    if seed.is_multiple_of(2) {
        for event in &mut case.events {
            let (Event::KindePlan { at, .. }
            | Event::KindePayment { at, .. }
            | Event::StripeSubscription { at, .. }
            | Event::StripeInvoicePaid { at, .. }
            | Event::StripeRefund { at, .. }
            | Event::StripeInvoicePayment { at, .. }
            | Event::StripeCustomerDeleted { at, .. }
            | Event::PolarSubscription { at, .. }
            | Event::PolarOrder { at, .. }
            | Event::PolarCustomerDeleted { at, .. }
            | Event::PolarGrant { at, .. }
            | Event::PaddleSubscription { at, .. }
            | Event::PaddleTransaction { at, .. }
            | Event::LsSubscription { at, .. }
            | Event::LsInvoice { at, .. }
            | Event::LsOrder { at, .. }
            | Event::StripeSummary { at, .. }
            | Event::StripeHealthNotice { at }) = event;
            *at %= 2;
        }
    }
    case
}

/// A seed's credits events and their deliveries (`order_credits::cases`, drawn on a generator
/// of their own, so that the rest of the seed is drawn as before they joined).
fn credits_workload(seed: u64) -> (Vec<CreditsEvent>, Vec<(usize, bool)>) {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8] = 4;
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    );
    order_credits::cases()
        .new_tree(&mut runner)
        .unwrap()
        .current()
}

/// The dedupe key of credits event `index` (its Stripe event id).
fn credits_key(index: usize, ns: &str) -> String {
    format!("evt_crd{index:02}_{ns}")
}

/// How a seed sends each event: of Stripe's subscription changes, on dice of their own (so the
/// rest of the seed's schedule is drawn as before), 30% as snapshots only, 35% thin with the
/// snapshot twin delivered too, 35% thin only.
fn sent_as(seed: u64, case: &Case) -> Vec<Sent> {
    let mut dice = Dice::new(seed ^ 0x7411_7411);
    case.events
        .iter()
        .map(|event| match event {
            Event::StripeSubscription { .. } => match dice.below(100) {
                0..=29 => Sent::Snapshot,
                30..=64 => Sent::ThinAndTwin,
                _ => Sent::ThinOnly,
            },
            _ => Sent::Snapshot,
        })
        .collect()
}

/// How many seconds a seed moves its Stripe events back: on two seeds in three, 2 s, so that
/// the changes at the workload's first instant (the start of a month, where every other seed
/// crowds half its events) are made 2 s before that month began, and the reads made for them
/// (months later, in the run) fall across the month boundary as a read made seconds after the
/// change would.
fn stripe_shift(seed: u64) -> i64 {
    match seed % 3 {
        0 => 0,
        _ => 2,
    }
}

/// Which paid invoices of a seed name a subscription no event names, on dice of their own (so
/// the rest of the seed's schedule is drawn as before): half of those whose lines name no
/// known price. Their plan is known only by the read of that subscription the worker makes for
/// the invoice (docs/design.md §6.2), months after the invoice's time.
fn invoice_reads(seed: u64, case: &Case, ns: &str) -> HashMap<usize, String> {
    let mut dice = Dice::new(seed ^ 0x1A70_1CE5);
    case.events
        .iter()
        .enumerate()
        .filter_map(|(index, event)| match event {
            Event::StripeInvoicePaid {
                plan: None | Some("price_legacy"),
                ..
            } if dice.chance(50) => Some((index, format!("subinv{index:02}_{ns}"))),
            // A Paddle renewal of an unknown price and a paid Lemon Squeezy invoice: the plan
            // is their subscription's.
            Event::PaddleTransaction {
                price: "pri_legacy",
                outcome: 0,
                ..
            } if dice.chance(50) => Some((index, format!("pdsubinv{index:02}_{ns}"))),
            Event::LsInvoice { outcome: 0, .. } if dice.chance(50) => {
                Some((index, format!("lssubinv{index:02}_{ns}")))
            }
            _ => None,
        })
        .collect()
}

/// The (source, customer, period) of every event of the case, at its provider time (Stripe's
/// moved back `shift` seconds).
fn periods_of(case: &Case, ns: &str, shift: i64) -> HashSet<(String, String, String)> {
    let mut periods = HashSet::new();
    for (index, event) in case.events.iter().enumerate() {
        let (source, _, at) = order::payload(index, event, ns);
        let customer = match *event {
            // A notice is about no customer: its sweep stores a read of every subscription,
            // which grants in the notice's month for any customer Stripe lists one of.
            Event::StripeHealthNotice { at } => {
                let time = order::time(at) - chrono::Duration::seconds(shift);
                for customer in 0..order::CUSTOMERS {
                    periods.insert((
                        source.to_owned(),
                        order::customer_id(customer, ns),
                        time.format("%Y-%m").to_string(),
                    ));
                }
                continue;
            }
            Event::KindePlan { customer, .. }
            | Event::KindePayment { customer, .. }
            | Event::StripeSubscription { customer, .. }
            | Event::StripeInvoicePaid { customer, .. }
            | Event::StripeRefund { customer, .. }
            | Event::StripeInvoicePayment { customer, .. }
            | Event::StripeCustomerDeleted { customer, .. }
            | Event::PolarSubscription { customer, .. }
            | Event::PolarOrder { customer, .. }
            | Event::PolarCustomerDeleted { customer, .. }
            | Event::PolarGrant { customer, .. }
            | Event::PaddleSubscription { customer, .. }
            | Event::PaddleTransaction { customer, .. }
            | Event::LsSubscription { customer, .. }
            | Event::LsInvoice { customer, .. }
            | Event::LsOrder { customer, .. }
            | Event::StripeSummary { customer, .. } => customer,
        };
        let back = if source == "stripe" { shift } else { 0 };
        let time = order::time(at) - chrono::Duration::seconds(back);
        periods.insert((
            source.to_owned(),
            order::customer_id(customer, ns),
            time.format("%Y-%m").to_string(),
        ));
    }
    periods
}

/// Runs one seed to rest and checks it. The seed's run is a large future (the world, every
/// stage's state): it is kept on the heap, not on the test thread's stack, whose default
/// 2 MiB it outgrew.
pub(crate) async fn simulate(
    base: &PgPool,
    seed: u64,
    bugs: HashSet<Bug>,
) -> Result<Vec<String>, Failure> {
    Box::pin(simulate_seed(base, seed, bugs)).await
}

async fn simulate_seed(
    base: &PgPool,
    seed: u64,
    bugs: HashSet<Bug>,
) -> Result<Vec<String>, Failure> {
    let case = workload(seed);
    let mut world = World::new(base, seed, bugs).await;
    world.sent = sent_as(seed, &case);
    world.invoice_reads = invoice_reads(seed, &case, &world.ns);
    world.keys = (case.events.iter().enumerate())
        .map(|(index, event)| match world.payload(index, event) {
            ("lemonsqueezy", payload) => shared::providers::lemonsqueezy::dedupe_key(&payload)
                .unwrap()
                .as_str()
                .to_owned(),
            _ => format!("e{index:02}_{}", world.ns),
        })
        .collect();
    world.periods = periods_of(&case, &world.ns, world.shift);
    world.show_provider_state(seed, &case);
    let (credits, credits_deliveries) = credits_workload(seed);
    world.credits = credits;
    // A thin event is delivered as often as its change's snapshot would be; a twin is the
    // change's snapshot event itself.
    let mut pending: Vec<Item> = Vec::new();
    for d in &case.deliveries {
        let (snapshot, thin) = match world.sent[d.index] {
            Sent::Snapshot => (true, false),
            Sent::ThinAndTwin => (true, true),
            Sent::ThinOnly => (false, true),
        };
        for (on, thin) in [(snapshot, false), (thin, true)] {
            if on {
                pending.push(Item {
                    index: d.index,
                    thin,
                    credits: false,
                });
            }
        }
    }
    // Stripe gives up on some events (only reconciliation finds them), and still lists some
    // that its webhooks will bring after all; its summaries on dice of their own, so that the
    // rest is drawn as before they joined.
    let mut undelivered = Vec::new();
    let mut summaries = Dice::new(seed ^ 0x5E17_7135);
    for (index, event) in case.events.iter().enumerate() {
        let (source, payload) = world.payload(index, event);
        if source != "stripe" {
            continue;
        }
        let dice = match event {
            Event::StripeSummary { .. } => &mut summaries,
            // A v2 notice is in no `/v1/events` list.
            Event::StripeHealthNotice { .. } => continue,
            _ => &mut world.dice,
        };
        let listed = match dice.below(100) {
            0..=14 => Some(true),
            15..=24 => Some(false),
            _ => None,
        };
        // A change sent only thin has no snapshot event to list (thin events are in
        // `/v2/core/events`, which reconciliation does not read).
        let (Some(only_listed), false) = (listed, world.sent[index] == Sent::ThinOnly) else {
            continue;
        };
        if only_listed {
            pending.retain(|i| {
                *i != Item {
                    index,
                    thin: false,
                    credits: false,
                }
            });
        }
        let id = payload["id"].as_str().unwrap_or_default().to_owned();
        undelivered.push((id, serde_json::to_vec(&payload).unwrap()));
    }
    undelivered.reverse();
    world.feed.0.lock().unwrap().undelivered = undelivered;
    // The credits events, each as often as the seed drew it (copies); the order property's
    // injected failures are left to the simulation's own faults.
    for (index, _) in credits_deliveries {
        pending.push(Item {
            index,
            thin: false,
            credits: true,
        });
    }
    let thin = world.sent.iter().filter(|s| **s != Sent::Snapshot).count();
    world.note(format!(
        "seed {seed}: {} events ({thin} sent thin, {} invoices read their subscription), {} deliveries{}",
        case.events.len(),
        world.invoice_reads.len(),
        pending.len(),
        match world.shift {
            0 => String::new(),
            shift => format!(", Stripe's times {shift} s earlier"),
        }
    ));
    let mut steps = 0;
    while !pending.is_empty() || world.queue.visible() > 0 {
        steps += 1;
        match world.dice.below(100) {
            0..=39 if !pending.is_empty() => world.deliver(&case, &mut pending, true).await,
            0..=69 => {
                world.work(true).await;
            }
            70..=77 => world.schedule(true).await,
            78..=79 => world.schedule_twice().await,
            80..=83 => world.replay().await,
            _ => {
                let ms = match world.dice.chance(80) {
                    true => 1_000 * (1 + world.dice.below(60) as i64),
                    false => 60_000 * (1 + world.dice.below(90) as i64),
                };
                world.clock.advance(ms);
                world.note(format!("time +{} s", ms / 1000));
            }
        }
        world.check_balances().await?;
        if world.spender.chance(25) {
            world.spend().await?;
        }
        // The app's debits of credits, on dice of their own (docs/design.md §4.14).
        if world.credit_spender.chance(12) {
            let started = Instant::now();
            world.spend_credits().await?;
            CREDITS_MICROS.fetch_add(started.elapsed().as_micros() as usize, Ordering::Relaxed);
        }
        // The app's reversals, on dice of their own (docs/design.md §4.10).
        if world.reverser.chance(5) {
            world.reverse().await?;
        }
        world.check_usage().await?;
        if world.dispatcher.chance(30) {
            world.dispatch(true).await?;
        }
        if steps > 2_000 {
            return Err(world.fail("the schedule did not end"));
        }
    }
    world.quiesce(&case, &mut pending).await?;
    world.drain_reports().await?;
    world.check_at_rest().await?;
    let started = Instant::now();
    Box::pin(world.check_credits()).await?;
    CREDITS_MICROS.fetch_add(started.elapsed().as_micros() as usize, Ordering::Relaxed);
    world.check_meter_reports().await?;
    world.check_after_the_retention().await?;
    world.note(format!(
        "at rest after {steps} steps; every invariant holds"
    ));
    world.pool.close().await;
    world.admin.close().await;
    Ok(world.trace)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs `count` seeds from `first`; the first failure ends the run.
pub(crate) async fn simulate_many(
    base: &PgPool,
    first: u64,
    count: u64,
    bugs: &HashSet<Bug>,
) -> Result<(), Failure> {
    for seed in first..first + count {
        simulate(base, seed, bugs.clone()).await?;
    }
    Ok(())
}

/// The seeds CI runs (`SIM_SEEDS` to change the count, `SIM_FIRST_SEED` where to start).
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn seeds(pool: PgPool) {
    let count = env_u64("SIM_SEEDS").unwrap_or(100);
    let first = env_u64("SIM_FIRST_SEED").unwrap_or(1);
    let started = Instant::now();
    if let Err(failure) = simulate_many(&pool, first, count, &HashSet::new()).await {
        panic!("{failure}");
    }
    let took = started.elapsed();
    eprintln!(
        "sim: {count} seeds from {first} passed in {took:.1?} ({:.1} seeds/s)",
        count as f64 / took.as_secs_f64()
    );
    eprintln!(
        "sim: thin events: {} applied as their read, {} carried by their twin, {} with their object gone; {} reads answered 500 or timed out",
        THIN_READ.load(Ordering::Relaxed),
        THIN_TWIN.load(Ordering::Relaxed),
        THIN_GONE.load(Ordering::Relaxed),
        READ_FAULTS.load(Ordering::Relaxed),
    );
    eprintln!(
        "sim: the fake Stripe answered {} requests (reads and meter reports), {} of them refused for the rate",
        STRIPE_REQUESTS.load(Ordering::Relaxed),
        STRIPE_OVER_LIMIT.load(Ordering::Relaxed),
    );
    eprintln!(
        "sim: {} invoices' subscription reads applied ({} for Paddle renewals, {} for Lemon Squeezy invoices); {} reads of a change made 2 s before a month began",
        INVOICE_READS.load(Ordering::Relaxed),
        PADDLE_READS.load(Ordering::Relaxed),
        LEMONSQUEEZY_READS.load(Ordering::Relaxed),
        READS_ACROSS_A_MONTH.load(Ordering::Relaxed),
    );
    eprintln!(
        "sim: entitlements: {} Stripe summaries whole, {} said has_more ({} applied as the complete list read, {} their customer gone); {} list reads answered 500 or timed out; {} Polar benefit-grant events",
        SUMMARIES_WHOLE.load(Ordering::Relaxed),
        SUMMARIES_READ.load(Ordering::Relaxed) + SUMMARIES_GONE.load(Ordering::Relaxed),
        SUMMARIES_READ.load(Ordering::Relaxed),
        SUMMARIES_GONE.load(Ordering::Relaxed),
        LIST_READ_FAULTS.load(Ordering::Relaxed),
        GRANT_EVENTS.load(Ordering::Relaxed),
    );
    eprintln!(
        "sim: notices of events Stripe failed to generate listed {} subscriptions, each stored as a read; {} of those swept had a register that already showed it",
        SWEPT.load(Ordering::Relaxed),
        SWEPT_MATCHING.load(Ordering::Relaxed),
    );
    eprintln!(
        "sim: past the retention, {} reads kept with the events they were made for ({} Lemon Squeezy), every account still the fold of its kept events",
        READS_KEPT.load(Ordering::Relaxed),
        LEMONSQUEEZY_READS_KEPT.load(Ordering::Relaxed),
    );
    eprintln!(
        "sim: meter reports: {} held by the meters at rest ({} of them compensations), {} cancelled; {} sends, {} of them resends held already, {} answered from a saved key; {} faulted (503 before taking, 500 after, or answered after the client gave up)",
        METER_HELD.load(Ordering::Relaxed),
        METER_COMPENSATED.load(Ordering::Relaxed),
        METER_CANCELLED.load(Ordering::Relaxed),
        METER_SENDS.load(Ordering::Relaxed),
        METER_RESENDS.load(Ordering::Relaxed),
        METER_REPLAYED.load(Ordering::Relaxed),
        METER_FAULTS.load(Ordering::Relaxed),
    );
    eprintln!(
        "sim: credits: {} Stripe credits events (grants, transactions, packs paid and refunded) delivered, {} grants at rest as Stripe's ledger gives them",
        CREDITS_EVENTS.load(Ordering::Relaxed),
        CREDITS_GRANTS.load(Ordering::Relaxed),
    );
    eprintln!(
        "sim: credits debits: {} accepted, {} refused; {} of the accepted derived otherwise at rest than answered, {} with a part unfunded; {} low or depleted crossings at rest; the debits and the credits checks at rest took {:.1} s",
        CREDIT_DEBITS_ACCEPTED.load(Ordering::Relaxed),
        CREDIT_DEBITS_REFUSED.load(Ordering::Relaxed),
        CREDIT_DEBITS_MOVED.load(Ordering::Relaxed),
        CREDIT_DEBITS_UNFUNDED.load(Ordering::Relaxed),
        CREDIT_CROSSINGS.load(Ordering::Relaxed),
        CREDITS_MICROS.load(Ordering::Relaxed) as f64 / 1e6,
    );
    eprintln!(
        "sim: reversals: {} asked, {} of them again; {} reports withdrawn, {} debits reversed while their report was in flight",
        REVERSALS.load(Ordering::Relaxed),
        REVERSALS_AGAIN.load(Ordering::Relaxed),
        REVERSED_WITHDRAWN.load(Ordering::Relaxed),
        REVERSED_IN_FLIGHT.load(Ordering::Relaxed),
    );
}

/// Seeds that once failed, kept as they are.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn regression_seeds(pool: PgPool) {
    // 72: a connection opened after a kill read the real clock, not the simulated one, so a
    // fresh row looked 72 days old and the purge took it (the pool now sets the clock on
    // connect as well as on acquire).
    // 25: after connections were killed, the intake's held connection failed the step
    // before its statement and was never replaced: every later delivery answered 503 (a
    // connection that fails before use is now dropped, and the delivery tried once more).
    // 208: an effect that was already written (a second deletion of one customer, stamped
    // earlier, moves the tombstone) still took a sequence number, leaving a gap in the
    // account's numbers (an effect already written now takes none).
    // 515: the simulator's own bug: quiescence counted a thin event's read among the events
    // sent, so it stopped before reconciliation found a Stripe event never delivered (the
    // count now leaves the reads out).
    // 78: the same case under the workload with entitlement events, which moved seed 515's
    // schedule away from it: an invoice's subscription read counted as an event sent.
    // Each seed replays the schedule today's workload draws for it. 72, 25 and 208 were found
    // under older workloads: 72 no longer meets its case (with the clock left unset on connect
    // it passes, as do seeds 1-400), and the fixes of 25 and 208 have tests of their own
    // (`round_trips::one_intake_delivery_is_one_round_trip_and_a_killed_connection_is_replaced`,
    // `effects::a_second_deletion_stamped_earlier_tells_nothing_and_takes_no_number`).
    for seed in [72, 25, 208, 515, 78] {
        if let Err(failure) = simulate(&pool, seed, HashSet::new()).await {
            panic!("{failure}");
        }
    }
}

/// One seed with its whole trace printed: `SIM_SEED=<seed>`.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn one_seed(pool: PgPool) {
    let Some(seed) = env_u64("SIM_SEED") else {
        return;
    };
    match simulate(&pool, seed, HashSet::new()).await {
        Ok(trace) => eprintln!("sim: seed {seed} passed\n  {}", trace.join("\n  ")),
        Err(failure) => panic!("{failure}"),
    }
}

/// Each planted bug is caught within a bounded number of seeds.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn planted_bugs_are_caught(pool: PgPool) {
    const WITHIN: u64 = 150;
    let bugs = [
        Bug::TieByArrival,
        Bug::ArrivalTime,
        Bug::CopyCountsNew,
        Bug::RetryNeverScheduled,
        Bug::RescueSkipsLeases,
        Bug::ThinSkipsTwin,
        Bug::ReadByTheClock,
        Bug::PartialSummaryApplied,
        Bug::ReportSentBeforeCommit,
        Bug::ClampInFold,
        Bug::ExpiryAddedToStripes,
        Bug::BurnOrderByArrival,
    ];
    let mut report = Vec::new();
    for (n, bug) in bugs.into_iter().enumerate() {
        let planted: HashSet<Bug> = [bug].into();
        let mut caught = None;
        for seed in 1..=WITHIN {
            let seed_run = 1_000_000 * (n as u64 + 1) + seed;
            if let Err(failure) = simulate(&pool, seed_run, planted.clone()).await {
                caught = Some((
                    seed,
                    failure.what.lines().next().unwrap_or_default().to_owned(),
                ));
                break;
            }
        }
        report.push(match caught {
            Some((seeds, what)) => format!("{bug:?}: caught after {seeds} seed(s): {what}"),
            None => format!("{bug:?}: SURVIVED {WITHIN} seeds"),
        });
    }
    for line in &report {
        eprintln!("sim: {line}");
    }
    assert!(
        !report.iter().any(|line| line.contains("SURVIVED")),
        "a planted bug was not caught"
    );
}
