//! What an operator and an app see of the store and do to it through the API (docs/design.md
//! §12.5): an account's event log, the events and effects lists with one event's whole story,
//! the overview of what needs a person, and replays, each written to the audit trail under the
//! name of the key that asked. Every list is paged on an index (the plans are in §12.5).

pub mod acts;
pub mod lists;
pub mod log;
pub mod overview;
pub mod trail;

use chrono::{DateTime, Utc};

/// A page's place in a list ordered by a time and then an id: `<microseconds>.<id>`, what a
/// page's `next` says and the following request's `after` gives back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place<Id> {
    pub at: DateTime<Utc>,
    pub id: Id,
}

impl<Id: std::fmt::Display + std::str::FromStr> Place<Id> {
    pub fn encode(&self) -> String {
        format!("{}.{}", self.at.timestamp_micros(), self.id)
    }

    /// The place a `next` named; `None` for what no page's `next` can be.
    pub fn parse(raw: &str) -> Option<Self> {
        let (micros, id) = raw.split_once('.')?;
        let at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
        let id = id.parse().ok().filter(|_| !id.is_empty())?;
        Some(Self { at, id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_reads_back_what_it_wrote_and_nothing_else() {
        let place = Place {
            at: DateTime::from_timestamp_micros(1_764_750_000_123_456).unwrap(),
            id: 42_i64,
        };
        assert_eq!(Place::parse(&place.encode()), Some(place));
        let effect = Place {
            at: DateTime::from_timestamp_micros(1).unwrap(),
            id: "eff_0a".to_owned(),
        };
        assert_eq!(Place::<String>::parse(&effect.encode()), Some(effect));
        for bad in ["", "42", "x.1", "1.", "1.x", "99999999999999999999.1"] {
            assert_eq!(Place::<i64>::parse(bad), None, "{bad:?}");
        }
    }
}
