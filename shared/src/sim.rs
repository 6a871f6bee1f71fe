//! The points between two steps where a simulation may stop the code under test — a crash
//! (the task never goes on: its open transaction rolls back, its message is never
//! acknowledged), a pause (another actor runs meanwhile), or connections killed — and the
//! simulated queue (docs/design.md §10).
//!
//! Without the `dev` feature [`point`] does nothing. With it, a point asks the
//! [`Interrupts`] of the task it runs in, set by [`with_interrupts`]; a task without any runs
//! straight through, as in production.

use std::fmt;

/// Where an interrupt can happen, with the event or row it concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Point {
    /// The intake committed the event; it is not sent to the queue yet.
    IntakeStored,
    /// The worker's claim (its lease) is committed; nothing else is done.
    WorkerClaimed,
    /// The account's registers are read, outside any transaction; nothing is written.
    WorkerRead,
    /// Inside a worker's transaction: the lease re-check passed (and the account's lock is
    /// held, for an event about an account).
    WorkerLocked,
    /// The event's writes are decided; the statement that writes them is not sent.
    WorkerDecided,
    /// Inside a worker's transaction: everything is written, the commit is not.
    WorkerWritten,
    /// The event's writes are committed; the message is not acknowledged yet.
    WorkerCommitted,
    /// The rescue marked rows as enqueued; it has not sent them.
    RescueMarked,
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// A bug a simulation can switch on, to show that it would be caught (docs/design.md §10).
/// Each is a one-line departure from the design; none is on outside a simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// Same-second events ordered by arrival (the row id) instead of the dedupe key.
    TieByArrival,
    /// Events ordered by when the worker applies them instead of provider time.
    ArrivalTime,
    /// A copy of a stored event stored again as a new event.
    CopyCountsNew,
    /// A failed attempt recorded with no time for the next one.
    RetryNeverScheduled,
    /// The rescue leaves expired leases alone.
    RescueSkipsLeases,
}

/// Whether the simulation running this task planted `bug`; always false outside one.
pub fn planted(_bug: Bug) -> bool {
    #[cfg(feature = "dev")]
    if let Ok(on) = interrupts::INTERRUPTS.try_with(|i| i.planted(_bug)) {
        return on;
    }
    false
}

/// Passes `point` (for the event or row `id`): straight through, unless the task runs under
/// [`with_interrupts`] and they say otherwise.
pub async fn point(_point: Point, _id: i64) {
    #[cfg(feature = "dev")]
    if let Ok(Some(wait)) = interrupts::INTERRUPTS.try_with(|i| i.at(_point, _id)) {
        wait.await;
    }
}

#[cfg(feature = "dev")]
pub use interrupts::{with_interrupts, Interrupts};

#[cfg(feature = "dev")]
mod interrupts {
    use std::future::Future;
    use std::sync::Arc;

    use super::Point;
    use crate::BoxFuture;

    tokio::task_local! {
        pub(super) static INTERRUPTS: Arc<dyn Interrupts>;
    }

    /// What a simulation does at a point: `None` goes on at once; a future is awaited first
    /// (one that never ends is a crash).
    pub trait Interrupts: Send + Sync {
        fn at(&self, point: Point, id: i64) -> Option<BoxFuture<'static, ()>>;

        fn planted(&self, _bug: super::Bug) -> bool {
            false
        }
    }

    /// Runs `task` with `interrupts` deciding at every point it passes.
    pub async fn with_interrupts<F: Future>(interrupts: Arc<dyn Interrupts>, task: F) -> F::Output {
        INTERRUPTS.scope(interrupts, task).await
    }
}

/// A queue in memory behind [`crate::queue::Queue`]: the simulator decides what becomes of
/// each message sent.
#[cfg(feature = "dev")]
pub trait SimQueue: Send + Sync {
    /// Takes the event ids; returns those refused (the sender unmarks them).
    fn send(&self, event_ids: &[i64]) -> Vec<i64>;
}
