//! The clock a function reads "now" from where a test must move it: the system's, or one set.

use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};

/// The clock a function reads the time of a request from: the system's, or one a test sets
/// (the API's debit at 23:59:59.9 and its retry at 00:00:01 without waiting for midnight; the
/// intake's window for writing its count of refused deliveries, without waiting it out).
#[derive(Debug, Clone, Default)]
pub enum Clock {
    #[default]
    System,
    Set(SetClock),
}

impl Clock {
    pub fn now(&self) -> DateTime<Utc> {
        match self {
            Self::System => Utc::now(),
            Self::Set(clock) => clock.now(),
        }
    }
}

/// A clock that shows the time it was last set to.
#[derive(Debug, Clone)]
pub struct SetClock(Arc<Mutex<DateTime<Utc>>>);

impl SetClock {
    pub fn at(time: DateTime<Utc>) -> Self {
        Self(Arc::new(Mutex::new(time)))
    }

    pub fn set(&self, time: DateTime<Utc>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = time;
    }

    pub fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
