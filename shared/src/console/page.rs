//! The console's pages and their addresses: `{base}/console/{path}` is the shell, and
//! `{base}/console/fragment/{path}` the page's HTML the script puts in it.

use percent_encoding::percent_decode_str;

/// One page of the console, named by its path below `{base}/console/` (or
/// `{base}/console/fragment/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Page {
    /// `` (empty): what needs a person, then each source.
    Overview,
    /// `events`: the searchable list.
    Events,
    /// `events/{event_id}`: one event's whole story.
    Event(i64),
    /// `accounts/{source}/{customer}`: the account, its log and why.
    Account { source: String, customer: String },
    /// `effects`.
    Effects,
    /// `meters`: meter reports and corrections (docs/design.md §4.13).
    Meters,
    /// `divergences`: every stored field that differs from its account's events.
    Divergences,
    /// `engine-room`.
    EngineRoom,
    /// `audit-trail`.
    AuditTrail,
}

impl Page {
    /// The page a path names (what follows `{base}/console/fragment/`, without the query):
    /// each segment percent-decoded; `None` for any other path, a segment that is not UTF-8
    /// once decoded, an empty source or customer, or an event id that is not a positive
    /// whole number. One leading and one trailing `/` are allowed.
    pub fn parse(path: &str) -> Option<Page> {
        let path = path.strip_prefix('/').unwrap_or(path);
        let path = path.strip_suffix('/').unwrap_or(path);
        if path.is_empty() {
            return Some(Page::Overview);
        }
        let segments = path
            .split('/')
            .map(|s| {
                percent_decode_str(s)
                    .decode_utf8()
                    .ok()
                    .map(|s| s.into_owned())
            })
            .collect::<Option<Vec<String>>>()?;
        let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
        match segments.as_slice() {
            ["events"] => Some(Page::Events),
            ["events", id] => event_id(id).map(Page::Event),
            ["accounts", source, customer] if !source.is_empty() && !customer.is_empty() => {
                Some(Page::Account {
                    source: (*source).to_owned(),
                    customer: (*customer).to_owned(),
                })
            }
            ["effects"] => Some(Page::Effects),
            ["meters"] => Some(Page::Meters),
            ["divergences"] => Some(Page::Divergences),
            ["engine-room"] => Some(Page::EngineRoom),
            ["audit-trail"] => Some(Page::AuditTrail),
            _ => None,
        }
    }

    /// The query parameters the page reads (each passed on to its route(s) by the handler):
    /// the search's fields and the cursor of the next page, the account's cut (`at`) and the
    /// cursor of its log. A page ignores any other.
    pub fn params(&self) -> &'static [&'static str] {
        match self {
            Page::Events => &[
                "status",
                "source",
                "type",
                "customer",
                "provider_event_id",
                "after",
            ],
            Page::Account { .. } => &["at", "after"],
            Page::Effects => &["status", "after"],
            Page::Meters => &["status", "source", "customer"],
            Page::AuditTrail => &["after"],
            Page::Overview | Page::Event(_) | Page::Divergences | Page::EngineRoom => &[],
        }
    }

    /// The page's path below `{base}/console/`, segments percent-encoded: `Page::parse` of it
    /// gives the page back.
    pub fn path(&self) -> String {
        use super::view::segment;
        match self {
            Page::Overview => String::new(),
            Page::Events => "events".to_owned(),
            Page::Event(id) => format!("events/{id}"),
            Page::Account { source, customer } => {
                format!("accounts/{}/{}", segment(source), segment(customer))
            }
            Page::Effects => "effects".to_owned(),
            Page::Meters => "meters".to_owned(),
            Page::Divergences => "divergences".to_owned(),
            Page::EngineRoom => "engine-room".to_owned(),
            Page::AuditTrail => "audit-trail".to_owned(),
        }
    }
}

/// An event id as a path gives it: digits only (no sign, no space), above zero.
fn event_id(segment: &str) -> Option<i64> {
    if segment.is_empty() || !segment.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    segment.parse().ok().filter(|id| *id > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(source: &str, customer: &str) -> Option<Page> {
        Some(Page::Account {
            source: source.to_owned(),
            customer: customer.to_owned(),
        })
    }

    #[test]
    fn each_page_is_parsed_from_its_path() {
        assert_eq!(Page::parse(""), Some(Page::Overview));
        assert_eq!(Page::parse("/"), Some(Page::Overview));
        assert_eq!(Page::parse("events"), Some(Page::Events));
        assert_eq!(Page::parse("events/"), Some(Page::Events));
        assert_eq!(Page::parse("events/42"), Some(Page::Event(42)));
        assert_eq!(Page::parse("accounts/kinde/kc_1"), account("kinde", "kc_1"));
        assert_eq!(Page::parse("effects"), Some(Page::Effects));
        assert_eq!(Page::parse("divergences"), Some(Page::Divergences));
        assert_eq!(Page::parse("engine-room"), Some(Page::EngineRoom));
        assert_eq!(Page::parse("audit-trail"), Some(Page::AuditTrail));
    }

    #[test]
    fn segments_are_percent_decoded_after_the_path_is_split() {
        assert_eq!(
            Page::parse("accounts/stripe/acct_1%2Fcus%201"),
            account("stripe", "acct_1/cus 1")
        );
        assert_eq!(Page::parse("accounts/k%C3%A9/c"), account("ké", "c"));
        assert_eq!(Page::parse("%65vents"), Some(Page::Events));
    }

    #[test]
    fn a_bad_event_id_or_an_unknown_path_is_no_page() {
        for path in [
            "events/abc",
            "events/0",
            "events/-1",
            "events/+5",
            "events/ 5",
            "events/1.5",
            "events/99999999999999999999",
            "events/1/2",
            "events//",
            "accounts/kinde",
            "accounts/kinde/",
            "accounts//kc_1",
            "accounts/kinde/kc_1/why",
            "accounts/kinde/%FF",
            "nope",
            "fragment/events",
            "..",
        ] {
            assert_eq!(Page::parse(path), None, "{path}");
        }
    }

    #[test]
    fn a_page_path_parses_back_to_the_page() {
        for page in [
            Page::Overview,
            Page::Events,
            Page::Event(7),
            Page::Account {
                source: "stripe".to_owned(),
                customer: "acct_1/cus ?#1".to_owned(),
            },
            Page::Effects,
            Page::Meters,
            Page::Divergences,
            Page::EngineRoom,
            Page::AuditTrail,
        ] {
            assert_eq!(Page::parse(&page.path()), Some(page.clone()));
        }
    }
}
