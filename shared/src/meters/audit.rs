//! The meter audit (docs/design.md §4.13a): per account, meter and UTC month, the value of the
//! reports sent compared with the total the provider's meter counts over the same window. A
//! difference is recorded in `meter_audit_differences` and alerted once, naming the reports of
//! the window that died where the provider may hold them, seen again for as long as it lasts,
//! and resolved when the totals agree again.
//!
//! A provider counts what it took asynchronously (Stripe's summaries lag), so only settled
//! windows are compared: from the month's start to [`SETTLE`] before now (to the provider's
//! step: Stripe's minute, Polar's hour), and an account with a report in that window still on
//! its way, or sent less than [`SETTLE`] ago, waits for a later run.

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Datelike, DurationRound, NaiveDate, TimeDelta, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};

use super::Meters;
use crate::domain::CustomerId;
use crate::platform::budget::Throttled;
use crate::platform::db::exec;
use crate::platform::differences::{self, Account, Differences};

/// How long after a send a provider's totals are trusted to count it.
pub const SETTLE: Duration = Duration::from_secs(15 * 60);

/// Accounts (with a meter and a month) a run compares at most: each is a provider read.
pub const MAX_CHECKED_PER_RUN: i64 = 50;

/// How far back a month with sent reports is still compared (a recorded difference is
/// compared until it is resolved, however old).
const LOOK_BACK_DAYS: f64 = 40.0;

/// A difference between our reports and the provider's total.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    pub source: String,
    pub customer_id: String,
    pub period: String,
    pub meter: String,
    pub ours: i64,
    pub theirs: f64,
    pub first_seen_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
}

/// What one audit did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MeterAudit {
    /// Accounts (with a meter and a month) compared with the provider.
    pub checked: u64,
    /// Left for a later run: a report in the window is on its way or not settled yet.
    pub unsettled: u64,
    /// Not compared: the provider's meter cannot be read back.
    pub unreadable: u64,
    /// Left for a later run: the source's API budget was spent, or its provider asked for a
    /// pause (docs/design.md §6.7); its other accounts wait for that run too.
    pub throttled: u64,
    /// Differences seen for the first time this run, and those resolved this run.
    pub new: u64,
    pub resolved: u64,
    /// Every open difference (of the sources audited), oldest first.
    pub differences: Vec<Difference>,
    /// Reads that failed, one line each; the other accounts were still compared.
    pub errors: Vec<String>,
}

/// One account's meter in one month, to compare.
struct Candidate {
    source: String,
    customer_id: String,
    meter: String,
    period: String,
}

/// Compares at most `max` accounts (those compared longest ago first) of the sources with a
/// meter (only `source` when given), while `deadline` allows. An error means the database
/// could not be reached; a provider's failure is one line of `errors`.
#[tracing::instrument(skip_all)]
pub async fn run(
    pool: &PgPool,
    meters: &Meters,
    source: Option<&str>,
    max: i64,
    deadline: Instant,
) -> anyhow::Result<MeterAudit> {
    let mut found = MeterAudit::default();
    let audited: Vec<_> = meters
        .each()
        .filter(|(name, _, _)| source.is_none_or(|s| s == *name))
        .collect();
    if audited.is_empty() {
        return Ok(found);
    }
    let sources: Vec<String> = audited.iter().map(|(s, _, _)| s.to_string()).collect();
    let names: Vec<String> = audited.iter().map(|(_, n, _)| n.to_string()).collect();
    // The store's clock, which every report row is written on (`first_sent_at`, `sent_at`,
    // `occurred_at`), as the dispatcher reads it at the claim: the machine's may differ.
    let now = sqlx::query_scalar!(r#"SELECT inbox_now() AS "now!""#)
        .fetch_one(exec(pool))
        .await
        .context("the store's time")?;
    let settled = (now - TimeDelta::from_std(SETTLE)?)
        .duration_trunc(TimeDelta::minutes(1))
        .context("the settled minute")?;
    let mut throttled: Vec<String> = Vec::new();
    for candidate in candidates(pool, &sources, &names, settled, max).await? {
        if Instant::now() >= deadline {
            break;
        }
        if throttled.contains(&candidate.source) {
            found.throttled += 1;
            continue;
        }
        let Some((_, _, meter)) = audited.iter().find(|(s, _, _)| *s == candidate.source) else {
            continue;
        };
        // The provider's totals end on its step (Polar's whole hours): the window ends on the
        // last one by the settled minute, and ours is summed over that same window.
        let readable = settled
            .duration_trunc(meter.total_step())
            .context("the settled minute to the provider's step")?;
        let Some((start, end)) = window(&candidate.period, readable) else {
            // The month's first readable step is not over yet: a later run.
            found.unsettled += 1;
            continue;
        };
        // Compared now, whatever comes of it: the others get their turn before it comes again.
        checked(pool, &candidate).await?;
        let account = format!(
            "{}/{} {} {}",
            candidate.source, candidate.customer_id, candidate.meter, candidate.period
        );
        let ours = match sum_sent(pool, &candidate, start, end).await? {
            Some(ours) => ours,
            None => {
                found.unsettled += 1;
                continue;
            }
        };
        let customer = match CustomerId::parse(&candidate.customer_id) {
            Ok(customer) => customer,
            Err(e) => {
                found.errors.push(format!("{account}: {e}"));
                continue;
            }
        };
        let theirs = match meter.total(&customer, start, end).await {
            Ok(Some(theirs)) => theirs,
            Ok(None) => {
                found.unreadable += 1;
                continue;
            }
            Err(e) if Throttled::find(&e).is_some() => {
                found.throttled += 1;
                throttled.push(candidate.source.clone());
                continue;
            }
            Err(e) => {
                found.errors.push(format!("{account}: {e:#}"));
                continue;
            }
        };
        found.checked += 1;
        let account = Account {
            source: &candidate.source,
            customer_id: &candidate.customer_id,
        };
        let month = MeterMonth {
            meter: candidate.meter.clone(),
            period: candidate.period.clone(),
        };
        if agree(ours, theirs) {
            let settled = differences::settle::<Table>(pool, account, &[], &[month]).await?;
            if settled.resolved > 0 {
                found.resolved += 1;
                tracing::info!(source = %candidate.source, customer_id = %candidate.customer_id,
                    meter = %candidate.meter, period = %candidate.period,
                    "a meter difference is resolved: the provider's total agrees again");
            }
            continue;
        }
        let seen = [Totals {
            month,
            ours,
            theirs,
        }];
        let settled = differences::settle::<Table>(pool, account, &seen, &[]).await?;
        if !settled.new.is_empty() {
            found.new += 1;
            let maybe_held = maybe_held(pool, &candidate, start, end).await?;
            tracing::error!(
                alert = "meter_difference", source = %candidate.source,
                customer_id = %candidate.customer_id, meter = %candidate.meter,
                period = %candidate.period, ours, theirs, maybe_held = %maybe_held,
                "the provider's meter counts a different total than the reports sent to it"
            );
        }
    }
    let mut conn = pool
        .acquire()
        .await
        .context("reading open meter differences")?;
    found.differences = open(&mut conn, Some(&sources), None)
        .await
        .context("reading open meter differences")?;
    Ok(found)
}

/// Whether two totals are the same (a provider keeps decimals: within a millionth).
fn agree(ours: i64, theirs: f64) -> bool {
    (ours as f64 - theirs).abs() < 1e-6
}

/// The compared window of a month: its start to its end or `settled`, whichever is first;
/// `None` for a month not begun before `settled` or not a month.
fn window(period: &str, settled: DateTime<Utc>) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let (year, month) = period.split_once('-')?;
    let (year, month): (i32, u32) = (year.parse().ok()?, month.parse().ok()?);
    let first = NaiveDate::from_ymd_opt(year, month, 1)?;
    let next = if first.month() == 12 {
        NaiveDate::from_ymd_opt(year + 1, 1, 1)?
    } else {
        NaiveDate::from_ymd_opt(year, month + 1, 1)?
    };
    let start = first.and_hms_opt(0, 0, 0)?.and_utc();
    let end = next.and_hms_opt(0, 0, 0)?.and_utc().min(settled);
    (start < end).then_some((start, end))
}

/// The accounts with sent reports to a meter in a recent month, and those with an open
/// difference, those compared longest ago (or never) first.
async fn candidates(
    pool: &PgPool,
    sources: &[String],
    names: &[String],
    settled: DateTime<Utc>,
    max: i64,
) -> anyhow::Result<Vec<Candidate>> {
    let rows = sqlx::query!(
        r#"
        WITH metered AS (SELECT * FROM unnest($1::text[], $2::text[]) AS m(source, meter)),
        due AS (
            SELECT DISTINCT r.source, r.customer_id, r.meter,
                   to_char(r.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM') AS period
            FROM meter_reports r JOIN metered m ON m.source = r.source AND m.meter = r.meter
            WHERE r.status = 'sent' AND r.occurred_at < $3
              AND r.occurred_at > $3 - make_interval(days => $4)
            UNION
            SELECT d.source, d.customer_id, d.meter, d.period
            FROM meter_audit_differences d
            JOIN metered m ON m.source = d.source AND m.meter = d.meter
            WHERE d.resolved_at IS NULL
        )
        SELECT due.source AS "source!", due.customer_id AS "customer_id!",
               due.meter AS "meter!", due.period AS "period!"
        FROM due LEFT JOIN meter_audit_checks c
          ON c.source = due.source AND c.customer_id = due.customer_id
         AND c.meter = due.meter AND c.period = due.period
        ORDER BY c.checked_at NULLS FIRST, due.period, due.source, due.customer_id
        LIMIT $5
        "#,
        sources,
        names,
        settled,
        LOOK_BACK_DAYS as i32,
        max,
    )
    .fetch_all(exec(pool))
    .await
    .context("picking accounts for the meter audit")?;
    Ok(rows
        .into_iter()
        .map(|r| Candidate {
            source: r.source,
            customer_id: r.customer_id,
            meter: r.meter,
            period: r.period,
        })
        .collect())
}

/// The value of the account's reports to the meter the provider took, timed in `[start,
/// end)`; `None` while one timed there is on its way or was sent less than [`SETTLE`] ago
/// (the provider may not count it yet).
async fn sum_sent(
    pool: &PgPool,
    c: &Candidate,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> anyhow::Result<Option<i64>> {
    let row = sqlx::query!(
        r#"
        SELECT COALESCE(sum(CASE kind WHEN 'correction' THEN -value ELSE value END)
                            FILTER (WHERE status = 'sent'), 0)::bigint AS "sent!",
               count(*) FILTER (WHERE status = 'pending'
                                   OR (status = 'sent' AND sent_at > inbox_now() - make_interval(secs => $6)))
                   AS "unsettled!"
        FROM meter_reports
        WHERE source = $1 AND customer_id = $2 AND meter = $3
          AND occurred_at >= $4 AND occurred_at < $5
        "#,
        c.source,
        c.customer_id,
        c.meter,
        start,
        end,
        SETTLE.as_secs_f64(),
    )
    .fetch_one(exec(pool))
    .await
    .context("summing sent meter reports")?;
    Ok((row.unsettled == 0).then_some(row.sent))
}

/// The reports of the window that died where the provider may hold them (an unanswered send,
/// a read-back that could not tell, a provider's error notice), with their values: what may
/// explain a difference, named beside it for the operator who replays or withdraws them.
async fn maybe_held(
    pool: &PgPool,
    c: &Candidate,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> anyhow::Result<String> {
    let rows = sqlx::query!(
        r#"
        SELECT id, CASE kind WHEN 'correction' THEN -value ELSE value END AS "value!"
        FROM meter_reports
        WHERE source = $1 AND customer_id = $2 AND meter = $3
          AND occurred_at >= $4 AND occurred_at < $5
          AND status = 'dead' AND (unanswered_at IS NOT NULL OR sent_at IS NOT NULL)
        ORDER BY occurred_at, id LIMIT 20
        "#,
        c.source,
        c.customer_id,
        c.meter,
        start,
        end,
    )
    .fetch_all(exec(pool))
    .await
    .context("naming the reports that may explain a meter difference")?;
    Ok(rows
        .iter()
        .map(|r| format!("{} ({})", r.id, r.value))
        .collect::<Vec<_>>()
        .join(", "))
}

/// A meter's month of an account: what names a meter difference within its account.
#[derive(Debug, Clone)]
struct MeterMonth {
    meter: String,
    period: String,
}

/// A meter month's totals that differ: the value of our sent reports and the provider's.
#[derive(Debug)]
struct Totals {
    month: MeterMonth,
    ours: i64,
    theirs: f64,
}

/// `meter_audit_differences`: one open difference per account, meter and month.
struct Table;

impl Differences for Table {
    type Seen = Totals;
    type Key = MeterMonth;

    async fn record(pool: &PgPool, account: Account<'_>, seen: &Totals) -> anyhow::Result<bool> {
        let new = sqlx::query_scalar!(
            r#"
            INSERT INTO meter_audit_differences (source, customer_id, period, meter, ours, theirs)
            VALUES ($1, $2, $3, $4, $5, $6)
            ON CONFLICT (source, customer_id, meter, period) WHERE resolved_at IS NULL
            DO UPDATE SET ours = EXCLUDED.ours, theirs = EXCLUDED.theirs,
                          last_seen_at = inbox_now()
            RETURNING xmax = 0 AS "new!"
            "#,
            account.source,
            account.customer_id,
            seen.month.period,
            seen.month.meter,
            seen.ours,
            seen.theirs,
        )
        .fetch_one(exec(pool))
        .await
        .context("recording a meter difference")?;
        Ok(new)
    }

    async fn resolve(
        pool: &PgPool,
        account: Account<'_>,
        months: &[MeterMonth],
    ) -> anyhow::Result<u64> {
        let (meters, periods): (Vec<String>, Vec<String>) = months
            .iter()
            .map(|m| (m.meter.clone(), m.period.clone()))
            .unzip();
        let done = sqlx::query!(
            r#"
            UPDATE meter_audit_differences
            SET resolved_at = inbox_now(), last_seen_at = inbox_now()
            WHERE source = $1 AND customer_id = $2 AND resolved_at IS NULL
              AND (meter, period) IN (SELECT * FROM unnest($3::text[], $4::text[]))
            "#,
            account.source,
            account.customer_id,
            &meters,
            &periods,
        )
        .execute(exec(pool))
        .await
        .context("resolving meter differences")?;
        Ok(done.rows_affected())
    }
}

async fn checked(pool: &PgPool, c: &Candidate) -> anyhow::Result<()> {
    sqlx::query!(
        r#"
        INSERT INTO meter_audit_checks (source, customer_id, meter, period, checked_at)
        VALUES ($1, $2, $3, $4, inbox_now())
        ON CONFLICT (source, customer_id, meter, period) DO UPDATE SET checked_at = inbox_now()
        "#,
        c.source,
        c.customer_id,
        c.meter,
        c.period,
    )
    .execute(exec(pool))
    .await
    .context("marking an account compared by the meter audit")?;
    Ok(())
}

/// The open differences, oldest first: of these sources (`None`: of every source), at most
/// `limit` (`None`: all).
pub async fn open(
    conn: &mut PgConnection,
    sources: Option<&[String]>,
    limit: Option<i64>,
) -> Result<Vec<Difference>, sqlx::Error> {
    sqlx::query_as!(
        Difference,
        r#"
        SELECT source, customer_id, period, meter, ours, theirs, first_seen_at, last_seen_at
        FROM meter_audit_differences
        WHERE resolved_at IS NULL AND ($1::text[] IS NULL OR source = ANY($1))
        ORDER BY first_seen_at, id
        LIMIT $2
        "#,
        sources,
        limit,
    )
    .fetch_all(exec(conn))
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn a_month_is_compared_from_its_start_to_its_end_or_the_settled_minute() {
        let settled = Utc.with_ymd_and_hms(2026, 12, 11, 10, 45, 0).unwrap();
        let december = window("2026-12", settled).unwrap();
        assert_eq!(
            december.0,
            Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap()
        );
        assert_eq!(december.1, settled);
        let november = window("2026-11", settled).unwrap();
        assert_eq!(
            november.1,
            Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap()
        );
        let later = Utc.with_ymd_and_hms(2027, 1, 5, 0, 0, 0).unwrap();
        assert_eq!(
            window("2026-12", later).unwrap().1,
            Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap(),
            "December ends at the next year's first"
        );
        assert_eq!(window("2027-01", settled), None, "not begun");
        assert_eq!(window("someday", settled), None);
    }

    #[test]
    fn totals_agree_to_a_millionth() {
        assert!(agree(5, 5.0));
        assert!(agree(5, 5.000_000_1));
        assert!(!agree(5, 4.0));
        assert!(!agree(0, 0.5));
    }
}
