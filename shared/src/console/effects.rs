//! Effects: the outbox rows (what changed, told to the app once), by status, a page at a
//! time, with a Replay button for each one not sent.

use maud::{html, Markup};
use serde_json::Value;

use super::view::{
    cursor, int, list, next_link, param, replay_form, shown, status, text, time, Links,
};

const EFFECT_STATUSES: [&str; 3] = ["pending", "sent", "dead"];

pub(super) fn render(data: &Value, query: &[(String, String)], links: Links) -> Markup {
    let effects = list(data, "effects");
    let chosen = param(query, "status");
    let next = cursor(&data["next"])
        .map(|after| links.console_query("effects", &[("status", chosen), ("after", &after)]));
    html! {
        h1 { "Effects" }
        form #effect-search.search method="get" action=(links.console("effects")) role="search"
            aria-label="Effects by status" {
            div.field {
                label for="effect-status" { "Status" }
                select #effect-status name="status" {
                    option value="" selected[chosen.is_empty()] { "any" }
                    @for word in EFFECT_STATUSES {
                        option value=(word) selected[chosen == word] { (word) }
                    }
                }
            }
            div.actions { button type="submit" { "Show" } }
        }
        @if !param(query, "after").is_empty() {
            p.pager { a href=(links.console_query("effects", &[("status", chosen)])) { "First page" } }
        }
        div.scroll {
            table #effects {
                thead {
                    tr {
                        th scope="col" { "Effect" span.second { "kind, sequence" } }
                        th scope="col" { "Account" }
                        th scope="col" { "Event" span.second { "occurred" } }
                        th scope="col" { "Status" span.second { "attempts" } }
                        th scope="col" { "Last error" }
                        th scope="col" { "Created" span.second { "sent" } }
                        th scope="col" { span.visually-hidden { "Action" } }
                    }
                }
                tbody {
                    @for effect in effects {
                        @let id = shown(&effect["effect_id"]);
                        @let source = text(effect, "source");
                        @let word = text(effect, "status");
                        tr data-effect-id=(id) {
                            th.id scope="row" {
                                code { (id) }
                                span.second { (text(effect, "kind")) ", sequence " (shown(&effect["sequence"])) }
                            }
                            td.id {
                                @match effect["customer_id"].as_str() {
                                    Some(customer) => a href=(links.account(source, customer)) { (source) " / " (customer) },
                                    None => (source),
                                }
                            }
                            td {
                                @match int(effect, "event_id") {
                                    Some(event) => a href=(links.event(event)) { "#" (event) },
                                    None => "—",
                                }
                                span.second { (time(&effect["occurred_at"])) }
                            }
                            td {
                                (status(word))
                                span.second { (shown(&effect["attempts"])) " attempt(s)" }
                            }
                            td.reason { (shown(&effect["last_error"])) }
                            td {
                                (time(&effect["created_at"]))
                                span.second { @if effect["sent_at"].is_null() { "not sent" } @else { (time(&effect["sent_at"])) } }
                            }
                            td {
                                @if word == "dead" || word == "pending" {
                                    (replay_form(
                                        &links.api(&format!("/v1/admin/effects/{}/replay", super::view::segment(&id))),
                                        &format!("Replay effect {id}"),
                                    ))
                                }
                            }
                        }
                    }
                }
            }
        }
        @if effects.is_empty() { p.empty { "No effect matches." } }
        (next_link(next))
    }
}
