//! The intake's count of the deliveries it refuses 401 (the overview's "401s in the last
//! hour", docs/design.md §12.5): tallied in the instance, written at most once a window.
//!
//! Written a row per refusal, a flood of junk at the webhook route's throttle would be as
//! many statements on one hot row (the source's minute), each holding the instance's
//! connection for up to [`WRITE_BUDGET`]: the database would be busiest when nothing is
//! stored. The alarm counts each refusal without the database (`RejectedDeliveries`, a
//! metric line per refusal); this count is what the overview shows, so a window's lag is
//! enough for it. The first refusal after a quiet window is written at once: a secret that
//! no longer matches shows at its first refused delivery.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use chrono::{DateTime, TimeDelta, Utc};

use crate::platform::db::{exec, Held};

/// The longest an instance holds counted refusals before a request writes them.
pub const WINDOW: TimeDelta = TimeDelta::seconds(10);
/// How long a request gives the write before it answers without it (best effort: the
/// counts go with the next write when this one failed).
pub const WRITE_BUDGET: std::time::Duration = std::time::Duration::from_millis(500);
/// What the table keeps of a source (`intake_refusals`): a held count older than this is let go.
const KEPT: TimeDelta = TimeDelta::days(1);

/// The refusals one instance has counted and not written yet, by source and minute, and when
/// it last wrote.
#[derive(Debug)]
pub struct Tally {
    window: TimeDelta,
    state: Mutex<Unwritten>,
}

#[derive(Debug, Default)]
struct Unwritten {
    counts: BTreeMap<(String, DateTime<Utc>), i32>,
    written_at: Option<DateTime<Utc>>,
}

/// Counts taken from the tally to be written: `(source, minute, count)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due(Vec<(String, DateTime<Utc>, i32)>);

impl Default for Tally {
    fn default() -> Self {
        Self::new(WINDOW)
    }
}

impl Tally {
    pub fn new(window: TimeDelta) -> Self {
        Self {
            window,
            state: Mutex::new(Unwritten::default()),
        }
    }

    /// Counts one delivery of `source` refused at `now`, in its minute.
    pub fn count(&self, source: &str, now: DateTime<Utc>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let held = state
            .counts
            .entry((source.to_owned(), minute_of(now)))
            .or_default();
        *held = held.saturating_add(1);
    }

    /// Everything held, taken to be written, when the last write is a window old (or there
    /// was none); `None` when nothing is held or the window is not over. A write is taken
    /// once: refusals counted meanwhile wait for the next window.
    pub fn due(&self, now: DateTime<Utc>) -> Option<Due> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let recent = state.written_at.is_some_and(|at| now - at < self.window);
        if state.counts.is_empty() || recent {
            return None;
        }
        state.written_at = Some(now);
        let counts = std::mem::take(&mut state.counts);
        let kept_from = now - KEPT;
        Some(Due(counts
            .into_iter()
            .filter(|((_, minute), _)| *minute > kept_from)
            .map(|((source, minute), count)| (source, minute, count))
            .collect()))
    }

    /// Holds again what a write could not write: it goes with the next.
    pub fn put_back(&self, due: Due) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        for (source, minute, count) in due.0 {
            let held = state.counts.entry((source, minute)).or_default();
            *held = held.saturating_add(count);
        }
    }
}

fn minute_of(at: DateTime<Utc>) -> DateTime<Utc> {
    let secs = at.timestamp();
    DateTime::from_timestamp(secs - secs.rem_euclid(60), 0).unwrap_or(at)
}

/// Writes what the tally holds if its window is over, in one statement on the instance's
/// connection, and lets each source's rows older than a day go. Best effort within
/// [`WRITE_BUDGET`]: what fails is held again; what ran out of time may have been written,
/// and is not counted twice.
pub async fn write_due(held: &Held, tally: &Tally, now: DateTime<Utc>) {
    let Some(due) = tally.due(now) else {
        return;
    };
    if due.0.is_empty() {
        return;
    }
    let write = async {
        let mut conn = held.lock().await;
        let conn = conn.get().await?;
        let sources: Vec<&str> = due.0.iter().map(|(s, _, _)| s.as_str()).collect();
        let minutes: Vec<DateTime<Utc>> = due.0.iter().map(|(_, m, _)| *m).collect();
        let counts: Vec<i32> = due.0.iter().map(|(_, _, c)| *c).collect();
        sqlx::query!(
            "WITH gone AS (DELETE FROM intake_refusals
                           WHERE source = ANY($1) AND minute < inbox_now() - interval '1 day')
             INSERT INTO intake_refusals (source, minute, count)
             SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::int[])
             ON CONFLICT (source, minute)
             DO UPDATE SET count = intake_refusals.count + EXCLUDED.count",
            &sources as &[&str],
            &minutes,
            &counts,
        )
        .execute(exec(conn))
        .await
        .map(|_| ())
    };
    match tokio::time::timeout(WRITE_BUDGET, write).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "could not write the count of refused deliveries");
            tally.put_back(due);
        }
        Err(_) => tracing::warn!("writing the count of refused deliveries took too long"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_764_000_000 + secs, 0).unwrap()
    }

    fn total(due: &Due) -> i32 {
        due.0.iter().map(|(_, _, c)| c).sum()
    }

    #[test]
    fn the_first_refusal_is_due_at_once_and_a_flood_waits_for_the_window() {
        let tally = Tally::new(TimeDelta::seconds(10));
        assert_eq!(tally.due(at(0)), None, "nothing held");
        tally.count("stripe", at(0));
        let first = tally.due(at(0)).expect("the first is written at once");
        assert_eq!(first.0, vec![("stripe".to_owned(), at(0), 1)]);
        for n in 1..500 {
            tally.count("stripe", at(n % 10));
            assert_eq!(tally.due(at(n % 10)), None, "within the window");
        }
        let rest = tally.due(at(10)).expect("the window is over");
        assert_eq!(total(&rest), 499, "every refusal held, none lost");
        assert_eq!(tally.due(at(30)), None, "nothing held since");
    }

    #[test]
    fn counts_keep_their_source_and_minute_and_a_failed_write_goes_with_the_next() {
        let tally = Tally::new(TimeDelta::seconds(10));
        tally.count("stripe", at(59));
        tally.count("stripe", at(61));
        tally.count("polar", at(61));
        let due = tally.due(at(61)).unwrap();
        assert_eq!(
            due.0,
            vec![
                ("polar".to_owned(), at(60), 1),
                ("stripe".to_owned(), at(0), 1),
                ("stripe".to_owned(), at(60), 1),
            ],
            "each refusal in the minute it was refused"
        );
        tally.put_back(due);
        tally.count("stripe", at(65));
        assert_eq!(tally.due(at(65)), None, "the window since the failed write");
        let again = tally.due(at(71)).unwrap();
        assert_eq!(total(&again), 4);
        assert!(again.0.contains(&("stripe".to_owned(), at(60), 2)));
    }

    #[test]
    fn a_count_older_than_the_table_keeps_is_let_go() {
        let tally = Tally::new(TimeDelta::seconds(10));
        tally.count("stripe", at(0));
        let due = tally.due(at(0)).unwrap();
        tally.put_back(due);
        assert_eq!(tally.due(at(2 * 86_400)), Some(Due(Vec::new())));
    }
}
