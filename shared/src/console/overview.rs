//! The Overview: what needs a person first, each a link to the list it names, then what
//! waits (effects, meter reports, divergences), then each source's traffic and backlog. Every
//! figure says what it counts; one above zero that needs a person links to its list.

use maud::{html, Markup};
use serde_json::Value;

use super::chart;
use super::view::{list, shown, text, time, Links};

/// A `needs_attention` kind in words.
fn kind_name(kind: &str) -> &str {
    match kind {
        "dead_events" => "Dead events",
        "unprocessable_events" => "Unprocessable events",
        "conflicting_deliveries" => "Conflicting deliveries",
        "dead_effects" => "Dead effects",
        "divergences" => "Divergences",
        "silent_source" => "Silent source",
        "dead_meter_reports" => "Dead meter reports",
        "meter_differences" => "Meter differences",
        "credit_differences" => "Credit differences",
        "unauthorized_spike" => "Spike of 401s",
        "backlog" => "Backlog",
        other => other,
    }
}

/// An age in seconds as a person reads it; `—` for none (the overview gives 0 when nothing
/// waits).
pub(super) fn age(secs: Option<f64>) -> String {
    match secs.map(|s| s.round() as i64) {
        None | Some(0) => "—".to_owned(),
        Some(s) if s < 120 => format!("{s} s"),
        Some(s) if s < 7200 => format!("{} min", s / 60),
        Some(s) if s < 172_800 => format!("{} h", s / 3600),
        Some(s) => format!("{} days", s / 86_400),
    }
}

/// A count cell; above zero, a link to the list that shows them.
fn count(name: &str, value: &Value, link: Option<String>) -> Markup {
    let n = value.as_i64().unwrap_or(0);
    html! {
        td.num data-count=(name) {
            @match link {
                Some(link) if n > 0 => a href=(link) { (n) },
                _ => (shown(value)),
            }
        }
    }
}

/// A source that never received anything: configured, not used yet. Not an alarm (the admin
/// API's `needs_attention` does not list it either).
fn never_delivered(source: &Value) -> bool {
    source["last_delivery_at"].is_null()
}

/// The figures that wait on something, each with what it counts and the list that shows it:
/// (`data-count` name, words, value, list).
fn waiting<'a>(
    data: &'a Value,
    links: Links,
) -> [(&'static str, &'static str, &'a Value, String); 7] {
    let effects = &data["effects"];
    let meters = &data["meter_reports"];
    [
        (
            "effects_pending",
            "Effects waiting to be told to the app",
            &effects["pending"],
            links.console_query("effects", &[("status", "pending")]),
        ),
        (
            "effects_dead",
            "Effects the app never acknowledged (dead)",
            &effects["dead"],
            links.console_query("effects", &[("status", "dead")]),
        ),
        (
            "meter_reports_pending",
            "Meter reports waiting to be sent to a provider's meter",
            &meters["pending"],
            links.console_query("meters", &[("status", "pending")]),
        ),
        (
            "meter_reports_dead",
            "Meter reports given up on (dead)",
            &meters["dead"],
            links.console_query("meters", &[("status", "dead")]),
        ),
        (
            "meter_differences_open",
            "Account-months where a provider's meter counts otherwise than the reports sent",
            &meters["differences_open"],
            links.console("divergences"),
        ),
        (
            "credit_differences_open",
            "Stripe credit grants whose mirrored balance differs from Stripe's",
            &data["credit_differences_open"],
            links.console("divergences"),
        ),
        (
            "divergences_open",
            "Stored fields that differ from their account's events (divergences)",
            &data["divergences_open"],
            links.console("divergences"),
        ),
    ]
}

/// The effects and meter reports waiting or given up on, as the picture's bars: the first
/// four figures of [`waiting`], each with a short label.
fn waiting_bars(data: &Value, links: Links) -> Vec<(&'static str, &'static str, i64, String)> {
    let labels = [
        "Effects pending",
        "Effects dead",
        "Meter reports pending",
        "Meter reports dead",
    ];
    waiting(data, links)
        .into_iter()
        .zip(labels)
        .map(|((name, _, value, link), label)| (name, label, value.as_i64().unwrap_or(0), link))
        .collect()
}

pub(super) fn render(data: &Value, links: Links) -> Markup {
    let attention = list(data, "needs_attention");
    let sources = list(data, "sources");
    html! {
        h1 { "Overview" }
        p.meta { "As of " (time(&data["generated_at"])) }
        section aria-labelledby="attention-title" {
            h2 #attention-title { "Needs a person" }
            ul #needs-attention {
                @for item in attention {
                    @let source = text(item, "source");
                    li.attention data-kind=(text(item, "kind")) {
                        a href=(links.console(text(item, "link"))) {
                            strong { (kind_name(text(item, "kind"))) }
                            @if !source.is_empty() { " · " (source) }
                        }
                        @let detail = text(item, "detail");
                        @if !detail.is_empty() { ": " span.detail { (detail) } }
                    }
                }
                @if attention.is_empty() {
                    li.ok { "Nothing needs a person" }
                }
            }
        }
        (chart::render(&chart::EVENTS, data, links))
        (chart::render(&chart::DELIVERIES, data, links))
        section aria-labelledby="totals-title" {
            h2 #totals-title { "Waiting" }
            (chart::waiting(&waiting_bars(data, links)))
            table #totals {
                thead { tr { th scope="col" { "What" } th scope="col" { "Now" } } }
                tbody {
                    @for (name, words, value, link) in waiting(data, links) {
                        tr data-figure=(name) {
                            th scope="row" { (words) }
                            (count(name, value, Some(link)))
                        }
                    }
                }
            }
        }
        section aria-labelledby="sources-title" {
            h2 #sources-title { "Sources" }
            div.scroll {
                table #sources {
                    thead {
                        tr {
                            th scope="col" { "Source" span.second { "kind" } }
                            th scope="col" { "Deliveries" span.second { "last hour" } }
                            th scope="col" { "Refused 401" span.second { "last hour" } }
                            th scope="col" { "Last delivery" }
                            th scope="col" { "Not applied yet" span.second { "events by status" } }
                            th scope="col" { "Oldest waiting" }
                            th scope="col" { "Dead" }
                            th scope="col" { "Unprocessable" }
                            th scope="col" { "Conflicting" span.second { "deliveries" } }
                        }
                    }
                    tbody {
                        @for source in sources {
                            @let name = text(source, "source");
                            @let events_of = |status: &str| {
                                Some(links.console_query("events", &[("status", status), ("source", name)]))
                            };
                            tr data-source=(name) {
                                th scope="row" {
                                    a href=(links.console_query("events", &[("source", name)])) { (name) }
                                    span.second { (text(source, "kind")) }
                                }
                                (count("deliveries_last_hour", &source["deliveries_last_hour"], None))
                                (count("unauthorized_last_hour", &source["unauthorized_last_hour"], None))
                                td data-last-delivery {
                                    @if never_delivered(source) { span.quiet { "no delivery yet" } }
                                    @else { (time(&source["last_delivery_at"])) }
                                }
                                td.by-status {
                                    @let by_status = waiting_by_status(source);
                                    @for (status, n) in &by_status {
                                        a href=(events_of(status).unwrap_or_default()) data-count=(status) {
                                            (status) " " (n)
                                        }
                                        " "
                                    }
                                    @if by_status.is_empty() { span.quiet { "none" } }
                                }
                                td.num { (age(source["oldest_unapplied_age_secs"].as_f64())) }
                                (count("dead", &source["dead"], events_of("dead")))
                                (count("unprocessable", &source["unprocessable"], events_of("unprocessable")))
                                (count("conflicting", &source["conflicting"], Some(links.console_query("events", &[("source", name)]))))
                            }
                        }
                    }
                }
            }
            @if sources.is_empty() { p.empty { "No source is configured." } }
            @if sources.iter().any(never_delivered) {
                p.meta #unused-sources {
                    "A source with no delivery yet is configured but not used: nothing is wrong "
                    "until its provider is expected to send."
                }
            }
        }
    }
}

/// A source's events by status, those not applied (or finished badly) only, with a count.
fn waiting_by_status(source: &Value) -> Vec<(String, i64)> {
    source["events_by_status"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(status, _)| !matches!(status.as_str(), "applied" | "ignored"))
        .filter_map(|(status, n)| Some((status.clone(), n.as_i64()?)))
        .filter(|(_, n)| *n > 0)
        .collect()
}
