//! The inbox: the one home of the life of an `inbox_events` row (docs/design.md §3). Every
//! statement that moves a row from one status to another is in this module:
//!
//! ```text
//!  store ──▶ received ──claim──▶ processing ──finish──▶ applied | ignored | unprocessable
//!               ▲                  │    ▲
//!               │        fail ─────┘    └── claim (due) ── failed ── 6th failure ──▶ dead
//!               └──────────────── replay (any row no worker holds) ◀────────────────┘
//! ```
//!
//! - [`store`]: the intake's one statement (event, copy count, delivery row, enqueue mark);
//! - [`lease`]: claim under a lease, re-check it in the worker's transaction, finish, record
//!   a failure with the retry policy (`domain::retry`, which the effects' deliveries share);
//! - [`commit`]: an event about an account finished in one statement with everything it
//!   writes, if the lease holds and the account has not moved since it was read;
//! - [`Events`]: the events as queued rows, the statements the life every queued row shares
//!   runs (`platform::queued`: the send that follows a mark, [`enqueue_or_unmark`], and the
//!   unmark when it fails; the rescue, alerts, replay and purge loops);
//! - [`rescue`]: what the queue lost (never enqueued, stuck, expired leases, due retries),
//!   and rows whose worker died on the last attempt;
//! - [`thin`]: a thin event's read of its object, stored as an event and finished once the
//!   thin event applied it;
//! - [`sweep`]: the place of a health notice's sweep of subscriptions, kept between attempts;
//! - [`months`]: the provider months the rows are stored by, made ahead by the scheduler;
//! - [`alerts`], [`purge`], [`replay`]; [`read`]: what operators read.
//!
//! An effect row's statements are `effects::outbox`'s, a meter report's `meters::outbox`'s;
//! the three tables' rows share one life, written once in `platform::queued`.

pub mod alerts;
pub mod commit;
pub mod kept;
pub mod lease;
pub mod months;
pub mod purge;
pub mod read;
pub mod replay;
pub mod rescue;
pub mod store;
pub mod sweep;
pub mod thin;

use std::time::Duration;

use sqlx::PgPool;

use crate::domain::EventStatus;
use crate::platform::db::exec;
use crate::platform::queue::Queue;
use crate::platform::queued::{self, Rows};

/// Longer than the worker's per-event budget, shorter than the SQS visibility timeout.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// A row stored this long ago and never enqueued is rescued (the intake's send failed).
pub const NEVER_ENQUEUED_AFTER: Duration = Duration::from_secs(60);

/// The statuses of an event still waiting to be applied (see [`EventStatus::is_pending`]).
pub const PENDING: [EventStatus; 3] = [
    EventStatus::Received,
    EventStatus::Processing,
    EventStatus::Failed,
];

/// The pending statuses as SQL parameters take them.
fn pending_names() -> [&'static str; 3] {
    PENDING.map(EventStatus::as_str)
}

/// The events as queued rows: the statements of their life that `platform::queued` runs.
pub struct Events;

impl Rows for Events {
    type Id = i64;
    type Alerts = alerts::Alerts;
    const NAME: &'static str = "events";

    async fn send(queue: &Queue, ids: &[i64]) -> Vec<i64> {
        queue.send_events(ids).await
    }

    async fn unmark(pool: &PgPool, ids: &[i64]) -> Result<(), sqlx::Error> {
        unmark(pool, ids).await
    }

    async fn bury(pool: &PgPool) -> Result<u64, sqlx::Error> {
        rescue::bury(pool).await
    }

    async fn mark(pool: &PgPool) -> anyhow::Result<Vec<i64>> {
        let ids = rescue::mark(pool).await?;
        rescue::simulated(pool, ids).await
    }

    async fn alerts(pool: &PgPool) -> anyhow::Result<alerts::Alerts> {
        alerts::collect_alerts(pool).await
    }

    async fn purge_batch(pool: &PgPool, retention: Duration) -> anyhow::Result<u64> {
        purge::purge_batch(pool, retention).await
    }
}

/// Sends event ids already marked `enqueued_at` after their statement's commit; unmarks
/// those the queue refused, and returns them ([`queued::enqueue_or_unmark`]).
pub async fn enqueue_or_unmark(
    pool: &PgPool,
    queue: &Queue,
    ids: &[i64],
) -> anyhow::Result<Vec<i64>> {
    queued::enqueue_or_unmark::<Events>(pool, queue, ids).await
}

/// Clears the enqueue mark of events that were not sent, so the next rescue sends them at
/// once.
pub async fn unmark(pool: &PgPool, ids: &[i64]) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE inbox_events SET enqueued_at = NULL WHERE id = ANY($1)",
        ids
    )
    .execute(exec(pool))
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_is_what_the_status_says() {
        for status in EventStatus::ALL {
            assert_eq!(PENDING.contains(&status), status.is_pending(), "{status}");
        }
    }
}
