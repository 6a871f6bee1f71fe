//! A worker's hold on an event: the claim (a lease committed at once, so that it outlives a
//! crash), the re-check inside the worker's transaction, the finish, and the failure record
//! with the retry policy (`domain::retry`, docs/design.md §3).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use sqlx::PgConnection;

use crate::billing::model::EventContext;
use crate::domain::retry::RetryPolicy;
use crate::domain::{CustomerId, DedupeKey, EventStatus, ProviderTime};
use crate::platform::db::exec;

/// An event this worker holds under a lease, typed as it was stored.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: i64,
    pub source: String,
    pub dedupe_key: DedupeKey,
    pub event_type: String,
    pub payload: Option<Value>,
    pub customer: Option<CustomerId>,
    pub occurred_at: Option<ProviderTime>,
    /// This attempt's number (counts toward `dead`; a replay resets it).
    pub attempts: i32,
    /// The claim's generation, raised by every claim and never lowered: with the id, it
    /// names the lease.
    pub claim: i64,
}

/// Takes the events for this worker, each for one lease, those that are claimable:
/// `received`, `failed` and due, or `processing` with an expired lease. One statement for a
/// whole SQS batch; it commits at once, so each lease outlives a crash and another worker
/// can take the event when it expires. Returned in the order of `event_ids`.
///
/// A row that another statement is writing (a copy being counted, a reconciliation storing
/// the same event, another worker's claim or write) is waited for and then checked again,
/// not skipped: a claim that passed it by would have its message acknowledged, and the event
/// would wait for the rescue. Every such statement is short (no provider read is made inside
/// a worker's transaction). The rows are locked in id order, so two claims of overlapping
/// batches cannot deadlock.
pub async fn claim(
    conn: &mut PgConnection,
    event_ids: &[i64],
    lease: Duration,
) -> Result<Vec<Claimed>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        UPDATE inbox_events e
        SET status = 'processing',
            locked_until = inbox_now() + make_interval(secs => $2),
            attempts = e.attempts + 1,
            claim_gen = e.claim_gen + 1
        WHERE e.id IN (
            SELECT id FROM inbox_events
            WHERE id = ANY($1)
              AND (status = 'received'
                   OR (status = 'failed' AND next_attempt_at <= inbox_now())
                   OR (status = 'processing' AND locked_until < inbox_now() AND attempts < $3))
            ORDER BY id
            FOR UPDATE
        )
        RETURNING e.id, e.source, e.dedupe_key AS "dedupe_key: DedupeKey", e.type AS event_type,
                  e.payload, CASE WHEN e.body_is_payload THEN e.raw_body END AS body,
                  e.customer_key AS "customer: CustomerId",
                  e.occurred_at AS "occurred_at: ProviderTime", e.attempts,
                  e.claim_gen AS claim
        "#,
        event_ids,
        lease.as_secs_f64(),
        RetryPolicy::MAX_ATTEMPTS,
    )
    .fetch_all(exec(conn))
    .await?;
    let mut claimed: Vec<Claimed> = rows
        .into_iter()
        .map(|r| Claimed {
            id: r.id,
            source: r.source,
            dedupe_key: r.dedupe_key,
            event_type: r.event_type,
            payload: payload_of(r.payload, r.body.as_deref()),
            customer: r.customer,
            occurred_at: r.occurred_at,
            attempts: r.attempts,
            claim: r.claim,
        })
        .collect();
    claimed.sort_by_key(|c| event_ids.iter().position(|id| *id == c.id));
    Ok(claimed)
}

/// An event's payload as its row keeps it: its own column, or, for an event whose raw body is
/// its JSON (`body_is_payload`), that body parsed here rather than in Postgres, which then
/// only hands over the bytes (docs/design.md §3).
pub fn payload_of(payload: Option<Value>, body: Option<&[u8]>) -> Option<Value> {
    payload.or_else(|| serde_json::from_slice(body?).ok())
}

/// Why a claim did not take an event, as its row says after the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unclaimed {
    /// No such row: purged once final, or never stored.
    Gone,
    /// Final: applied, ignored, unprocessable or dead.
    Final,
    /// Under another worker's live lease: it finishes the event, or the lease's end brings
    /// the event back (the queue's redelivery of that worker's message, the rescue).
    Held,
    /// Failed and not due yet, or its worker stopped on its last allowed attempt: the rescue
    /// sends it when it is due, or the scheduler buries it.
    Waiting,
    /// A worker could take it now, as the claim takes events: the claim should have.
    Claimable,
}

impl Unclaimed {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gone => "no such event",
            Self::Final => "the event is final",
            Self::Held => "another worker holds the event under a live lease",
            Self::Waiting => "the event is not due yet",
            Self::Claimable => "a worker could take the event now",
        }
    }
}

/// What the rows of `event_ids` (events a claim did not take) say now, by the claim's own
/// rule: a message may be acknowledged without work only when its event is final, held
/// under a live lease, waiting for a later time, or gone (docs/design.md §1.3). An id with no
/// row is [`Unclaimed::Gone`].
pub async fn unclaimed(
    conn: &mut PgConnection,
    event_ids: &[i64],
) -> Result<HashMap<i64, Unclaimed>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        SELECT id,
               CASE WHEN status IN ('applied', 'ignored', 'unprocessable', 'dead') THEN 'final'
                    WHEN status = 'received'
                         OR (status = 'failed' AND next_attempt_at <= inbox_now())
                         OR (status = 'processing' AND locked_until < inbox_now() AND attempts < $2)
                    THEN 'claimable'
                    WHEN status = 'processing' AND locked_until >= inbox_now() THEN 'held'
                    ELSE 'waiting' END AS "state!"
        FROM inbox_events WHERE id = ANY($1)
        "#,
        event_ids,
        RetryPolicy::MAX_ATTEMPTS,
    )
    .fetch_all(exec(conn))
    .await?;
    let mut states: HashMap<i64, Unclaimed> =
        event_ids.iter().map(|id| (*id, Unclaimed::Gone)).collect();
    for row in rows {
        let state = match row.state.as_str() {
            "final" => Unclaimed::Final,
            "claimable" => Unclaimed::Claimable,
            "held" => Unclaimed::Held,
            _ => Unclaimed::Waiting,
        };
        states.insert(row.id, state);
    }
    Ok(states)
}

/// Renews the leases of `events` (each still this worker's claim) for another `lease` from
/// now, in one statement: a batch whose later events would otherwise be worked on after their
/// lease ran out. Returns the ids renewed; an event not among them is no longer this claim's.
pub async fn renew(
    conn: &mut PgConnection,
    events: &[&Claimed],
    lease: Duration,
) -> Result<Vec<i64>, sqlx::Error> {
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
    let claims: Vec<i64> = events.iter().map(|e| e.claim).collect();
    sqlx::query_scalar!(
        r#"
        UPDATE inbox_events e
        SET locked_until = inbox_now() + make_interval(secs => $3)
        FROM unnest($1::int8[], $2::int8[]) AS c (id, claim)
        WHERE e.id = c.id AND e.claim_gen = c.claim AND e.status = 'processing'
        RETURNING e.id
        "#,
        &ids,
        &claims,
        lease.as_secs_f64(),
    )
    .fetch_all(exec(conn))
    .await
}

/// Inside the worker's transaction: is the lease still ours? Holding the row lock from here
/// keeps other claims off the event until the commit.
pub async fn still_held(conn: &mut PgConnection, event: &Claimed) -> Result<bool, sqlx::Error> {
    let held = sqlx::query_scalar!(
        "SELECT id FROM inbox_events WHERE id = $1 AND status = 'processing' AND claim_gen = $2 FOR UPDATE",
        event.id,
        event.claim
    )
    .fetch_optional(exec(conn))
    .await?;
    Ok(held.is_some())
}

/// Inside the worker's transaction: [`still_held`], and when the lease holds, the account's
/// row, created if new and locked, in the same statement: for an event whose account moved
/// between its read and its write, or that writes a payment intent, so that the account
/// cannot move again before the commit (docs/design.md §3.5).
pub async fn still_held_locking(
    conn: &mut PgConnection,
    event: &Claimed,
    customer: &CustomerId,
) -> Result<bool, sqlx::Error> {
    let held = sqlx::query_scalar!(
        r#"
        WITH held AS (
            SELECT id FROM inbox_events
            WHERE id = $1 AND status = 'processing' AND claim_gen = $2 FOR UPDATE
        ), locked AS (
            INSERT INTO accounts (source, customer_id) SELECT $3, $4 FROM held
            ON CONFLICT (source, customer_id) DO UPDATE SET customer_id = EXCLUDED.customer_id
            RETURNING 1
        )
        SELECT EXISTS (SELECT 1 FROM held) AND EXISTS (SELECT 1 FROM locked) AS "held!"
        "#,
        event.id,
        event.claim,
        event.source,
        customer.as_str(),
    )
    .fetch_one(exec(conn))
    .await?;
    Ok(held)
}

/// Finishes an event that writes nothing else through `commit`, if the lease is still this
/// worker's: unprocessable, ignored, or links without a customer (inside their
/// transaction). With `account` (an event about an account that its rules ignore outright)
/// the same statement writes the account's log line and the account row if the customer is
/// new; it neither checks nor moves the account's version, since nothing of it was decided
/// from the registers (docs/design.md §3.5). A line that says `applied` stays: a replay that
/// finds its work done does not rewrite history. Returns whether the lease held.
pub async fn finish_held(
    conn: &mut PgConnection,
    event: &Claimed,
    status: EventStatus,
    reason: &str,
    account: Option<&EventContext<'_>>,
) -> Result<bool, sqlx::Error> {
    debug_assert!(status.is_final());
    sqlx::query_scalar!(
        r#"
        WITH finished AS (
            UPDATE inbox_events
            SET status = $3, reason = $4, processed_at = inbox_now(), locked_until = NULL,
                next_attempt_at = NULL, last_error = NULL
            WHERE id = $1 AND status = 'processing' AND claim_gen = $2
            RETURNING id
        ), account AS (
            INSERT INTO accounts (source, customer_id, version, effect_seq)
            SELECT $5, $6, 1, 0 FROM finished WHERE $5::text IS NOT NULL
            ON CONFLICT (source, customer_id) DO NOTHING
        ), logged AS (
            INSERT INTO account_log AS l (event_id, source, customer_id, event_type, occurred_at, outcome, reason)
            SELECT $1, $5, $6, $7, $8, $3, $4 FROM finished WHERE $5::text IS NOT NULL
            ON CONFLICT (event_id) DO UPDATE
                SET outcome = EXCLUDED.outcome, reason = EXCLUDED.reason, logged_at = inbox_now()
                WHERE l.outcome <> 'applied'
        )
        SELECT EXISTS (SELECT 1 FROM finished) AS "held!"
        "#,
        event.id,
        event.claim,
        status.as_str(),
        reason,
        account.map(|a| a.source),
        account.map(|a| a.customer.as_str()),
        account.map(|a| a.event_type),
        account.map(|a| a.version.at.as_datetime()),
    )
    .fetch_one(exec(conn))
    .await
}

/// Gives back an event whose attempt did part of its work and kept it, then ran out of its
/// budget (a health notice's sweep, docs/design.md §6.2): `received` again, with `progress`
/// as its reason, and its attempt not counted, since it failed nothing (an attempt that reads
/// nothing fails, and those count toward `dead`). It is left unmarked: the rescue sends it at
/// its next run, as a row stored over a minute ago and never enqueued. Only the lease holder's
/// give-back lands; returns whether it did.
pub async fn give_back(
    conn: &mut PgConnection,
    event: &Claimed,
    progress: &str,
) -> Result<bool, sqlx::Error> {
    let given = sqlx::query!(
        r#"
        UPDATE inbox_events
        SET status = 'received', attempts = greatest(attempts - 1, 0), reason = $3,
            locked_until = NULL, next_attempt_at = NULL, enqueued_at = NULL, last_error = NULL
        WHERE id = $1 AND status = 'processing' AND claim_gen = $2
        "#,
        event.id,
        event.claim,
        progress,
    )
    .execute(exec(conn))
    .await?;
    Ok(given.rows_affected() == 1)
}

/// Puts off an event whose attempt could not make a provider read for the rate (its source's
/// budget was spent, or the provider answered 429, docs/design.md §6.7): `failed`, due again
/// at `until` (the time the budget or the provider said), and its attempt not counted, since
/// nothing of the event failed. The rescue sends it when it is due. Only the lease holder's
/// record lands; returns whether it did.
pub async fn defer(
    conn: &mut PgConnection,
    event: &Claimed,
    until: chrono::DateTime<chrono::Utc>,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    tracing::info!(event_id = event.id, %until, reason, "event put off for the provider's rate");
    let deferred = sqlx::query!(
        r#"
        UPDATE inbox_events
        SET status = 'failed', attempts = greatest(attempts - 1, 0), last_error = $3,
            next_attempt_at = greatest($4, inbox_now()), locked_until = NULL
        WHERE id = $1 AND status = 'processing' AND claim_gen = $2
        "#,
        event.id,
        event.claim,
        reason,
        until,
    )
    .execute(exec(conn))
    .await?;
    Ok(deferred.rows_affected() == 1)
}

/// Records a failed attempt: `failed` with the next attempt's time, or `dead` after the last.
/// Only the lease holder's record lands (the status and claim must still be its own):
/// `None` when the event is no longer this attempt's, because another worker took it after
/// the lease ran out, or because the attempt's own write finished it and only the reply was
/// lost.
pub async fn record_failure(
    conn: &mut PgConnection,
    event: &Claimed,
    error: &str,
    retry: &RetryPolicy,
) -> Result<Option<EventStatus>, sqlx::Error> {
    let delay = retry.wait_after(event.attempts);
    let status = if delay.is_some() {
        EventStatus::Failed
    } else {
        EventStatus::Dead
    };
    tracing::warn!(
        event_id = event.id,
        attempts = event.attempts,
        status = status.as_str(),
        error,
        "event attempt failed"
    );
    let recorded = sqlx::query!(
        r#"
        UPDATE inbox_events
        SET status = $2,
            last_error = $3,
            next_attempt_at = CASE WHEN $4::float8 IS NULL THEN NULL ELSE inbox_now() + make_interval(secs => $4) END,
            locked_until = NULL
        WHERE id = $1 AND status = 'processing' AND claim_gen = $5
        "#,
        event.id,
        status.as_str(),
        error,
        delay
            .filter(|_| !crate::platform::sim::planted(crate::platform::sim::Bug::RetryNeverScheduled))
            .map(|d| d.as_secs_f64()),
        event.claim,
    )
    .execute(exec(conn))
    .await?;
    Ok((recorded.rows_affected() == 1).then_some(status))
}
