//! The points between two steps where a simulation may stop the code under test — a crash
//! (the task never goes on: its open transaction rolls back, its message is never
//! acknowledged), a pause (another actor runs meanwhile), or connections killed — and the
//! simulated queue (docs/design.md §10).
//!
//! Without the `dev` feature [`point`] and [`fallible_point`] do nothing. With it, a point
//! asks the [`Interrupts`] of the task it runs in, set by [`with_interrupts`]; a task without
//! any runs straight through, as in production. A fallible point may also be told to fail
//! (an injected fault: the attempt returns an error and writes nothing), or to end the
//! process there ([`Fault`]), for the tests that prove a crash at that point loses nothing.

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
    /// The event's writes are decided; the statement that writes them and finishes the
    /// event (and, under the account's lock, the commit) is not sent. A fallible point.
    WorkerDecided,
    /// Inside a worker's transaction: everything is written, the commit is not.
    WorkerWritten,
    /// The event's writes are committed; the message is not acknowledged yet.
    WorkerCommitted,
    /// The rescue marked rows as enqueued; it has not sent them.
    RescueMarked,
    /// A meter report's attempt at the provider is over (sent, perhaps taken); its outcome
    /// is not recorded yet (docs/design.md §4.13).
    MeterAttempted,
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
    /// A thin event reads its object though its snapshot twin is stored.
    ThinSkipsTwin,
    /// A provider read made for an event is stamped with the clock, not the event's time.
    ReadByTheClock,
    /// A Stripe entitlement summary that says `has_more` applies the partial list it embeds
    /// instead of reading the complete one.
    PartialSummaryApplied,
    /// The simulated app sends a debit's meter report itself before the debit commits, and
    /// the debit may then roll back (the library writes the report with the debit and sends
    /// it after the commit, §4.13).
    ReportSentBeforeCommit,
    /// A grant's remaining clamped at zero inside the credits fold, not only when shown (an
    /// over-applied grant then sums to 0, and an invoice voided afterwards gives back too much).
    ClampInFold,
    /// The fold's provisional expiry counted beside the provider's own `credits_expired` or
    /// `credits_voided` instead of being replaced by it.
    ExpiryAddedToStripes,
    /// Grants spent in the order they were told (their latest snapshot's time, then its event's
    /// key) instead of the burn order's own fields.
    BurnOrderByArrival,
}

/// Whether the simulation running this task planted `bug`; always false outside one.
pub fn planted(_bug: Bug) -> bool {
    #[cfg(feature = "dev")]
    if let Ok(on) = interrupts::INTERRUPTS.try_with(|i| i.planted(_bug)) {
        return on;
    }
    false
}

/// `value`, or what `planted_value` makes in its place when the simulation running this task
/// planted `bug`: a planted bug's departure at the one place it departs.
pub fn or_planted<T>(bug: Bug, value: T, planted_value: impl FnOnce() -> T) -> T {
    match planted(bug) {
        true => planted_value(),
        false => value,
    }
}

/// Passes `point` (for the event or row `id`): straight through, unless the task runs under
/// [`with_interrupts`] and they say otherwise.
pub async fn point(_point: Point, _id: i64) {
    #[cfg(feature = "dev")]
    if let Ok(Some(wait)) = interrupts::INTERRUPTS.try_with(|i| i.at(_point, _id)) {
        wait.await;
    }
}

/// An injected fault: the code at a fallible point returns this instead of going on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("injected fault at {0}")]
pub struct Injected(pub Point);

/// Passes a point where the code can fail (for the event or row `id`): like [`point`], and
/// the task's [`Interrupts`] may make it fail there first ([`Interrupts::fails`]).
pub async fn fallible_point(point: Point, id: i64) -> Result<(), Injected> {
    #[cfg(feature = "dev")]
    if let Ok(true) = interrupts::INTERRUPTS.try_with(|i| i.fails(point, id)) {
        return Err(Injected(point));
    }
    self::point(point, id).await;
    Ok(())
}

#[cfg(feature = "dev")]
pub use interrupts::{with_interrupts, Fault, FaultAction, Interrupts};

#[cfg(feature = "dev")]
mod interrupts {
    use std::future::Future;
    use std::sync::{Arc, Mutex};

    use super::Point;
    use crate::BoxFuture;

    tokio::task_local! {
        pub(super) static INTERRUPTS: Arc<dyn Interrupts>;
    }

    /// What a simulation does at a point: `None` goes on at once; a future is awaited first
    /// (one that never ends is a crash).
    pub trait Interrupts: Send + Sync {
        fn at(&self, point: Point, id: i64) -> Option<BoxFuture<'static, ()>>;

        /// Whether the code fails at this point instead of going on; asked only at a
        /// [`super::fallible_point`], before [`Interrupts::at`].
        fn fails(&self, _point: Point, _id: i64) -> bool {
            false
        }

        fn planted(&self, _bug: super::Bug) -> bool {
            false
        }
    }

    /// Runs `task` with `interrupts` deciding at every point it passes.
    pub async fn with_interrupts<F: Future>(interrupts: Arc<dyn Interrupts>, task: F) -> F::Output {
        INTERRUPTS.scope(interrupts, task).await
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum FaultAction {
        /// Fail this many times (an error return; nothing is written).
        Fail(u32),
        /// End the process on the spot (exit code 86), before the write.
        Exit,
    }

    /// A fault at one fallible point, for the tests that prove a crash there loses nothing.
    /// One fault is shared by every task run under it: `Fail(n)` fails the first `n` passes
    /// of all of them together.
    #[derive(Debug)]
    pub struct Fault {
        point: Point,
        action: Mutex<FaultAction>,
    }

    impl Fault {
        pub fn new(point: Point, action: FaultAction) -> Arc<Self> {
            Arc::new(Self {
                point,
                action: Mutex::new(action),
            })
        }
    }

    impl Interrupts for Fault {
        fn at(&self, _point: Point, _id: i64) -> Option<BoxFuture<'static, ()>> {
            None
        }

        fn fails(&self, point: Point, _id: i64) -> bool {
            if point != self.point {
                return false;
            }
            let mut action = self.action.lock().unwrap_or_else(|e| e.into_inner());
            match *action {
                FaultAction::Exit => std::process::exit(86),
                FaultAction::Fail(n) if n > 0 => {
                    *action = FaultAction::Fail(n - 1);
                    true
                }
                FaultAction::Fail(_) => false,
            }
        }
    }
}

/// A queue in memory behind [`crate::platform::queue::Queue`]: the simulator decides what becomes of
/// each message sent.
#[cfg(feature = "dev")]
pub trait SimQueue: Send + Sync {
    /// Takes the event ids; returns those refused (the sender unmarks them).
    fn send(&self, event_ids: &[i64]) -> Vec<i64>;
}
