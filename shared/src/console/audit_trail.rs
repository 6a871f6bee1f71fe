//! The audit trail: every admin action that changed something, who (the key's name), what,
//! on what, and when, newest first. A target or a detail that names an event or an account
//! links to its page; the rest is said in words, not JSON.

use maud::{html, Markup};
use serde_json::Value;

use super::view::{cursor, list, next_link, param, shown, status, text, time, Links};

/// At most this many of a bulk replay's events are linked one by one.
const LISTED_EVENTS: usize = 20;

pub(super) fn render(data: &Value, query: &[(String, String)], links: Links) -> Markup {
    let actions = list(data, "actions");
    let next =
        cursor(&data["next"]).map(|after| links.console_query("audit-trail", &[("after", &after)]));
    html! {
        h1 { "Audit trail" }
        p.meta { "Every action taken through the admin API, with the name of the key that took it." }
        @if !param(query, "after").is_empty() {
            p.pager { a href=(links.console("audit-trail")) { "First page" } }
        }
        div.scroll {
            table #trail {
                thead {
                    tr {
                        th scope="col" { "When" }
                        th scope="col" { "Who" }
                        th scope="col" { "Action" }
                        th scope="col" { "Target" }
                        th scope="col" { "Detail" }
                    }
                }
                tbody {
                    @for action in actions {
                        tr data-action-id=(shown(&action["id"])) {
                            td { (time(&action["at"])) }
                            td { (shown(&action["who"])) }
                            td { code { (text(action, "action")) } }
                            td.target { (target(action, links)) }
                            td.detail { (detail(&action["detail"], links)) }
                        }
                    }
                }
            }
        }
        @if actions.is_empty() { p.empty { "No action was taken yet." } }
        (next_link(next))
    }
}

/// What an action was taken on, by its kind: an event linked, a bulk replay's status and
/// source in words, a report's or an effect's or a run's id.
fn target(action: &Value, links: Links) -> Markup {
    let raw = text(action, "target");
    match text(action, "action") {
        "event.replay" | "account_event.replay" => match raw.parse::<i64>() {
            Ok(id) => html! { a href=(links.event(id)) { "event #" (id) } },
            Err(_) => html! { (raw) },
        },
        "events.replay" => {
            // The bulk replay's target is its filter, as the detail also holds it.
            let filter: Value = serde_json::from_str(raw).unwrap_or(Value::Null);
            let source = filter["source"].as_str();
            html! {
                "every " (status(text(&filter, "status"))) " event"
                @match source {
                    Some(source) => { " of " a href=(links.console_query("events", &[("source", source)])) { (source) } },
                    None => " of every source",
                }
            }
        }
        "effect.replay" => html! { "effect " code { (raw) } },
        "meter_report.replay" => html! {
            "meter report " a href=(links.console("meters")) { code { (raw) } }
        },
        "engine_room.run" => html! { "Engine Room run " code { (raw) } },
        _ => html! { (raw) },
    }
}

/// An action's detail in words: its status now, the events a bulk replay took (linked), the
/// account it was taken for (linked); any other value as `name: value`. Nothing for an empty
/// detail.
pub(super) fn detail(detail: &Value, links: Links) -> Markup {
    let Some(fields) = detail.as_object() else {
        return html! { (shown(detail)) };
    };
    let account = detail["source"]
        .as_str()
        .zip(detail["customer_id"].as_str());
    let mut parts: Vec<Markup> = Vec::new();
    for (name, value) in fields.iter().filter(|(_, v)| !v.is_null()) {
        parts.push(match name.as_str() {
            "status" => html! { "now " (status(value.as_str().unwrap_or(""))) },
            "event_ids" => {
                let ids: Vec<i64> = value
                    .as_array()
                    .map_or(&[][..], Vec::as_slice)
                    .iter()
                    .filter_map(Value::as_i64)
                    .collect();
                html! {
                    @if ids.is_empty() { "no event replayed" } @else {
                        (ids.len()) " event(s) replayed: "
                        @for (i, id) in ids.iter().take(LISTED_EVENTS).enumerate() {
                            @if i > 0 { ", " }
                            a href=(links.event(*id)) { "#" (id) }
                        }
                        @if ids.len() > LISTED_EVENTS { " and " (ids.len() - LISTED_EVENTS) " more" }
                    }
                }
            }
            "customer_id" if account.is_some() => {
                let (source, customer) = account.unwrap_or_default();
                html! { "for " a href=(links.account(source, customer)) { (source) " / " (customer) } }
            }
            // Said with the account's link, or a bulk replay's filter, which is its target.
            "source" => continue,
            "customer" => html! { "customer " code { (shown(value)) } },
            _ => html! { (name) ": " (shown(value)) },
        });
    }
    html! {
        @if parts.is_empty() { "—" }
        @for (i, part) in parts.iter().enumerate() {
            @if i > 0 { "; " }
            (part)
        }
    }
}
