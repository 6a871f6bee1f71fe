//! The audit trail: every admin action that changed something, who (the key's name), what,
//! on what, and when, newest first.

use maud::{html, Markup};
use serde_json::Value;

use super::view::{cursor, list, next_link, param, shown, text, time, Links};

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
                            td { (shown(&action["target"])) }
                            td.detail { (shown(&action["detail"])) }
                        }
                    }
                }
            }
        }
        @if actions.is_empty() { p.empty { "No action was taken yet." } }
        (next_link(next))
    }
}
