//! Divergences: every stored field the audit found differing from the fold of its account's
//! events (docs/design.md §5.5a), by account, each linked to the account's Why row for it.

use std::collections::BTreeSet;

use maud::{html, Markup};
use serde_json::Value;

use super::account::why_id;
use super::view::{list, text, time, value, Links};

/// How many accounts the divergences name: each account once, whatever its fields.
pub(super) fn accounts(divergences: &[Value]) -> usize {
    divergences
        .iter()
        .map(|d| (text(d, "source"), text(d, "customer_id")))
        .collect::<BTreeSet<_>>()
        .len()
}

pub(super) fn render(data: &Value, links: Links) -> Markup {
    let divergences = list(data, "divergences");
    let accounts = accounts(divergences);
    html! {
        h1 { "Divergences" }
        p.lead #divergences-summary {
            @if divergences.is_empty() {
                "No stored field differs from its account's events: the audit found nothing."
            } @else {
                (divergences.len()) " stored field(s) of " (accounts) " account(s) differ from what "
                "their events give. The app reads the stored value; open the account's Why to see "
                "the events, then replay the one that should have decided it."
            }
        }
        p.meta {
            "The scheduler's audit folds each account's events and compares the result with the "
            "stored registers; a difference stays listed until a run finds it gone."
        }
        div.scroll {
            table #divergences {
                thead {
                    tr {
                        th scope="col" { "Account" }
                        th scope="col" { "Field" }
                        th scope="col" { "Stored" }
                        th scope="col" { "The events give" }
                        th scope="col" { "First seen" span.second { "last seen" } }
                    }
                }
                tbody {
                    @for d in divergences {
                        @let (source, customer) = (text(d, "source"), text(d, "customer_id"));
                        @let field = text(d, "field");
                        @let account = links.account(source, customer);
                        tr data-account={ (source) "/" (customer) } data-field=(field) {
                            th scope="row" { a href=(account) { (source) " / " (customer) } }
                            td {
                                a href={ (account) "#" (why_id(field)) } { code { (field) } }
                            }
                            td { strong { (value(&d["stored"])) } }
                            td { (value(&d["folded"])) }
                            td { (time(&d["first_seen"])) span.second { (time(&d["last_seen"])) } }
                        }
                    }
                }
            }
        }
    }
}
