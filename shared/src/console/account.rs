//! The account page: first what an operator must not miss (its payment standing, a plan key
//! the catalog does not know, a stored field that differs from its events), each linked to
//! its Why row; then its state (plan, subscriptions with their ends, the period's allowance
//! as a meter, features; its prepaid credits and each grant), its pictures in time
//! (`timeline`: the allowance over the period, the plan's changes), `why` per field (the deciding event and those it beat), the state
//! as of a chosen time, and its event log with a Replay button per event.

use std::collections::BTreeMap;

use maud::{html, Markup};
use serde_json::{json, Map, Value};

use super::timeline;
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
        (truth(account, why, at))
        (state(account, why, at.filter(|_| as_of.is_some())))
        @if data["credits"].is_object() { (credits(&data["credits"])) }
        @if data["allowance_history"].is_object() || data.get("plan_timeline").is_some() {
            section #pictures aria-label="This account in time" {
                h2 { "In time" }
                @if data["allowance_history"].is_object() {
                    (timeline::allowance(&data["allowance_history"], links))
                }
                @if data.get("plan_timeline").is_some() {
                    (timeline::plan(&data["plan_timeline"], links))
                }
            }
        }
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

/// Something the top of the account says, with the field of `why` whose row explains it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Finding {
    /// `past-due`, `good-standing`, `unknown-plan-key` or `divergent`.
    pub kind: &'static str,
    /// The `why` field that explains it (its row is `#why-{field}`, see [`why_id`]).
    pub field: String,
    pub words: String,
}

impl Finding {
    fn needs_a_person(&self) -> bool {
        self.kind != "good-standing"
    }
}

/// What `why` says an operator must see before the state: the payment standing, each plan key
/// the catalog does not name (a plan register whose plan is null while its key is not), and
/// each field whose register differs from the fold of the events, worst first.
pub(super) fn findings(why: &Value) -> Vec<Finding> {
    let fields = list(why, "fields");
    let value_of = |name: &str| {
        fields
            .iter()
            .find(|f| text(f, "field") == name)
            .map(|f| &f["value"])
    };
    let mut found = Vec::new();
    let mut standing = None;
    for field in fields {
        let name = text(field, "field");
        if name == "standing" {
            standing = Some(match text(field, "value") {
                "past_due" => Finding {
                    kind: "past-due",
                    field: name.to_owned(),
                    words: "Past due: its latest payment event left it in arrears.".to_owned(),
                },
                _ => Finding {
                    kind: "good-standing",
                    field: name.to_owned(),
                    words: "Payments in good standing.".to_owned(),
                },
            });
        }
        let Some(key) = field["value"].as_str() else {
            continue;
        };
        // The register's plan next to this key: `customer_plan` beside `customer_plan_key`,
        // `subscription:{id}:plan` beside `subscription:{id}:plan_key`.
        let Some(plan_field) = name.strip_suffix("_key") else {
            continue;
        };
        if value_of(plan_field).is_some_and(Value::is_null) {
            let whose = match name.strip_prefix("subscription:") {
                Some(rest) => format!(
                    "Subscription {}'s plan key",
                    rest.trim_end_matches(":plan_key")
                ),
                None => "The plan key".to_owned(),
            };
            found.push(Finding {
                kind: "unknown-plan-key",
                field: name.to_owned(),
                words: format!("{whose} {key} is not in the catalog: it entitles nothing."),
            });
        }
    }
    for name in list(why, "divergent").iter().filter_map(Value::as_str) {
        let field = fields.iter().find(|f| text(f, "field") == name);
        let stored = field.and_then(|f| f.get("stored")).unwrap_or(&Value::Null);
        let folded = field.map_or(&Value::Null, |f| &f["value"]);
        found.push(Finding {
            kind: "divergent",
            field: name.to_owned(),
            words: format!(
                "Stored {name} is {}, but its events give {}.",
                shown(stored),
                shown(folded)
            ),
        });
    }
    if let Some(standing) = standing {
        match standing.needs_a_person() {
            true => found.insert(0, standing),
            false => found.push(standing),
        }
    }
    found
}

/// The id of a `why` field's row: `why-` and the field, each character that is not a letter,
/// a digit, `-` or `_` as `-` (a field holds `:`; an id is also a CSS selector).
pub(super) fn why_id(field: &str) -> String {
    let slug: String = field
        .chars()
        .map(
            |c| match c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                true => c,
                false => '-',
            },
        )
        .collect();
    format!("why-{slug}")
}

/// The top of the page: each finding, linked to its Why row; a word that all is well when
/// `why` could compare the registers with the events and found nothing.
fn truth(account: &Value, why: &Value, at: Option<&str>) -> Markup {
    let found = findings(why);
    let compared = at.is_none() && why.get("fields").is_some();
    let plan = text(account, "plan");
    html! {
        section #truth aria-label="What this account needs" {
            ul #account-findings {
                @for finding in &found {
                    @let tone = if finding.needs_a_person() { "bad" } else { "good" };
                    li data-finding=(finding.kind) class={ "finding tone-" (tone) } {
                        (finding.words) " "
                        a href={ "#" (why_id(&finding.field)) } data-why=(finding.field) {
                            "Why " code { (finding.field) }
                        }
                    }
                }
                @if compared && !found.iter().any(Finding::needs_a_person) {
                    li.ok data-finding="none" {
                        "On " (plan) ", and every stored field is what its events give."
                    }
                }
            }
        }
    }
}

/// The account's state: as the app reads it now, or as of `at`.
fn state(account: &Value, why: &Value, at: Option<&str>) -> Markup {
    let allowance = int(account, "allowance").unwrap_or(0);
    let used = int(account, "used").unwrap_or(0);
    let subscriptions = list(account, "subscriptions");
    let features = account["features"].as_object();
    // Now, the plan the registers give; the events may give another (a divergence).
    let folded_plan = list(why, "fields")
        .iter()
        .find(|f| text(f, "field") == "plan")
        .and_then(|f| f["value"].as_str())
        .filter(|folded| at.is_none() && *folded != text(account, "plan"));
    // The plan register's plan is no candidate while the account is past due (docs/design.md §4.5):
    // the plan it holds, held back.
    let value_of = |name: &str| {
        list(why, "fields")
            .iter()
            .find(|f| text(f, "field") == name)
            .map(|f| &f["value"])
    };
    let held_back = value_of("customer_plan")
        .and_then(Value::as_str)
        .filter(|held| {
            value_of("standing").and_then(Value::as_str) == Some("past_due")
                && *held != text(account, "plan")
        });
    html! {
        section aria-labelledby="state-title" {
            h2 #state-title {
                "State"
                @if let Some(at) = at { " as of " (time_str(at)) } @else { " now" }
            }
            dl.facts {
                dt { "Plan" }
                dd {
                    strong #plan { (text(account, "plan")) }
                    @if let Some(held) = held_back {
                        " " span.status.tone-bad { "past due" }
                        " its plan register holds " strong #held-plan { (held) }
                        ", which the account gets back once it is paid "
                        a href="#why-standing" data-why="standing" { "Why" }
                    }
                    @if let Some(folded) = folded_plan {
                        " " span.status.tone-bad { "divergent" }
                        " its events give " strong #folded-plan { (folded) } " "
                        a href="#why-plan" data-why="plan" { "Why" }
                    }
                }
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
            }
            @if !account["version"].is_null() {
                p.meta #version {
                    "Version " (shown(&account["version"])) ": the writes to this account so far "
                    "(its events and debits), as the app API's " code { "version" } " counts them; "
                    "two reads with the same version and period are the same."
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

/// An amount as shown: a decimal string, never below zero (the fold keeps the signed sum, a
/// reader clamps it; docs/design.md §4.14).
fn clamped(amount: &Value) -> String {
    match amount.as_str() {
        Some(a) if a.starts_with('-') => "0".to_owned(),
        Some(a) => a.to_owned(),
        None => "—".to_owned(),
    }
}

/// The account's prepaid credit (`GET …/credits`, as of the page's time): each balance per unit
/// and scope, and each grant in the order a debit spends them.
fn credits(credits: &Value) -> Markup {
    let balances = list(credits, "balances");
    let grants = list(credits, "grants");
    html! {
        section #credits aria-labelledby="credits-title" {
            h2 #credits-title { "Credits" }
            p.meta { "As of " (time(&credits["at"])) ". Amounts of a currency are in its minor units." }
            @if balances.is_empty() {
                p.empty { "No credit grant." }
            } @else {
                div.scroll {
                    table #credit-balances {
                        thead {
                            tr {
                                th scope="col" { "Unit" }
                                th scope="col" { "Scope" }
                                th scope="col" { "Available" }
                                th scope="col" { "Granted" }
                                th scope="col" { "Used" }
                                th scope="col" { "Expired" }
                            }
                        }
                        tbody {
                            @for b in balances {
                                tr data-unit=(text(b, "unit")) data-scope=(text(b, "scope")) {
                                    th scope="row" { code { (text(b, "unit")) } }
                                    td { code { (text(b, "scope")) } }
                                    td.available { strong { (clamped(&b["available"])) } }
                                    td { (clamped(&b["granted"])) }
                                    td { (clamped(&b["used"])) }
                                    td { (clamped(&b["expired"])) }
                                }
                            }
                        }
                    }
                }
                h3 { "Grants, in the order debits spend them" }
                div.scroll {
                    table #credit-grants {
                        thead {
                            tr {
                                th scope="col" { "Grant" }
                                th scope="col" { "Origin" }
                                th scope="col" { "Remaining" }
                                th scope="col" { "Amount" }
                                th scope="col" { "Priority" }
                                th scope="col" { "Category" }
                                th scope="col" { "Effective" }
                                th scope="col" { "Expires" }
                                th scope="col" { "Voided" }
                            }
                        }
                        tbody {
                            @for g in grants {
                                tr data-grant=(text(g, "grant_id")) {
                                    th scope="row" {
                                        code { (text(g, "grant_id")) }
                                        @if g["provisional"].as_bool() == Some(true) {
                                            " " span.status.tone-wait title="Counts an amount or an end the provider has not told yet" { "provisional" }
                                        }
                                    }
                                    td { (text(g, "origin")) }
                                    td.remaining { strong { (clamped(&g["remaining"])) } " " (text(g, "unit")) }
                                    td { (clamped(&g["amount"])) }
                                    td { (shown(&g["priority"])) }
                                    td { (text(g, "category")) }
                                    td { (time(&g["effective_at"])) }
                                    td { (time(&g["expires_at"])) }
                                    td { (time(&g["voided_at"])) }
                                }
                            }
                        }
                    }
                }
            }
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
                details data-field=(name) id=(why_id(name)) {
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
                            th scope="col" { "Event" span.second { "via" } }
                            th scope="col" { "Occurred" }
                            th scope="col" { "Type" }
                            th scope="col" { "Status" span.second { "copies seen" } }
                            th scope="col" { "Outcome and reason" }
                            th scope="col" { span.visually-hidden { "Action" } }
                        }
                    }
                    tbody {
                        @for event in rows {
                            @let id = int(event, "event_id").unwrap_or(0);
                            tr data-event-id=(id) {
                                th scope="row" {
                                    a href=(links.event(id)) { "#" (id) }
                                    span.second { (text(event, "via")) }
                                }
                                td { (time(&event["occurred_at"])) }
                                td.id { code { (text(event, "type")) } }
                                td {
                                    (status(text(event, "status")))
                                    span.second { "seen " (shown(&event["seen_count"])) "×" }
                                }
                                td.reason data-outcome=(text(event, "outcome")) {
                                    (status(text(event, "outcome")))
                                    @if let Some(reason) = event["reason"].as_str() { " " span.reason { (reason) } }
                                }
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
