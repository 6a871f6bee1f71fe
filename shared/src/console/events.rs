//! Events: the admin search (status, source, type, customer, provider event id), newest
//! first, a page at a time, and replaying every dead (unprocessable, failed) event of a
//! source at once.

use maud::{html, Markup};
use serde_json::Value;

use super::view::{cursor, int, list, next_link, param, shown, status, text, time, Links};

/// The statuses an event can have (docs/design.md §3.1).
pub(super) const EVENT_STATUSES: [&str; 7] = [
    "received",
    "processing",
    "applied",
    "ignored",
    "failed",
    "dead",
    "unprocessable",
];

/// The search's parameters, in the form's order, with their labels.
const FILTERS: [(&str, &str); 4] = [
    ("source", "Source"),
    ("type", "Type"),
    ("customer", "Customer"),
    ("provider_event_id", "Provider event id"),
];

pub(super) fn render(data: &Value, query: &[(String, String)], links: Links) -> Markup {
    let events = list(data, "events");
    let chosen = param(query, "status");
    let source = param(query, "source");
    let filters: Vec<(&str, &str)> = ["status", "source", "type", "customer", "provider_event_id"]
        .into_iter()
        .map(|name| (name, param(query, name)))
        .collect();
    let next = cursor(&data["next"]).map(|after| {
        let mut pairs = filters.clone();
        pairs.push(("after", &after));
        links.console_query("events", &pairs)
    });
    // What "replay all" takes: the status searched for when it is one the route replays.
    let bulk = match chosen {
        "unprocessable" | "failed" => chosen,
        _ => "dead",
    };
    html! {
        h1 { "Events" }
        form #event-search.search method="get" action=(links.console("events")) role="search"
            aria-label="Search events" {
            div.field {
                label for="search-status" { "Status" }
                select #search-status name="status" {
                    option value="" selected[chosen.is_empty()] { "any" }
                    @for word in EVENT_STATUSES {
                        option value=(word) selected[chosen == word] { (word) }
                    }
                }
            }
            @for (name, label) in FILTERS {
                div.field {
                    label for={ "search-" (name) } { (label) }
                    input id={ "search-" (name) } name=(name) type="text" value=(param(query, name))
                        autocomplete="off" spellcheck="false";
                }
            }
            div.actions {
                button type="submit" { "Search" }
                " "
                a href=(links.console("events")) { "Clear" }
            }
        }
        form #replay-all.bulk data-action="POST" action=(links.api("/v1/admin/events/replay")) {
            input type="hidden" name="status" value=(bulk);
            @if !source.is_empty() { input type="hidden" name="source" value=(source); }
            button type="submit" {
                "Replay all " (bulk) " events"
                @if !source.is_empty() { " of " (source) }
            }
        }
        @if !param(query, "after").is_empty() {
            p.pager { a href=(links.console_query("events", &filters)) { "First page" } }
        }
        (table(events, links))
        @if events.is_empty() { p.empty { "No event matches." } }
        (next_link(next))
    }
}

/// The list, six columns so that a laptop's window shows them all: the event and how it came,
/// its account, its type, when, its status with its attempts and copies, its outcome and why.
fn table(events: &[Value], links: Links) -> Markup {
    html! {
        div.scroll {
            table #events {
                thead {
                    tr {
                        th scope="col" { "Event" span.second { "via" } }
                        th scope="col" { "Customer" span.second { "source" } }
                        th scope="col" { "Type" }
                        th scope="col" { "Occurred" span.second { "received" } }
                        th scope="col" { "Status" span.second { "attempts, copies" } }
                        th scope="col" { "Outcome and reason" }
                    }
                }
                tbody {
                    @for event in events {
                        @let id = int(event, "event_id").unwrap_or(0);
                        @let source = text(event, "source");
                        tr data-event-id=(id) {
                            th scope="row" {
                                a href=(links.event(id)) { "#" (id) }
                                span.second { (text(event, "via")) }
                            }
                            td.id {
                                @match event["customer_id"].as_str() {
                                    Some(customer) => a href=(links.account(source, customer)) { (customer) },
                                    None => "—",
                                }
                                span.second { (source) }
                            }
                            td.id { code { (text(event, "type")) } }
                            td { (time(&event["occurred_at"])) span.second { (time(&event["received_at"])) } }
                            td {
                                (status(text(event, "status")))
                                span.second data-attempts=(shown(&event["attempts"])) {
                                    (shown(&event["attempts"])) " attempt(s), seen "
                                    (shown(&event["seen_count"])) "×"
                                }
                            }
                            td.reason {
                                (status(text(event, "outcome")))
                                @if let Some(reason) = event["reason"].as_str() { " " span.reason { (reason) } }
                            }
                        }
                    }
                }
            }
        }
    }
}
