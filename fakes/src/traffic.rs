//! What a provider fake does to a request before its endpoint sees it: the provider's rate
//! limit (a rolling minute of the fake's clock, the wall clock's unless a test set it, as the
//! providers state their limits in requests per minute) and the
//! test's own faults on top. Each provider's module says what its limit is and how its 429
//! reads; this keeps the count, so a test can ask how many requests went over the limit and
//! the most that arrived in any one minute.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

/// A time source a test hands a fake (a simulation's clock, ahead of the wall clock), read for
/// the provider's own time limits.
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// A test's per-request decider: given a request's path and the key it names (an ingested
/// event's `external_id`, say), what goes wrong with it, if anything.
pub type Decider = Box<dyn FnMut(&str, &str) -> Option<Fault> + Send>;

/// The window the providers' limits are stated over.
const MINUTE: TimeDelta = TimeDelta::minutes(1);

/// What goes wrong with a request, a test's choice on top of the provider's documented
/// behaviour.
#[derive(Debug, Clone)]
pub enum Fault {
    /// The provider fails with this status before doing anything (a 5xx, or any refusal), its
    /// body in the provider's own error shape.
    Fails(u16),
    /// The provider does the work, then answers this status (the "held" case: a 5xx after the
    /// provider acted).
    TakesThenFails(u16),
    /// The provider answers after this long (a client with a shorter timeout gives up).
    Slow(Duration),
    /// The provider's limiter refuses it, as its 429 says, the wait given as this many
    /// seconds where the provider gives one (a limit reached by traffic the fake does not see).
    RateLimited(u64),
}

/// A provider's rate limit and the requests it has seen.
pub struct Traffic {
    /// Requests taken per rolling minute; `None`: the provider publishes no number.
    limit: Option<u32>,
    /// The provider's time, which its minute is counted on: the wall clock's unless a test
    /// set it (a simulation's, ahead of the wall clock).
    clock: Option<Clock>,
    /// When each request taken in the last minute arrived.
    taken: VecDeque<DateTime<Utc>>,
    /// When each request that arrived in the last minute did, taken or not.
    arrived: VecDeque<DateTime<Utc>>,
    over: u32,
    peak: u32,
    requests: u32,
    faults: VecDeque<(Option<String>, Fault)>,
    decider: Option<Decider>,
}

/// A request the limit refused: the seconds until a place in the window frees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub retry_after: u64,
}

/// A request the limit took: the limit and what is left of it in this minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub limit: Option<u32>,
    pub remaining: Option<u32>,
}

impl Traffic {
    pub fn new(limit: Option<u32>) -> Self {
        Self {
            limit,
            clock: None,
            taken: VecDeque::new(),
            arrived: VecDeque::new(),
            over: 0,
            peak: 0,
            requests: 0,
            faults: VecDeque::new(),
            decider: None,
        }
    }

    pub fn set_limit(&mut self, limit: Option<u32>) {
        self.limit = limit;
    }

    /// Counts the minute on `clock` from now on.
    pub fn set_clock(&mut self, clock: Clock) {
        self.clock = Some(clock);
    }

    /// Counts a request arriving now, by the provider's clock, against the limit.
    pub fn arrive(&mut self) -> Result<Taken, Refused> {
        let now = self.clock.as_ref().map_or_else(Utc::now, |clock| clock());
        self.arrive_at(now)
    }

    fn arrive_at(&mut self, now: DateTime<Utc>) -> Result<Taken, Refused> {
        self.requests += 1;
        let recent = |t: &DateTime<Utc>| now - *t < MINUTE;
        while self.arrived.front().is_some_and(|t| !recent(t)) {
            self.arrived.pop_front();
        }
        while self.taken.front().is_some_and(|t| !recent(t)) {
            self.taken.pop_front();
        }
        self.arrived.push_back(now);
        self.peak = self.peak.max(self.arrived.len() as u32);
        match self.limit {
            Some(limit) if self.taken.len() as u32 >= limit => {
                self.over += 1;
                let oldest = self.taken.front().copied().unwrap_or(now);
                let wait = (MINUTE - (now - oldest)).to_std().unwrap_or_default();
                Err(Refused {
                    retry_after: wait.as_secs_f64().ceil().max(1.0) as u64,
                })
            }
            limit => {
                self.taken.push_back(now);
                Ok(Taken {
                    limit,
                    remaining: limit.map(|l| l.saturating_sub(self.taken.len() as u32)),
                })
            }
        }
    }

    /// Queues a fault for the next request to `path` (any path when `None`).
    pub fn then(&mut self, path: Option<&str>, fault: Fault) {
        self.faults.push_back((path.map(str::to_owned), fault));
    }

    /// The first queued fault for a request to `path`, taken off the queue.
    pub fn fault(&mut self, path: &str) -> Option<Fault> {
        let at = self
            .faults
            .iter()
            .position(|(p, _)| p.as_deref().is_none_or(|p| p == path))?;
        self.faults.remove(at).map(|(_, f)| f)
    }

    /// Asks `decider` what goes wrong with each request once no queued fault is left (`None`:
    /// stops asking).
    pub fn deciding(&mut self, decider: Option<Decider>) {
        self.decider = decider;
    }

    /// The first queued fault for a request to `path`, else the decider's for it and `key`.
    pub fn fault_for(&mut self, path: &str, key: &str) -> Option<Fault> {
        match self.fault(path) {
            Some(fault) => Some(fault),
            None => self.decider.as_mut().and_then(|d| d(path, key)),
        }
    }

    /// Requests refused for the limit so far.
    pub fn over_limit(&self) -> u32 {
        self.over
    }

    /// The most requests that arrived within one minute.
    pub fn peak_per_minute(&self) -> u32 {
        self.peak
    }

    /// Every request that reached the fake's endpoints.
    pub fn requests(&self) -> u32 {
        self.requests
    }
}

/// What a test asks of a fake whose traffic a [`Traffic`] counts (Polar, Kinde, Paddle,
/// Lemon Squeezy): its limit lowered, faults in turn, and the counts.
pub trait Metered {
    /// The fake's traffic.
    fn traffic(&self) -> &Mutex<Traffic>;

    /// The rate limit per minute (each fake starts at its provider's; a test may lower it).
    fn rate_limit(&self, per_minute: u32) -> &Self {
        lock(self.traffic()).set_limit(Some(per_minute));
        self
    }

    /// What goes wrong with the next request to `path` (any when `None`), in turn.
    fn then(&self, path: Option<&str>, fault: Fault) -> &Self {
        lock(self.traffic()).then(path, fault);
        self
    }

    /// Requests refused for the rate limit.
    fn over_limit(&self) -> u32 {
        lock(self.traffic()).over_limit()
    }

    /// The most requests that arrived within one minute.
    fn peak_per_minute(&self) -> u32 {
        lock(self.traffic()).peak_per_minute()
    }

    /// Requests that reached it.
    fn requests(&self) -> u32 {
        lock(self.traffic()).requests()
    }
}

fn lock(traffic: &Mutex<Traffic>) -> std::sync::MutexGuard<'_, Traffic> {
    traffic.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_takes_so_many_in_a_rolling_minute_and_counts_the_rest() {
        let mut traffic = Traffic::new(Some(2));
        let start = Utc::now();
        let at = |s: i64| start + TimeDelta::seconds(s);
        assert_eq!(
            traffic.arrive_at(at(0)),
            Ok(Taken {
                limit: Some(2),
                remaining: Some(1)
            })
        );
        assert!(traffic.arrive_at(at(10)).is_ok());
        assert_eq!(
            traffic.arrive_at(at(20)),
            Err(Refused { retry_after: 40 }),
            "a place frees when the first request is a minute old"
        );
        assert!(
            traffic.arrive_at(at(61)).is_ok(),
            "the first left the window"
        );
        assert_eq!(traffic.over_limit(), 1);
        assert_eq!(traffic.peak_per_minute(), 3);
        assert_eq!(traffic.requests(), 4);
    }

    #[test]
    fn a_fault_is_taken_by_the_first_request_to_its_path() {
        let mut traffic = Traffic::new(None);
        traffic.then(Some("/b"), Fault::Fails(500));
        traffic.then(None, Fault::Fails(503));
        assert!(matches!(traffic.fault("/a"), Some(Fault::Fails(503))));
        assert!(traffic.fault("/a").is_none());
        assert!(matches!(traffic.fault("/b"), Some(Fault::Fails(500))));
    }
}
