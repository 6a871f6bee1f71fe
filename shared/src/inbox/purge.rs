//! Purge: the one home of the events' purge rules (docs/design.md §3.9, §3.14) — what goes,
//! after how long, and what must be kept. A month of events whose end is older than the
//! retention goes at once, its partitions dropped with their deliveries, after what the rules
//! keep is put back into the kept partition; the kept partition (what such a drop kept, rows of
//! months older than the oldest partition) is purged by rows: applied and ignored events older
//! than the retention go, with their deliveries, in batches. Dead, unprocessable and pending
//! rows stay for the operator. What reads the provider's lists again asks [`kept_since`] how
//! far back the store still holds everything it stored. The batches are the loop every queued
//! row's purge shares (`platform::queued::purge`); sent effects give theirs in
//! `effects::outbox`.

use std::time::{Duration, Instant};

use crate::platform::db::exec;
use crate::platform::queued::{self, PURGE_BATCH};
use anyhow::Context;
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgPool;

/// The clocks of a provider (which stamps `created`) and of this store (which stamps
/// `received_at`) may disagree by this much.
const CLOCK_MARGIN: Duration = Duration::from_secs(3600);

/// Events a provider created at or after this time, if this source ever stored them, are
/// still stored: the purge takes only rows received before `now − retention` and months that
/// ended before it ([`drop_months`]), and an event is received after it is created (less
/// [`CLOCK_MARGIN`]). A list the provider keeps for longer
/// (Stripe's undelivered events, 30 days) is read back only this far, so that an event this
/// source stored and purged is never taken for one the webhooks missed.
pub fn kept_since(retention: Duration, now: DateTime<Utc>) -> DateTime<Utc> {
    let kept = retention.saturating_sub(CLOCK_MARGIN);
    now - chrono::Duration::from_std(kept).unwrap_or_default()
}

/// The events' whole purge: the months past the retention dropped ([`drop_months`]), then
/// applied and ignored events of the kept partition older than the retention deleted, with
/// their deliveries, in batches while `deadline` allows ([`queued::purge`]); the events that
/// went.
pub async fn purge(pool: &PgPool, retention: Duration, deadline: Instant) -> anyhow::Result<u64> {
    let dropped: i64 = drop_months(pool, retention)
        .await?
        .iter()
        .map(|m| m.dropped)
        .sum();
    let deleted = queued::purge::<super::Events>(pool, retention, deadline).await?;
    Ok(deleted + u64::try_from(dropped).unwrap_or_default())
}

/// One month of events dropped: how many went, and how many the rules kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DroppedMonth {
    pub month: NaiveDate,
    pub dropped: i64,
    pub kept: i64,
}

/// Drops every month of events whose end is older than the retention (docs/design.md §3.14),
/// oldest first, each in a transaction of its own (`inbox_drop_month`): its partitions are
/// detached, the events the rules of [`purge_batch`] keep go back into `inbox_events` with
/// their first delivery (they land in the kept partition, under their own ids), the rest goes
/// with the dropped tables. Every event created after `now − retention` sits in a later
/// month, so [`kept_since`] holds.
pub async fn drop_months(pool: &PgPool, retention: Duration) -> anyhow::Result<Vec<DroppedMonth>> {
    let months = sqlx::query_scalar!(
        r#"
        SELECT m AS "month!" FROM inbox_months() AS m
        WHERE (m + interval '1 month') AT TIME ZONE 'UTC'
              <= inbox_now() - make_interval(secs => $1)
        ORDER BY m
        "#,
        retention.as_secs_f64(),
    )
    .fetch_all(exec(pool))
    .await
    .context("listing the months past the retention")?;
    let mut dropped = Vec::with_capacity(months.len());
    for month in months {
        let row = sqlx::query!(
            r#"SELECT dropped AS "dropped!", kept AS "kept!" FROM inbox_drop_month($1)"#,
            month,
        )
        .fetch_one(exec(pool))
        .await
        .with_context(|| format!("dropping the events of {month}"))?;
        dropped.push(DroppedMonth {
            month,
            dropped: row.dropped,
            kept: row.kept,
        });
    }
    Ok(dropped)
}

/// Deletes at most [`PURGE_BATCH`] applied and ignored events of the kept partition (and
/// their deliveries, and a health notice's sweep) older than the retention; the other months
/// go whole ([`drop_months`]). Dead, conflicting and unprocessable rows are kept for the
/// operator, and so is every event a register (an entitlement's, a credit grant's too), a
/// grant, a credit transaction, a payment intent or a tombstone names (`inbox_event_named`,
/// which the drop of a month asks too), and every read made for an event still stored: the
/// fold of the account's kept events gives its registers again, and a replay applies what was
/// read without reading again (docs/design.md §3.9, §4.11, §6.2).
pub(super) async fn purge_batch(pool: &PgPool, retention: Duration) -> anyhow::Result<u64> {
    let purged = sqlx::query_scalar!(
        r#"
            WITH gone AS (
                DELETE FROM inbox_events_kept
                WHERE id IN (
                    SELECT e.id FROM inbox_events_kept e
                    WHERE e.status IN ('applied', 'ignored')
                      AND e.received_at < inbox_now() - make_interval(secs => $1)
                      -- What the fold of an account needs stays (docs/design.md §3.9, §4.11).
                      AND NOT inbox_event_named(e.id)
                      -- A read the worker made for an event decided what that event applied:
                      -- a thin event's registers name the thin event, an invoice's grant the
                      -- invoice. It stays as long as that event does (the row it names, one
                      -- probe of each month's primary key), so the fold and a replay find it.
                      AND NOT EXISTS (SELECT 1 FROM inbox_events m WHERE m.id = e.made_for)
                    LIMIT $2 FOR UPDATE SKIP LOCKED
                )
                RETURNING id
            ), sweeps AS (
                DELETE FROM health_sweeps s WHERE s.event_id IN (SELECT id FROM gone)
            )
            SELECT count(*) AS "purged!" FROM gone
            "#,
        retention.as_secs_f64(),
        PURGE_BATCH,
    )
    .fetch_one(exec(pool))
    .await
    .context("purging finished events")?;
    Ok(u64::try_from(purged).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::config::MIN_RETENTION_DAYS;

    #[test]
    fn what_is_kept_reaches_back_to_the_retention_less_the_clock_margin() {
        let now: DateTime<Utc> = "2026-03-10T12:00:00Z".parse().unwrap();
        let six_days = Duration::from_secs(MIN_RETENTION_DAYS * 86_400);
        assert_eq!(
            kept_since(six_days, now),
            "2026-03-04T13:00:00Z".parse::<DateTime<Utc>>().unwrap()
        );
    }
}
