//! Applying one claimed event (docs/design.md §1.2, §3.5, §4, §8): decide what it means (its
//! provider), read the account's registers, make the provider reads a tie or a refund needs
//! (outside any lock or transaction), apply the register rules (billing), and write it all
//! with the event's finish in one statement that re-checks the lease and the account's
//! version (inbox); an account that moved meanwhile is read and written again under its
//! lock. The claim, the batch and what becomes of a failed attempt are the worker's
//! (`handlers::worker`); this is the algorithm between them.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};

use crate::billing::rules::{Registers, Stamp};
use crate::billing::ruling::{rule, tie_on, Ruling, TieMoved};
use crate::billing::{credits, registers};
use crate::billing::{Decision, Effect, EventContext, Rank, Settled, SubscriptionEnds, Version};
use crate::domain::{Catalog, EventStatus, SourceKind};
use crate::effects;
use crate::inbox::commit::{self, Committed};
use crate::inbox::lease::{self, Claimed};
use crate::platform::budget::Throttled;
use crate::platform::config::SourceConfig;
use crate::platform::sim::{self, Bug, Injected, Point};
use crate::providers::{self, Api, ApiClient, Carrier, Notice, Reads, Shown};

mod notice;
pub(crate) mod subscription_read;
pub use notice::health::{generation_failure_metric, SWEEP_BUDGET};
pub use notice::thin::thin_without_api_key_metric;

/// What applying an event needs of the worker: its sources, the plan catalog, whether
/// effects are written (docs/design.md §11), and the accounts it found contended lately.
pub struct Applier<'a> {
    pub sources: &'a HashMap<String, WorkerSource>,
    pub catalog: &'a Catalog,
    /// Effects on: the plan before and after an event is derived, and the effects its
    /// changes tell are written with it.
    pub effects: bool,
    pub contended: &'a Contended,
    /// How long an attempt goes on starting pages of a health notice's sweep (§6.2).
    pub sweep_budget: Duration,
}

/// What applying an event knows of one configured source.
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
    pub fn from_config(config: &SourceConfig, client: impl Into<ApiClient>) -> Self {
        Self {
            kind: config.kind,
            livemode: config.livemode,
            reads: Api::for_source(config, client)
                .and_then(|api| providers::provider(config.kind).reads(api)),
        }
    }

    /// The notice a claimed event is, when its provider's hook reads it as one (a thin event,
    /// a generation failure, a meter error notice: docs/design.md §6.2); `None` for every
    /// other event, and for every event of a provider that sends none.
    fn notice(&self, event: &Claimed) -> Option<Notice> {
        providers::provider(self.kind).notice(event.payload.as_ref()?)
    }
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

/// Why an attempt wrote nothing. The worker records it on the event with the retry schedule
/// (a lost lease excepted: the event is another worker's then).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("source '{0}' is not configured")]
    UnknownSource(String),
    #[error("the lease on the event was lost to another worker")]
    LeaseLost,
    #[error("another event wrote the same payment intent meanwhile; retrying")]
    Raced,
    #[error(
        "another event of the same second reached the register during the provider read; retrying"
    )]
    TieMoved,
    #[error("the account, or a subscription or payment another customer's event wrote, moved during the write; retrying")]
    Moved,
    /// A thin event's object, or an invoice's subscription, could not be read or stored.
    #[error("a provider read failed: {0}")]
    Fetch(String),
    /// The attempt did part of the event's work and kept it (a health notice's sweep, past
    /// the pages it read), then ran out of its budget, or failed after doing some: the event
    /// is given back to be continued, the attempt not counted against it.
    #[error("{0}")]
    Unfinished(String),
    #[error(transparent)]
    Injected(#[from] Injected),
    /// A provider read not made for the rate (the source's budget is spent, or the provider
    /// answered 429): the event waits until then, the attempt not counted against it
    /// (docs/design.md §6.7).
    #[error(transparent)]
    Throttled(#[from] Throttled),
}

impl ApplyError {
    /// A provider read that failed: [`ApplyError::Throttled`] when it was not made for the
    /// rate, else [`ApplyError::Fetch`] with the whole chain.
    pub fn fetch(error: anyhow::Error) -> Self {
        match Throttled::find(&error) {
            Some(throttled) => Self::Throttled(throttled.clone()),
            None => Self::Fetch(format!("{error:#}")),
        }
    }
}

/// What one event's write committed: its final status and reason, the ids of the effects it
/// wrote, and the events the attempt stored that wait for the queue (a provider read stored
/// as an event of its own, docs/design.md §6.2), for the worker to send after the commit as
/// the intake sends what it stores.
pub struct Applied {
    pub status: EventStatus,
    pub reason: String,
    pub effects: Vec<String>,
    pub enqueue: Vec<i64>,
}

/// Applies one claimed event: for an event about an account, one read of the account's
/// registers, the register rules, and one statement that writes it all if the account has not
/// moved meanwhile — else again under the account's lock (docs/design.md §8); for one its
/// rules ignore outright, or any other, one statement that finishes it.
///
/// A notice (a thin event, a provider's notice of events it failed to generate or of meter
/// reports it could not count, docs/design.md §6.2) is the provider's hook's to name, asked
/// once here; what it stands for is read and applied in its place (`notice`).
pub async fn apply_claimed(
    applier: &Applier<'_>,
    conn: &mut PgConnection,
    event: &Claimed,
) -> Result<Applied, ApplyError> {
    let source = applier
        .sources
        .get(&event.source)
        .ok_or_else(|| ApplyError::UnknownSource(event.source.clone()))?;
    match source.notice(event) {
        None => apply_event(applier, conn, event, source).await,
        Some(notice) => notice::apply(applier, conn, event, source, notice).await,
    }
}

/// An event as stored (or a notice's read, under the notice's id and lease).
async fn apply_event(
    applier: &Applier<'_>,
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
) -> Result<Applied, ApplyError> {
    let provider = providers::provider(source.kind);
    let decision = match (&event.payload, event.occurred_at) {
        (Some(payload), Some(_)) => match provider.out_of_scope(payload, source.livemode) {
            Some(reason) => Decision::Ignore(reason),
            None => providers::decide(source.kind, &event.event_type, payload, applier.catalog),
        },
        _ => Decision::Unprocessable("the stored event has no parsed payload".into()),
    };
    // The event's place in the provider's order: one for the reads and the writes.
    let version = event.occurred_at.map(|at| version_of(event, at));
    let mut customer = event.customer.clone();
    if let (None, Decision::Apply { effects, .. }) = (&customer, &decision) {
        // An event that only links a payment intent to an invoice names no customer (Stripe's
        // `invoice_payment.paid`), nor does a refund of a customer that is an Account (its
        // charge has no `customer_account`): it belongs to the customer the intent is known
        // under, else to the one the provider shows the intent for.
        customer = links_only_customer(conn, &event.source, effects).await?;
        if customer.is_none() {
            customer = refunded_intent_customer(source, event, effects).await?;
        }
        // A credit transaction names its grant, not its customer: it is the grant's
        // customer's, once the grant is known (docs/design.md §4.14).
        if let [Effect::CreditTransaction(t)] = effects.as_slice() {
            customer = registers::grant_customer(conn, &event.source, &t.grant_id).await?;
        }
    }
    let ctx = customer
        .as_ref()
        .and_then(|c| event_context(event, c, &version));
    let (status, reason, account) = match (decision, ctx) {
        (Decision::Apply { effects, notes }, Some(ctx)) => {
            return apply_to_account(applier, conn, event, source, &ctx, effects, notes).await
        }
        // Nothing of it depends on the account's registers: it reads none and leaves the
        // account's version alone, so an event of the account applied meanwhile does not
        // find the account moved (docs/design.md §3.5). Its finish writes its log line.
        (Decision::Ignore(reason), Some(ctx)) => (EventStatus::Ignored, reason, Some(ctx)),
        (Decision::Apply { effects, .. }, None) if customer.is_none() => {
            if let [Effect::CreditTransaction(t)] = effects.as_slice() {
                return keep_transaction_without_grant(conn, event, t).await;
            }
            return remember_links_without_customer(conn, event, &effects).await;
        }
        (Decision::Apply { .. }, None) => (
            EventStatus::Unprocessable,
            "the event has no provider time".to_owned(),
            None,
        ),
        (Decision::Unprocessable(reason), _) => (EventStatus::Unprocessable, reason, None),
        (Decision::Ignore(reason), None) => (EventStatus::Ignored, reason, None),
    };
    finish(conn, event, status, reason, account.as_ref()).await
}

/// Finishes an event that wrote nothing but its finish (and its log line, for an event about
/// an account), while its lease holds.
async fn finish(
    conn: &mut PgConnection,
    event: &Claimed,
    status: EventStatus,
    reason: String,
    account: Option<&EventContext<'_>>,
) -> Result<Applied, ApplyError> {
    sim::fallible_point(Point::WorkerDecided, event.id).await?;
    if !lease::finish_held(conn, event, status, &reason, account).await? {
        return Err(ApplyError::LeaseLost);
    }
    Ok(applied(event, status, reason, Vec::new()))
}

/// An event about an account, with its effects. The provider reads a tie or a refund needs
/// are made after the read and before any lock or transaction (docs/design.md §4.2).
async fn apply_to_account(
    applier: &Applier<'_>,
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    ctx: &EventContext<'_>,
    mut effects: Vec<Effect>,
    mut notes: Vec<String>,
) -> Result<Applied, ApplyError> {
    let plan = applier.effects;
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
    let unlocked = !intents && !applier.contended.is_hot(ctx.source, ctx.customer.as_str());
    // The read without a lock serves the write without one, and the provider reads.
    let mut registers = match unlocked || source.reads.is_some() {
        true => registers::read(conn, ctx, &effects, plan).await?,
        false => Registers::default(),
    };
    sim::point(Point::WorkerRead, event.id).await;
    // A same-second tie the provider settles with a read stored as an event of its own (a
    // Stripe summary's list): the read is applied in this event's place (§4.2, §4.12).
    let read_ties = read_ties(source, event, &effects);
    if let Some((tie, carrier)) = tied(ctx, &registers, &read_ties) {
        tracing::info!(
            event_id = event.id,
            tie,
            "same-second tie settled by the provider's read, applied in the event's place"
        );
        return Box::pin(notice::apply_tie_read(
            applier, conn, event, source, carrier,
        ))
        .await;
    }
    let (ties_read, settled) = settle(source, ctx, &registers, &mut effects, &mut notes).await?;
    let settled = (!settled.is_empty()).then(|| json!(settled));
    // An invoice whose subscription the register does not hold yet: the provider's read.
    let subscription_read::Shown {
        read: shown,
        to_send,
    } = subscription_read::read(
        conn,
        event,
        source,
        ctx,
        &registers,
        &effects,
        applier.catalog,
    )
    .await?;
    let enqueue: Vec<i64> = to_send.into_iter().collect();
    let tie_grants: Vec<&str> = read_ties.iter().map(|(grant, _)| grant.as_str()).collect();
    // The rules' outcome, and the effects its changes tell.
    let rule = |registers: &mut Registers| {
        let reads = source.reads.is_some();
        let ruling = rule(
            ctx,
            registers,
            (applier.catalog, applier.effects),
            (&effects, &notes),
            reads,
            (&ties_read, &shown, &tie_grants),
        )?;
        let mut new = match &ruling.told {
            Some(told) => effects::effects_of(ctx, &told.facts, &told.before, &told.after),
            None => Vec::new(),
        };
        // What the account's credits tell as of the event's time, when they moved: each
        // effect once by its id, whoever writes it first (docs/design.md §4.14).
        if plan && registers.changed.credits() {
            let period = crate::domain::Period::of(ctx.version.at);
            let on = match &ruling.told {
                Some(told) => told.after.plan.clone(),
                None => {
                    let customer = ctx.customer.as_str();
                    registers.state(customer, &period, applier.catalog).plan
                }
            };
            let low = credits::low_levels(&applier.catalog.credits_low_of(&on));
            let account = (ctx.source, ctx.customer.as_str());
            // As of the latest time the event or the credits it joins say: an event that came
            // late tells what its set tells, as it would have had it come in order.
            let at = ctx.version.at.as_datetime().timestamp();
            // The debits' derived allocations counted, as every writer counts them.
            let counted = registers.spends.counted(&registers.credits);
            let until = counted.latest().map_or(at, |l| l.max(at));
            new.extend(credits::told(account, &counted, &low, until));
        }
        Ok::<_, TieMoved>((ruling, new))
    };
    if unlocked {
        let (ruling, new) = rule(&mut registers)?;
        sim::fallible_point(Point::WorkerDecided, event.id).await?;
        let outcome = (ruling.status, ruling.reason.as_str());
        let written = (&new[..], settled.as_ref());
        match commit::commit(conn, event, ctx, &registers, outcome, written).await? {
            Committed::Done { effects, .. } => {
                committed(ctx, &ruling);
                let done = applied(event, ruling.status, ruling.reason, effects);
                return Ok(Applied { enqueue, ..done });
            }
            Committed::LeaseLost => return Err(ApplyError::LeaseLost),
            // Another event of the account committed since the read: read it again under
            // the account's lock, where it cannot move.
            Committed::Moved => {
                tracing::debug!(event_id = event.id, "the account moved since the read");
                applier.contended.moved(ctx.source, ctx.customer.as_str());
            }
        }
    }
    let mut tx = begin(conn).await?;
    if !lease::still_held_locking(&mut tx, event, ctx.customer).await? {
        return Err(ApplyError::LeaseLost);
    }
    sim::point(Point::WorkerLocked, event.id).await;
    let mut registers = registers::read(&mut tx, ctx, &effects, plan).await?;
    let (ruling, new) = rule(&mut registers)?;
    sim::fallible_point(Point::WorkerDecided, event.id).await?;
    let outcome = (ruling.status, ruling.reason.as_str());
    let written = match commit::commit(
        &mut tx,
        event,
        ctx,
        &registers,
        outcome,
        (&new, settled.as_ref()),
    )
    .await?
    {
        Committed::Done { effects, intents } => {
            // A link written meanwhile by an event without a customer: the rules did not see
            // it, so the retry reads again (and the link's event sees this one's customer).
            if intents
                .iter()
                .any(|(id, now)| registers.intents.get(id) != Some(now))
            {
                return Err(ApplyError::Raced);
            }
            effects
        }
        Committed::LeaseLost => return Err(ApplyError::LeaseLost),
        Committed::Moved => return Err(ApplyError::Moved),
    };
    sim::point(Point::WorkerWritten, event.id).await;
    tx.commit().await?;
    committed(ctx, &ruling);
    let done = applied(event, ruling.status, ruling.reason, written);
    Ok(Applied { enqueue, ..done })
}

/// Opens one of the worker's transactions, in the round trip of its `BEGIN`. Its statements
/// follow one another with nothing to wait for in between, so the server ends it once it
/// idles for 10 s. Without that, a worker whose connection went silent inside
/// it (a network that drops what it carries; Lambda stopping the instance closes a socket
/// the server then never hears of) would leave the event's row and its account locked until
/// the server's TCP keepalive gave up, by default two hours later, and every claim of the
/// event and every write to the account would wait on it.
///
/// Through a transaction-mode pooler the bound is set by a function, `inbox_bound_transaction`
/// (migration 20261206100001), in the same round trip: RDS Proxy pins a session for its whole
/// life when it sees a `SET` (or `set_config`), and does not look into the functions a
/// statement calls; the setting is the transaction's alone, so nothing of it outlives it on
/// the server connection the proxy hands on (docs/deploy.md, RDS Proxy).
pub async fn begin(
    conn: &mut PgConnection,
) -> Result<sqlx::Transaction<'_, sqlx::Postgres>, sqlx::Error> {
    if crate::platform::database::sends_unnamed_statements() {
        conn.begin_with(BEGIN_BOUNDED_BY_FUNCTION).await
    } else {
        conn.begin_with(BEGIN_BOUNDED).await
    }
}

const BEGIN_BOUNDED: &str = "BEGIN; SET LOCAL idle_in_transaction_session_timeout = '10s'";
const BEGIN_BOUNDED_BY_FUNCTION: &str = "BEGIN; SELECT inbox_bound_transaction()";

/// What the event finished with, said once in the log.
fn applied(event: &Claimed, status: EventStatus, reason: String, effects: Vec<String>) -> Applied {
    tracing::info!(event_id = event.id, status = status.as_str(), reason = %reason, effects = effects.len(), "event finished");
    Applied {
        status,
        reason,
        effects,
        enqueue: Vec::new(),
    }
}

impl From<TieMoved> for ApplyError {
    fn from(_: TieMoved) -> Self {
        Self::TieMoved
    }
}

/// The Embedded Metric Format line for a paid invoice applied without an allowance because
/// nothing it carries or the registers hold tells its plan: `PaymentsWithoutPlan` by `Stack`
/// and `Source`. Its reason says which paths were read; a steady count means a price missing
/// from the catalog or a layout the decoder does not read.
pub fn payment_without_plan_metric(source: &str, now: chrono::DateTime<chrono::Utc>) -> Value {
    let mut line = crate::platform::metrics::document(
        now,
        &[&["Source"]],
        &[("PaymentsWithoutPlan", "Count")],
    );
    line["Source"] = json!(source);
    line["PaymentsWithoutPlan"] = json!(1);
    line
}

/// Says, once the event's write committed, what only a metric shows.
fn committed(ctx: &EventContext<'_>, ruling: &Ruling) {
    if ruling.ungranted {
        crate::platform::metrics::emit(payment_without_plan_metric(ctx.source, chrono::Utc::now()));
    }
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
        dedupe_key: &event.dedupe_key,
        version: version.clone()?,
    })
}

/// The event's version: its provider time and dedupe key (or a planted bug's, §10).
fn version_of(event: &Claimed, at: crate::domain::ProviderTime) -> Version {
    let key = event.dedupe_key.clone();
    Version {
        at: sim::or_planted(Bug::ArrivalTime, at, || chrono::Utc::now().into()),
        key: sim::or_planted(Bug::TieByArrival, key, || {
            crate::domain::DedupeKey::parse(&format!("{:020}", event.id))
                .unwrap_or_else(|_| event.dedupe_key.clone())
        }),
    }
}

/// The provider time a read made for `event` stands at: the event's own, never the clock's
/// (docs/design.md §6.2). A read is the event it was made for, told by the provider: stamped
/// when it is made, it took a later place in the order than its event and granted in the
/// month of the read, so a change made just before a month began granted that month too when
/// its thin event came first, and only the month before when its snapshot twin did. Every read
/// the worker stores for an event takes its time from here (a thin event's object, an
/// invoice's subscription, a health notice's object and its sweep's subscriptions), and the
/// provider's `read_as_event` writes it at that time, in the provider's resolution. `None`:
/// the event has no provider time.
pub(crate) fn stands_at(event: &Claimed) -> Option<chrono::DateTime<chrono::Utc>> {
    if sim::planted(Bug::ReadByTheClock) {
        return Some(chrono::Utc::now());
    }
    event.occurred_at.map(|at| at.as_datetime())
}

/// What only the provider can settle, settled after the read and before any lock or
/// transaction (docs/design.md §4.2, §4.6): a subscription state stamped with the same second
/// as another event's takes the rank a provider read gives it (else its status rank decides,
/// and the note says so); a refund known only by its payment intent is linked to its invoice
/// by a read when no event has. A failed read settles nothing and says why (a read not made
/// for the rate is not a failure: the event waits for it, §6.7): the status rank
/// still gives one order. With reads, returns each subscription's tie as read (the other
/// event, if any), which the rules must find again when the event is written, and what the
/// reads settled, kept with the event for the fold (docs/design.md §4.11).
async fn settle(
    source: &WorkerSource,
    ctx: &EventContext<'_>,
    registers: &Registers,
    effects: &mut Vec<Effect>,
    notes: &mut Vec<String>,
) -> Result<(HashMap<String, Option<i64>>, Settled), ApplyError> {
    let mut ties_read = HashMap::new();
    let mut settled = Settled::default();
    let Some(reads) = &source.reads else {
        // Without a provider read the status rank settles a tie: the rules say whether
        // there was one.
        return Ok((ties_read, settled));
    };
    let at = Stamp::of(ctx, Rank(0)).at;
    for effect in effects.iter() {
        match effect {
            Effect::Subscription {
                id,
                status,
                plan,
                ends,
                rank: _,
            } => {
                let tie = registers
                    .subscriptions
                    .get(id.as_str())
                    .filter(|held| held.stamp.at == at && !held.is_of(ctx));
                ties_read.insert(id.clone(), tie.map(|t| t.event_id));
                let Some(tie) = tie else {
                    continue;
                };
                let (tie_id, tie_status) = (tie.event_id, &tie.value.status);
                let plan_key = plan.as_ref().map(|p| p.key.as_str());
                let this = (status.as_str(), plan_key, ends);
                let tied = (
                    tie_status.as_str(),
                    tie.value.plan_key.as_deref(),
                    &tie.value.ends,
                );
                // Two states of one status differ in their ends: the words say which.
                let state = |status: &str, ends: &SubscriptionEnds| match ends.words() {
                    words if tie_status == status && !words.is_empty() => {
                        format!("{status} ({words})")
                    }
                    _ => status.to_owned(),
                };
                notes.push(match reads.subscription(ctx.customer, id).await {
                    Ok(Some(now)) if now.settles(this, tied) == Shown::This => {
                        // the read's time: a state confirmed later outranks one confirmed earlier
                        let rank = Rank::confirmed(chrono::Utc::now());
                        settled.ranks.insert(id.clone(), rank.0);
                        format!("same-second tie with event {tie_id} resolved by a provider read: {id} is {}", state(status, ends))
                    }
                    Ok(Some(now)) if now.settles(this, tied) == Shown::Tie => {
                        settled.ranks.insert(id.clone(), Rank::REFUTED.0);
                        format!("same-second tie with event {tie_id} resolved by a provider read: {id} is {}", state(tie_status, &tie.value.ends))
                    }
                    Ok(Some(now)) => format!(
                        "same-second tie with event {tie_id}: the provider shows {id} as {} now, neither state; resolved by status rank",
                        now.status
                    ),
                    Ok(None) => format!(
                        "same-second tie with event {tie_id}: the provider does not know {id}; resolved by status rank"
                    ),
                    // Not read for the rate: the event waits for the read rather than settle
                    // without it (docs/design.md §6.7).
                    Err(error) if Throttled::find(&error).is_some() => {
                        return Err(ApplyError::fetch(error))
                    }
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
                        settled.links.push((payment_intent.clone(), invoice));
                    }
                    Ok(None) => {
                        notes.push(format!("the provider links {payment_intent} to no invoice"))
                    }
                    Err(error) if Throttled::find(&error).is_some() => {
                        return Err(ApplyError::fetch(error))
                    }
                    Err(error) => notes.push(format!(
                        "the provider read of {payment_intent}'s invoice failed ({error:#})"
                    )),
                }
            }
            _ => {}
        }
    }
    // The effects as the reads settled them, by the one rule the fold repeats them with: each
    // settled rank in place of the status's, and a link read from the provider written before
    // the refund, which then finds it.
    settled.apply_to(effects);
    Ok((ties_read, settled))
}

/// An entitlement register whose same-second tie a read settles, and that read's carrier.
type ReadTie = (String, Carrier);

/// The entitlement registers this event writes whose same-second tie its provider settles
/// with a read stored as an event of its own, each with that read's carrier (docs/design.md
/// §4.2); none without an API key.
fn read_ties(source: &WorkerSource, event: &Claimed, effects: &[Effect]) -> Vec<ReadTie> {
    let (Some(_), Some(payload)) = (&source.reads, &event.payload) else {
        return Vec::new();
    };
    let provider = providers::provider(source.kind);
    effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::Entitlement { grant, .. } => provider
                .tie_read(payload, effect)
                .map(|carrier| (grant.clone(), carrier)),
            _ => None,
        })
        .collect()
}

/// The first of `read_ties` whose register holds another event's state stamped with this
/// event's provider time (`tie_on`): the event it ties with, and the read that settles it.
fn tied<'a>(
    ctx: &EventContext<'_>,
    registers: &Registers,
    read_ties: &'a [ReadTie],
) -> Option<(i64, &'a Carrier)> {
    read_ties
        .iter()
        .find_map(|(grant, carrier)| tie_on(ctx, registers, grant).map(|tie| (tie, carrier)))
}

/// Whether every effect is a payment-intent link or refund; then the customer the intent is
/// known under, if any.
async fn links_only_customer(
    conn: &mut PgConnection,
    source: &str,
    effects: &[Effect],
) -> Result<Option<crate::domain::CustomerId>, sqlx::Error> {
    let mut customer = None;
    for effect in effects {
        let (Effect::PaymentIntent { payment_intent, .. }
        | Effect::RefundIntent { payment_intent, .. }) = effect
        else {
            return Ok(None);
        };
        if customer.is_none() {
            customer = registers::intent_customer(conn, source, payment_intent).await?;
        }
    }
    Ok(customer)
}

/// The customer of a refund that names none, as the provider shows its payment intent
/// (docs/design.md §6.2): read before any lock, as a tie's read is. A read that fails fails the
/// attempt (the event's retry schedule); none without an API key, or when the provider does not
/// know the intent or it names no customer. Once applied, the intent is known under the
/// customer, so a retry or a replay finds it there and reads nothing again.
async fn refunded_intent_customer(
    source: &WorkerSource,
    event: &Claimed,
    effects: &[Effect],
) -> Result<Option<crate::domain::CustomerId>, ApplyError> {
    let (Some(reads), Some(payload)) = (&source.reads, &event.payload) else {
        return Ok(None);
    };
    let Some(payment_intent) = effects.iter().find_map(|e| match e {
        Effect::RefundIntent { payment_intent, .. } => Some(payment_intent),
        _ => None,
    }) else {
        return Ok(None);
    };
    reads
        .payment_intent_customer(payload, payment_intent)
        .await
        .map_err(ApplyError::fetch)
}

/// A credit transaction whose grant is not known yet (docs/design.md §4.14): its row is kept,
/// keyed by its grant, and counted when the grant comes, whose event also writes this one's
/// line into the account's log; it is neither dropped nor given a guessed account. A grant
/// that committed between the look-up and the write is a conflict: the attempt fails and is
/// retried, and the retry applies it to the grant's account.
async fn keep_transaction_without_grant(
    conn: &mut PgConnection,
    event: &Claimed,
    t: &crate::billing::credits::Transaction,
) -> Result<Applied, ApplyError> {
    let mut tx = begin(conn).await?;
    if !lease::still_held(&mut tx, event).await? {
        return Err(ApplyError::LeaseLost);
    }
    sim::point(Point::WorkerLocked, event.id).await;
    if registers::keep_transaction(&mut tx, &event.source, t, event.id)
        .await?
        .is_some()
    {
        return Err(ApplyError::Raced);
    }
    let reason = format!(
        "credit balance transaction {} of grant {}: {} {}, kept: the grant is not known yet, nor so its account; counted when the grant comes",
        t.transaction_id,
        t.grant_id,
        t.kind.as_str(),
        t.amount
    );
    sim::fallible_point(Point::WorkerDecided, event.id).await?;
    let status = EventStatus::Applied;
    if !lease::finish_held(&mut tx, event, status, &reason, None).await? {
        return Err(ApplyError::LeaseLost);
    }
    sim::point(Point::WorkerWritten, event.id).await;
    tx.commit().await?;
    Ok(applied(event, status, reason, Vec::new()))
}

/// A links-only event whose intents no customer is known under yet: the links are kept for
/// the refund that may follow; any other effect needs a customer. A refund that committed
/// between the look-up and the write is a conflict: the attempt fails and is retried, and
/// the retry finds the customer.
async fn remember_links_without_customer(
    conn: &mut PgConnection,
    event: &Claimed,
    effects: &[Effect],
) -> Result<Applied, ApplyError> {
    let mut tx = begin(conn).await?;
    if !lease::still_held(&mut tx, event).await? {
        return Err(ApplyError::LeaseLost);
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
            learned = vec![match effect {
                Effect::RefundIntent { payment_intent, .. } => format!(
                    "the event names no customer, and none is known for {payment_intent} (nor read: the provider names none, or the source has no API key)"
                ),
                _ => "the event names no customer".to_owned(),
            }];
            break;
        };
        let source = &event.source;
        let customer =
            registers::remember_link(&mut tx, source, payment_intent, invoice, event.id).await?;
        if customer.is_some() {
            return Err(ApplyError::Raced);
        }
        learned.push(format!("payment intent {payment_intent} paid {invoice}"));
    }
    let reason = learned.join("; ");
    sim::fallible_point(Point::WorkerDecided, event.id).await?;
    if !lease::finish_held(&mut tx, event, status, &reason, None).await? {
        return Err(ApplyError::LeaseLost);
    }
    sim::point(Point::WorkerWritten, event.id).await;
    tx.commit().await?;
    Ok(applied(event, status, reason, Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payment_without_a_plan_is_counted_per_source() {
        let line = payment_without_plan_metric("shop", chrono::Utc::now());
        let spec = &line["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(spec["Dimensions"], json!([["Stack", "Source"]]));
        assert_eq!(
            spec["Metrics"],
            json!([{"Name": "PaymentsWithoutPlan", "Unit": "Count"}])
        );
        assert_eq!(
            (&line["Source"], &line["PaymentsWithoutPlan"]),
            (&json!("shop"), &json!(1))
        );
    }

    #[test]
    fn a_moved_account_is_contended_and_the_memory_of_them_stays_bounded() {
        let contended = Contended::default();
        assert!(!contended.is_hot("shop", "cus_1"));
        contended.moved("shop", "cus_1");
        assert!(contended.is_hot("shop", "cus_1"));
        assert!(!contended.is_hot("polar", "cus_1"));
        for n in 0..CONTENDED_MAX {
            contended.moved("shop", &format!("cus_x{n}"));
        }
        let remembered = contended.0.lock().unwrap().len();
        assert!(
            remembered <= CONTENDED_MAX,
            "{remembered} accounts remembered"
        );
    }
}
