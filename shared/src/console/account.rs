//! The account page: its state (plan, subscriptions with their ends, the period's allowance
//! as a meter, features), `why` per field (the deciding event and those it beat), the state
//! as of a chosen time, and its event log with a Replay button per event.

use std::collections::BTreeMap;

use maud::{html, Markup};
use serde_json::{json, Map, Value};

use super::view::{
    cursor, int, list, local_input, replay_form, shown, status, text, time, time_str, value,
    with_query, Links,
};

pub(super) fn render((source, customer): (&str, &str), data: &Value, links: Links) -> Markup {
    let why = &data["why"];
    let at = data["at"].as_str().filter(|at| !at.is_empty());
    let here = links.account(source, customer);
    // As of a time, the state is what `why` folds from the events up to then; now, the
    // account as the app reads it.
    let as_of = at.and_then(|at| as_of(why, at));
    let account = as_of.as_ref().unwrap_or(&data["account"]);
    html! {
        h1 { "Account " span.id { (source) " / " (customer) } }
        @if let Some(stripe_account) = data["account"]["stripe_account"].as_str() {
            p.meta { "Connected account " code { (stripe_account) } }
        }
        form #as-of.search method="get" action=(here) aria-label="The state as of a time" {
            div.field {
                label for="at" { "State as of (UTC)" }
                input #at name="at" type="datetime-local" step="1" data-utc
                    value=(at.map(local_input).unwrap_or_default());
            }
            div.actions {
                button type="submit" { "Show" }
                @if at.is_some() { " " a href=(here) { "Now" } }
            }
        }
        @if let Some(at) = at {
            p.note #as-of-note {
                "As of " (time_str(at)) ": what the events the provider created up to then give. "
                @if as_of.is_none() { "Why could not say it, so the state shown is the account now. " }
                a href=(here) { "See the account now" } "."
            }
        }
        (state(account, at.filter(|_| as_of.is_some())))
        section aria-labelledby="why-title" {
            h2 #why-title {
                "Why"
                @if let Some(at) = at { ", as of " (time_str(at)) }
            }
            p.meta { "Open a field to see the event that decided it and those it beat." }
            (why_fields(why, links))
        }
        (log(&data["events"], (source, customer), at, links))
    }
}

/// The account as `why`'s fields give it as of `at`, shaped as the account's JSON: the plan,
/// each subscription, the allowance and use of `at`'s month, the features. `None` when `why`
/// has no fields (an error's answer).
fn as_of(why: &Value, at: &str) -> Option<Value> {
    let fields = why.get("fields")?.as_array()?;
    let period = chrono::DateTime::parse_from_rfc3339(at)
        .map(|t| t.with_timezone(&chrono::Utc).format("%Y-%m").to_string())
        .unwrap_or_default();
    let mut plan = Value::Null;
    let mut deleted = false;
    let (mut allowance, mut used) = (0, 0);
    let mut subscriptions: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    let mut features = Map::new();
    for field in fields {
        let name = text(field, "field");
        let value = field["value"].clone();
        if name == "plan" {
            plan = value;
        } else if name == "deleted" {
            deleted = !value.is_null();
        } else if name == format!("allowance:{period}") {
            allowance = value.as_i64().unwrap_or(0);
        } else if name == format!("used:{period}") {
            used = value.as_i64().unwrap_or(0);
        } else if let Some(key) = name.strip_prefix("feature:") {
            features.insert(key.to_owned(), value);
        } else if let Some((id, part)) = name
            .strip_prefix("subscription:")
            .and_then(|rest| rest.rsplit_once(':'))
        {
            let sub = subscriptions.entry(id).or_default();
            sub.insert("id".to_owned(), json!(id));
            sub.insert(part.to_owned(), value);
        }
    }
    Some(json!({
        "plan": plan, "deleted": deleted, "period": period,
        "allowance": allowance, "used": used, "remaining": (allowance - used).max(0),
        "subscriptions": subscriptions.into_values().collect::<Vec<_>>(),
        "features": features, "version": null,
    }))
}

/// The account's state: as the app reads it now, or as of `at`.
fn state(account: &Value, at: Option<&str>) -> Markup {
    let allowance = int(account, "allowance").unwrap_or(0);
    let used = int(account, "used").unwrap_or(0);
    let subscriptions = list(account, "subscriptions");
    let features = account["features"].as_object();
    html! {
        section aria-labelledby="state-title" {
            h2 #state-title {
                "State"
                @if let Some(at) = at { " as of " (time_str(at)) } @else { " now" }
            }
            dl.facts {
                dt { "Plan" }
                dd { strong #plan { (text(account, "plan")) } }
                @if account["deleted"].as_bool() == Some(true) {
                    dt { "Customer" }
                    dd { span.status.tone-bad { "deleted" } " by the provider" }
                }
                dt { "Period" }
                dd { (text(account, "period")) }
                dt { "Allowance" }
                dd {
                    meter #allowance min="0" max=(allowance) value=(used)
                        aria-label="Allowance used" { (used) " of " (allowance) }
                    " "
                    span #used { (used) } " used, "
                    span #remaining { (shown(&account["remaining"])) } " remaining of "
                    span #allowance-total { (allowance) }
                }
                @if !account["version"].is_null() {
                    dt { "Version" }
                    dd { (shown(&account["version"])) }
                }
            }
            h3 { "Subscriptions" }
            div.scroll {
                table #subscriptions {
                    thead {
                        tr {
                            th scope="col" { "Subscription" }
                            th scope="col" { "Status" }
                            th scope="col" { "Plan" }
                            th scope="col" { "Current period end" }
                            th scope="col" { "Cancels" }
                            th scope="col" { "Trial end" }
                            th scope="col" { "Ended" }
                        }
                    }
                    tbody {
                        @for sub in subscriptions {
                            tr data-subscription=(text(sub, "id")) {
                                th scope="row" { code { (text(sub, "id")) } }
                                td { (status(text(sub, "status"))) }
                                td { (shown(&sub["plan"])) }
                                td { (time(&sub["current_period_end"])) }
                                td {
                                    @if sub["cancel_at_period_end"].as_bool() == Some(true) {
                                        "at the period's end"
                                    } @else if !sub["cancel_at"].is_null() {
                                        "at " (time(&sub["cancel_at"]))
                                    } @else { "—" }
                                }
                                td { (time(&sub["trial_end"])) }
                                td { (time(&sub["ended_at"])) }
                            }
                        }
                    }
                }
            }
            @if subscriptions.is_empty() { p.empty { "No subscription." } }
            h3 { "Features" }
            table #features {
                thead { tr { th scope="col" { "Feature" } th scope="col" { "Value" } } }
                tbody {
                    @for (key, value) in features.into_iter().flatten() {
                        tr data-feature=(key) { th scope="row" { code { (key) } } td { (shown(value)) } }
                    }
                }
            }
            @if features.is_none_or(|f| f.is_empty()) { p.empty { "No feature." } }
        }
    }
}

/// Every field of `why`, each a `<details>` whose summary is the field and its value and
/// whose body names the deciding event and those it beat.
fn why_fields(why: &Value, links: Links) -> Markup {
    let fields = list(why, "fields");
    let pending = list(why, "pending");
    let purged = int(why, "purged").unwrap_or(0);
    if let Some(code) = why.get("code").and_then(Value::as_str) {
        return html! {
            p.note #why-error { "Why cannot say: " strong { (code) } " " (text(why, "detail")) }
        };
    }
    html! {
        div #why {
            @for field in fields {
                @let name = text(field, "field");
                @let stored = field.get("stored");
                details data-field=(name) id=[(name == "plan").then_some("why-plan")] {
                    summary {
                        code.why-field { (name) } " " strong.why-value { (value(&field["value"])) }
                        @if let Some(stored) = stored {
                            " " span.status.tone-bad { "divergent" } " stored: " (value(stored))
                        }
                    }
                    div.why-body {
                        @match field["decided_by"].as_object() {
                            Some(_) => {
                                @let by = &field["decided_by"];
                                p.decided-by {
                                    "Decided by "
                                    (event_link(by, links))
                                    " " code { (text(by, "type")) }
                                    ", occurred " (time(&by["occurred_at"]))
                                    ", via " (text(by, "via"))
                                    @if by["replayed"].as_bool() == Some(true) { " (replayed)" }
                                }
                            }
                            None => p.decided-by { "No event decided it (the default)." }
                        }
                        @let beaten = list(field, "beaten");
                        @if beaten.is_empty() {
                            p.beaten { "It beat no other event." }
                        } @else {
                            p { "It beat:" }
                            ul.beaten {
                                @for b in beaten {
                                    li {
                                        (event_link(b, links)) " "
                                        strong { (text(b, "reason")) }
                                        @let detail = text(b, "detail");
                                        @if !detail.is_empty() { ": " (detail) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        @if fields.is_empty() { p.empty { "No field: no event of the account is kept." } }
        @if purged > 0 {
            p.note {
                (purged) " events were purged; the answer is whole from "
                (time(&why["complete_from"])) " on."
            }
        }
        @if !pending.is_empty() {
            p.note {
                "Not finished yet: "
                @for (i, id) in pending.iter().enumerate() {
                    @if i > 0 { ", " }
                    @match id.as_i64() {
                        Some(id) => a href=(links.event(id)) { "#" (id) },
                        None => (shown(id)),
                    }
                }
            }
        }
        @let divergent = list(why, "divergent");
        @if !divergent.is_empty() {
            p.note #divergent {
                span.status.tone-bad { "divergent" } " The registers differ from the events on: "
                @for (i, field) in divergent.iter().enumerate() {
                    @if i > 0 { ", " }
                    code { (shown(field)) }
                }
            }
        }
    }
}

fn event_link(event: &Value, links: Links) -> Markup {
    html! {
        @match int(event, "event_id") {
            Some(id) => a href=(links.event(id)) { "event #" (id) },
            None => "an event",
        }
    }
}

/// The account's event log in provider order, a Replay button per event.
fn log(events: &Value, (source, customer): (&str, &str), at: Option<&str>, links: Links) -> Markup {
    let rows = list(events, "events");
    let next = cursor(&events["next"]).map(|after| {
        with_query(
            links.account(source, customer),
            &[("at", at.unwrap_or("")), ("after", &after)],
        )
    });
    html! {
        section aria-labelledby="log-title" {
            h2 #log-title { "Event log" }
            div.scroll {
                table #log {
                    thead {
                        tr {
                            th scope="col" { "Event" }
                            th scope="col" { "Occurred" }
                            th scope="col" { "Type" }
                            th scope="col" { "Status" }
                            th scope="col" { "Outcome" }
                            th scope="col" { "Reason" }
                            th scope="col" { "Seen" }
                            th scope="col" { "Via" }
                            th scope="col" { span.visually-hidden { "Action" } }
                        }
                    }
                    tbody {
                        @for event in rows {
                            @let id = int(event, "event_id").unwrap_or(0);
                            tr data-event-id=(id) {
                                th scope="row" { a href=(links.event(id)) { "#" (id) } }
                                td { (time(&event["occurred_at"])) }
                                td { code { (text(event, "type")) } }
                                td { (status(text(event, "status"))) }
                                td data-outcome=(text(event, "outcome")) { (status(text(event, "outcome"))) }
                                td.reason { (shown(&event["reason"])) }
                                td.num { (shown(&event["seen_count"])) }
                                td { (text(event, "via")) }
                                td {
                                    (replay_form(
                                        &links.api(&format!("/v1/admin/events/{id}/replay")),
                                        &format!("Replay event #{id}"),
                                    ))
                                }
                            }
                        }
                    }
                }
            }
            @if rows.is_empty() { p.empty { "No event of this account is stored." } }
            @if let Some(next) = next {
                p.pager { a #log-next href=(next) rel="next" { "Later events" } }
            }
        }
    }
}
