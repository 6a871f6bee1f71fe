//! The worker function's handler: for each SQS message, claim the event it names under a
//! lease, decide what the event means (its provider) and make the provider reads a tie or a
//! refund needs, then in one transaction re-check the lease, write the registers and the
//! account's log line (billing) and finish the event (inbox). A failure rolls the transaction
//! back and is recorded with the retry schedule; only transient failures are reported back to
//! SQS (docs/design.md §1, §3).

use std::collections::HashMap;
use std::time::Duration;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use sqlx::{Connection, PgConnection, PgPool};

use crate::billing::registers::{self, EventContext};
use crate::billing::{account, outcome, Catalog, Change, Decision, Effect, Rank, Version};
use crate::config::{SourceConfig, WorkerConfig};
use crate::domain::Period;
use crate::domain::{EventStatus, SourceKind};
use crate::effects::{self, outbox, Cause};
use crate::inbox::lease::{self, Claimed};
use crate::inbox::{DEFAULT_LEASE, RETRY_DELAYS};
use crate::providers::{self, Api, Reads};
use crate::queue::{parse_message_body, Queue};
use crate::sim::{self, Bug, Point};

/// How long the worker waits for one provider read before settling without it.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// Injected faults, for tests that prove a crash at a point loses nothing.
    #[cfg(feature = "dev")]
    pub faults: Faults,
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
        let configs =
            crate::secrets::resolve(&config.sources, crate::secrets::Needs::ApiKey, true).await?;
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
    #[error(transparent)]
    Register(#[from] registers::WriteError),
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
            if let (Some(queue), false) = (&state.effects, effects.is_empty()) {
                // After the commit: a send that fails leaves the effects to the rescue.
                if let Err(error) = outbox::enqueue_or_unmark(&state.pool, queue, &effects).await {
                    tracing::warn!(event_id = event.id, error = %error, "effects written but not enqueued; the scheduler will");
                }
            }
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
            let status = match lease::record_failure(conn, event, &error, delays).await {
                Ok(status) => status,
                // The connection may be what failed: the record goes through a fresh one.
                Err(_) => {
                    let mut fresh = state.pool.acquire().await?;
                    lease::record_failure(&mut fresh, event, &error, delays).await?
                }
            };
            Ok(Processed::Failed { status, error })
        }
    }
}

/// What one event's transaction committed: its final status and reason, and the ids of the
/// effects it wrote.
struct Applied {
    status: EventStatus,
    reason: String,
    effects: Vec<String>,
}

/// The one transaction: re-check the lease, decide, write the registers, log, write the
/// effects, finish.
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
    let mut decision = match (&event.payload, event.occurred_at) {
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
    // What only the provider can settle is read before the transaction, so a slow provider
    // holds neither the account's lock nor an open transaction (docs/design.md §4.2).
    let mut ties_read = HashMap::new();
    let named = event.customer.as_ref();
    let ctx = named.and_then(|c| event_context(event, c, &version));
    if let (Decision::Apply { effects, notes }, Some(ctx)) = (&mut decision, ctx) {
        ties_read = settle(conn, source, &ctx, effects, notes).await?;
    }
    let mut tx = conn.begin().await?;
    // The account's lock comes with the lease re-check when the event names its customer and
    // its decision touches the account: one statement.
    let mut locked = false;
    let held = match (&event.customer, &decision, event.occurred_at) {
        (Some(customer), Decision::Apply { .. } | Decision::Ignore(_), Some(_)) => {
            locked = true;
            lease::still_held_locking(&mut tx, event, customer).await?
        }
        _ => lease::still_held(&mut tx, event).await?,
    };
    if !held {
        return Err(WorkerError::LeaseLost);
    }
    sim::point(Point::WorkerLeaseChecked, event.id).await;
    let mut customer = event.customer.clone();
    if customer.is_none() {
        // An event that only links a payment intent to an invoice names no customer (Stripe's
        // `invoice_payment.paid`): it belongs to the customer the intent is known under.
        if let Decision::Apply { effects, .. } = &decision {
            customer = links_only_customer(&mut tx, &event.source, effects).await?;
        }
    }
    let context = customer
        .as_ref()
        .and_then(|c| event_context(event, c, &version));
    let mut written = Vec::new();
    let (status, reason) = match (decision, &context) {
        (Decision::Unprocessable(reason), _) => (EventStatus::Unprocessable, reason),
        (Decision::Ignore(reason), ctx) => {
            if let (Some(ctx), false) = (ctx, locked) {
                registers::lock_account(&mut tx, ctx.source, ctx.customer).await?;
            }
            (EventStatus::Ignored, reason)
        }
        (Decision::Apply { effects, .. }, None) if customer.is_none() => {
            remember_links_without_customer(&mut tx, &event.source, &effects).await?
        }
        (Decision::Apply { .. }, None) => (
            EventStatus::Unprocessable,
            "the event has no provider time".to_owned(),
        ),
        (Decision::Apply { effects, mut notes }, Some(ctx)) => {
            if !locked {
                registers::lock_account(&mut tx, ctx.source, ctx.customer).await?;
            }
            let period = Period::of(ctx.version.at);
            let plan_before = match &state.effects {
                Some(_) => {
                    let before =
                        account::state(&mut tx, ctx.source, ctx.customer, &period, &state.catalog);
                    Some(before.await?.plan)
                }
                None => None,
            };
            let mut changes = Vec::with_capacity(effects.len());
            let mut facts = Vec::new();
            for (i, effect) in effects.iter().enumerate() {
                if i == 1 {
                    state.fault(FaultPoint::BetweenEffects)?;
                }
                sim::point(Point::WorkerEffect(i), event.id).await;
                let write = registers::apply_effect(&mut tx, ctx, effect).await?;
                if let Effect::Subscription { id, .. } = effect {
                    match (&source.reads, write.tied_with) {
                        (None, Some(tie)) => notes.push(format!(
                            "same-second tie with event {tie} resolved by status rank"
                        )),
                        // Under the lock the register holds another tie than the read settled:
                        // the retry reads again.
                        (Some(_), tied) if ties_read.get(id) != Some(&tied) => {
                            return Err(WorkerError::TieMoved)
                        }
                        _ => {}
                    }
                }
                changes.push(write.change);
                facts.extend(write.fact);
            }
            let (status, reason) = outcome(&changes, &notes);
            let made = changes.iter().any(|c| matches!(c, Change::Made(_)));
            if let (Some(plan_before), true) = (plan_before, made) {
                let after =
                    account::state(&mut tx, ctx.source, ctx.customer, &period, &state.catalog)
                        .await?;
                let cause = Cause {
                    event_id: event.id,
                    provider_event_id: event.dedupe_key.as_str(),
                    source: ctx.source,
                    customer: ctx.customer.as_str(),
                    occurred_at: ctx.version.at.as_datetime(),
                };
                let new = effects::effects_of(&cause, &facts, &plan_before, &after);
                written = outbox::write(&mut tx, &cause, &new).await?;
            }
            (status, reason)
        }
    };
    state.fault(FaultPoint::BeforeCommit)?;
    // An event about a known account is finished with its line in the account's log.
    let log = match (&context, status) {
        (Some(ctx), EventStatus::Applied | EventStatus::Ignored) => Some(lease::LogLine {
            source: ctx.source,
            customer: ctx.customer,
            event_type: ctx.event_type,
            occurred_at: ctx.version.at.as_datetime(),
        }),
        _ => None,
    };
    lease::finish(&mut tx, event.id, status, &reason, log).await?;
    sim::point(Point::WorkerLogged, event.id).await;
    tx.commit().await?;
    tracing::info!(event_id = event.id, status = status.as_str(), reason = %reason, effects = written.len(), "event finished");
    Ok(Applied {
        status,
        reason,
        effects: written,
    })
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

/// What only the provider can settle, settled before the transaction (docs/design.md §4.2,
/// §4.6): a subscription state stamped with the same second as another event's takes the rank
/// a provider read gives it (else its status rank decides, and the note says so); a refund
/// known only by its payment intent is linked to its invoice by a read when no event has.
/// A failed read settles nothing and says why: the status rank still gives one order.
/// With reads, returns each subscription's tie as read (the other event, if any), which the
/// write under the account's lock must find again.
async fn settle(
    conn: &mut PgConnection,
    source: &WorkerSource,
    ctx: &EventContext<'_>,
    effects: &mut Vec<Effect>,
    notes: &mut Vec<String>,
) -> Result<HashMap<String, Option<i64>>, sqlx::Error> {
    let mut ties_read = HashMap::new();
    let mut linked = Vec::new();
    for effect in effects.iter_mut() {
        match effect {
            Effect::Subscription {
                id,
                status,
                plan,
                rank,
            } => {
                // Without a provider read the status rank settles a tie: the write itself
                // says whether there was one (apply_claimed), with no read before it.
                let Some(reads) = &source.reads else {
                    continue;
                };
                let tie = registers::subscription_tie(conn, ctx, id).await?;
                ties_read.insert(id.clone(), tie.as_ref().map(|t| t.event_id));
                let Some(tie) = tie else {
                    continue;
                };
                let plan_key = plan.as_ref().map(|p| p.key.as_str());
                notes.push(match reads.subscription(id).await {
                    Ok(Some(now)) if now.shows(status, plan_key) => {
                        *rank = Rank::CONFIRMED;
                        format!("same-second tie with event {} resolved by a provider read: {id} is {status}", tie.event_id)
                    }
                    Ok(Some(now)) if now.shows(&tie.status, tie.plan_key.as_deref()) => {
                        *rank = Rank::REFUTED;
                        format!("same-second tie with event {} resolved by a provider read: {id} is {}", tie.event_id, tie.status)
                    }
                    Ok(Some(now)) => format!(
                        "same-second tie with event {}: the provider shows {id} as {} now, neither state; resolved by status rank",
                        tie.event_id, now.status
                    ),
                    Ok(None) => format!(
                        "same-second tie with event {}: the provider does not know {id}; resolved by status rank",
                        tie.event_id
                    ),
                    Err(error) => format!(
                        "same-second tie with event {}: the provider read failed ({error:#}); resolved by status rank",
                        tie.event_id
                    ),
                });
            }
            Effect::RefundIntent { payment_intent, .. } => {
                // Without reads nothing is looked up: the refund is recorded and linked later.
                let Some(reads) = &source.reads else {
                    continue;
                };
                if registers::linked_invoice(conn, ctx.source, payment_intent)
                    .await?
                    .is_some()
                {
                    continue;
                }
                match reads.invoice_of_payment_intent(payment_intent).await {
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
    Ok(ties_read)
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
    conn: &mut PgConnection,
    source: &str,
    effects: &[Effect],
) -> Result<(EventStatus, String), WorkerError> {
    let mut learned = Vec::new();
    for effect in effects {
        let Effect::PaymentIntent {
            payment_intent,
            invoice,
        } = effect
        else {
            return Ok((
                EventStatus::Ignored,
                "the event names no customer".to_owned(),
            ));
        };
        let state = registers::remember_link(conn, source, payment_intent, invoice, None).await?;
        if state.customer.is_some() {
            return Err(WorkerError::Raced);
        }
        learned.push(format!("payment intent {payment_intent} paid {invoice}"));
    }
    Ok((EventStatus::Applied, learned.join("; ")))
}

/// Handles an SQS batch: every message names one event. The batch is claimed in one
/// statement and worked on one connection (docs/design.md §8). Only messages whose event
/// could not be processed for a transient reason are reported, so SQS delivers them again.
pub async fn handle_batch(state: &WorkerState, event: SqsEvent) -> SqsBatchResponse {
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
    let claimed = async {
        let mut conn = state.pool.acquire().await?;
        let claimed = lease::claim(&mut conn, &ids, state.lease).await?;
        Ok::<_, sqlx::Error>((conn, claimed))
    };
    let (mut conn, claimed) = match claimed.await {
        Ok(claimed) => claimed,
        Err(error) => {
            tracing::error!(error = %error, "database unavailable; the batch will be delivered again");
            messages
                .into_iter()
                .for_each(|(message_id, _)| retry(message_id));
            return response;
        }
    };
    let mut claimed: HashMap<i64, Claimed> = claimed.into_iter().map(|c| (c.id, c)).collect();
    for (message_id, event_id) in messages {
        // Not claimed: final, held by another worker, not due, gone, or a copy in this batch.
        let Some(event) = claimed.remove(&event_id) else {
            continue;
        };
        let failed = match process_claimed(state, &mut conn, &event).await {
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

/// Where a fault can be injected, to prove that a crash at that point loses nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// After an event's first register write, before the rest (e.g. the allowance grant).
    BetweenEffects,
    /// After every write, before the commit.
    BeforeCommit,
}

#[cfg(feature = "dev")]
mod faults {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::{FaultPoint, WorkerError};

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum FaultAction {
        /// Fail this many times (an error return; the transaction rolls back).
        Fail(u32),
        /// End the process on the spot, mid-transaction.
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
