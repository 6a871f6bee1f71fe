//! What an operator and an app see of the store and do to it through the API (docs/design.md
//! §12.5): an account's event log, the events and effects lists with one event's whole story,
//! the overview of what needs a person (with the intake's count of refused deliveries it
//! reads), an account's allowance in time (`history`, the console's picture of it), and
//! replays, each written to the audit trail under the name of the key that asked.
//! Every list is paged on an index (the plans are in §12.5).

pub mod acts;
pub mod history;
pub mod lists;
pub mod log;
pub mod overview;
pub mod refusals;
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

    /// The place a `next` named; `None` for what no page's `next` can be: a time outside the
    /// years a stored time has ([`place_time`]), an id with control characters. Asked of the
    /// store, a time before any Postgres holds would fail the statement (a 503 for a bad
    /// request), and so would a NUL.
    pub fn parse(raw: &str) -> Option<Self> {
        if raw.chars().any(char::is_control) {
            return None;
        }
        let (micros, id) = raw.split_once('.')?;
        let at = place_time(micros.parse().ok()?)?;
        let id = id.parse().ok().filter(|_| !id.is_empty())?;
        Some(Self { at, id })
    }
}

/// A place's time from its microseconds: within the years 1 to 9999, which every time a page
/// orders by is in (a provider's time is trusted only from 2000 and a day ahead, a row's is
/// the clock's) and Postgres holds (from 4713 BC).
fn place_time(micros: i64) -> Option<DateTime<Utc>> {
    use chrono::Datelike;
    DateTime::from_timestamp_micros(micros).filter(|at| (1..=9999).contains(&at.year()))
}

/// Cuts what a query read for a page (`limit` + 1 rows, so that one more says there are more)
/// to the page, and names where the next one starts: `place` of the page's last row.
pub fn cut<T>(
    mut rows: Vec<T>,
    limit: i64,
    place: impl Fn(&T) -> String,
) -> (Vec<T>, Option<String>) {
    let limit = usize::try_from(limit).unwrap_or(0);
    if rows.len() <= limit {
        return (rows, None);
    }
    rows.truncate(limit);
    let next = rows.last().map(place);
    (rows, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_cut_at_its_limit_and_names_its_last_row_when_more_were_read() {
        assert_eq!(
            cut(vec![1, 2, 3], 2, i32::to_string),
            (vec![1, 2], Some("2".into()))
        );
        assert_eq!(cut(vec![1, 2], 2, i32::to_string), (vec![1, 2], None));
        assert_eq!(cut(Vec::<i32>::new(), 2, i32::to_string), (vec![], None));
    }

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
        assert_eq!(Place::<String>::parse("1.eff_\u{0}"), None);
        let first = Place {
            at: DateTime::from_timestamp(-62_135_596_800, 0).unwrap(),
            id: 1_i64,
        };
        assert_eq!(
            Place::parse(&first.encode()),
            Some(first),
            "year 1 is a place"
        );
        for bad in [
            "",
            "42",
            "x.1",
            "1.",
            "1.x",
            "99999999999999999999.1",
            // Before year 1 and before any time Postgres holds; after 9999.
            "-1000000000000000000.1",
            "-62135596800000001.1",
            "253402300800000000.1",
            "1\u{0}.1",
        ] {
            assert_eq!(Place::<i64>::parse(bad), None, "{bad:?}");
        }
    }
}
