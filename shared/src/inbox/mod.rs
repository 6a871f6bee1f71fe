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
//!   a failure with the retry schedule;
//! - [`commit`]: an event about an account finished in one statement with everything it
//!   writes, if the lease holds and the account has not moved since it was read;
//! - [`enqueue_or_unmark`]: the send that follows a mark, and the unmark when it fails;
//! - [`rescue`]: what the queue lost (never enqueued, stuck, expired leases, due retries),
//!   and rows whose worker died on the last attempt;
//! - [`thin`]: a thin event's read of its object, stored as an event and finished once the
//!   thin event applied it;
//! - [`sweep`]: the place of a health notice's sweep of subscriptions, kept between attempts;
//! - [`alerts`], [`purge`], [`replay`]; [`read`]: what operators read.

pub mod alerts;
pub mod commit;
mod enqueue;
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

pub use enqueue::{bounded_unmark, enqueue_or_unmark, unmark, UNMARK_TIMEOUT};

use crate::domain::EventStatus;

/// Attempts before an event is dead: the 6th failure ends it. An attempt whose worker died
/// (its lease expired) counts too, so an event that crashes every worker cannot loop forever.
pub const MAX_ATTEMPTS: i32 = 6;
/// Longer than the worker's per-event budget, shorter than the SQS visibility timeout.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Waits after the 1st..5th failed attempt; the 6th failure makes the event dead.
pub const RETRY_DELAYS: [Duration; 5] = [
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(120),
    Duration::from_secs(600),
    Duration::from_secs(3600),
];
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

/// The wait before the next attempt after `attempts` failed ones; `None`: no attempt left.
pub fn retry_delay(delays: &[Duration], attempts: i32) -> Option<Duration> {
    let index = usize::try_from(attempts).ok()?.checked_sub(1)?;
    delays.get(index).copied()
}

/// The pending statuses as SQL parameters take them.
fn pending_names() -> [&'static str; 3] {
    PENDING.map(EventStatus::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_schedule_then_dead() {
        let delays: Vec<_> = (1..=6)
            .map(|a| retry_delay(&RETRY_DELAYS, a).map(|d| d.as_secs()))
            .collect();
        assert_eq!(
            delays,
            [Some(5), Some(30), Some(120), Some(600), Some(3600), None]
        );
    }

    #[test]
    fn pending_is_what_the_status_says() {
        for status in EventStatus::ALL {
            assert_eq!(PENDING.contains(&status), status.is_pending(), "{status}");
        }
    }
}
