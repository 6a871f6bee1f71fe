//! Divergences: every stored field the audit found differing from the fold of its account's
//! events (docs/design.md §5.5a), by account, each linked to the account's Why row for it;
//! then what the provider audits found open: each meter month whose provider total differs
//! from the reports sent (§4.13a), each Stripe-mirrored credit grant whose ledger balance
//! differs from Stripe's (§4.14).

use std::collections::BTreeSet;

use maud::{html, Markup};
use serde_json::Value;

use super::account::why_id;
use super::view::{list, shown, text, time, value, Links};

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
        (meter_differences(list(data, "meter_differences"), links))
        (credit_differences(list(data, "credit_differences"), links))
    }
}

/// What one side says of a credit grant: its balance, or that it does not hold the grant.
fn side(balance: &Value, missing: &str) -> Markup {
    match balance {
        Value::Null => html! { em { (missing) } },
        held => html! { (shown(held)) },
    }
}

fn meter_differences(differences: &[Value], links: Links) -> Markup {
    html! {
        h2 #meter-differences-title { "Meter differences" }
        p.meta #meter-differences-summary {
            @if differences.is_empty() {
                "No open meter difference: every compared month's provider total is the reports sent."
            } @else {
                (differences.len()) " account month(s) where the provider's meter counts otherwise "
                "than the reports sent to it. A dead report the provider may hold explains most: "
                "replay it from Meters, or withdraw it."
            }
        }
        @if !differences.is_empty() {
            div.scroll {
                table #meter-differences aria-labelledby="meter-differences-title" {
                    thead {
                        tr {
                            th scope="col" { "Account" }
                            th scope="col" { "Meter" span.second { "month" } }
                            th scope="col" { "Reports sent" }
                            th scope="col" { "The provider counts" }
                            th scope="col" { "First seen" span.second { "last seen" } }
                        }
                    }
                    tbody {
                        @for d in differences {
                            @let (source, customer) = (text(d, "source"), text(d, "customer_id"));
                            tr data-account={ (source) "/" (customer) } data-meter=(text(d, "meter")) {
                                th scope="row" {
                                    a href=(links.account(source, customer)) { (source) " / " (customer) }
                                }
                                td { code { (text(d, "meter")) } span.second { (text(d, "period")) } }
                                td.num { strong { (shown(&d["ours"])) } }
                                td.num { (shown(&d["theirs"])) }
                                td { (time(&d["first_seen_at"])) span.second { (time(&d["last_seen_at"])) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn credit_differences(differences: &[Value], links: Links) -> Markup {
    html! {
        h2 #credit-differences-title { "Credit differences" }
        p.meta #credit-differences-summary {
            @if differences.is_empty() {
                "No open credit difference: every compared grant's balance is Stripe's."
            } @else {
                (differences.len()) " Stripe credit grant(s) whose mirrored ledger balance differs "
                "from Stripe's. A credits event the webhooks never brought explains most: find it "
                "in Stripe's dashboard and replay it."
            }
        }
        @if !differences.is_empty() {
            div.scroll {
                table #credit-differences aria-labelledby="credit-differences-title" {
                    thead {
                        tr {
                            th scope="col" { "Account" }
                            th scope="col" { "Grant" span.second { "unit" } }
                            th scope="col" { "Mirrored" }
                            th scope="col" { "Stripe" }
                            th scope="col" { "First seen" span.second { "last seen" } }
                        }
                    }
                    tbody {
                        @for d in differences {
                            @let (source, customer) = (text(d, "source"), text(d, "customer_id"));
                            tr data-account={ (source) "/" (customer) } data-grant=(text(d, "grant_id")) {
                                th scope="row" {
                                    a href=(links.account(source, customer)) { (source) " / " (customer) }
                                }
                                td { code { (text(d, "grant_id")) } span.second { (text(d, "unit")) } }
                                td.num { strong { (side(&d["ours"], "not mirrored")) } }
                                td.num { (side(&d["theirs"], "not listed")) }
                                td { (time(&d["first_seen_at"])) span.second { (time(&d["last_seen_at"])) } }
                            }
                        }
                    }
                }
            }
        }
    }
}
