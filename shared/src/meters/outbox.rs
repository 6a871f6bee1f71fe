//! The one home of a meter report row's life after its birth in `inbox_debit` (docs/design.md
//! §4.13): the dispatcher's claim and record, the scheduler's rescue and alerts, an
//! operator's replay, and the lists. The row is the fact; a queue message only names it. The
//! loops of the send, the rescue and the replay are the life every queued row shares
//! (`platform::queued`); [`MeterReports`] gives them the reports' statements.
//!
//! ```text
//!  inbox_debit ──▶ pending ──claim──▶ (held) ──record──▶ sent
//!                   ▲   ▲                │
//!                   │   └── retry due ───┘ not taken, or unanswered: later (dead after the
//!                   │                      last attempt); refused: dead at once; waiting (for
//!                   │                      other reports to settle): later, no attempt spent,
//!                   │                      armed again when they settle
//!                   └────── replay (dead) ◀─────────────────────
//!
//!  inbox_reverse_debit ──▶ the report withdrawn (never went out), or a correction born
//!                          pending, which lives as a report does
//! ```

use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

use crate::domain::meter::MeterReport;
use crate::domain::retry::RetryPolicy;
use crate::domain::CustomerId;
use crate::platform::budget::Throttled;
use crate::platform::db::exec;
use crate::platform::queue::Queue;
use crate::platform::queued::{self, Outbox, Rows, ROWS_PER_STEP};

/// How long a dispatcher holds a report: longer than a send and a read-back together.
pub const SEND_LEASE: Duration = Duration::from_secs(60);

/// A report's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportStatus {
    Pending,
    Sent,
    Dead,
    /// Never sent now: its debit was reversed before it went out, or, for a correction, the
    /// report it corrects never reached the provider.
    Withdrawn,
}

impl ReportStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Sent => "sent",
            Self::Dead => "dead",
            Self::Withdrawn => "withdrawn",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        [Self::Pending, Self::Sent, Self::Dead, Self::Withdrawn]
            .into_iter()
            .find(|s| s.as_str() == raw)
    }
}

/// A report a dispatcher holds, with this attempt's number (which, with the id, names the
/// hold).
#[derive(Debug, Clone)]
pub struct Claimed {
    pub report: MeterReport,
    pub attempts: i32,
    /// The store's time at the claim (`inbox_now()`, the clock `first_sent_at` and `sent_at` are
    /// written on): the provider's windows are read on it.
    pub now: DateTime<Utc>,
    /// For a correction: the report it takes back, as it stands now.
    pub corrects: Option<Corrected>,
}

/// The report a correction takes back, as the correction's attempt finds it.
#[derive(Debug, Clone)]
pub struct Corrected {
    pub id: String,
    pub identifier: String,
    pub status: ReportStatus,
    /// When its first send went out: the start of the provider's window for an adjustment.
    pub first_sent_at: Option<DateTime<Utc>>,
    /// Whether the provider holds it or may (taken, or a send unanswered).
    pub maybe_held: bool,
    /// How the correction takes it back, once chosen (`cancel` or `compensate`).
    pub how: Option<String>,
}

/// Takes a pending report for one attempt, if no other dispatcher holds it and no retry wait
/// is running; the attempt's start is its first send's when it has none yet (the start of the
/// provider's dedupe window, never later than the provider's own). A hold that expired
/// unrecorded was a holder that stopped, perhaps after its send: the report is taken as one
/// the provider may hold. Every attempt gets a key of its own for the provider's idempotency
/// layer, a cancel adjustment's too: Stripe replays a key's first answer for 24 hours, 500s
/// included, so a cancel resent under the key of an attempt answered 500 would get that 500
/// until it died, while a cancel sent again under a new key takes nothing more back (the event
/// is cancelled once). Commits at once.
pub async fn claim(
    pool: &PgPool,
    id: &str,
    lease: Duration,
) -> Result<Option<Claimed>, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        UPDATE meter_reports r
        SET locked_until = inbox_now() + make_interval(secs => $2), attempts = r.attempts + 1,
            first_sent_at = COALESCE(r.first_sent_at, inbox_now()),
            unanswered_at = CASE WHEN r.locked_until IS NOT NULL
                                 THEN COALESCE(r.unanswered_at, r.locked_until)
                                 ELSE r.unanswered_at END,
            sends = r.sends + 1, last_sent_at = inbox_now(),
            send_key = r.id || '-' || (r.sends + 1)
        WHERE r.id = (
            SELECT id FROM meter_reports
            WHERE id = $1 AND status = 'pending' AND attempts < $3
              AND outbox_free(locked_until, next_attempt_at)
            FOR UPDATE SKIP LOCKED
        )
        RETURNING r.id, r.source, r.customer_id, r.identifier, r.meter, r.value, r.occurred_at,
                  r.first_sent_at AS "first_sent_at!", r.unanswered_at, r.attempts, r.corrects,
                  r.how, r.send_key AS "send_key!", inbox_now() AS "now!"
        "#,
        id,
        lease.as_secs_f64(),
        RetryPolicy::MAX_ATTEMPTS,
    )
    .fetch_optional(exec(pool))
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let customer = CustomerId::parse(&row.customer_id)
        .map_err(|e| sqlx::Error::Decode(format!("meter report {id}: {e}").into()))?;
    let corrects = match &row.corrects {
        Some(corrected) => Some(corrected_report(pool, corrected, row.how).await?),
        None => None,
    };
    Ok(Some(Claimed {
        report: MeterReport {
            id: row.id,
            source: row.source,
            customer,
            identifier: row.identifier,
            meter: row.meter,
            value: row.value,
            occurred_at: row.occurred_at,
            first_sent_at: Some(row.first_sent_at),
            unanswered: row.unanswered_at.is_some(),
            take_back: None,
            send_key: Some(row.send_key),
        },
        attempts: row.attempts,
        now: row.now,
        corrects,
    }))
}

/// The report a correction takes back, as it stands.
async fn corrected_report(
    pool: &PgPool,
    id: &str,
    how: Option<String>,
) -> Result<Corrected, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        SELECT identifier, status, first_sent_at,
               (sent_at IS NOT NULL OR unanswered_at IS NOT NULL) AS "maybe_held!"
        FROM meter_reports WHERE id = $1
        "#,
        id,
    )
    .fetch_one(exec(pool))
    .await?;
    let status = ReportStatus::parse(&row.status).ok_or_else(|| {
        sqlx::Error::Decode(format!("meter report {id}: status '{}'", row.status).into())
    })?;
    Ok(Corrected {
        id: id.to_owned(),
        identifier: row.identifier,
        status,
        first_sent_at: row.first_sent_at,
        maybe_held: row.maybe_held,
        how,
    })
}

/// Keeps the way this attempt of a correction takes its report back, before it is sent:
/// once an attempt may have reached the provider, every later one is the same request.
pub async fn keep_how(pool: &PgPool, claimed: &Claimed, how: &str) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE meter_reports SET how = $2 WHERE id = $1 AND attempts = $3",
        claimed.report.id,
        how,
        claimed.attempts,
    )
    .execute(exec(pool))
    .await?;
    Ok(())
}

/// What an attempt came to, as it is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The provider holds it: it took the send, or the read-back found it.
    Taken,
    /// Never: dead at once, with the provider's reason.
    Refused(String),
    /// Not taken: tried again later.
    NotTaken(String),
    /// Sent without an answer: tried again later, and from now on as a report the provider
    /// may hold.
    Unanswered(String),
    /// A correction with nothing to take back: the report it corrects never reached the
    /// provider (which is withdrawn with it).
    Withdrawn(String),
    /// Not tried: it waits for other reports to settle (a correction for its report; a
    /// read-back for the other reports of its minute). Not an attempt: it is armed again when
    /// they settle, or after the longest retry wait.
    Waits(String),
    /// Not sent for the rate (the source's budget, or the provider's 429): not an attempt; it
    /// is due again at the time said (docs/design.md §6.7).
    Throttled(Throttled),
}

/// Records an attempt; only the holder's record lands. Returns the status it left. A report
/// settled (sent, dead or withdrawn) arms again what waited for it.
pub async fn record(
    pool: &PgPool,
    claimed: &Claimed,
    outcome: &Outcome,
    retry: &RetryPolicy,
) -> Result<ReportStatus, sqlx::Error> {
    let delay = retry.wait_after(claimed.attempts);
    let (status, error, unanswered) = match outcome {
        Outcome::Taken => (ReportStatus::Sent, None, false),
        Outcome::Withdrawn(e) => (ReportStatus::Withdrawn, Some(e), false),
        Outcome::Refused(e) => (ReportStatus::Dead, Some(e), false),
        Outcome::Waits(e) => (ReportStatus::Pending, Some(e), false),
        Outcome::Throttled(_) => (ReportStatus::Pending, None, false),
        Outcome::NotTaken(e) | Outcome::Unanswered(e) => (
            match delay {
                Some(_) => ReportStatus::Pending,
                None => ReportStatus::Dead,
            },
            Some(e),
            matches!(outcome, Outcome::Unanswered(_)),
        ),
    };
    let throttled = match outcome {
        Outcome::Throttled(throttled) => Some(throttled),
        _ => None,
    };
    let said = throttled.map(ToString::to_string);
    let error = error.or(said.as_ref());
    if let Some(error) = error {
        tracing::warn!(report_id = %claimed.report.id, attempts = claimed.attempts,
            status = status.as_str(), error = %error, "meter report not sent");
    }
    let waits = matches!(outcome, Outcome::Waits(_));
    // A wait gives its attempt back and comes again after the longest retry wait at the
    // latest (what it waits for arms it sooner); a throttled send gives it back too, and is
    // due at the time its budget or its provider said.
    let delay = match waits {
        true => retry.wait_after(RetryPolicy::MAX_ATTEMPTS - 1),
        false => delay,
    };
    sqlx::query!(
        r#"
        UPDATE meter_reports
        SET status = $2, last_error = COALESCE($3, last_error), locked_until = NULL,
            next_attempt_at = CASE WHEN $2 = 'pending'
                THEN coalesce($8, inbox_now() + make_interval(secs => $4)) END,
            sent_at = CASE WHEN $2 = 'sent' THEN inbox_now() END,
            unanswered_at = CASE WHEN $5 THEN COALESCE(unanswered_at, inbox_now()) ELSE unanswered_at END,
            attempts = CASE WHEN $7 OR $8::timestamptz IS NOT NULL THEN attempts - 1 ELSE attempts END,
            waiting_since = CASE WHEN $7 THEN COALESCE(waiting_since, inbox_now()) END
        WHERE id = $1 AND status = 'pending' AND attempts = $6
        "#,
        claimed.report.id,
        status.as_str(),
        error,
        delay.map(|d| d.as_secs_f64()).unwrap_or_default(),
        unanswered,
        claimed.attempts,
        waits,
        throttled.map(|t| t.until),
    )
    .execute(exec(pool))
    .await?;
    if let (Outcome::Withdrawn(_), Some(corrected)) = (outcome, &claimed.corrects) {
        // The report never reached the provider, and its debit is reversed: a replay must not
        // send it.
        sqlx::query!(
            r#"
            UPDATE meter_reports
            SET status = 'withdrawn',
                last_error = COALESCE(last_error || '; ', '') || 'withdrawn: its debit was reversed'
            WHERE id = $1 AND status = 'dead' AND sent_at IS NULL AND unanswered_at IS NULL
            "#,
            corrected.id,
        )
        .execute(exec(pool))
        .await?;
    }
    if status != ReportStatus::Pending {
        arm_waiting(pool, &claimed.report.id, status).await?;
    }
    Ok(status)
}

/// What waited for a report that is settled now is due at once: its correction, and the
/// reports of its minute waiting to be read back. A report the provider took arms again a
/// correction of it that died before reaching the provider (it died beside a report that
/// may have been held; an operator replayed the report): a reversed debit is never left
/// billed.
async fn arm_waiting(pool: &PgPool, id: &str, status: ReportStatus) -> Result<(), sqlx::Error> {
    sqlx::query!(
        r#"
        UPDATE meter_reports w SET next_attempt_at = inbox_now()
        FROM meter_reports s
        WHERE s.id = $1 AND w.id <> s.id AND w.status = 'pending'
          AND w.waiting_since IS NOT NULL
          AND (w.corrects = s.id
               OR (w.source = s.source AND w.customer_id = s.customer_id AND w.meter = s.meter
                   AND date_trunc('minute', w.occurred_at) = date_trunc('minute', s.occurred_at)))
        "#,
        id,
    )
    .execute(exec(pool))
    .await?;
    if status == ReportStatus::Sent {
        sqlx::query!(
            r#"
            UPDATE meter_reports
            SET status = 'pending', attempts = 0, next_attempt_at = NULL, locked_until = NULL,
                alerted_at = NULL, enqueued_at = NULL,
                last_error = COALESCE(last_error || '; ', '')
                             || 'armed again: the report it corrects is sent'
            WHERE corrects = $1 AND status = 'dead' AND sent_at IS NULL AND unanswered_at IS NULL
            "#,
            id,
        )
        .execute(exec(pool))
        .await?;
    }
    Ok(())
}

/// Marks the reports of `source` that the provider named as not counted (its samples, by
/// the report's identifier or by the `Idempotency-Key` of an attempt of it, which begins with
/// the report's id): the provider's reason kept, the report dead and alerted anew. A report
/// sent again since the notice (`notice_at`, the notice's own time), as an operator's replay
/// sends it, is left alone: the notice speaks of an earlier send. Returns their ids.
pub async fn mark_provider_errors(
    conn: &mut PgConnection,
    source: &str,
    samples: &[crate::providers::MeterErrorSample],
    notice_at: Option<DateTime<Utc>>,
) -> Result<Vec<String>, sqlx::Error> {
    let identifiers: Vec<&str> = samples.iter().map(|s| s.identifier.as_str()).collect();
    let reasons: Vec<String> = samples
        .iter()
        .map(|s| format!("{}: {}", s.code, s.message))
        .collect();
    sqlx::query_scalar!(
        r#"
        UPDATE meter_reports r
        SET provider_error = e.reason, provider_error_at = inbox_now(), status = 'dead',
            locked_until = NULL, next_attempt_at = NULL, alerted_at = NULL,
            last_error = 'the provider could not count it: ' || e.reason
        FROM unnest($2::text[], $3::text[]) AS e(identifier, reason)
        WHERE r.source = $1
          AND (r.identifier = e.identifier OR r.id = split_part(e.identifier, '-', 1))
          AND ($4::timestamptz IS NULL
               OR COALESCE(r.last_sent_at, r.sent_at, r.first_sent_at) IS NULL
               OR COALESCE(r.last_sent_at, r.sent_at, r.first_sent_at) <= $4)
        RETURNING r.id
        "#,
        source,
        &identifiers as &[&str],
        &reasons,
        notice_at,
    )
    .fetch_all(exec(conn))
    .await
}

/// Another report of the same account, meter and minute as one being read back, as it
/// stands (`meters::read_back` decides what the provider's total of the minute holds of it).
#[derive(Debug, Clone)]
pub struct MinuteOther {
    pub id: String,
    /// As the provider's meter adds it: a correction's is negative.
    pub value: i64,
    pub status: ReportStatus,
    /// When its first send went out, and whether a send of it went unanswered.
    pub first_sent_at: Option<DateTime<Utc>>,
    pub unanswered: bool,
    /// When the provider took it (`sent`).
    pub sent_at: Option<DateTime<Utc>>,
}

/// This account's other reports to the same meter timed in the same minute as `report`,
/// corrections included but those of `report` itself (they wait for it).
pub async fn minute_others(
    pool: &PgPool,
    report: &MeterReport,
) -> Result<Vec<MinuteOther>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        SELECT id, CASE kind WHEN 'correction' THEN -value ELSE value END AS "value!", status,
               first_sent_at, unanswered_at IS NOT NULL AS "unanswered!", sent_at
        FROM meter_reports
        WHERE source = $1 AND customer_id = $2 AND meter = $3 AND id <> $4
          AND corrects IS DISTINCT FROM $4
          AND date_trunc('minute', occurred_at) = date_trunc('minute', $5::timestamptz)
        ORDER BY id
        "#,
        report.source,
        report.customer.as_str(),
        report.meter,
        report.id,
        report.occurred_at,
    )
    .fetch_all(exec(pool))
    .await?;
    rows.into_iter()
        .map(|r| {
            let status = ReportStatus::parse(&r.status).ok_or_else(|| {
                sqlx::Error::Decode(format!("meter report {}: status '{}'", r.id, r.status).into())
            })?;
            Ok(MinuteOther {
                id: r.id,
                value: r.value,
                status,
                first_sent_at: r.first_sent_at,
                unanswered: r.unanswered,
                sent_at: r.sent_at,
            })
        })
        .collect()
}

/// The meter reports as queued rows: the statements of their life that `platform::queued`
/// runs. Reports are kept: nothing purges them.
pub struct MeterReports;

const METER_REPORTS: Outbox = Outbox("meter_reports");

impl Rows for MeterReports {
    type Id = String;
    type Alerts = ReportAlerts;
    const NAME: &'static str = "meter reports";

    async fn send(queue: &Queue, ids: &[String]) -> Vec<String> {
        queue.send_bodies(ids).await
    }

    async fn unmark(pool: &PgPool, ids: &[String]) -> Result<(), sqlx::Error> {
        sqlx::query!(
            "UPDATE meter_reports SET enqueued_at = NULL WHERE id = ANY($1) AND status = 'pending'",
            ids
        )
        .execute(exec(pool))
        .await?;
        Ok(())
    }

    /// Buries reports whose dispatcher died on the last allowed attempt, then takes the attempt
    /// each other expired hold held as unanswered: it may have sent.
    /// A report buried so was sent and got no answer: it says since when.
    async fn bury(pool: &PgPool) -> Result<u64, sqlx::Error> {
        sqlx::query!(
            r#"
            UPDATE meter_reports SET unanswered_at = COALESCE(unanswered_at, inbox_now())
            WHERE status = 'pending' AND locked_until < inbox_now() AND attempts >= $1
            "#,
            RetryPolicy::MAX_ATTEMPTS,
        )
        .execute(exec(pool))
        .await?;
        let buried = METER_REPORTS.bury(pool, RetryPolicy::MAX_ATTEMPTS).await?;
        sqlx::query!(
            r#"
            UPDATE meter_reports SET unanswered_at = COALESCE(unanswered_at, locked_until)
            WHERE status = 'pending' AND locked_until < inbox_now()
            "#
        )
        .execute(exec(pool))
        .await?;
        Ok(buried)
    }

    async fn mark(pool: &PgPool) -> anyhow::Result<Vec<String>> {
        Ok(METER_REPORTS.mark(pool).await?)
    }

    async fn alerts(pool: &PgPool) -> anyhow::Result<ReportAlerts> {
        collect_alerts(pool).await
    }
}

/// What the scheduler reports of meter reports.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReportAlerts {
    /// Reports that died since the last run (each reported once).
    pub dead: Vec<String>,
    pub dead_total: i64,
    pub pending: i64,
    /// How long the oldest pending report has waited since its debit wrote it, in seconds (0
    /// with none): usage the provider has not billed yet, which an alarm watches.
    pub oldest_pending_secs: f64,
    /// Reports the provider took and later said it could not count (Stripe's meter error
    /// reports), not yet looked at.
    pub provider_errors: i64,
}

/// Reports each newly dead report once, and counts the dead, the pending and those the
/// provider named in an error report.
pub async fn collect_alerts(pool: &PgPool) -> anyhow::Result<ReportAlerts> {
    let dead = sqlx::query!(
        r#"
        UPDATE meter_reports SET alerted_at = inbox_now()
        WHERE id IN (
            SELECT id FROM meter_reports WHERE status = 'dead' AND alerted_at IS NULL
            ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED
        )
        RETURNING id, source, customer_id, value, unanswered_at, last_error
        "#,
        ROWS_PER_STEP,
    )
    .fetch_all(exec(pool))
    .await
    .context("collecting dead meter reports")?;
    for r in &dead {
        tracing::error!(
            alert = "dead_meter_report", report_id = %r.id, source = %r.source,
            customer_id = %r.customer_id, value = r.value,
            maybe_held = r.unanswered_at.is_some(),
            last_error = r.last_error.as_deref().unwrap_or(""),
            "a debit could not be reported to the provider's meter; it needs an operator"
        );
    }
    let counts = sqlx::query!(
        r#"
        SELECT count(*) FILTER (WHERE status = 'dead') AS "dead!",
               count(*) FILTER (WHERE status = 'pending') AS "pending!",
               COALESCE(extract(epoch FROM inbox_now() - min(created_at) FILTER (WHERE status = 'pending')), 0)::float8
                   AS "oldest_pending_secs!",
               count(*) FILTER (WHERE provider_error IS NOT NULL) AS "provider_errors!"
        FROM meter_reports WHERE status <> 'sent' OR provider_error IS NOT NULL
        "#
    )
    .fetch_one(exec(pool))
    .await
    .context("counting pending and dead meter reports")?;
    Ok(ReportAlerts {
        dead: dead.into_iter().map(|r| r.id).collect(),
        dead_total: counts.dead,
        pending: counts.pending,
        oldest_pending_secs: counts.oldest_pending_secs,
        provider_errors: counts.provider_errors,
    })
}

/// Puts dead reports back to `pending` with fresh attempts, marked as on their way to the
/// queue (the caller sends them after its commit). A report whose send may have reached the
/// provider keeps that mark, so its next send reads back or resends under its key first;
/// `not_held` clears it, when the operator has seen that the provider does not hold it. The
/// provider's reason for not counting it is dropped from the count (`last_error` keeps it).
pub async fn reset(
    conn: &mut PgConnection,
    ids: &[String],
    not_held: bool,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"
        UPDATE meter_reports
        SET status = 'pending', attempts = 0, next_attempt_at = NULL, locked_until = NULL,
            alerted_at = NULL, enqueued_at = inbox_now(), provider_error = NULL,
            unanswered_at = CASE WHEN $2 THEN NULL ELSE unanswered_at END
        WHERE id = ANY($1) AND status = 'dead'
        RETURNING id
        "#,
        ids,
        not_held,
    )
    .fetch_all(exec(conn))
    .await
}

/// Replays dead reports: reset, then enqueued. Returns those replayed.
pub async fn replay(
    pool: &PgPool,
    queue: Option<&Queue>,
    ids: &[String],
    not_held: bool,
) -> anyhow::Result<Vec<String>> {
    let put_back = async |conn: &mut PgConnection| reset(conn, ids, not_held).await;
    queued::replay::<MeterReports>(pool, queue, put_back).await
}

/// The ids of every report with this status (of this source when given), oldest first.
pub async fn ids_with_status(
    pool: &PgPool,
    status: ReportStatus,
    source: Option<&str>,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"
        SELECT id FROM meter_reports
        WHERE status = $1 AND ($2::text IS NULL OR source = $2)
        ORDER BY created_at, id
        "#,
        status.as_str(),
        source,
    )
    .fetch_all(exec(pool))
    .await
}

/// The status of each of these reports that exists.
pub async fn statuses(pool: &PgPool, ids: &[String]) -> Result<Vec<(String, String)>, sqlx::Error> {
    let rows = sqlx::query!(
        "SELECT id, status FROM meter_reports WHERE id = ANY($1) ORDER BY id",
        ids
    )
    .fetch_all(exec(pool))
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.status)).collect())
}

/// One line of `inboxctl meters`.
#[derive(Debug, Clone, Serialize)]
pub struct ReportLine {
    pub id: String,
    /// `report`, or `correction` (of the report `corrects`, by `how`).
    pub kind: String,
    pub corrects: Option<String>,
    pub how: Option<String>,
    pub status: String,
    pub source: String,
    pub customer_id: String,
    pub usage_id: String,
    pub idempotency_key: String,
    pub identifier: String,
    pub meter: String,
    pub value: i64,
    pub period: String,
    pub occurred_at: DateTime<Utc>,
    pub attempts: i32,
    /// Whether a send ended without an answer (the provider may hold it).
    pub unanswered: bool,
    pub last_error: Option<String>,
    pub provider_error: Option<String>,
    pub sent_at: Option<DateTime<Utc>>,
}

/// The newest reports, with this status (and of this account) when given.
pub async fn list(
    conn: &mut PgConnection,
    status: Option<ReportStatus>,
    account: Option<(&str, &CustomerId)>,
    limit: i64,
) -> Result<Vec<ReportLine>, sqlx::Error> {
    sqlx::query_as!(
        ReportLine,
        r#"
        SELECT id, kind, corrects, how, status, source, customer_id, usage_id, idempotency_key,
               identifier, meter,
               value, period, occurred_at, attempts, unanswered_at IS NOT NULL AS "unanswered!",
               last_error, provider_error, sent_at
        FROM meter_reports
        WHERE ($1::text IS NULL OR status = $1)
          AND ($2::text IS NULL OR (source = $2 AND customer_id = $3))
        ORDER BY created_at DESC, id LIMIT $4
        "#,
        status.map(ReportStatus::as_str),
        account.map(|(source, _)| source),
        account.map(|(_, customer)| customer.as_str()),
        limit,
    )
    .fetch_all(exec(conn))
    .await
}
