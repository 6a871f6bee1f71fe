//! The retry policy of a failed attempt, one for both rows that are retried: an event's
//! (`inbox::lease`, docs/design.md §3.6) and an effect's delivery (`effects::outbox`, §11.2).
//! The waits after each failure are a value of the policy; the number of attempts is the
//! type's, since the claims and the rescues' bury statements compare a row's `attempts` with
//! it in SQL ([`RetryPolicy::MAX_ATTEMPTS`], passed as a parameter: no SQL function or
//! migration holds the schedule).

use std::time::Duration;

/// Failed attempts followed by another: one wait each.
const RETRIES: usize = 5;

/// The waits after the 1st..5th failed attempt; the 6th failure is the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    waits: [Duration; RETRIES],
}

/// The schedule of events and effects alike: 5 s, 30 s, 2 min, 10 min, 1 h, then dead.
pub const RETRY: RetryPolicy = RetryPolicy::new([
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(120),
    Duration::from_secs(600),
    Duration::from_secs(3600),
]);

impl RetryPolicy {
    /// Attempts before a row is dead: the 6th failure ends it. An attempt whose holder died
    /// (its lease or hold expired) counts too, so a row that crashes every worker cannot loop
    /// forever.
    pub const MAX_ATTEMPTS: i32 = RETRIES as i32 + 1;

    pub const fn new(waits: [Duration; RETRIES]) -> Self {
        Self { waits }
    }

    /// The wait before the next attempt after `attempts` failed ones; `None`: no attempt
    /// left, the row is dead.
    pub fn wait_after(&self, attempts: i32) -> Option<Duration> {
        let index = usize::try_from(attempts).ok()?.checked_sub(1)?;
        self.waits.get(index).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_schedule_then_dead() {
        let waits: Vec<_> = (1..=6)
            .map(|a| RETRY.wait_after(a).map(|d| d.as_secs()))
            .collect();
        assert_eq!(
            waits,
            [Some(5), Some(30), Some(120), Some(600), Some(3600), None]
        );
        assert_eq!(RETRY.wait_after(0), None);
        assert_eq!(RetryPolicy::MAX_ATTEMPTS, 6);
    }
}
