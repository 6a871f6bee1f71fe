//! The fake Stripe's one clock: every window of the meter side (a saved key's 24 hours, an
//! identifier's, the cancel window, a `timestamp`'s 35 days) and of the read side (the rate
//! limiter's seconds, the events' 30 days) is read on it, so a test or a simulation that moves
//! it moves both sides at once.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use chrono::{DateTime, TimeDelta, Utc};

pub use crate::traffic::Clock;

/// Where the fake's time comes from.
#[derive(Clone, Default)]
enum Setting {
    /// The wall clock.
    #[default]
    Wall,
    /// Stopped at a time (a test moves it).
    Stopped(DateTime<Utc>),
    /// Running from a time, set at an instant of the wall clock.
    Running(DateTime<Utc>, Instant),
    /// Read from the test's own clock.
    Read(Clock),
}

/// The fake's clock, settable; clones read and set the same one.
#[derive(Clone, Default)]
pub(super) struct Time(Arc<Mutex<Setting>>);

impl Time {
    pub(super) fn now(&self) -> DateTime<Utc> {
        let setting = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match setting {
            Setting::Wall => Utc::now(),
            Setting::Stopped(at) => at,
            Setting::Running(from, set) => {
                from + TimeDelta::from_std(set.elapsed()).unwrap_or_default()
            }
            Setting::Read(clock) => clock(),
        }
    }

    fn set(&self, setting: Setting) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = setting;
    }

    pub(super) fn read_from(&self, clock: Clock) {
        self.set(Setting::Read(clock));
    }

    pub(super) fn stop_at(&self, at: DateTime<Utc>) {
        self.set(Setting::Stopped(at));
    }

    pub(super) fn run_from(&self, at: DateTime<Utc>) {
        self.set(Setting::Running(at, Instant::now()));
    }

    /// Moves the time on by `by`, stopped there.
    pub(super) fn advance(&self, by: TimeDelta) {
        let now = self.now();
        self.set(Setting::Stopped(now + by));
    }
}
