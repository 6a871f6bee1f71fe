//! The Overview: what needs a person first, each a link to the list it names, then each
//! source's traffic and backlog, then the effects and the audit's divergences.

use maud::{html, Markup};
use serde_json::Value;

use super::view::{int, list, shown, text, time, Links};

/// A `needs_attention` kind in words.
fn kind_name(kind: &str) -> &str {
    match kind {
        "dead_events" => "Dead events",
        "unprocessable_events" => "Unprocessable events",
        "conflicting_deliveries" => "Conflicting deliveries",
        "dead_effects" => "Dead effects",
        "divergences" => "Divergences",
        "silent_source" => "Silent source",
        "unauthorized_spike" => "Spike of 401s",
        "backlog" => "Backlog",
        other => other,
    }
}

/// An age in seconds as a person reads it.
fn age(secs: Option<i64>) -> String {
    match secs {
        None => "—".to_owned(),
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

pub(super) fn render(data: &Value, links: Links) -> Markup {
    let attention = list(data, "needs_attention");
    let sources = list(data, "sources");
    let effects = &data["effects"];
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
                            " (" (shown(&item["count"])) ")"
                        }
                        @let detail = text(item, "detail");
                        @if !detail.is_empty() { span.detail { (detail) } }
                    }
                }
                @if attention.is_empty() {
                    li.ok { "Nothing needs a person" }
                }
            }
        }
        section aria-labelledby="sources-title" {
            h2 #sources-title { "Sources" }
            div.scroll {
                table #sources {
                    thead {
                        tr {
                            th scope="col" { "Source" }
                            th scope="col" { "Kind" }
                            th scope="col" { "Deliveries, last hour" }
                            th scope="col" { "401s, last hour" }
                            th scope="col" { "Last delivery" }
                            th scope="col" { "Events by status" }
                            th scope="col" { "Oldest unapplied" }
                            th scope="col" { "Dead" }
                            th scope="col" { "Unprocessable" }
                            th scope="col" { "Conflicting" }
                        }
                    }
                    tbody {
                        @for source in sources {
                            @let name = text(source, "source");
                            @let events_of = |status: &str| {
                                Some(links.console_query("events", &[("status", status), ("source", name)]))
                            };
                            tr data-source=(name) {
                                th scope="row" { a href=(links.console_query("events", &[("source", name)])) { (name) } }
                                td { (text(source, "kind")) }
                                (count("deliveries_last_hour", &source["deliveries_last_hour"], None))
                                (count("unauthorized_last_hour", &source["unauthorized_last_hour"], None))
                                td {
                                    @if source["last_delivery_at"].is_null() { "never" }
                                    @else { (time(&source["last_delivery_at"])) }
                                }
                                td.by-status {
                                    @if let Some(by_status) = source["events_by_status"].as_object() {
                                        @for (status, n) in by_status {
                                            a href=(events_of(status).unwrap_or_default()) data-count=(status) {
                                                (status) " " (shown(n))
                                            }
                                            " "
                                        }
                                    }
                                }
                                td.num { (age(int(source, "oldest_unapplied_age_secs"))) }
                                (count("dead", &source["dead"], events_of("dead")))
                                (count("unprocessable", &source["unprocessable"], events_of("unprocessable")))
                                (count("conflicting", &source["conflicting"], None))
                            }
                        }
                    }
                }
            }
            @if sources.is_empty() { p.empty { "No source is configured." } }
        }
        section aria-labelledby="totals-title" {
            h2 #totals-title { "Effects and audit" }
            table #totals {
                tbody {
                    tr {
                        th scope="row" { "Effects pending" }
                        (count("effects_pending", &effects["pending"], Some(links.console_query("effects", &[("status", "pending")]))))
                    }
                    tr {
                        th scope="row" { "Effects dead" }
                        (count("effects_dead", &effects["dead"], Some(links.console_query("effects", &[("status", "dead")]))))
                    }
                    tr {
                        th scope="row" { "Divergences open" }
                        (count("divergences_open", &data["divergences_open"], None))
                    }
                }
            }
        }
    }
}
