//! Purge: the one home of the events' purge rules (docs/design.md §3.9) — what goes, after how
//! long, and what must be kept. Applied and ignored events older than the retention go, with
//! their deliveries, in batches. Dead, unprocessable and pending rows stay for the operator.
//! What reads the provider's lists again asks [`kept_since`] how far back the store still
//! holds everything it stored. The batches are the loop every queued row's purge shares
//! (`platform::queued::purge`); sent effects give theirs in `effects::outbox`.

use std::time::{Duration, Instant};

use crate::platform::db::exec;
use crate::platform::queued::{self, PURGE_BATCH};
use anyhow::Context;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// The clocks of a provider (which stamps `created`) and of this store (which stamps
/// `received_at`) may disagree by this much.
const CLOCK_MARGIN: Duration = Duration::from_secs(3600);

/// Events a provider created at or after this time, if this source ever stored them, are
/// still stored: the purge takes only rows received before `now − retention`, and an event is
/// received after it is created (less [`CLOCK_MARGIN`]). A list the provider keeps for longer
/// (Stripe's undelivered events, 30 days) is read back only this far, so that an event this
/// source stored and purged is never taken for one the webhooks missed.
pub fn kept_since(retention: Duration, now: DateTime<Utc>) -> DateTime<Utc> {
    let kept = retention.saturating_sub(CLOCK_MARGIN);
    now - chrono::Duration::from_std(kept).unwrap_or_default()
}

/// Deletes applied and ignored events (and their deliveries) older than the retention, in
/// batches while `deadline` allows ([`queued::purge`]); the events deleted.
pub async fn purge(pool: &PgPool, retention: Duration, deadline: Instant) -> anyhow::Result<u64> {
    queued::purge::<super::Events>(pool, retention, deadline).await
}

/// Deletes at most [`PURGE_BATCH`] applied and ignored events (and their deliveries) older
/// than the retention. Dead, conflicting and unprocessable rows are kept for the operator, and so is
/// every event a register (an entitlement's, a credit grant's too), a grant, a credit
/// transaction, a payment intent or a tombstone names, and every read
/// made for an event still stored: the fold of the account's kept events gives its registers
/// again, and a replay applies what was read without reading again (docs/design.md §3.9,
/// §4.11, §6.2).
pub(super) async fn purge_batch(pool: &PgPool, retention: Duration) -> anyhow::Result<u64> {
    Ok(sqlx::query!(
        r#"
            DELETE FROM inbox_events
            WHERE id IN (
                SELECT e.id FROM inbox_events e
                WHERE e.status IN ('applied', 'ignored')
                  AND e.received_at < inbox_now() - make_interval(secs => $1)
                  -- What the fold of an account needs stays (docs/design.md §3.9, §4.11): the
                  -- event each register holds, each grant's, each payment intent's halves', and
                  -- the tombstone's.
                  AND NOT EXISTS (SELECT 1 FROM customer_plans r WHERE r.event_id = e.id)
                  AND NOT EXISTS (SELECT 1 FROM customer_standing r WHERE r.event_id = e.id)
                  AND NOT EXISTS (SELECT 1 FROM subscriptions r WHERE r.event_id = e.id)
                  AND NOT EXISTS (SELECT 1 FROM payments r WHERE r.event_id = e.id)
                  AND NOT EXISTS (SELECT 1 FROM ledger r WHERE r.event_id = e.id)
                  AND NOT EXISTS (SELECT 1 FROM entitlements r WHERE r.event_id = e.id)
                  AND NOT EXISTS (SELECT 1 FROM payment_intents r
                                  WHERE r.linked_by = e.id OR r.refunded_by = e.id)
                  AND NOT EXISTS (SELECT 1 FROM accounts r WHERE r.deleted_by = e.id)
                  -- A credit grant's latest snapshot and the void it keeps, and every
                  -- transaction counted (docs/design.md §4.14).
                  AND NOT EXISTS (SELECT 1 FROM credit_grants r WHERE r.event_id = e.id)
                  AND NOT EXISTS (SELECT 1 FROM credit_grants r WHERE r.voided_by = e.id)
                  AND NOT EXISTS (SELECT 1 FROM credit_transactions r WHERE r.event_id = e.id)
                  -- A read the worker made for an event decided what that event applied: a
                  -- thin event's registers name the thin event, an invoice's grant the
                  -- invoice. It stays as long as that event does (the row it names, one
                  -- primary-key probe), so the fold and a replay find it.
                  AND NOT EXISTS (SELECT 1 FROM inbox_events m WHERE m.id = e.made_for)
                LIMIT $2 FOR UPDATE SKIP LOCKED
            )
            "#,
        retention.as_secs_f64(),
        PURGE_BATCH,
    )
    .execute(exec(pool))
    .await
    .context("purging finished events")?
    .rows_affected())
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
