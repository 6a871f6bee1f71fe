//! The worker function's handler: for each SQS message, claim the event it names under a
//! lease, decide what the event means (its provider), read the account's registers, make the
//! provider reads a tie or a refund needs, apply the register rules (billing), and write it
//! all with the event's finish in one statement that re-checks the lease and the account's
//! version (inbox); an account that moved meanwhile is read and written again under its
//! lock. A failure writes nothing and is recorded with the retry schedule; only transient
//! failures are reported back to SQS (docs/design.md §1, §3).

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgConnection, PgPool, Postgres};
use tokio::time::timeout;

use crate::billing::registers;
use crate::billing::rules::{Registers, Stamp};
use crate::billing::{outcome, Catalog, Change, Decision, Effect, EventContext, Rank, Version};
use crate::config::{SourceConfig, WorkerConfig};
use crate::domain::Period;
use crate::domain::{EventStatus, SourceKind};
use crate::effects::{self, outbox, Cause, NewEffect};
use crate::inbox::commit::{self, Committed};
use crate::inbox::lease::{self, Claimed};
use crate::inbox::{DEFAULT_LEASE, RETRY_DELAYS};
use crate::providers::{self, Api, Reads};
use crate::queue::{parse_message_body, Queue};
use crate::sim::{self, Bug, Point};

/// How long the worker waits for one provider read before settling without it.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one event of a batch may take. An event takes tens of milliseconds, and its
/// provider reads (a tie, a refund's link) at most 5 s each; one that takes longer is
/// waiting on a connection that went silent (a network that drops what it carries). The
/// worker then gives the event up to the queue's redelivery and the rescue, closes that
/// connection, and goes on with the rest of the batch on another, instead of holding the
/// whole batch until Lambda stops the invocation. Shorter than the lease, so the event is
/// given up before another worker may take it.
pub const EVENT_BUDGET: Duration = Duration::from_secs(20);

/// What the worker knows of one configured source.
pub struct WorkerSource {
    pub kind: SourceKind,
    /// Stripe: the mode the source takes (`None`: both).
    pub livemode: Option<bool>,
    /// The provider's object reads, when the source has an API key.
    pub reads: Option<Box<dyn Reads>>,
}

impl From<SourceKind> for WorkerSource {
    fn from(kind: SourceKind) -> Self {
        Self {
            kind,
            livemode: None,
            reads: None,
        }
    }
}

impl WorkerSource {
    pub fn from_config(config: &SourceConfig, http: &reqwest::Client) -> Self {
        Self {
            kind: config.kind,
            livemode: config.livemode,
            reads: Api::for_source(config, http)
                .and_then(|api| providers::provider(config.kind).reads(api)),
        }
    }
}

#[cfg(feature = "dev")]
pub use faults::{FaultAction, Faults};

pub struct WorkerState {
    pub pool: PgPool,
    pub sources: HashMap<String, WorkerSource>,
    pub catalog: Catalog,
    pub lease: Duration,
    pub retry_delays: Vec<Duration>,
    /// Effects on: the queue the dispatcher takes effect ids from (docs/design.md §11).
    /// `None`: no effect is written.
    pub effects: Option<Queue>,
    /// Accounts another event moved lately between an event's read and its write.
    pub contended: Contended,
    /// How long one event of a batch may take, its provider reads included, before the
    /// worker gives up on it and on its connection ([`EVENT_BUDGET`]).
    pub event_budget: Duration,
    /// Injected faults, for tests that prove a crash at a point loses nothing.
    #[cfg(feature = "dev")]
    pub faults: Faults,
}

/// How long an account stays contended after a write found it moved, and how many accounts
/// are remembered at most.
const CONTENDED_FOR: Duration = Duration::from_secs(10);
const CONTENDED_MAX: usize = 1024;

/// Accounts whose write lately found them moved since the event's read: their next events
/// are read and written under the account's lock at once, since on a hot account the first,
/// unlocked attempt would mostly be wasted (docs/design.md §8).
#[derive(Debug, Default)]
pub struct Contended(std::sync::Mutex<HashMap<(String, String), std::time::Instant>>);

impl Contended {
    pub fn is_hot(&self, source: &str, customer: &str) -> bool {
        let accounts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = (source.to_owned(), customer.to_owned());
        accounts
            .get(&key)
            .is_some_and(|since| since.elapsed() < CONTENDED_FOR)
    }

    fn moved(&self, source: &str, customer: &str) {
        let mut accounts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if accounts.len() >= CONTENDED_MAX {
            accounts.retain(|_, since| since.elapsed() < CONTENDED_FOR);
            if accounts.len() >= CONTENDED_MAX {
                accounts.clear();
            }
        }
        let key = (source.to_owned(), customer.to_owned());
        accounts.insert(key, std::time::Instant::now());
    }
}

impl WorkerState {
    pub fn new(pool: PgPool, sources: HashMap<String, WorkerSource>, catalog: Catalog) -> Self {
        Self {
            pool,
            sources,
            catalog,
            lease: DEFAULT_LEASE,
            retry_delays: RETRY_DELAYS.to_vec(),
            effects: None,
            contended: Contended::default(),
            event_budget: EVENT_BUDGET,
            #[cfg(feature = "dev")]
            faults: Faults::default(),
        }
    }

    /// Builds the pool and each source's reads (with the API key from its secret, if any).
    pub async fn from_config(config: &WorkerConfig, max_connections: u32) -> anyhow::Result<Self> {
        use anyhow::Context;
        let pool =
            crate::db::lazy_pool(&config.database_url, max_connections).context("DATABASE_URL")?;
        let http = reqwest::Client::builder()
            .timeout(READ_TIMEOUT)
            .build()
            .context("building the HTTP client")?;
        let configs = crate::secrets::resolve(
            &config.sources,
            crate::secrets::Needs::ApiKey,
            crate::secrets::OnFailure::RetryOnUse("worker"),
        )
        .await?;
        let sources = configs
            .iter()
            .map(|s| (s.name.clone(), WorkerSource::from_config(s, &http)))
            .collect();
        let mut state = Self::new(pool, sources, config.catalog.clone());
        if let Some(effects) = &config.effects {
            state.effects = Some(Queue::from_env(effects.queue_url.clone()).await);
        }
        Ok(state)
    }

    /// A fault injected at this point, if any (never, without the `dev` feature).
    fn fault(&self, _point: FaultPoint) -> Result<(), WorkerError> {
        #[cfg(feature = "dev")]
        self.faults.hit(_point)?;
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("source '{0}' is not configured")]
    UnknownSource(String),
    #[error("the lease on the event was lost to another worker")]
    LeaseLost,
    #[error("another event wrote the same payment intent meanwhile; retrying")]
    Raced,
    #[error("another event of the same second reached the subscription during the provider read; retrying")]
    TieMoved,
    #[error("the account, or a subscription or payment another customer's event wrote, moved during the write; retrying")]
    Moved,
    #[error("injected fault at {0:?}")]
    Injected(FaultPoint),
}

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Processed {
    /// The event is final now, with this status and reason.
    Finished { status: EventStatus, reason: String },
    /// Nothing to do: the event is final, leased by another worker, not due, or gone.
    Skipped,
    /// This attempt failed; the event is `failed` (retry due later) or `dead`.
    Failed { status: EventStatus, error: String },
}

/// Processes one stored event. An error means the database could not be reached at all;
/// every other failure is recorded on the event and reported as `Failed`.
#[tracing::instrument(skip_all, fields(event_id))]
pub async fn process_event(state: &WorkerState, event_id: i64) -> Result<Processed, sqlx::Error> {
    let mut conn = state.pool.acquire().await?;
    let claimed = lease::claim(&mut conn, &[event_id], state.lease).await?;
    match claimed.into_iter().next() {
        Some(event) => process_claimed(state, &mut conn, &event).await,
        None => Ok(Processed::Skipped),
    }
}

/// Applies one claimed event on `conn`, or records why it could not be.
#[tracing::instrument(skip_all, fields(event_id = event.id))]
async fn process_claimed(
    state: &WorkerState,
    conn: &mut PgConnection,
    event: &Claimed,
) -> Result<Processed, sqlx::Error> {
    sim::point(Point::WorkerClaimed, event.id).await;
    match apply_claimed(state, conn, event).await {
        Ok(Applied {
            status,
            reason,
            effects,
        }) => {
            sim::point(Point::WorkerCommitted, event.id).await;
            send_effects(state, event.id, &effects).await;
            Ok(Processed::Finished { status, reason })
        }
        Err(WorkerError::LeaseLost) => {
            tracing::warn!(
                event_id = event.id,
                "lease lost; another worker has the event"
            );
            Ok(Processed::Skipped)
        }
        Err(error) => {
            let error = error.to_string();
            let delays = &state.retry_delays;
            let recorded = match lease::record_failure(conn, event, &error, delays).await {
                Ok(recorded) => recorded,
                // The connection may be what failed: the record goes through a fresh one.
                Err(_) => {
                    let mut fresh = state.pool.acquire().await?;
                    lease::record_failure(&mut fresh, event, &error, delays).await?
                }
            };
            match recorded {
                Some(status) => Ok(Processed::Failed { status, error }),
                None => Ok(no_longer_held(state, event.id, &error).await),
            }
        }
    }
}

/// An attempt failed after its event stopped being its own: another worker took it after
/// the lease ran out, or the attempt's own write finished it and only the reply was lost (a
/// connection that broke then). The message goes. Whatever effects that write left marked
/// for the send the attempt never made are sent now: at worst a message more, which the
/// dispatcher's claim makes nothing of.
async fn no_longer_held(state: &WorkerState, event_id: i64, error: &str) -> Processed {
    tracing::warn!(
        event_id,
        error,
        "attempt failed after the event stopped being its own"
    );
    if state.effects.is_some() {
        match outbox::marked_of_event(&state.pool, event_id).await {
            Ok(ids) => send_effects(state, event_id, &ids).await,
            Err(error) => {
                tracing::warn!(event_id, error = %error, "could not read the event's effects; the scheduler will send them")
            }
        }
    }
    Processed::Skipped
}

/// Sends committed effects to the dispatcher's queue; a send that fails leaves them to the
/// rescue.
async fn send_effects(state: &WorkerState, event_id: i64, ids: &[String]) {
    let Some(queue) = state.effects.as_ref().filter(|_| !ids.is_empty()) else {
        return;
    };
    if let Err(error) = outbox::enqueue_or_unmark(&state.pool, queue, ids).await {
        tracing::warn!(
            event_id,
            error = format!("{error:#}"),
            "effects written but not enqueued; the scheduler will"
        );
    }
}

/// What one event's write committed: its final status and reason, and the ids of the
/// effects it wrote.
struct Applied {
    status: EventStatus,
    reason: String,
    effects: Vec<String>,
}

/// Decides what the event means and applies it: for an event about an account, one read of
/// the account's registers, the register rules, and one statement that writes it all if the
/// account has not moved meanwhile — else again under the account's lock (docs/design.md
/// §8); for one its rules ignore outright, or any other, one statement that finishes it.
async fn apply_claimed(
    state: &WorkerState,
    conn: &mut PgConnection,
    event: &Claimed,
) -> Result<Applied, WorkerError> {
    let source = state
        .sources
        .get(&event.source)
        .ok_or_else(|| WorkerError::UnknownSource(event.source.clone()))?;
    let provider = providers::provider(source.kind);
    let decision = match (&event.payload, event.occurred_at) {
        (Some(payload), Some(_)) => match provider.out_of_scope(payload, source.livemode) {
            Some(reason) => Decision::Ignore(reason),
            None => providers::decide(
                source.kind,
                &event.event_type,
                payload,
                &event.dedupe_key,
                &state.catalog,
            ),
        },
        _ => Decision::Unprocessable("the stored event has no parsed payload".into()),
    };
    // The event's place in the provider's order: one for the reads and the writes.
    let version = event.occurred_at.map(|at| planted_version(event, at));
    let mut customer = event.customer.clone();
    if let (None, Decision::Apply { effects, .. }) = (&customer, &decision) {
        // An event that only links a payment intent to an invoice names no customer (Stripe's
        // `invoice_payment.paid`): it belongs to the customer the intent is known under.
        customer = links_only_customer(conn, &event.source, effects).await?;
    }
    let ctx = customer
        .as_ref()
        .and_then(|c| event_context(event, c, &version));
    let (status, reason, account) = match (decision, ctx) {
        (Decision::Apply { effects, notes }, Some(ctx)) => {
            return apply_to_account(state, conn, event, source, &ctx, effects, notes).await
        }
        // Nothing of it depends on the account's registers: it reads none and leaves the
        // account's version alone, so an event of the account applied meanwhile does not
        // find the account moved (docs/design.md §3.5). Its finish writes its log line.
        (Decision::Ignore(reason), Some(ctx)) => (EventStatus::Ignored, reason, Some(ctx)),
        (Decision::Apply { effects, .. }, None) if customer.is_none() => {
            return remember_links_without_customer(state, conn, event, &effects).await
        }
        (Decision::Apply { .. }, None) => (
            EventStatus::Unprocessable,
            "the event has no provider time".to_owned(),
            None,
        ),
        (Decision::Unprocessable(reason), _) => (EventStatus::Unprocessable, reason, None),
        (Decision::Ignore(reason), None) => (EventStatus::Ignored, reason, None),
    };
    state.fault(FaultPoint::BeforeCommit)?;
    sim::point(Point::WorkerDecided, event.id).await;
    if !lease::finish_held(conn, event, status, &reason, account.as_ref()).await? {
        return Err(WorkerError::LeaseLost);
    }
    Ok(applied(event, status, reason, Vec::new()))
}

/// An event about an account, with its effects. The provider reads a tie or a refund needs
/// are made after the read and before any lock or transaction (docs/design.md §4.2).
async fn apply_to_account(
    state: &WorkerState,
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    ctx: &EventContext<'_>,
    mut effects: Vec<Effect>,
    mut notes: Vec<String>,
) -> Result<Applied, WorkerError> {
    let plan = state.effects.is_some();
    // A payment intent is also written by events that take no account lock (a link without
    // a customer): an event that touches one is written under the lock, where what the
    // intent holds after the write can still be checked and rolled back. So is an event of
    // an account this worker found contended lately.
    let intents = effects.iter().any(|e| {
        matches!(
            e,
            Effect::PaymentIntent { .. } | Effect::RefundIntent { .. }
        )
    });
    let unlocked = !intents && !state.contended.is_hot(ctx.source, ctx.customer.as_str());
    // The read without a lock serves the write without one, and the provider reads.
    let mut registers = match unlocked || source.reads.is_some() {
        true => registers::read(conn, ctx, &effects, plan).await?,
        false => Registers::default(),
    };
    sim::point(Point::WorkerRead, event.id).await;
    let ties_read = settle(source, ctx, &registers, &mut effects, &mut notes).await;
    let decide = |registers: &mut Registers| {
        let reads = source.reads.is_some();
        decide(
            state,
            event,
            ctx,
            registers,
            (&effects, &notes),
            reads,
            &ties_read,
        )
    };
    if unlocked {
        let (status, reason, new) = decide(&mut registers)?;
        state.fault(FaultPoint::BeforeCommit)?;
        sim::point(Point::WorkerDecided, event.id).await;
        let outcome = (status, reason.as_str());
        match commit::commit(conn, event, ctx, &registers, outcome, &new).await? {
            Committed::Done { effects, .. } => {
                return Ok(applied(event, status, reason, effects));
            }
            Committed::LeaseLost => return Err(WorkerError::LeaseLost),
            // Another event of the account committed since the read: read it again under
            // the account's lock, where it cannot move.
            Committed::Moved => {
                tracing::debug!(event_id = event.id, "the account moved since the read");
                state.contended.moved(ctx.source, ctx.customer.as_str());
            }
        }
    }
    let mut tx = begin(conn).await?;
    if !lease::still_held_locking(&mut tx, event, ctx.customer).await? {
        return Err(WorkerError::LeaseLost);
    }
    sim::point(Point::WorkerLocked, event.id).await;
    let mut registers = registers::read(&mut tx, ctx, &effects, plan).await?;
    let (status, reason, new) = decide(&mut registers)?;
    state.fault(FaultPoint::BeforeCommit)?;
    sim::point(Point::WorkerDecided, event.id).await;
    let outcome = (status, reason.as_str());
    let written = match commit::commit(&mut tx, event, ctx, &registers, outcome, &new).await? {
        Committed::Done { effects, intents } => {
            // A link written meanwhile by an event without a customer: the rules did not see
            // it, so the retry reads again (and the link's event sees this one's customer).
            if intents
                .iter()
                .any(|(id, now)| registers.intents.get(id) != Some(now))
            {
                return Err(WorkerError::Raced);
            }
            effects
        }
        Committed::LeaseLost => return Err(WorkerError::LeaseLost),
        Committed::Moved => return Err(WorkerError::Moved),
    };
    sim::point(Point::WorkerWritten, event.id).await;
    tx.commit().await?;
    Ok(applied(event, status, reason, written))
}

/// Opens one of the worker's transactions, in the round trip of its `BEGIN`. Its statements
/// follow one another with nothing to wait for in between, so the server ends it once it
/// idles for 10 s. Without that, a worker whose connection went silent inside
/// it (a network that drops what it carries; Lambda stopping the instance closes a socket
/// the server then never hears of) would leave the event's row and its account locked until
/// the server's TCP keepalive gave up, by default two hours later, and every claim of the
/// event and every write to the account would wait on it.
async fn begin(
    conn: &mut PgConnection,
) -> Result<sqlx::Transaction<'_, sqlx::Postgres>, sqlx::Error> {
    conn.begin_with(BEGIN_BOUNDED).await
}

const BEGIN_BOUNDED: &str = "BEGIN; SET LOCAL idle_in_transaction_session_timeout = '10s'";

/// What the event finished with, said once in the log.
fn applied(event: &Claimed, status: EventStatus, reason: String, effects: Vec<String>) -> Applied {
    tracing::info!(event_id = event.id, status = status.as_str(), reason = %reason, effects = effects.len(), "event finished");
    Applied {
        status,
        reason,
        effects,
    }
}

/// The register rules applied to the account as read: the event's outcome and reason, and,
/// with effects on, the effects its changes tell. With provider reads, a subscription whose
/// tie is not the one the read settled fails the attempt (the retry reads again).
fn decide(
    state: &WorkerState,
    event: &Claimed,
    ctx: &EventContext<'_>,
    registers: &mut Registers,
    (effects, notes): (&[Effect], &[String]),
    reads: bool,
    ties_read: &HashMap<String, Option<i64>>,
) -> Result<(EventStatus, String, Vec<NewEffect>), WorkerError> {
    let period = Period::of(ctx.version.at);
    let customer = ctx.customer.as_str();
    let plan_before = state
        .effects
        .as_ref()
        .map(|_| registers.state(customer, &period, &state.catalog).plan);
    let mut notes = notes.to_vec();
    let mut changes = Vec::with_capacity(effects.len());
    let mut facts = Vec::new();
    for effect in effects {
        let written = registers.apply(ctx, effect);
        if let Effect::Subscription { id, .. } = effect {
            match (reads, written.tied_with) {
                (false, Some(tie)) => notes.push(format!(
                    "same-second tie with event {tie} resolved by status rank"
                )),
                (true, tied) if ties_read.get(id) != Some(&tied) => {
                    return Err(WorkerError::TieMoved)
                }
                _ => {}
            }
        }
        changes.push(written.change);
        facts.extend(written.fact);
    }
    let (status, reason) = outcome(&changes, &notes);
    let made = changes.iter().any(|c| matches!(c, Change::Made(_)));
    let new = match (plan_before, made) {
        (Some(plan_before), true) => {
            let after = registers.state(customer, &period, &state.catalog);
            let cause = Cause {
                event_id: event.id,
                provider_event_id: event.dedupe_key.as_str(),
                source: ctx.source,
                customer,
                occurred_at: ctx.version.at.as_datetime(),
            };
            effects::effects_of(&cause, &facts, &plan_before, &after)
        }
        _ => Vec::new(),
    };
    Ok((status, reason, new))
}

/// Who the event is about and where it sits in the provider's order, once it has a time.
fn event_context<'a>(
    event: &'a Claimed,
    customer: &'a crate::domain::CustomerId,
    version: &Option<Version>,
) -> Option<EventContext<'a>> {
    Some(EventContext {
        event_id: event.id,
        source: &event.source,
        customer,
        event_type: &event.event_type,
        version: version.clone()?,
    })
}

/// The event's version: its provider time and dedupe key (or a planted bug's).
fn planted_version(event: &Claimed, at: crate::domain::ProviderTime) -> Version {
    let at = match sim::planted(Bug::ArrivalTime) {
        true => chrono::Utc::now().into(),
        false => at,
    };
    let key = match sim::planted(Bug::TieByArrival) {
        true => crate::domain::DedupeKey::parse(&format!("{:020}", event.id))
            .unwrap_or_else(|_| event.dedupe_key.clone()),
        false => event.dedupe_key.clone(),
    };
    Version { at, key }
}

/// What only the provider can settle, settled after the read and before any lock or
/// transaction (docs/design.md §4.2, §4.6): a subscription state stamped with the same second
/// as another event's takes the rank a provider read gives it (else its status rank decides,
/// and the note says so); a refund known only by its payment intent is linked to its invoice
/// by a read when no event has. A failed read settles nothing and says why: the status rank
/// still gives one order. With reads, returns each subscription's tie as read (the other
/// event, if any), which the rules must find again when the event is written.
async fn settle(
    source: &WorkerSource,
    ctx: &EventContext<'_>,
    registers: &Registers,
    effects: &mut Vec<Effect>,
    notes: &mut Vec<String>,
) -> HashMap<String, Option<i64>> {
    let mut ties_read = HashMap::new();
    let Some(reads) = &source.reads else {
        // Without a provider read the status rank settles a tie: the rules say whether
        // there was one.
        return ties_read;
    };
    let mut linked = Vec::new();
    let at = Stamp::of(ctx, Rank(0)).at;
    for effect in effects.iter_mut() {
        match effect {
            Effect::Subscription {
                id,
                status,
                plan,
                rank,
            } => {
                let tie = registers
                    .subscriptions
                    .get(id.as_str())
                    .filter(|held| held.stamp.at == at && held.event_id != ctx.event_id);
                ties_read.insert(id.clone(), tie.map(|t| t.event_id));
                let Some(tie) = tie else {
                    continue;
                };
                let (tie_id, tie_status) = (tie.event_id, &tie.value.status);
                let plan_key = plan.as_ref().map(|p| p.key.as_str());
                notes.push(match reads.subscription(ctx.customer, id).await {
                    Ok(Some(now)) if now.shows(status, plan_key) => {
                        // the read's time: a state confirmed later outranks one confirmed earlier
                        *rank = Rank::confirmed(chrono::Utc::now());
                        format!("same-second tie with event {tie_id} resolved by a provider read: {id} is {status}")
                    }
                    Ok(Some(now)) if now.shows(tie_status, tie.value.plan_key.as_deref()) => {
                        *rank = Rank::REFUTED;
                        format!("same-second tie with event {tie_id} resolved by a provider read: {id} is {tie_status}")
                    }
                    Ok(Some(now)) => format!(
                        "same-second tie with event {tie_id}: the provider shows {id} as {} now, neither state; resolved by status rank",
                        now.status
                    ),
                    Ok(None) => format!(
                        "same-second tie with event {tie_id}: the provider does not know {id}; resolved by status rank"
                    ),
                    Err(error) => format!(
                        "same-second tie with event {tie_id}: the provider read failed ({error:#}); resolved by status rank"
                    ),
                });
            }
            Effect::RefundIntent { payment_intent, .. } => {
                let known = registers.intents.get(payment_intent.as_str());
                if known.is_some_and(|i| i.invoice.is_some()) {
                    continue;
                }
                match reads
                    .invoice_of_payment_intent(ctx.customer, payment_intent)
                    .await
                {
                    Ok(Some(invoice)) => {
                        notes.push(format!(
                            "{payment_intent} linked to {invoice} by a provider read"
                        ));
                        linked.push(Effect::PaymentIntent {
                            payment_intent: payment_intent.clone(),
                            invoice,
                        });
                    }
                    Ok(None) => {
                        notes.push(format!("the provider links {payment_intent} to no invoice"))
                    }
                    Err(error) => notes.push(format!(
                        "the provider read of {payment_intent}'s invoice failed ({error:#})"
                    )),
                }
            }
            _ => {}
        }
    }
    // A link read from the provider is written before the refund, which then finds it.
    for (i, link) in linked.into_iter().enumerate() {
        effects.insert(i, link);
    }
    ties_read
}

/// Whether every effect is a payment-intent link; then the customer the intent is known
/// under, if any.
async fn links_only_customer(
    conn: &mut PgConnection,
    source: &str,
    effects: &[Effect],
) -> Result<Option<crate::domain::CustomerId>, sqlx::Error> {
    let mut customer = None;
    for effect in effects {
        let Effect::PaymentIntent { payment_intent, .. } = effect else {
            return Ok(None);
        };
        if customer.is_none() {
            customer = registers::intent_customer(conn, source, payment_intent).await?;
        }
    }
    Ok(customer)
}

/// A links-only event whose intents no customer is known under yet: the links are kept for
/// the refund that may follow; any other effect needs a customer. A refund that committed
/// between the look-up and the write is a conflict: the attempt fails and is retried, and
/// the retry finds the customer.
async fn remember_links_without_customer(
    state: &WorkerState,
    conn: &mut PgConnection,
    event: &Claimed,
    effects: &[Effect],
) -> Result<Applied, WorkerError> {
    let mut tx = begin(conn).await?;
    if !lease::still_held(&mut tx, event).await? {
        return Err(WorkerError::LeaseLost);
    }
    sim::point(Point::WorkerLocked, event.id).await;
    let mut learned = Vec::new();
    let mut status = EventStatus::Applied;
    for effect in effects {
        let Effect::PaymentIntent {
            payment_intent,
            invoice,
        } = effect
        else {
            status = EventStatus::Ignored;
            learned = vec!["the event names no customer".to_owned()];
            break;
        };
        let source = &event.source;
        let customer = registers::remember_link(&mut tx, source, payment_intent, invoice).await?;
        if customer.is_some() {
            return Err(WorkerError::Raced);
        }
        learned.push(format!("payment intent {payment_intent} paid {invoice}"));
    }
    let reason = learned.join("; ");
    state.fault(FaultPoint::BeforeCommit)?;
    sim::point(Point::WorkerDecided, event.id).await;
    if !lease::finish_held(&mut tx, event, status, &reason, None).await? {
        return Err(WorkerError::LeaseLost);
    }
    sim::point(Point::WorkerWritten, event.id).await;
    tx.commit().await?;
    Ok(applied(event, status, reason, Vec::new()))
}

/// Handles an SQS batch: every message names one event. The batch is claimed in one
/// statement and worked on one connection (docs/design.md §8). Only messages whose event
/// could not be processed for a transient reason are reported, so SQS delivers them again.
pub async fn handle_batch(state: &WorkerState, event: SqsEvent) -> SqsBatchResponse {
    handle_batch_until(state, event, None).await
}

/// [`handle_batch`] within an invocation that ends at `until` (the Lambda deadline). No event
/// is worked on past its lease or past the invocation: before each event, the leases of the
/// batch's remaining events are renewed in one statement when the event's budget would
/// outlast them (the lease started at the claim, so event k's began up to k − 1 budgets
/// earlier), and the events that could not have their whole budget before `until` are given
/// back to the queue (docs/design.md §3.5).
pub async fn handle_batch_until(
    state: &WorkerState,
    event: SqsEvent,
    until: Option<Instant>,
) -> SqsBatchResponse {
    let mut messages = Vec::with_capacity(event.records.len());
    for message in event.records {
        let Some(message_id) = message.message_id.clone() else {
            continue;
        };
        match message.body.as_deref().and_then(parse_message_body) {
            Some(event_id) => messages.push((message_id, event_id)),
            // Not ours to retry: a body that is not an event id never will be.
            None => tracing::error!(message_id, "message body is not an event id; dropping it"),
        }
    }
    let mut response = SqsBatchResponse::default();
    let mut retry = |message_id: String| {
        let mut failure = BatchItemFailure::default();
        failure.item_identifier = message_id;
        response.batch_item_failures.push(failure);
    };
    let ids: Vec<i64> = messages.iter().map(|(_, id)| *id).collect();
    // The leases start at the claim, or later: the batch counts from before it.
    let mut leased_at = Instant::now();
    let (mut conn, claimed) = match claim_batch(state, &ids).await {
        Ok(claimed) => claimed,
        Err(why) => {
            tracing::error!(error = %why, "the batch will be delivered again");
            messages
                .into_iter()
                .for_each(|(message_id, _)| retry(message_id));
            return response;
        }
    };
    let mut claimed: HashMap<i64, Claimed> = claimed.into_iter().map(|c| (c.id, c)).collect();
    let mut begun = false;
    let mut messages = messages.into_iter();
    while let Some((message_id, event_id)) = messages.next() {
        // Not claimed: final, held by another worker, not due, gone, or a copy in this batch.
        if !claimed.contains_key(&event_id) {
            continue;
        }
        // The first event is always begun: an invocation shorter than one budget still moves.
        if begun && until.is_some_and(|until| Instant::now() + state.event_budget > until) {
            tracing::warn!(event_id, "the invocation ends before this event's budget would; it and the rest of the batch will be delivered again");
            retry(message_id);
            messages
                .filter(|(_, id)| claimed.contains_key(id))
                .for_each(|(message_id, _)| retry(message_id));
            return response;
        }
        if leased_at.elapsed() + state.event_budget > state.lease {
            let renewing = Instant::now();
            match renew_leases(state, &mut conn, &claimed).await {
                Ok(renewed) => {
                    claimed.retain(|id, _| renewed.contains(id));
                    leased_at = renewing;
                }
                Err(why) => {
                    tracing::error!(error = %why, "the rest of the batch will be delivered again");
                    // Closed, not returned to the pool, as after a silent event.
                    drop(conn.detach());
                    retry(message_id);
                    messages
                        .filter(|(_, id)| claimed.contains_key(id))
                        .for_each(|(message_id, _)| retry(message_id));
                    return response;
                }
            }
        }
        // Renewed by another worker's claim meanwhile: no longer this batch's.
        let Some(event) = claimed.remove(&event_id) else {
            continue;
        };
        begun = true;
        let processed = timeout(
            state.event_budget,
            process_claimed(state, &mut conn, &event),
        );
        let Ok(processed) = processed.await else {
            tracing::error!(event_id, budget = ?state.event_budget, "the event took longer than its budget; its connection is closed and the message will be delivered again");
            retry(message_id);
            // Closed, not returned to the pool: the pool pings a connection on its way back,
            // and that ping would wait on it for good, holding a place in the pool.
            drop(conn.detach());
            conn = match state.pool.acquire().await {
                Ok(fresh) => fresh,
                Err(error) => {
                    tracing::error!(error = %error, "database unavailable; the rest of the batch will be delivered again");
                    messages
                        .filter(|(_, id)| claimed.contains_key(id))
                        .for_each(|(message_id, _)| retry(message_id));
                    return response;
                }
            };
            continue;
        };
        let failed = match processed {
            Ok(Processed::Failed { status, .. }) => {
                if status == EventStatus::Failed {
                    retry(message_id);
                }
                true
            }
            Ok(_) => false,
            Err(error) => {
                tracing::error!(event_id, error = %error, "database unavailable; the message will be delivered again");
                retry(message_id);
                true
            }
        };
        // After a failure the connection may be the broken part: the rest of the batch
        // takes another, so one broken connection does not fail the events after it.
        if failed {
            if let Ok(fresh) = state.pool.acquire().await {
                conn = fresh;
            }
        }
    }
    response
}

/// Renews the leases of the batch's events not yet worked on, bounded like one event; the
/// ids renewed. When it fails or is not answered in time, the caller gives the rest of the
/// batch back and closes the connection.
async fn renew_leases(
    state: &WorkerState,
    conn: &mut PgConnection,
    claimed: &HashMap<i64, Claimed>,
) -> Result<Vec<i64>, String> {
    let events: Vec<&Claimed> = claimed.values().collect();
    match timeout(state.event_budget, lease::renew(conn, &events, state.lease)).await {
        Ok(Ok(renewed)) => Ok(renewed),
        Ok(Err(e)) => Err(format!("the leases could not be renewed: {e}")),
        Err(_) => Err(format!(
            "the lease renewal was not answered within {:?}",
            state.event_budget
        )),
    }
}

/// Claims a batch's events on a connection of the pool, the claim bounded like one event
/// ([`EVENT_BUDGET`]); says why not, when not. A claim that reached the server may have
/// committed although it was not answered: its events are then under a lease nobody works,
/// and come again when it ends (the queue's redelivery, the rescue). Its connection is
/// closed, not returned to the pool, as after a silent event.
async fn claim_batch(
    state: &WorkerState,
    ids: &[i64],
) -> Result<(PoolConnection<Postgres>, Vec<Claimed>), String> {
    let mut conn = state
        .pool
        .acquire()
        .await
        .map_err(|e| format!("database unavailable: {e}"))?;
    match timeout(
        state.event_budget,
        lease::claim(&mut conn, ids, state.lease),
    )
    .await
    {
        Ok(Ok(claimed)) => Ok((conn, claimed)),
        Ok(Err(e)) => Err(format!("database unavailable: {e}")),
        Err(_) => {
            drop(conn.detach());
            Err(format!(
                "the claim was not answered within {:?}; its connection is closed",
                state.event_budget
            ))
        }
    }
}

/// Where a fault can be injected, to prove that a crash at that point loses nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// The event's writes are decided; the statement that writes them and finishes the
    /// event (and, under the account's lock, the commit) has not run.
    BeforeCommit,
}

#[cfg(feature = "dev")]
mod faults {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::{FaultPoint, WorkerError};

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum FaultAction {
        /// Fail this many times (an error return; nothing is written).
        Fail(u32),
        /// End the process on the spot, before the write.
        Exit,
    }

    /// Injected faults, empty unless a test sets one. Each worker state has its own, so tests
    /// that run side by side do not see each other's faults.
    #[derive(Debug, Default)]
    pub struct Faults(Mutex<HashMap<FaultPoint, FaultAction>>);

    impl Faults {
        pub fn set(&self, point: FaultPoint, action: FaultAction) {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(point, action);
        }

        pub(super) fn hit(&self, point: FaultPoint) -> Result<(), WorkerError> {
            let mut faults = self.0.lock().unwrap_or_else(|e| e.into_inner());
            match faults.get(&point).copied() {
                Some(FaultAction::Exit) => std::process::exit(86),
                Some(FaultAction::Fail(n)) if n > 0 => {
                    faults.insert(point, FaultAction::Fail(n - 1));
                    Err(WorkerError::Injected(point))
                }
                _ => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moved_account_is_contended_and_the_memory_of_them_stays_bounded() {
        let contended = Contended::default();
        assert!(!contended.is_hot("stripe", "cus_1"));
        contended.moved("stripe", "cus_1");
        assert!(contended.is_hot("stripe", "cus_1"));
        assert!(!contended.is_hot("polar", "cus_1"));
        for n in 0..CONTENDED_MAX {
            contended.moved("stripe", &format!("cus_x{n}"));
        }
        let remembered = contended.0.lock().unwrap().len();
        assert!(
            remembered <= CONTENDED_MAX,
            "{remembered} accounts remembered"
        );
    }
}
