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
//! - [`enqueue_or_unmark`]: the send that follows a mark, and the unmark when it fails;
//! - [`rescue`]: what the queue lost (never enqueued, stuck, expired leases, due retries),
//!   and rows whose worker died on the last attempt;
//! - [`thin`]: a thin event's read of its object, stored as an event and finished once the
//!   thin event applied it;
//! - [`sweep`]: the place of a health notice's sweep of subscriptions, kept between attempts;
//! - [`alerts`], [`purge`], [`replay`]; [`read`]: what operators read.
//!
//! An effect row's life, its rescue and purge included, is `effects::outbox`'s; it shares
//! the scheduler's bounds below ([`ROWS_PER_STEP`], [`STUCK_AFTER`]) and the purge's batches.

pub mod alerts;
pub mod commit;
pub mod kept;
pub mod lease;
pub mod purge;
pub mod read;
pub mod replay;
pub mod rescue;
pub mod store;
pub mod sweep;
pub mod thin;

use std::time::Duration;

pub use crate::platform::queued::{
    bounded_unmark, enqueue_or_unmark, send_in_tens, unmark, UNMARK_TIMEOUT,
};

use crate::domain::EventStatus;

/// Longer than the worker's per-event budget, shorter than the SQS visibility timeout.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// A row stored this long ago and never enqueued is rescued (the intake's send failed).
pub const NEVER_ENQUEUED_AFTER: Duration = Duration::from_secs(60);
/// A pending row whose last enqueue mark is this old is enqueued again, whatever wrote the
/// mark: its message was lost, or never sent (a run that died between mark and send).
pub const STUCK_AFTER: Duration = Duration::from_secs(300);
/// The most rows one scheduled step touches.
pub const ROWS_PER_STEP: i64 = 1000;

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
