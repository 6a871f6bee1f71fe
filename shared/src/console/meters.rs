//! Meters: the reports of accepted debits to the providers' meters and the corrections of
//! reversed ones (docs/design.md §4.13), newest first, by status and account, with a Replay
//! button for each dead one.

use maud::{html, Markup};
use serde_json::Value;

use super::view::{int, list, param, replay_form, segment, shown, status, text, time, Links};

const REPORT_STATUSES: [&str; 4] = ["pending", "sent", "dead", "withdrawn"];

pub(super) fn render(data: &Value, query: &[(String, String)], links: Links) -> Markup {
    let reports = list(data, "reports");
    let chosen = param(query, "status");
    html! {
        h1 { "Meters" }
        p.lead {
            "Each accepted debit of a source with a meter, told to the provider once; a reversed "
            "debit's report is withdrawn, or corrected at the provider."
        }
        form #meter-search.search method="get" action=(links.console("meters")) role="search"
            aria-label="Meter reports by status and account" {
            div.field {
                label for="meter-status" { "Status" }
                select #meter-status name="status" {
                    option value="" selected[chosen.is_empty()] { "any" }
                    @for word in REPORT_STATUSES {
                        option value=(word) selected[chosen == word] { (word) }
                    }
                }
            }
            div.field {
                label for="meter-source" { "Source" }
                input #meter-source name="source" type="text" value=(param(query, "source"))
                    autocomplete="off" spellcheck="false" size="8";
            }
            div.field {
                label for="meter-customer" { "Customer" }
                input #meter-customer name="customer" type="text" value=(param(query, "customer"))
                    autocomplete="off" spellcheck="false" size="14";
            }
            div.actions { button type="submit" { "Show" } }
        }
        div.scroll {
            table #meter-reports {
                thead {
                    tr {
                        th scope="col" { "Report" span.second { "debit" } }
                        th scope="col" { "Account" span.second { "meter" } }
                        th scope="col" { "Value" span.second { "period" } }
                        th scope="col" { "Status" span.second { "attempts" } }
                        th scope="col" { "Last error" }
                        th scope="col" { "Debited" span.second { "sent" } }
                        th scope="col" { span.visually-hidden { "Action" } }
                    }
                }
                tbody {
                    @for report in reports {
                        @let id = text(report, "id");
                        @let source = text(report, "source");
                        @let word = text(report, "status");
                        tr data-report-id=(id) {
                            th scope="row" {
                                code { (id) }
                                span.second { code { (text(report, "usage_id")) } }
                            }
                            td {
                                a href=(links.account(source, text(report, "customer_id"))) {
                                    (source) " / " (text(report, "customer_id"))
                                }
                                span.second { (text(report, "meter")) }
                            }
                            td.num {
                                @match report["corrects"].as_str() {
                                    // A correction takes its report's value back.
                                    Some(corrected) => {
                                        "−" (shown(&report["value"]))
                                        span.second {
                                            "corrects " code { (corrected) }
                                            @if let Some(how) = report["how"].as_str() { " by " (how) }
                                        }
                                    }
                                    None => { (shown(&report["value"])) span.second { (text(report, "period")) } }
                                }
                            }
                            td {
                                (status(word))
                                span.second {
                                    (int(report, "attempts").unwrap_or_default()) " attempt(s)"
                                    @if report["unanswered"] == true { ", one unanswered" }
                                }
                            }
                            td.reason {
                                @match report["provider_error"].as_str() {
                                    Some(said) => { "provider: " (said) },
                                    None => (shown(&report["last_error"])),
                                }
                            }
                            td {
                                (time(&report["occurred_at"]))
                                span.second { @if report["sent_at"].is_null() { "not sent" } @else { (time(&report["sent_at"])) } }
                            }
                            td {
                                @if word == "dead" {
                                    (replay_form(
                                        &links.api(&format!("/v1/admin/meter-reports/{}/replay", segment(id))),
                                        &format!("Replay meter report {id}"),
                                    ))
                                }
                            }
                        }
                    }
                }
            }
        }
        @if reports.is_empty() { (empty(data, query)) }
    }
}

/// Why the list is empty: no source of this deployment has a meter (then no report is ever
/// written), none was written yet, or none matches the search.
fn empty(data: &Value, query: &[(String, String)]) -> Markup {
    let metered: Vec<(&String, &Value)> = data["meters"]
        .as_object()
        .map(|m| m.iter().collect())
        .unwrap_or_default();
    let searched = ["status", "source", "customer"]
        .iter()
        .any(|name| !param(query, name).is_empty());
    html! {
        p.empty #meters-empty {
            @if metered.is_empty() && data.get("meters").is_some() {
                "No source of this deployment has a meter, so no debit is reported to a provider: "
                "a source's " code { "meter" } " in INBOX_SOURCES turns its reports on "
                "(docs/operating.md)."
            } @else if searched {
                "No meter report matches."
            } @else {
                "No meter report yet: each accepted debit of a metered source ("
                @for (i, (source, meter)) in metered.iter().enumerate() {
                    @if i > 0 { ", " }
                    (source) " to " code { (shown(meter)) }
                }
                ") writes one."
            }
        }
    }
}
