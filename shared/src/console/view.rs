//! What every page shares: its links (under `{base}/console/` and `{base}/v1/`), times in UTC
//! with their RFC 3339 value for the script, statuses in words and colour, JSON values shown.

use chrono::{DateTime, SecondsFormat, Utc};
use maud::{html, Markup};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;

/// What a path segment keeps as it is: RFC 3986's unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// A value as one path segment (a customer id may hold `/` or spaces).
pub(super) fn segment(value: &str) -> String {
    utf8_percent_encode(value, SEGMENT).to_string()
}

/// The addresses a page links to, all under the deployment's `base` (empty deployed,
/// `/lambda-url/api` under `cargo lambda watch`).
#[derive(Clone, Copy)]
pub(super) struct Links<'a> {
    pub base: &'a str,
}

impl Links<'_> {
    /// A console page, `path` relative to `{base}/console/`.
    pub fn console(&self, path: &str) -> String {
        format!("{}/console/{}", self.base, path.trim_start_matches('/'))
    }

    /// A console page with its query; empty values are left out.
    pub fn console_query(&self, path: &str, pairs: &[(&str, &str)]) -> String {
        with_query(self.console(path), pairs)
    }

    pub fn event(&self, event_id: i64) -> String {
        self.console(&format!("events/{event_id}"))
    }

    pub fn account(&self, source: &str, customer: &str) -> String {
        self.console(&format!(
            "accounts/{}/{}",
            segment(source),
            segment(customer)
        ))
    }

    /// An API route, `path` starting with `/v1/`.
    pub fn api(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }
}

/// `address?k=v&…` with the non-empty values, form-encoded.
pub(super) fn with_query(address: String, pairs: &[(&str, &str)]) -> String {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    let mut any = false;
    for (name, value) in pairs.iter().filter(|(_, value)| !value.is_empty()) {
        query.append_pair(name, value);
        any = true;
    }
    if any {
        format!("{address}?{}", query.finish())
    } else {
        address
    }
}

/// A query parameter of the page's request, the first if given more than once.
pub(super) fn param<'a>(query: &'a [(String, String)], name: &str) -> &'a str {
    query
        .iter()
        .find(|(key, _)| key == name)
        .map_or("", |(_, value)| value.as_str())
}

pub(super) fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

pub(super) fn int(value: &Value, key: &str) -> Option<i64> {
    value.get(key).and_then(Value::as_i64)
}

/// The array under `key`, empty when there is none.
pub(super) fn list<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    value
        .get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// A JSON value as a person reads it: a string as it is, `—` for nothing, anything else as
/// compact JSON.
pub(super) fn shown(value: &Value) -> String {
    match value {
        Value::Null => "—".to_owned(),
        Value::String(s) => s.clone(),
        // A provider's count kept as a float (a meter's summary is a `double precision`) reads
        // as the whole number it is, as the CLI prints it: `9`, not `9.0`.
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// A JSON value as [`shown`] gives it, a time as [`time_str`] does.
pub(super) fn value(value: &Value) -> Markup {
    match value {
        Value::String(s) if DateTime::parse_from_rfc3339(s).is_ok() => time_str(s),
        other => html! { (shown(other)) },
    }
}

/// A cursor (`next`) as a query value; `None` on the last page.
pub(super) fn cursor(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// An RFC 3339 time as `<time datetime=…>YYYY-MM-DD HH:MM:SS UTC</time>` (the script adds the
/// local time as its title); `—` for none, the text as it came when it is not a time.
pub(super) fn time(value: &Value) -> Markup {
    match value {
        Value::String(s) => time_str(s),
        other => html! { (shown(other)) },
    }
}

pub(super) fn time_str(s: &str) -> Markup {
    match DateTime::parse_from_rfc3339(s) {
        Ok(at) => {
            let at = at.with_timezone(&Utc);
            html! {
                time datetime=(at.to_rfc3339_opts(SecondsFormat::AutoSi, true)) {
                    (at.format("%Y-%m-%d %H:%M:%S UTC"))
                }
            }
        }
        Err(_) => html! { (s) },
    }
}

/// `datetime-local`'s value (`YYYY-MM-DDTHH:MM:SS`, read as UTC) for an RFC 3339 time.
pub(super) fn local_input(s: &str) -> String {
    DateTime::parse_from_rfc3339(s)
        .map(|at| {
            at.with_timezone(&Utc)
                .format("%Y-%m-%dT%H:%M:%S")
                .to_string()
        })
        .unwrap_or_default()
}

/// How a status word reads at a glance; the word itself is always shown beside the colour.
pub(super) fn tone(word: &str) -> &'static str {
    match word {
        "applied" | "sent" | "stored" | "active" | "trialing" | "paid" | "good" | "ok" => "good",
        "dead" | "unprocessable" | "failed" | "conflict" | "conflicting" | "past_due"
        | "unauthorized" | "rejected" | "divergent" => "bad",
        "received" | "processing" | "pending" | "incomplete" => "wait",
        _ => "plain",
    }
}

/// A status word, coloured by its tone.
pub(super) fn status(word: &str) -> Markup {
    if word.is_empty() {
        return html! { "—" };
    }
    html! { span class={ "status tone-" (tone(word)) } { (word) } }
}

/// A Replay button: a form the script posts (with the key, no body) to `action`.
pub(super) fn replay_form(action: &str, label: &str) -> Markup {
    html! {
        form.inline data-action="POST" action=(action) {
            button type="submit" aria-label=(label) { "Replay" }
        }
    }
}

/// The "Next page" link (`#next`) when there is a next page.
pub(super) fn next_link(address: Option<String>) -> Markup {
    html! {
        @if let Some(address) = address {
            p.pager { a #next href=(address) rel="next" { "Next page" } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_whole_float_is_shown_as_its_count_and_a_fraction_is_kept() {
        assert_eq!(shown(&json!(9.0)), "9");
        assert_eq!(shown(&json!(-3.0)), "-3");
        assert_eq!(shown(&json!(9.5)), "9.5");
        assert_eq!(shown(&json!(12)), "12");
        assert_eq!(shown(&json!(1e20)), "1e+20");
    }

    #[test]
    fn a_time_is_shown_in_utc_with_its_rfc3339_value() {
        let shown = time(&json!("2026-12-03T11:00:00+01:00")).into_string();
        assert_eq!(
            shown,
            r#"<time datetime="2026-12-03T10:00:00Z">2026-12-03 10:00:00 UTC</time>"#
        );
        assert_eq!(time(&Value::Null).into_string(), "—");
        assert_eq!(time(&json!("soon")).into_string(), "soon");
    }

    #[test]
    fn a_segment_is_percent_encoded_and_a_query_leaves_empty_values_out() {
        let links = Links {
            base: "/lambda-url/api",
        };
        assert_eq!(
            links.account("stripe", "acct_1/cus 1"),
            "/lambda-url/api/console/accounts/stripe/acct_1%2Fcus%201"
        );
        assert_eq!(
            links.console_query(
                "events",
                &[("status", "dead"), ("source", ""), ("type", "a&b")]
            ),
            "/lambda-url/api/console/events?status=dead&type=a%26b"
        );
        assert_eq!(
            links.console_query("events", &[("status", "")]),
            "/lambda-url/api/console/events"
        );
    }
}
