//! The worker function's handler, the Lambda adapter: it takes an SQS batch, claims
//! the events its messages name under a lease in one statement, keeps the leases and
//! each event's budget within the invocation, has each event applied (`apply`: decide,
//! read, settle with provider reads, rules, one writing statement, docs/design.md §1.2),
//! records a failed attempt with the retry schedule, sends the effects committed, and
//! reports only transient failures back to SQS (docs/design.md §1, §3).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
use tokio::time::timeout;

use crate::apply::{self, Applied, Applier, ApplyError, Contended};
use crate::domain::retry::{RetryPolicy, RETRY};
use crate::domain::Catalog;
use crate::domain::EventStatus;
use crate::effects::outbox;
use crate::inbox::lease::{self, Claimed, Unclaimed};
use crate::inbox::DEFAULT_LEASE;
use crate::platform::config::WorkerConfig;
use crate::platform::queue::{message_traceparent, parse_message_body, Queue};
use crate::platform::queued;
use crate::platform::sim::{self, Point};

pub use crate::apply::WorkerSource;

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

pub struct WorkerState {
    pub pool: PgPool,
    pub sources: HashMap<String, WorkerSource>,
    pub catalog: Catalog,
    pub lease: Duration,
    /// The waits after a failed attempt ([`RETRY`]; the tests wait less).
    pub retry: RetryPolicy,
    /// Effects on: the queue the dispatcher takes effect ids from (docs/design.md §11).
    /// `None`: no effect is written.
    pub effects: Option<Queue>,
    /// The queue the intake sends to: an event an attempt stored (a provider read, stored as
    /// an event of its own) is sent to it after the commit. `None`: the rescue sends it.
    pub events: Option<Queue>,
    /// Accounts another event moved lately between an event's read and its write.
    pub contended: Contended,
    /// How long one event of a batch may take, its provider reads included, before the
    /// worker gives up on it and on its connection ([`EVENT_BUDGET`]).
    pub event_budget: Duration,
    /// How long one attempt of a health notice goes on starting pages of its sweep
    /// ([`apply::SWEEP_BUDGET`]); at most half of `event_budget` is used, so that the attempt
    /// ends within the event's budget (docs/design.md §6.2).
    pub sweep_budget: Duration,
    /// Where the pool's options come from, when it is a secret that a rotation changes
    /// (`None`: fixed options).
    pub database: Option<std::sync::Arc<crate::platform::database::Database>>,
}

impl WorkerState {
    pub fn new(pool: PgPool, sources: HashMap<String, WorkerSource>, catalog: Catalog) -> Self {
        Self {
            pool,
            sources,
            catalog,
            lease: DEFAULT_LEASE,
            retry: RETRY,
            effects: None,
            events: None,
            contended: Contended::default(),
            event_budget: EVENT_BUDGET,
            sweep_budget: apply::SWEEP_BUDGET,
            database: None,
        }
    }

    /// Builds the pool and each source's reads (with the API key from its secret, if any).
    pub async fn from_config(config: &WorkerConfig, max_connections: u32) -> anyhow::Result<Self> {
        use anyhow::Context;
        crate::providers::check_sources(&config.sources)?;
        let database = crate::platform::database::Database::open(&config.database).await?;
        let pool = database.pool(max_connections);
        let http = reqwest::Client::builder()
            .timeout(READ_TIMEOUT)
            .build()
            .context("building the HTTP client")?;
        let configs = crate::platform::secrets::resolve(
            &config.sources_read(),
            crate::platform::secrets::Needs::ApiKey,
            crate::platform::secrets::OnFailure::RetryOnUse("worker"),
        )
        .await?;
        // Every read takes from its source's budget, shared with every other instance.
        let client = crate::providers::ApiClient::budgeted(
            &http,
            crate::platform::budget::Budgets::new(pool.clone()),
            crate::platform::budget::Lane::Reads,
        );
        let sources = configs
            .iter()
            .map(|s| (s.name.clone(), WorkerSource::from_config(s, &client)))
            .collect();
        let mut state = Self::new(pool, sources, config.catalog.clone());
        state.database = Some(database);
        if let Some(effects) = &config.effects {
            state.effects = Some(Queue::from_env(effects.queue_url.clone()).await);
        }
        if let Some(queue_url) = &config.queue_url {
            state.events = Some(Queue::from_env(queue_url.clone()).await);
        }
        Ok(state)
    }

    /// What applying an event needs of this state.
    fn applier(&self) -> Applier<'_> {
        Applier {
            sources: &self.sources,
            catalog: &self.catalog,
            effects: self.effects.is_some(),
            contended: &self.contended,
            sweep_budget: self.sweep_budget.min(self.event_budget / 2),
        }
    }
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
    /// This attempt did part of the event's work, kept it, and gave the event back to be
    /// continued (`received`, the attempt not counted): a health notice's sweep.
    Unfinished { progress: String },
    /// A provider read was not made for the rate: the event is `failed` and due again at
    /// `until`, the attempt not counted (docs/design.md §6.7).
    Deferred {
        until: chrono::DateTime<chrono::Utc>,
        reason: String,
    },
}

/// Processes one stored event. An error means the database could not be reached at all;
/// every other failure is recorded on the event and reported as `Failed`.
#[tracing::instrument(skip_all, fields(event_id))]
pub async fn process_event(state: &WorkerState, event_id: i64) -> Result<Processed, sqlx::Error> {
    let mut conn = state.pool.acquire().await?;
    let claimed = lease::claim(&mut conn, &[event_id], state.lease).await?;
    match claimed.into_iter().next() {
        Some(event) => {
            let span = event_span(&event, None);
            process_claimed(state, &mut conn, &event)
                .instrument(span)
                .await
        }
        None => Ok(Processed::Skipped),
    }
}

/// One event's span in the worker (docs/operating.md "Following one event"): its source,
/// row id, provider key and account, continuing the trace its message carries (the
/// intake's, or the rescue's), so that its effects' sends are part of it too.
fn event_span(event: &Claimed, traceparent: Option<&str>) -> tracing::Span {
    let span = tracing::info_span!(
        "worker",
        source = %event.source,
        event_id = event.id,
        dedupe_key = event.dedupe_key.as_str(),
        account = tracing::field::Empty,
        attempt = event.attempts,
    );
    if let Some(customer) = &event.customer {
        span.record("account", customer.as_str());
    }
    crate::platform::telemetry::continue_trace(&span, traceparent);
    span
}

/// Applies one claimed event on `conn`, or records why it could not be.
async fn process_claimed(
    state: &WorkerState,
    conn: &mut PgConnection,
    event: &Claimed,
) -> Result<Processed, sqlx::Error> {
    sim::point(Point::WorkerClaimed, event.id).await;
    match apply::apply_claimed(&state.applier(), conn, event).await {
        Ok(Applied {
            status,
            reason,
            effects,
            enqueue,
        }) => {
            sim::point(Point::WorkerCommitted, event.id).await;
            send_effects(state, event.id, &effects).await;
            send_events(state, event.id, &enqueue).await;
            Ok(Processed::Finished { status, reason })
        }
        Err(ApplyError::LeaseLost) => {
            tracing::warn!(
                event_id = event.id,
                "lease lost; another worker has the event"
            );
            Ok(Processed::Skipped)
        }
        Err(ApplyError::Unfinished(progress)) => {
            if lease::give_back(conn, event, &progress).await? {
                tracing::info!(
                    event_id = event.id,
                    progress,
                    "event given back to be continued"
                );
                Ok(Processed::Unfinished { progress })
            } else {
                tracing::warn!(
                    event_id = event.id,
                    "lease lost; another worker has the event"
                );
                Ok(Processed::Skipped)
            }
        }
        Err(ApplyError::Throttled(throttled)) => {
            let reason = throttled.to_string();
            let until = throttled.until;
            let deferred = match lease::defer(conn, event, until, &reason).await {
                Ok(deferred) => deferred,
                // The connection may be what failed: the record goes through a fresh one.
                Err(_) => {
                    let mut fresh = state.pool.acquire().await?;
                    lease::defer(&mut fresh, event, until, &reason).await?
                }
            };
            match deferred {
                true => Ok(Processed::Deferred { until, reason }),
                false => Ok(no_longer_held(state, event.id, &reason).await),
            }
        }
        Err(error) => {
            let error = error.to_string();
            let retry = &state.retry;
            let recorded = match lease::record_failure(conn, event, &error, retry).await {
                Ok(recorded) => recorded,
                // The connection may be what failed: the record goes through a fresh one.
                Err(_) => {
                    let mut fresh = state.pool.acquire().await?;
                    lease::record_failure(&mut fresh, event, &error, retry).await?
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
    if let Err(error) = queued::enqueue_or_unmark::<outbox::Effects>(&state.pool, queue, ids).await
    {
        tracing::warn!(
            event_id,
            error = format!("{error:#}"),
            "effects written but not enqueued; the scheduler will"
        );
    }
}

/// Sends the events an attempt stored (marked `enqueued_at` by the statement that stored
/// them) to the intake's queue after its commit, as the intake sends what it stores; what
/// the queue refuses is unmarked, and the rescue sends it (docs/design.md §3.7).
async fn send_events(state: &WorkerState, event_id: i64, ids: &[i64]) {
    let Some(queue) = state.events.as_ref().filter(|_| !ids.is_empty()) else {
        return;
    };
    if let Err(error) = crate::inbox::enqueue_or_unmark(&state.pool, queue, ids).await {
        tracing::warn!(
            event_id,
            error = format!("{error:#}"),
            "events stored but not enqueued; the scheduler will"
        );
    }
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
    // Each event's trace, from its message (the first, when a batch names an event twice).
    let mut traces: HashMap<i64, String> = HashMap::new();
    for message in event.records {
        let Some(message_id) = message.message_id.clone() else {
            continue;
        };
        match message.body.as_deref().and_then(parse_message_body) {
            Some(event_id) => {
                if let Some(traceparent) = message_traceparent(&message) {
                    traces
                        .entry(event_id)
                        .or_insert_with(|| traceparent.to_owned());
                }
                messages.push((message_id, event_id))
            }
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
            if let Some(database) = &state.database {
                database.after_pool_error().await;
            }
            messages
                .into_iter()
                .for_each(|(message_id, _)| retry(message_id));
            return response;
        }
    };
    let mut claimed: HashMap<i64, Claimed> = claimed.into_iter().map(|c| (c.id, c)).collect();
    let taken: HashSet<i64> = claimed.keys().copied().collect();
    let not_taken = not_taken(state, &mut conn, &ids, &taken).await;
    if not_taken.is_err() {
        // The connection may be what failed: the batch goes on with another.
        drop(conn.detach());
        conn = match state.pool.acquire().await {
            Ok(fresh) => fresh,
            Err(error) => {
                tracing::error!(error = %error, "database unavailable; the batch will be delivered again");
                messages
                    .into_iter()
                    .for_each(|(message_id, _)| retry(message_id));
                return response;
            }
        };
    }
    let mut begun = false;
    let mut messages = messages.into_iter();
    while let Some((message_id, event_id)) = messages.next() {
        if !claimed.contains_key(&event_id) {
            if taken.contains(&event_id) {
                tracing::info!(event_id, "message acknowledged without work: this batch took its event already (a copy in the batch), or another worker has since");
            } else if !acknowledged(event_id, &not_taken) {
                retry(message_id);
            }
            continue;
        }
        // The first event is always begun: an invocation shorter than one budget still moves.
        if begun && until.is_some_and(|until| Instant::now() + state.event_budget > until) {
            tracing::warn!(event_id, "the invocation ends before this event's budget would; it and the rest of the batch will be delivered again");
            give_back(&mut retry, Some(message_id), messages, &claimed);
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
                    give_back(&mut retry, Some(message_id), messages, &claimed);
                    return response;
                }
            }
        }
        // Not renewed (another worker claimed it meanwhile): no longer this batch's.
        let Some(event) = claimed.remove(&event_id) else {
            continue;
        };
        begun = true;
        let span = event_span(&event, traces.get(&event_id).map(String::as_str));
        let processed = timeout(
            state.event_budget,
            process_claimed(state, &mut conn, &event).instrument(span),
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
                    give_back(&mut retry, None, messages, &claimed);
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
            // Due again later: the queue's redelivery finds it waiting, or it comes due.
            Ok(Processed::Deferred { .. }) => {
                retry(message_id);
                false
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

/// What the rows of the batch's events that the claim did not take say now ([`lease::unclaimed`]),
/// in one statement, bounded like one event; `Err` when that could not be learned.
async fn not_taken(
    state: &WorkerState,
    conn: &mut PgConnection,
    ids: &[i64],
    taken: &HashSet<i64>,
) -> Result<HashMap<i64, Unclaimed>, String> {
    let mut left: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| !taken.contains(id))
        .collect();
    left.sort_unstable();
    left.dedup();
    if left.is_empty() {
        return Ok(HashMap::new());
    }
    match timeout(state.event_budget, lease::unclaimed(conn, &left)).await {
        Ok(Ok(states)) => Ok(states),
        Ok(Err(e)) => Err(format!("database unavailable: {e}")),
        Err(_) => Err(format!("no answer within {:?}", state.event_budget)),
    }
}

/// Whether the message of an event the batch's claim did not take may be acknowledged: only
/// when the event is final, held under another worker's live lease, waiting for a later
/// time, or gone. An event a worker could take now (a row the claim passed by) keeps its
/// message, as does one whose row could not be read: the message is what brings a worker to
/// the event, and without it the event would wait for the rescue's 5-minute rule
/// (docs/design.md §1.3, §3.7). Each is said in the log.
fn acknowledged(event_id: i64, not_taken: &Result<HashMap<i64, Unclaimed>, String>) -> bool {
    match not_taken.as_ref().map(|states| states.get(&event_id)) {
        Ok(Some(Unclaimed::Claimable)) => {
            tracing::warn!(
                event_id,
                "the claim did not take an event that a worker could take; its message will be delivered again"
            );
            false
        }
        Ok(Some(state)) => {
            tracing::info!(
                event_id,
                why = state.as_str(),
                "message acknowledged without work"
            );
            true
        }
        Ok(None) => false,
        Err(error) => {
            tracing::warn!(
                event_id,
                error = %error,
                "the claim did not take the event and its row could not be read; its message will be delivered again"
            );
            false
        }
    }
}

/// Reports `first` (if any) and every message after it whose event the batch still holds,
/// so SQS delivers them again.
fn give_back(
    retry: &mut impl FnMut(String),
    first: Option<String>,
    rest: impl Iterator<Item = (String, i64)>,
    claimed: &HashMap<i64, Claimed>,
) {
    first.into_iter().for_each(&mut *retry);
    rest.filter(|(_, id)| claimed.contains_key(id))
        .for_each(|(message_id, _)| retry(message_id));
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
