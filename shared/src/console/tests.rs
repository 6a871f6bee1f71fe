//! Each page rendered from its route's JSON (the account and `why` from their real
//! serializations), the ids the browser tests use, escaping, the headers and the assets.

use std::collections::BTreeMap;

use chrono::Utc;
use serde_json::{json, Value};

use super::*;
use crate::audit::{EventRef, Why, WhyField};
use crate::billing::account::{AccountSnapshot, SubscriptionView};
use crate::billing::fold::{Beaten, Via};
use crate::domain::features::FeatureValue;

const BASE: &str = "/lambda-url/api";
const XSS: &str = "<script>alert(1)</script>";

fn rendered(page: &Page, data: &Value, query: &[(&str, &str)]) -> String {
    let query: Vec<(String, String)> = query
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    render(page, data, &query, BASE)
}

fn has(html: &str, needles: &[&str]) {
    for needle in needles {
        assert!(html.contains(needle), "missing {needle:?} in:\n{html}");
    }
}

/// No inline style, no event-handler attribute (`onclick=`…), no `javascript:` address.
fn no_inline_code(html: &str) {
    assert!(
        !html.contains("<style") && !html.contains("style="),
        "{html}"
    );
    assert!(!html.contains("javascript:"), "{html}");
    for (at, _) in html.match_indices(" on") {
        let name: String = html[at + 1..]
            .chars()
            .take_while(char::is_ascii_lowercase)
            .collect();
        assert!(
            !html[at + 1 + name.len()..].starts_with('='),
            "an inline handler {name} in:\n{html}"
        );
    }
}

fn escaped(html: &str) {
    assert!(!html.contains("<script"), "unescaped script in:\n{html}");
    assert!(
        html.contains("&lt;script&gt;"),
        "the value is not shown in:\n{html}"
    );
}

pub(super) fn overview(customer_detail: &str) -> Value {
    json!({
        "generated_at": "2026-12-03T10:00:00Z",
        "sources": [
            {"source": "kinde", "kind": "kinde", "deliveries_last_hour": 12,
             "unauthorized_last_hour": 0, "last_delivery_at": "2026-12-03T09:59:30Z",
             "events_by_status": {"applied": 40, "dead": 1, "ignored": 3},
             "oldest_unapplied_age_secs": 95.4, "dead": 1, "unprocessable": 0, "conflicting": 0},
            {"source": "stripe", "kind": "stripe", "deliveries_last_hour": 0,
             "unauthorized_last_hour": 7, "last_delivery_at": null,
             "events_by_status": {}, "oldest_unapplied_age_secs": null,
             "dead": 0, "unprocessable": 2, "conflicting": 1}
        ],
        "effects": {"pending": 0, "dead": 2},
        "divergences_open": 1,
        "needs_attention": [
            {"kind": "dead_events", "source": "kinde", "count": 1, "detail": customer_detail,
             "link": "events?status=dead&source=kinde"},
            {"kind": "unauthorized_spike", "source": "stripe", "count": 7,
             "detail": "7 deliveries refused with 401 in the last hour", "link": "events?source=stripe"}
        ]
    })
}

#[test]
fn the_overview_puts_what_needs_a_person_first_each_a_link() {
    let html = rendered(&Page::Overview, &overview("1 dead event"), &[]);
    has(
        &html,
        &[
            r#"<ul id="needs-attention">"#,
            r#"href="/lambda-url/api/console/events?status=dead&amp;source=kinde""#,
            "Dead events",
            "Spike of 401s",
            r#"<table id="sources">"#,
            r#"<tr data-source="kinde">"#,
            r#"<tr data-source="stripe">"#,
            r#"data-count="dead"><a href="/lambda-url/api/console/events?status=dead&amp;source=kinde">1</a></td>"#,
            r#"data-count="unprocessable"><a href="/lambda-url/api/console/events?status=unprocessable&amp;source=stripe">2</a></td>"#,
            r#"data-count="unauthorized_last_hour">7</td>"#,
            r#"data-count="effects_dead"><a href="/lambda-url/api/console/effects?status=dead">2</a>"#,
            r#"data-count="divergences_open"><a href="/lambda-url/api/console/divergences">1</a></td>"#,
            r#"<time datetime="2026-12-03T09:59:30Z">2026-12-03 09:59:30 UTC</time>"#,
            "no delivery yet",
            "95 s",
        ],
    );
    assert!(html.find("needs-attention") < html.find("id=\"sources\""));
    assert!(!html.contains("Nothing needs a person"));
}

#[test]
fn a_needs_attention_link_stays_under_the_console() {
    let mut data = overview("");
    data["needs_attention"][0]["link"] = json!("//evil.example/x");
    data["needs_attention"][1]["link"] = json!("javascript:alert(1)");
    let html = rendered(&Page::Overview, &data, &[]);
    has(
        &html,
        &[
            r#"href="/lambda-url/api/console/evil.example/x""#,
            r#"href="/lambda-url/api/console/javascript:alert(1)""#,
        ],
    );
    assert!(!html.contains(r#"href="//"#) && !html.contains(r#"href="javascript:"#));
}

#[test]
fn an_overview_with_nothing_to_do_says_so() {
    let mut data = overview("");
    data["needs_attention"] = json!([]);
    let html = rendered(&Page::Overview, &data, &[]);
    has(&html, &[r#"<li class="ok">Nothing needs a person</li>"#]);
}

fn event_row(id: i64, customer: &str, reason: &str) -> Value {
    json!({"event_id": id, "source": "kinde", "provider_event_id": format!("evt_{id}"),
           "type": "customer.plan_changed", "customer_id": customer,
           "occurred_at": "2026-12-03T09:00:00Z", "received_at": "2026-12-03T09:00:01.250Z",
           "status": "dead", "outcome": null, "reason": reason, "seen_count": 2,
           "attempts": 6, "via": "webhook"})
}

#[test]
fn events_are_listed_with_the_search_replay_all_and_the_next_page() {
    let data = json!({"events": [event_row(42, "kc_1", "gave up after 6 attempts"),
                                 event_row(41, "kc_2", "")],
                      "next": "41"});
    let html = rendered(
        &Page::Events,
        &data,
        &[("status", "dead"), ("source", "kinde")],
    );
    has(
        &html,
        &[
            r#"id="event-search""#,
            r#"method="get" action="/lambda-url/api/console/events""#,
            r#"name="status""#,
            r#"<option value="dead" selected>dead</option>"#,
            r#"name="source" type="text" value="kinde""#,
            r#"name="type""#,
            r#"name="customer""#,
            r#"name="provider_event_id""#,
            r#"<table id="events">"#,
            r#"<tr data-event-id="42">"#,
            r#"<a href="/lambda-url/api/console/events/42">#42</a>"#,
            r#"<a href="/lambda-url/api/console/accounts/kinde/kc_1">kc_1</a>"#,
            r#"data-action="POST" action="/lambda-url/api/v1/admin/events/replay""#,
            r#"<input type="hidden" name="status" value="dead">"#,
            r#"<input type="hidden" name="source" value="kinde">"#,
            r#"<a id="next" href="/lambda-url/api/console/events?status=dead&amp;source=kinde&amp;after=41""#,
            "gave up after 6 attempts",
        ],
    );
}

#[test]
fn the_last_page_of_events_has_no_next_link() {
    let html = rendered(&Page::Events, &json!({"events": [], "next": null}), &[]);
    assert!(!html.contains(r#"id="next""#));
    has(
        &html,
        &[
            "No event matches.",
            r#"<option value="" selected>any</option>"#,
        ],
    );
}

fn event_detail(reason: &str) -> Value {
    let mut event = event_row(42, "kc_1", reason);
    event["last_error"] = json!("connection reset");
    event["next_attempt_at"] = json!(null);
    event["locked_until"] = json!(null);
    event["enqueued_at"] = json!("2026-12-03T09:00:01Z");
    event["processed_at"] = json!(null);
    event["replays"] = json!(0);
    json!({
        "event": event,
        "deliveries": [
            {"delivery_id": 7, "received_at": "2026-12-03T09:00:01Z", "verdict": "stored",
             "provider_delivery_id": null, "sent_at": "2026-12-03T09:00:00Z",
             "headers": {"content-type": "application/json", "user-agent": "Kinde"}},
            {"delivery_id": 8, "received_at": "2026-12-03T09:05:01Z", "verdict": "duplicate",
             "provider_delivery_id": null, "sent_at": null, "headers": {}}
        ],
        "payload": {"type": "customer.plan_changed", "data": {"customer": {"id": "kc_1"}, "note": reason}},
        "effects": [{"effect_id": "eff_1", "kind": "plan_changed", "status": "dead"}]
    })
}

#[test]
fn an_event_page_tells_its_whole_story_with_a_replay_button() {
    let html = rendered(
        &Page::Event(42),
        &event_detail("gave up after 6 attempts"),
        &[],
    );
    has(
        &html,
        &[
            r#"<span id="event-status" class="status tone-bad">dead</span>"#,
            r#"<dd id="event-reason">gave up after 6 attempts</dd>"#,
            r#"<table id="deliveries">"#,
            r#"<tr data-delivery-id="7">"#,
            "duplicate",
            "content-type: application/json",
            "connection reset",
            r#"<pre id="payload""#,
            "&quot;customer.plan_changed&quot;",
            r#"<form class="inline" data-action="POST" action="/lambda-url/api/v1/admin/events/42/replay"><button id="replay" type="submit">Replay</button></form>"#,
            r#"href="/lambda-url/api/console/accounts/kinde/kc_1""#,
            "eff_1",
        ],
    );
}

#[test]
fn a_payload_stored_as_text_is_shown_as_it_came_or_indented_when_it_is_json() {
    let mut data = event_detail("");
    data["payload"] = json!("eyJhbGciOiJSUzI1NiJ9.eyJ0eXBlIjoiY3VzdG9tZXIifQ.c2ln");
    let html = rendered(&Page::Event(42), &data, &[]);
    has(
        &html,
        &[">eyJhbGciOiJSUzI1NiJ9.eyJ0eXBlIjoiY3VzdG9tZXIifQ.c2ln</pre>"],
    );
    data["payload"] = json!(r#"{"id":"evt_1"}"#);
    let html = rendered(&Page::Event(42), &data, &[]);
    has(&html, &["{\n  &quot;id&quot;: &quot;evt_1&quot;\n}</pre>"]);
}

#[test]
fn an_event_whose_payload_is_gone_says_so() {
    let mut data = event_detail("");
    data["payload"] = Value::Null;
    data["event"]["customer_id"] = Value::Null;
    let html = rendered(&Page::Event(42), &data, &[]);
    has(&html, &["The payload is no longer kept."]);
    assert!(!html.contains(r#"id="payload""#));
    assert!(!html.contains("/console/accounts/"));
}

fn at(s: &str) -> chrono::DateTime<Utc> {
    chrono::DateTime::parse_from_rfc3339(s)
        .unwrap()
        .with_timezone(&Utc)
}

/// The account as `GET /v1/accounts/{s}/{c}` serializes it.
fn snapshot(customer: &str) -> Value {
    let snapshot = AccountSnapshot {
        source: "kinde".to_owned(),
        customer_id: customer.to_owned(),
        plan: "pro".to_owned(),
        entitled: true,
        deleted: false,
        period: "2026-12".to_owned(),
        allowance: 500,
        used: 3,
        remaining: 497,
        subscriptions: vec![SubscriptionView {
            id: "sub_1".to_owned(),
            status: "active".to_owned(),
            plan: Some("pro".to_owned()),
            current_period_end: Some(at("2026-12-31T00:00:00Z")),
            cancel_at_period_end: true,
            cancel_at: None,
            trial_end: None,
            ended_at: None,
        }],
        features: BTreeMap::from([
            ("sso".to_owned(), FeatureValue::Flag(true)),
            ("seats".to_owned(), FeatureValue::Number(20)),
        ]),
        feature_origins: BTreeMap::new(),
        version: 12,
        customer_plan: None,
        past_due: false,
        credits: Vec::new(),
    };
    serde_json::to_value(&snapshot).unwrap()
}

/// `why` as `GET …/why` serializes it.
fn why(customer: &str, detail: &str) -> Value {
    let decided = |id: i64, occurred: &str| EventRef {
        event_id: id,
        event_type: "customer.plan_changed".to_owned(),
        occurred_at: at(occurred),
        via: Via::Webhook,
        replayed: false,
    };
    let why = Why {
        source: "kinde".to_owned(),
        customer_id: customer.to_owned(),
        at: None,
        received_before: None,
        fields: vec![
            WhyField {
                field: "plan".to_owned(),
                value: json!("pro"),
                decided_by: Some(decided(1, "2026-12-01T10:03:00Z")),
                beaten: vec![Beaten {
                    event_id: 3,
                    reason: "older",
                    detail: detail.to_owned(),
                }],
                stored: None,
            },
            WhyField {
                field: "allowance:2026-12".to_owned(),
                value: json!(500),
                decided_by: Some(decided(1, "2026-12-01T10:03:00Z")),
                beaten: vec![],
                stored: Some(json!(400)),
            },
        ],
        purged: 0,
        complete_from: None,
        pending: vec![5],
        divergent: vec!["allowance:2026-12".to_owned()],
        credits: vec![],
    };
    serde_json::to_value(&why).unwrap()
}

fn account_events(reason: &str) -> Value {
    json!({"events": [
        {"event_id": 1, "provider_event_id": "evt_1", "type": "customer.plan_changed",
         "occurred_at": "2026-12-01T10:03:00Z", "received_at": "2026-12-01T10:03:01Z",
         "status": "applied", "outcome": "applied", "reason": "plan set to pro; granted 500 for pro in 2026-12",
         "seen_count": 3, "via": "webhook"},
        {"event_id": 3, "provider_event_id": "evt_3", "type": "customer.plan_changed",
         "occurred_at": "2026-12-01T10:00:00Z", "received_at": "2026-12-01T10:05:00Z",
         "status": "ignored", "outcome": "ignored", "reason": reason,
         "seen_count": 1, "via": "webhook"}
    ], "next": "3"})
}

fn account_page(customer: &str) -> Page {
    Page::Account {
        source: "kinde".to_owned(),
        customer: customer.to_owned(),
    }
}

/// The credits read's answer is shown as it is, each figure clamped at zero: the fold keeps a
/// signed sum (an invoice voided after more was applied), only its reader clamps.
#[test]
fn the_account_page_shows_each_credit_balance_and_grant_clamped() {
    let credits = json!({"at": "2026-01-20T00:00:00Z",
        "balances": [{"unit": "usd", "scope": "price_type:metered", "available": "700",
                      "granted": "1000", "used": "-50", "expired": "0"}],
        "grants": [{"grant_id": "credgr_1", "origin": "stripe_credit_grant", "unit": "usd",
                    "scope": "price_type:metered", "amount": "1000", "remaining": "700",
                    "priority": 50, "category": "paid", "effective_at": "2026-01-01T00:00:00Z",
                    "expires_at": "2026-02-01T00:00:00Z", "voided_at": null,
                    "provisional": true}]});
    let data = json!({"account": snapshot("kc_1"), "events": account_events(""),
                      "why": why("kc_1", ""), "at": null, "credits": credits});
    let html = rendered(&account_page("kc_1"), &data, &[]);
    has(
        &html,
        &[
            r#"<section id="credits" aria-labelledby="credits-title">"#,
            r#"<tr data-unit="usd" data-scope="price_type:metered">"#,
            r#"<td class="available"><strong>700</strong></td><td>1000</td><td>0</td><td>0</td>"#,
            r#"<tr data-grant="credgr_1">"#,
            "provisional",
            r#"<td class="remaining"><strong>700</strong> usd</td>"#,
        ],
    );
    assert!(!html.contains("-50"), "never shown below zero");
    let none = json!({"account": snapshot("kc_1"), "events": account_events(""),
                      "why": why("kc_1", ""), "at": null,
                      "credits": {"at": "2026-01-20T00:00:00Z", "balances": [], "grants": []}});
    has(
        &rendered(&account_page("kc_1"), &none, &[]),
        &["No credit grant."],
    );
}

#[test]
fn the_account_page_shows_its_state_why_and_log() {
    let data = json!({"account": snapshot("kc_1"),
                      "events": account_events("a newer plan change is already stored"),
                      "why": why("kc_1", "its provider time is before"), "at": null});
    let html = rendered(&account_page("kc_1"), &data, &[]);
    has(
        &html,
        &[
            r#"<strong id="plan">pro</strong>"#,
            r#"<table id="subscriptions">"#,
            r#"<tr data-subscription="sub_1">"#,
            r#"<time datetime="2026-12-31T00:00:00Z">2026-12-31 00:00:00 UTC</time>"#,
            "at the period's end",
            r#"<meter id="allowance" min="0" max="500" value="3""#,
            r#"<span id="used">3</span>"#,
            r#"<span id="remaining">497</span>"#,
            r#"<table id="features">"#,
            r#"<tr data-feature="seats">"#,
            r#"<table id="log">"#,
            r#"<tr data-event-id="3">"#,
            "a newer plan change is already stored",
            r#"data-action="POST" action="/lambda-url/api/v1/admin/events/3/replay""#,
            r#"<details data-field="plan" id="why-plan">"#,
            r#"<details data-field="allowance:2026-12" id="why-allowance-2026-12">"#,
            r#"<a href="/lambda-url/api/console/events/1">event #1</a>"#,
            r#"<a href="/lambda-url/api/console/events/3">event #3</a> <strong>older</strong>: its provider time is before"#,
            "stored: 400",
            r#"id="as-of" method="get" action="/lambda-url/api/console/accounts/kinde/kc_1""#,
            r#"name="at" type="datetime-local""#,
            r#"<a id="log-next" href="/lambda-url/api/console/accounts/kinde/kc_1?after=3""#,
            r#"<a href="/lambda-url/api/console/events/5">#5</a>"#,
        ],
    );
    // The plan's summary is the field and its value.
    let plan = &html[html.find(r#"id="why-plan""#).unwrap()..];
    let summary = &plan[plan.find("<summary>").unwrap()..plan.find("</summary>").unwrap()];
    has(summary, &["plan", "pro"]);
}

/// `why` as of a time, as `GET …/why?at=` serializes it: a starter trial then.
fn why_as_of(at_time: &str) -> Value {
    let field = |name: &str, value: Value| WhyField {
        field: name.to_owned(),
        value,
        decided_by: Some(EventRef {
            event_id: 1,
            event_type: "customer.subscription.created".to_owned(),
            occurred_at: at("2026-12-01T10:00:00Z"),
            via: Via::Webhook,
            replayed: false,
        }),
        beaten: vec![],
        stored: None,
    };
    let why = Why {
        source: "kinde".to_owned(),
        customer_id: "kc_1".to_owned(),
        at: Some(at(at_time)),
        received_before: None,
        fields: vec![
            field("plan", json!("starter")),
            field("subscription:sub_1:status", json!("trialing")),
            field("subscription:sub_1:plan", json!("starter")),
            field(
                "subscription:sub_1:current_period_end",
                json!("2026-12-31T00:00:00Z"),
            ),
            field("subscription:sub_1:cancel_at_period_end", json!(false)),
            field("subscription:sub_1:cancel_at", Value::Null),
            field("allowance:2026-11", json!(40)),
            field("allowance:2026-12", json!(100)),
            field("used:2026-12", json!(3)),
            field("feature:seats", json!(5)),
        ],
        purged: 0,
        complete_from: None,
        pending: vec![],
        divergent: vec![],
        credits: vec![],
    };
    serde_json::to_value(&why).unwrap()
}

#[test]
fn the_account_as_of_a_time_shows_the_state_why_gives_then() {
    let cut = "2026-12-01T10:01:00Z";
    let data = json!({"account": snapshot("kc_1"), "events": account_events(""),
                      "why": why_as_of(cut), "at": cut});
    let html = rendered(&account_page("kc_1"), &data, &[("at", cut)]);
    has(
        &html,
        &[
            r#"<strong id="plan">starter</strong>"#,
            r#"<meter id="allowance" min="0" max="100" value="3""#,
            r#"<span id="remaining">97</span>"#,
            r#"<tr data-subscription="sub_1">"#,
            "trialing",
            r#"<tr data-feature="seats"><th scope="row"><code>seats</code></th><td>5</td></tr>"#,
            "State as of <time datetime=\"2026-12-01T10:01:00Z\">",
            r#"value="2026-12-01T10:01:00""#,
            ", as of <time datetime=\"2026-12-01T10:01:00Z\">",
            ">See the account now</a>",
            "?at=2026-12-01T10%3A01%3A00Z&amp;after=3",
        ],
    );
    assert!(!html.contains(r#"<strong id="plan">pro</strong>"#));
    assert!(!html.contains(r#"data-feature="sso""#));
}

#[test]
fn an_account_whose_why_failed_says_so_and_shows_the_state_now() {
    let data = json!({"account": snapshot("kc_1"), "events": account_events(""),
                      "why": {"code": "not_folded", "detail": "the account has more than 10000 events"},
                      "at": "2026-12-01T10:01:00Z"});
    let html = rendered(&account_page("kc_1"), &data, &[]);
    has(
        &html,
        &[
            r#"<strong id="plan">pro</strong>"#,
            r#"<p class="note" id="why-error">Why cannot say: <strong>not_folded</strong>"#,
            "so the state shown is the account now",
        ],
    );
}

#[test]
fn a_connect_customer_is_linked_with_its_slash_encoded() {
    let customer = "acct_1/cus_1";
    let data = json!({"account": snapshot(customer), "events": account_events(""),
                      "why": why(customer, ""), "at": null});
    let html = rendered(&account_page(customer), &data, &[]);
    has(&html, &["/console/accounts/kinde/acct_1%2Fcus_1"]);
}

fn effects() -> Value {
    json!({"effects": [
        {"effect_id": "eff_dead", "kind": "plan_changed", "source": "kinde", "customer_id": "kc_1",
         "sequence": 4, "event_id": 42, "occurred_at": "2026-12-03T09:00:00Z", "status": "dead",
         "attempts": 8, "last_error": "503 from the app", "created_at": "2026-12-03T09:00:02Z",
         "sent_at": null},
        {"effect_id": "eff_sent", "kind": "allowance_granted", "source": "kinde", "customer_id": "kc_1",
         "sequence": 5, "event_id": 43, "occurred_at": "2026-12-03T09:00:00Z", "status": "sent",
         "attempts": 1, "last_error": null, "created_at": "2026-12-03T09:00:02Z",
         "sent_at": "2026-12-03T09:00:03Z"}
    ], "next": null})
}

#[test]
fn effects_are_listed_with_a_replay_for_each_not_sent() {
    let html = rendered(&Page::Effects, &effects(), &[("status", "")]);
    has(
        &html,
        &[
            r#"<table id="effects">"#,
            r#"<tr data-effect-id="eff_dead">"#,
            r#"<tr data-effect-id="eff_sent">"#,
            r#"action="/lambda-url/api/v1/admin/effects/eff_dead/replay""#,
            "503 from the app",
        ],
    );
    assert!(!html.contains("effects/eff_sent/replay"));
    assert!(!html.contains(r#"id="next""#));
}

fn meter_reports() -> Value {
    json!({"reports": [
        {"id": "mrp_dead", "kind": "report", "corrects": null, "how": null, "status": "dead",
         "source": "stripe", "customer_id": "cus_1", "usage_id": "use_1", "idempotency_key": "req_1",
         "identifier": "bi_1", "meter": "api_calls", "value": 7, "period": "2026-12",
         "occurred_at": "2026-12-03T09:00:00Z", "attempts": 5, "unanswered": true,
         "last_error": "503: Service unavailable", "provider_error": null, "sent_at": null},
        {"id": "mrp_fix", "kind": "correction", "corrects": "mrp_sent", "how": "cancel",
         "status": "sent", "source": "stripe", "customer_id": "cus_1", "usage_id": "use_2",
         "idempotency_key": "req_2", "identifier": "bi_2", "meter": "api_calls", "value": 3,
         "period": "2026-12", "occurred_at": "2026-12-03T09:01:00Z", "attempts": 1,
         "unanswered": false, "last_error": null, "provider_error": null,
         "sent_at": "2026-12-03T09:02:00Z"}
    ]})
}

#[test]
fn meter_reports_are_listed_with_corrections_and_a_replay_for_each_dead_one() {
    let html = rendered(&Page::Meters, &meter_reports(), &[("status", "dead")]);
    has(
        &html,
        &[
            r#"<table id="meter-reports">"#,
            r#"<tr data-report-id="mrp_dead">"#,
            r#"<tr data-report-id="mrp_fix">"#,
            r#"action="/lambda-url/api/v1/admin/meter-reports/mrp_dead/replay""#,
            "503: Service unavailable",
            "one unanswered",
            "−3",
            "by cancel",
            r#"<option value="dead" selected>dead</option>"#,
        ],
    );
    assert!(
        !html.contains("mrp_fix/replay"),
        "only a dead report is replayed"
    );
    no_inline_code(&html);
}

#[test]
fn the_engine_room_offers_the_scenarios_and_empty_tables_for_the_script() {
    let data = json!({"enabled": true, "scenarios": [
        {"name": "nine-deliveries", "source": "kinde-test",
         "setup": "plan-assigned, plan free, 60 minutes before the start",
         "steps": [{"step": 1, "what": "plan change to pro (crashes)"}, {"step": 2, "what": "payment"}]},
        {"name": "refund", "source": "stripe-test", "steps": [{"step": 1, "what": "charge"}]}
    ]});
    let html = rendered(&Page::EngineRoom, &data, &[]);
    has(
        &html,
        &[
            r#"<select id="scenario" name="scenario">"#,
            r#"<option value="refund">"#,
            r#"<button id="run" type="button">Run</button>"#,
            r#"<table id="engine-steps">"#,
            r#"<p id="engine-result""#,
            r#"data-runs="/lambda-url/api/v1/admin/engine-room/runs""#,
            "plan change to pro (crashes)",
            // the setup delivery is said, apart from the steps, and given to the script
            r#"<p class="setup">First, with step 1 and not a step of its own, the setup: plan-assigned, plan free, 60 minutes before the start."#,
            r#"<option value="nine-deliveries" data-setup="plan-assigned, plan free, 60 minutes before the start">"#,
        ],
    );
    assert!(!html.contains("engine-off"));
    // a scenario without a setup says none
    assert_eq!(html.matches(r#"class="setup""#).count(), 1);
}

#[test]
fn an_engine_room_that_is_off_says_so() {
    let html = rendered(&Page::EngineRoom, &json!({"enabled": false}), &[]);
    has(&html, &[r#"id="engine-off""#]);
    assert!(!html.contains(r#"id="run""#));
}

#[test]
fn the_audit_trail_lists_each_action_and_who_took_it() {
    let data = json!({"actions": [
        {"id": 9, "at": "2026-12-03T10:00:00Z", "who": "dev-admin", "action": "event.replay",
         "target": "42", "detail": {"status": "received"}}
    ], "next": 9});
    let html = rendered(&Page::AuditTrail, &data, &[]);
    has(
        &html,
        &[
            r#"<table id="trail">"#,
            "dev-admin",
            "event.replay",
            r#"<a href="/lambda-url/api/console/events/42">event #42</a>"#,
            r#"now <span class="status tone-wait">received</span>"#,
            r#"<a id="next" href="/lambda-url/api/console/audit-trail?after=9""#,
        ],
    );
}

#[test]
fn every_value_from_the_data_is_escaped() {
    let overview = overview(XSS);
    let mut events = json!({"events": [event_row(42, XSS, XSS)], "next": XSS});
    events["events"][0]["type"] = json!(XSS);
    let event = event_detail(XSS);
    let account = json!({"account": snapshot(XSS), "events": account_events(XSS),
                         "why": why(XSS, XSS), "at": XSS});
    let mut effects = effects();
    effects["effects"][0]["effect_id"] = json!(XSS);
    effects["effects"][0]["last_error"] = json!(XSS);
    let engine = json!({"enabled": true, "scenarios": [{"name": XSS, "source": XSS, "steps": [{"step": 1, "what": XSS}]}]});
    let trail = json!({"actions": [{"id": 1, "at": XSS, "who": XSS, "action": XSS, "target": XSS, "detail": XSS}], "next": null});
    let query = [
        ("source", XSS),
        ("type", XSS),
        ("status", XSS),
        ("after", XSS),
    ];
    for (page, data) in [
        (Page::Overview, overview),
        (Page::Events, events),
        (Page::Event(42), event),
        (account_page(XSS), account),
        (Page::Effects, effects),
        (
            Page::Meters,
            json!({"reports": [{"id": XSS, "source": XSS, "customer_id": XSS,
            "meter": XSS, "status": XSS, "corrects": XSS, "how": XSS, "last_error": XSS,
            "usage_id": XSS, "value": 1}]}),
        ),
        (Page::EngineRoom, engine),
        (Page::AuditTrail, trail),
        (
            Page::Divergences,
            json!({"divergences": [{"source": XSS, "customer_id": XSS, "field": XSS,
            "stored": XSS, "folded": XSS, "first_seen": XSS, "last_seen": XSS}]}),
        ),
    ] {
        escaped(&rendered(&page, &data, &query));
    }
    escaped(&error_fragment("bad_time", XSS));
    assert!(!shell("/x\"><script>").contains("<script>"));
}

#[test]
fn an_error_is_a_fragment_with_its_code_and_detail() {
    assert_eq!(
        error_fragment("forbidden", "this key lacks the admin scope"),
        r#"<div id="error" role="alert"><strong>forbidden</strong> this key lacks the admin scope</div>"#
    );
}

#[test]
fn the_shell_loads_the_assets_and_has_no_inline_code() {
    let html = shell(BASE);
    has(
        &html,
        &[
            "<!DOCTYPE html>",
            r#"<html lang="en">"#,
            r#"<link rel="icon" href="data:,">"#,
            r#"<script src="/lambda-url/api/console/assets/console.js" defer></script>"#,
            r#"<link rel="stylesheet" href="/lambda-url/api/console/assets/console.css">"#,
            r##"<a class="skip" href="#page">"##,
            r#"<form id="account-form""#,
            r#"<button id="forget-key" type="button">"#,
            r#"<div id="flash" role="status""#,
            r#"<main id="page" tabindex="-1"></main>"#,
            r#"href="/lambda-url/api/console/" data-section="">Overview</a>"#,
            r#"href="/lambda-url/api/console/events""#,
            r#"href="/lambda-url/api/console/effects""#,
            r#"href="/lambda-url/api/console/engine-room""#,
            r#"href="/lambda-url/api/console/audit-trail""#,
        ],
    );
    assert_eq!(html.matches("<script").count(), 1);
    no_inline_code(&html);
    assert!(shell("").contains(r#"src="/console/assets/console.js""#));
}

#[test]
fn the_csp_allows_no_inline_code_and_every_answer_carries_it() {
    assert!(!CSP.contains("unsafe-inline") && !CSP.contains("unsafe-eval"));
    assert!(CSP.contains("script-src 'self'") && CSP.contains("frame-ancestors 'none'"));
    let headers = security_headers();
    assert!(headers.contains(&("content-security-policy", CSP)));
    assert!(headers.contains(&("x-content-type-options", "nosniff")));
    assert!(headers.contains(&("referrer-policy", "no-referrer")));
    assert!(headers.contains(&("cache-control", "no-store")));
    for (name, _) in headers {
        assert_eq!(name, name.to_ascii_lowercase());
    }
}

#[test]
fn the_assets_are_embedded_by_name_and_nothing_else_is() {
    let (js_type, js) = asset("console.js").unwrap();
    assert!(js_type.starts_with("text/javascript"));
    has(
        js,
        &[
            "billing-inbox-key",
            "/console/fragment/",
            "engine-result",
            "key-form",
        ],
    );
    // No request leaves the origin: every fetch is of a path under `base`.
    assert!(!js.contains("http://") && !js.contains("https://"));
    let (css_type, css) = asset("console.css").unwrap();
    assert!(css_type.starts_with("text/css"));
    assert!(!css.contains("url("), "the stylesheet loads nothing");
    assert_eq!(asset("../mod.rs"), None);
    assert_eq!(asset("console.js.map"), None);
}

#[test]
fn a_fragment_holds_no_inline_script_or_style() {
    let account = json!({"account": snapshot("kc_1"), "events": account_events(""),
                         "why": why("kc_1", ""), "at": null});
    for (page, data) in [
        (Page::Overview, overview("x")),
        (Page::Event(42), event_detail("x")),
        (account_page("kc_1"), account),
        (Page::Effects, effects()),
    ] {
        no_inline_code(&rendered(&page, &data, &[]));
    }
}

#[test]
fn each_link_a_page_renders_to_itself_carries_only_the_parameters_it_reads() {
    let account = json!({"account": snapshot("kc_1"), "events": account_events(""),
                         "why": why("kc_1", ""), "at": "2026-12-01T10:01:00Z"});
    let events = json!({"events": [event_row(42, "kc_1", "")], "next": "41"});
    let effects = json!({"effects": [], "next": "e9"});
    let trail = json!({"actions": [], "next": 9});
    let query = [
        ("status", "dead"),
        ("source", "kinde"),
        ("at", "2026-12-01T10:01:00Z"),
    ];
    for (page, data, own) in [
        (Page::Events, events, "/console/events?"),
        (
            account_page("kc_1"),
            account,
            "/console/accounts/kinde/kc_1?",
        ),
        (Page::Effects, effects, "/console/effects?"),
        (Page::AuditTrail, trail, "/console/audit-trail?"),
    ] {
        let html = rendered(&page, &data, &query);
        let mut seen = 0;
        for (at, _) in html.match_indices(own) {
            let query = &html[at + own.len()..];
            let query = &query[..query.find('"').unwrap()];
            for pair in query.split("&amp;") {
                let name = pair.split('=').next().unwrap();
                assert!(page.params().contains(&name), "{page:?} links with {name}");
            }
            seen += 1;
        }
        assert!(seen > 0, "{page:?} links to a next page");
    }
}

/// `why` of an account in arrears whose plan register holds a key the catalog does not name
/// and whose stored plan was moved by hand: `team` stored, `pro` given by its events.
fn why_in_trouble() -> Value {
    let field = |name: &str, value: Value, stored: Option<Value>| WhyField {
        field: name.to_owned(),
        value,
        decided_by: Some(EventRef {
            event_id: 7,
            event_type: "customer.payment_failed".to_owned(),
            occurred_at: at("2026-12-01T10:00:00Z"),
            via: Via::Webhook,
            replayed: false,
        }),
        beaten: vec![],
        stored,
    };
    let why = Why {
        source: "kinde".to_owned(),
        customer_id: "kc_1".to_owned(),
        at: None,
        received_before: None,
        fields: vec![
            field("plan", json!("pro"), None),
            field("customer_plan", json!("pro"), Some(json!("team"))),
            field("customer_plan_key", json!("pro"), None),
            field("standing", json!("past_due"), None),
            field("subscription:sub_9:plan", Value::Null, None),
            field("subscription:sub_9:plan_key", json!("mystery"), None),
        ],
        purged: 0,
        complete_from: None,
        pending: vec![],
        divergent: vec!["customer_plan".to_owned()],
        credits: vec![],
    };
    serde_json::to_value(&why).unwrap()
}

#[test]
fn the_top_of_an_account_says_past_due_an_unknown_plan_key_and_a_divergence_each_linked_to_its_why_row(
) {
    let mut account = snapshot("kc_1");
    account["plan"] = json!("team");
    let data = json!({"account": account, "events": account_events(""),
                      "why": why_in_trouble(), "at": null});
    let html = rendered(&account_page("kc_1"), &data, &[]);
    has(
        &html,
        &[
            r#"<li data-finding="past-due" class="finding tone-bad">Past due"#,
            r##"href="#why-standing""##,
            r#"<li data-finding="unknown-plan-key" class="finding tone-bad">Subscription sub_9's plan key mystery is not in the catalog"#,
            r##"href="#why-subscription-sub_9-plan_key""##,
            r#"<li data-finding="divergent" class="finding tone-bad">Stored customer_plan is team, but its events give pro."#,
            r##"href="#why-customer_plan""##,
            // each link's row is there to open
            r#"<details data-field="standing" id="why-standing">"#,
            r#"<details data-field="subscription:sub_9:plan_key" id="why-subscription-sub_9-plan_key">"#,
            r#"<details data-field="customer_plan" id="why-customer_plan">"#,
            // the header's plan is the stored one, with the plan held back while past due and
            // what the events give beside it
            r#"<strong id="plan">team</strong> <span class="status tone-bad">past due</span> its plan register holds <strong id="held-plan">pro</strong>"#,
            r#"<span class="status tone-bad">divergent</span> its events give <strong id="folded-plan">pro</strong>"#,
        ],
    );
    // what needs a person comes before the state, past due first
    let top = html.find(r#"id="account-findings""#).unwrap();
    assert!(top < html.find(r#"id="state-title""#).unwrap());
    assert!(html.find("past-due").unwrap() < html.find("unknown-plan-key").unwrap());
    assert!(!html.contains(r#"data-finding="none""#));
    // the customer's own plan key is in the catalog: no finding names it
    assert!(!html.contains("The plan key pro"));
}

#[test]
fn an_account_in_step_with_its_events_says_so_and_its_version_explains_itself() {
    let mut why = why("kc_1", "");
    why["divergent"] = json!([]);
    why["fields"][1]["stored"] = Value::Null;
    let data = json!({"account": snapshot("kc_1"), "events": account_events(""),
                      "why": why, "at": null});
    let html = rendered(&account_page("kc_1"), &data, &[]);
    has(
        &html,
        &[
            r#"<li class="ok" data-finding="none">On pro, and every stored field is what its events give.</li>"#,
            r#"<p class="meta" id="version">Version 12: the writes to this account so far"#,
        ],
    );
    assert!(!html.contains("<dt>Version</dt>"));
    assert!(!html.contains("folded-plan"));
}

#[test]
fn findings_name_only_a_key_whose_plan_is_null() {
    let why = json!({"fields": [
        {"field": "customer_plan", "value": null},
        {"field": "customer_plan_key", "value": "gold"},
        {"field": "subscription:s1:plan", "value": "pro"},
        {"field": "subscription:s1:plan_key", "value": "pro_v2"},
        {"field": "standing", "value": "good"}
    ], "divergent": []});
    let found = account::findings(&why);
    let kinds: Vec<(&str, &str)> = found.iter().map(|f| (f.kind, f.field.as_str())).collect();
    assert_eq!(
        kinds,
        [
            ("unknown-plan-key", "customer_plan_key"),
            ("good-standing", "standing")
        ]
    );
    assert_eq!(
        found[0].words,
        "The plan key gold is not in the catalog: it entitles nothing."
    );
    assert_eq!(
        account::why_id("allowance:2026-12"),
        "why-allowance-2026-12"
    );
    assert_eq!(account::why_id("plan"), "why-plan");
}

#[test]
fn an_unused_source_is_no_alarm_and_says_no_delivery_yet() {
    let mut data = overview("1 dead event");
    let html = rendered(&Page::Overview, &data, &[]);
    assert!(!html.contains(r#"data-kind="silent_source""#), "{html}");
    assert!(!html.contains("(0)"));
    has(
        &html,
        &[
            r#"<span class="quiet">no delivery yet</span>"#,
            r#"id="unused-sources""#,
        ],
    );
    // a source that did send, then went quiet, still needs a person
    data["needs_attention"].as_array_mut().unwrap().push(
        json!({"kind": "silent_source", "source": "kinde", "count": 0,
                     "detail": "nothing from kinde for 30.0 h", "link": "events?source=kinde"}),
    );
    let html = rendered(&Page::Overview, &data, &[]);
    has(&html, &[r#"data-kind="silent_source""#]);
}

#[test]
fn every_overview_figure_says_what_it_counts_and_links_its_list() {
    let mut data = overview("");
    data["meter_reports"] = json!({"pending": 3, "dead": 1, "differences_open": 2});
    data["credit_differences_open"] = json!(5);
    data["needs_attention"].as_array_mut().unwrap().push(
        json!({"kind": "divergences", "count": 4, "detail": "4 field(s) differ",
                     "link": "divergences"}),
    );
    let html = rendered(&Page::Overview, &data, &[]);
    has(
        &html,
        &[
            r#"<th scope="row">Meter reports waiting to be sent to a provider's meter</th><td class="num" data-count="meter_reports_pending"><a href="/lambda-url/api/console/meters?status=pending">3</a>"#,
            r#"data-count="meter_reports_dead"><a href="/lambda-url/api/console/meters?status=dead">1</a>"#,
            r#"data-count="meter_differences_open"><a href="/lambda-url/api/console/divergences">2</a>"#,
            r#"data-count="credit_differences_open"><a href="/lambda-url/api/console/divergences">5</a>"#,
            // the divergences' item opens the list of them all, not one account
            r#"<li class="attention" data-kind="divergences"><a href="/lambda-url/api/console/divergences">"#,
            // a source with nothing waiting says none; applied events are not counted there
            r#"<span class="quiet">none</span>"#,
            r#"data-count="dead">dead 1</a>"#,
        ],
    );
    assert!(!html.contains(">applied 40<"));
    // the oldest waiting event's age is read as the number it is (seconds, a fraction)
    assert_eq!(overview::age(Some(95.4)), "95 s");
    assert_eq!(overview::age(Some(0.0)), "—");
}

#[test]
fn the_divergences_page_lists_every_account_and_field_each_linked_to_its_why_row() {
    let data = json!({"divergences": [
        {"source": "kinde", "customer_id": "kc_1", "field": "customer_plan", "stored": "team",
         "folded": "pro", "first_seen": "2026-12-03T09:00:00Z", "last_seen": "2026-12-03T10:00:00Z"},
        {"source": "kinde", "customer_id": "kc_1", "field": "allowance:2026-12", "stored": 400,
         "folded": 500, "first_seen": "2026-12-03T09:00:00Z", "last_seen": "2026-12-03T10:00:00Z"},
        {"source": "stripe", "customer_id": "acct_1/cus_2", "field": "subscription:sub_1:status",
         "stored": "canceled", "folded": "active", "first_seen": "2026-12-03T09:00:00Z",
         "last_seen": "2026-12-03T10:00:00Z"}
    ]});
    let html = rendered(&Page::Divergences, &data, &[]);
    has(
        &html,
        &[
            "3 stored field(s) of 2 account(s) differ",
            r#"<tr data-account="kinde/kc_1" data-field="customer_plan">"#,
            r##"<a href="/lambda-url/api/console/accounts/kinde/kc_1#why-allowance-2026-12"><code>allowance:2026-12</code></a>"##,
            r##"href="/lambda-url/api/console/accounts/stripe/acct_1%2Fcus_2#why-subscription-sub_1-status""##,
            "<td><strong>team</strong></td><td>pro</td>",
        ],
    );
    no_inline_code(&html);
    let none = rendered(&Page::Divergences, &json!({"divergences": []}), &[]);
    has(&none, &["No stored field differs"]);
}

#[test]
fn the_divergences_page_lists_the_provider_audits_open_meter_and_credit_differences() {
    let data = json!({"divergences": [],
        "meter_differences": [
            {"source": "stripe", "customer_id": "cus_m", "period": "2026-12", "meter": "api_calls",
             "ours": 12, "theirs": 9.0, "first_seen_at": "2026-12-03T09:00:00Z",
             "last_seen_at": "2026-12-03T10:00:00Z"}],
        "credit_differences": [
            {"source": "stripe", "customer_id": "cus_c", "grant_id": "credgr_1", "unit": "usd",
             "ours": "1000", "theirs": "700", "first_seen_at": "2026-12-03T09:00:00Z",
             "last_seen_at": "2026-12-03T10:00:00Z"},
            {"source": "stripe", "customer_id": "cus_c", "grant_id": "credgr_2", "unit": "usd",
             "ours": null, "theirs": "9", "first_seen_at": "2026-12-03T09:00:00Z",
             "last_seen_at": "2026-12-03T10:00:00Z"}]});
    let html = rendered(&Page::Divergences, &data, &[]);
    has(
        &html,
        &[
            "No stored field differs",
            "1 account month(s) where the provider's meter counts otherwise",
            r#"<tr data-account="stripe/cus_m" data-meter="api_calls">"#,
            r#"<td><code>api_calls</code><span class="second">2026-12</span></td>"#,
            r#"<td class="num"><strong>12</strong></td><td class="num">9</td>"#,
            "2 Stripe credit grant(s) whose mirrored ledger balance differs",
            r#"<tr data-account="stripe/cus_c" data-grant="credgr_1">"#,
            r#"<td class="num"><strong>1000</strong></td><td class="num">700</td>"#,
            r#"<td class="num"><strong><em>not mirrored</em></strong></td><td class="num">9</td>"#,
            r#"<a href="/lambda-url/api/console/accounts/stripe/cus_c">"#,
        ],
    );
    no_inline_code(&html);
    let none = rendered(&Page::Divergences, &json!({"divergences": []}), &[]);
    has(
        &none,
        &["No open meter difference", "No open credit difference"],
    );
    assert!(!none.contains("id=\"credit-differences\""), "{none}");
}

#[test]
fn the_meters_page_says_when_no_source_has_a_meter() {
    let html = rendered(&Page::Meters, &json!({"reports": [], "meters": {}}), &[]);
    has(&html, &["No source of this deployment has a meter"]);
    let html = rendered(
        &Page::Meters,
        &json!({"reports": [], "meters": {"stripe": "api_calls"}}),
        &[],
    );
    has(
        &html,
        &["No meter report yet", "stripe to <code>api_calls</code>"],
    );
    let html = rendered(
        &Page::Meters,
        &json!({"reports": [], "meters": {"stripe": "api_calls"}}),
        &[("status", "dead")],
    );
    has(&html, &["No meter report matches."]);
}

#[test]
fn the_audit_trail_says_targets_and_details_in_words_with_links() {
    let data = json!({"actions": [
        {"id": 3, "at": "2026-12-03T10:00:00Z", "who": "dev-admin", "action": "events.replay",
         "target": "{\"source\":null,\"status\":\"dead\"}",
         "detail": {"source": null, "status": "dead", "event_ids": [4, 5]}},
        {"id": 2, "at": "2026-12-03T09:00:00Z", "who": "dev-admin", "action": "account_event.replay",
         "target": "4", "detail": {"source": "kinde", "customer_id": "kc_1", "status": "received"}},
        {"id": 1, "at": "2026-12-03T08:00:00Z", "who": "dev-admin", "action": "meter_report.replay",
         "target": "mrp_1", "detail": {}}
    ], "next": null});
    let html = rendered(&Page::AuditTrail, &data, &[]);
    has(
        &html,
        &[
            r#"every <span class="status tone-bad">dead</span> event of every source"#,
            r#"2 event(s) replayed: <a href="/lambda-url/api/console/events/4">#4</a>, <a href="/lambda-url/api/console/events/5">#5</a>"#,
            r#"<a href="/lambda-url/api/console/events/4">event #4</a>"#,
            r#"for <a href="/lambda-url/api/console/accounts/kinde/kc_1">kinde / kc_1</a>"#,
            "meter report",
        ],
    );
    assert!(!html.contains("{&quot;"), "no JSON left: {html}");
}

/// The value of attribute `name` in a tag's text (`<rect … name="v" …>`).
fn attribute<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    Some(&tag[at..at + tag[at..].find('"')?])
}

/// Each `<{element} …>` tag's `key` and `value` attributes, summed by key.
fn summed(html: &str, element: &str, key: &str, value: &str) -> BTreeMap<String, i64> {
    let mut sums = BTreeMap::new();
    for (at, _) in html.match_indices(&format!("<{element} ")) {
        let tag = &html[at..at + html[at..].find('>').unwrap()];
        if let (Some(k), Some(v)) = (attribute(tag, key), attribute(tag, value)) {
            *sums.entry(k.to_owned()).or_insert(0) += v.parse::<i64>().unwrap();
        }
    }
    sums
}

#[test]
fn the_overviews_picture_of_24_hours_has_the_numbers_of_its_table() {
    let mut data = overview("");
    data["traffic"] = json!([
        {"hour": "2026-12-02T09:00:00Z", "status": "applied", "count": 50},
        {"hour": "2026-12-02T11:00:00Z", "status": "ignored", "count": 2},
        {"hour": "2026-12-03T08:00:00Z", "status": "applied", "count": 4},
        {"hour": "2026-12-03T10:00:00Z", "status": "applied", "count": 3},
        {"hour": "2026-12-03T10:00:00Z", "status": "dead", "count": 1},
        {"hour": "2026-12-03T10:00:00Z", "status": "unprocessable", "count": 2}
    ]);
    let html = rendered(&Page::Overview, &data, &[]);
    // the 24 hours end with generated_at's (10:00): 09:00 the day before is left out
    let bars = summed(&html, "rect", "data-status", "data-count");
    let mut totals = BTreeMap::new();
    for (at, _) in html.match_indices(r#"<td class="num" data-total=""#) {
        let tag = &html[at..];
        let status = attribute(tag, "data-total").unwrap();
        let n: i64 = tag[tag.find('>').unwrap() + 1..tag.find("</td>").unwrap()]
            .parse()
            .unwrap();
        totals.insert(status.to_owned(), n);
    }
    let expected = BTreeMap::from([
        ("applied".to_owned(), 7),
        ("dead".to_owned(), 1),
        ("ignored".to_owned(), 2),
        ("unprocessable".to_owned(), 2),
    ]);
    assert_eq!(bars, expected, "the bars");
    assert_eq!(totals, expected, "the table's totals");
    has(
        &html,
        &[
            r#"<figure id="traffic-chart" data-total="12" data-marked="3" data-dead="1">"#,
            r#"role="img" aria-labelledby="traffic-title traffic-desc""#,
            // the hour's title says its numbers; the dead and unprocessable are marked
            "<title>10:00 UTC: 3 applied, 2 unprocessable, 1 dead</title>",
            ">✕3</text>",
            // the legend links each status's list
            r#"<a href="/lambda-url/api/console/events?status=dead">dead</a> <span data-total="dead">1</span>"#,
            // the table beside it, hour by hour
            r#"<th scope="row">2026-12-03 10:00</th>"#,
            r#"<th scope="row">2026-12-02 11:00</th>"#,
        ],
    );
    assert!(!html.contains("2026-12-02 09:00"));
    no_inline_code(&html);
    // the overview reads first what needs a person, then the picture
    assert!(html.find("needs-attention") < html.find("traffic-chart"));
}

#[test]
fn a_quiet_day_is_drawn_empty_and_says_so() {
    let mut data = overview("");
    data["traffic"] = json!([]);
    let html = rendered(&Page::Overview, &data, &[]);
    has(
        &html,
        &[
            r#"data-total="0" data-marked="0" data-dead="0""#,
            "No event received in the last 24 hours.",
            "No delivery in the last 24 hours.",
        ],
    );
    assert!(
        !html.contains(r#"<rect class="bar s-"#),
        "no hour has a bar"
    );
}

/// The `<td class="num" data-total="…">` totals of the table whose id is `table`.
fn table_totals(html: &str, table: &str) -> BTreeMap<String, i64> {
    let start = html.find(&format!(r#"<table id="{table}">"#)).unwrap();
    let html = &html[start..start + html[start..].find("</table>").unwrap()];
    let mut totals = BTreeMap::new();
    for (at, _) in html.match_indices(r#"<td class="num" data-total=""#) {
        let tag = &html[at..];
        let kind = attribute(tag, "data-total").unwrap();
        let n: i64 = tag[tag.find('>').unwrap() + 1..tag.find("</td>").unwrap()]
            .parse()
            .unwrap();
        totals.insert(kind.to_owned(), n);
    }
    totals
}

#[test]
fn the_overviews_deliveries_are_drawn_by_outcome_with_the_numbers_of_their_table() {
    let mut data = overview("");
    data["deliveries"] = json!([
        {"hour": "2026-12-03T09:00:00Z", "outcome": "stored", "count": 5},
        {"hour": "2026-12-03T09:00:00Z", "outcome": "duplicate", "count": 2},
        {"hour": "2026-12-03T10:00:00Z", "outcome": "stored", "count": 1},
        {"hour": "2026-12-03T10:00:00Z", "outcome": "refused", "count": 7},
        {"hour": "2026-12-03T10:00:00Z", "outcome": "conflict", "count": 1}
    ]);
    let html = rendered(&Page::Overview, &data, &[]);
    let chart = &html[html.find(r#"id="deliveries-chart""#).unwrap()..];
    let chart = &chart[..chart.find("</figure>").unwrap()];
    let bars = summed(chart, "rect", "data-status", "data-count");
    let expected = BTreeMap::from([
        ("conflict".to_owned(), 1),
        ("duplicate".to_owned(), 2),
        ("refused".to_owned(), 7),
        ("stored".to_owned(), 6),
    ]);
    assert_eq!(bars, expected, "the bars");
    assert_eq!(
        table_totals(&html, "deliveries-table"),
        expected,
        "the table"
    );
    has(
        &html,
        &[
            r#"<figure id="deliveries-chart" data-total="16" data-marked="8" data-refused="7">"#,
            "<title>10:00 UTC: 1 stored, 1 conflict, 7 refused</title>",
            ">✕8</text>",
            // no deliveries list to link: the outcome in words
            r#"</span>refused <span data-total="refused">7</span>"#,
        ],
    );
    no_inline_code(&html);
}

#[test]
fn the_overviews_waiting_bars_have_the_numbers_of_the_waiting_table() {
    let mut data = overview("");
    data["effects"] = json!({"pending": 4, "dead": 2});
    data["meter_reports"] = json!({"pending": 9, "dead": 0, "differences_open": 1});
    let html = rendered(&Page::Overview, &data, &[]);
    let chart = &html[html.find(r#"id="waiting-chart""#).unwrap()..];
    let chart = &chart[..chart.find("</figure>").unwrap()];
    for (figure, n) in [
        ("effects_pending", 4),
        ("effects_dead", 2),
        ("meter_reports_pending", 9),
        ("meter_reports_dead", 0),
    ] {
        let group = &chart[chart.find(&format!(r#"data-figure="{figure}""#)).unwrap()..];
        assert!(
            group.contains(&format!(r#"data-count="{n}""#)),
            "{figure}'s bar: {group}"
        );
        let row = &html[html
            .find(&format!(r#"<tr data-figure="{figure}">"#))
            .unwrap()..];
        let cell = &row[row.find("<td").unwrap()..row.find("</td>").unwrap()];
        assert!(
            cell.ends_with(&format!(">{n}")) || cell.ends_with(&format!(">{n}</a>")),
            "{figure}'s row says {n}: {cell}"
        );
    }
    has(
        &html,
        &[
            r#"<a href="/lambda-url/api/console/meters?status=pending"><g class="waiting" data-figure="meter_reports_pending"><title>Meter reports pending: 9</title>"#,
        ],
    );
    no_inline_code(&html);
}

fn allowance_history() -> Value {
    json!({
        "period": "2026-12",
        "grants": [
            {"at": "2026-12-02T09:00:00Z", "event_id": 1, "plan": "starter", "allowance": 100, "delta": 100},
            {"at": "2026-12-05T12:00:00Z", "event_id": 4, "plan": "pro", "allowance": 500, "delta": 400}
        ],
        "days": [
            {"day": "2026-12-03T00:00:00Z", "debited": 2, "reversed": 0},
            {"day": "2026-12-05T00:00:00Z", "debited": 3, "reversed": 2}
        ]
    })
}

fn plan_timeline() -> Value {
    json!([
        {"event": {"event_id": 1, "type": "customer.plan_assigned", "occurred_at": "2026-12-02T09:00:00Z",
                   "via": "webhook", "replayed": false}, "from": "free", "to": "starter"},
        {"event": {"event_id": 4, "type": "customer.plan_changed", "occurred_at": "2026-12-05T12:00:00Z",
                   "via": "webhook", "replayed": false}, "from": "starter", "to": "pro"}
    ])
}

#[test]
fn an_accounts_allowance_is_drawn_day_by_day_ending_at_its_granted_and_used() {
    let history = allowance_history();
    let days = timeline::days(&history);
    let said: Vec<(String, i64, i64)> = days
        .iter()
        .map(|d| (d.day.to_string(), d.granted, d.used))
        .collect();
    assert_eq!(
        said,
        [
            ("2026-12-02".to_owned(), 100, 0),
            ("2026-12-03".to_owned(), 100, 2),
            ("2026-12-05".to_owned(), 500, 3),
        ]
    );
    // The account's snapshot says allowance 500, used 3: the picture ends there.
    let data = json!({"account": snapshot("kc_1"),
                      "events": account_events(""),
                      "why": why("kc_1", ""), "at": null,
                      "allowance_history": history, "plan_timeline": plan_timeline()});
    let html = rendered(&account_page("kc_1"), &data, &[]);
    has(
        &html,
        &[
            r#"<figure id="allowance-chart" data-granted="500" data-used="3">"#,
            ">granted 500</text>",
            ">used 3</text>",
            r#"<polyline class="granted""#,
            r#"<polyline class="used""#,
            // each grant a point linked to its event
            r#"<a href="/lambda-url/api/console/events/4"><circle class="grant""#,
            "<title>pro grants 500, +400, event #4</title>",
            // the table beside it
            r#"<tr data-day="2026-12-05"><th scope="row">2026-12-05</th><td class="num" data-granted>500</td><td class="num">3</td><td class="num">2</td><td class="num" data-used>3</td></tr>"#,
        ],
    );
    no_inline_code(&html);
    // In the current period the lines end today, not at the month's end.
    assert!(!html.contains(">today</text>"));
    let mut data = data;
    data["allowance_history"]["as_of"] = json!("2026-12-09T10:00:00Z");
    let html = rendered(&account_page("kc_1"), &data, &[]);
    has(&html, &[">today</text>"]);
}

#[test]
fn a_plans_timeline_has_a_point_per_change_each_linked_to_its_event() {
    let data = json!({"account": snapshot("kc_1"),
                      "events": account_events(""),
                      "why": why("kc_1", ""), "at": null,
                      "allowance_history": allowance_history(), "plan_timeline": plan_timeline()});
    let html = rendered(&account_page("kc_1"), &data, &[]);
    let figure = &html[html.find(r#"<figure id="plan-timeline""#).unwrap()..];
    let figure = &figure[..figure.find("</figure>").unwrap()];
    let points: Vec<&str> = figure
        .match_indices(r#"<g class="plan-step" data-event-id=""#)
        .map(|(at, _)| attribute(&figure[at..], "data-event-id").unwrap())
        .collect();
    assert_eq!(points, ["1", "4"]);
    has(
        &html,
        &[
            r#"<figure id="plan-timeline" data-changes="2">"#,
            "<title>starter → pro, event #4 customer.plan_changed</title>",
            r#"text-anchor="middle">pro</text>"#,
            r#"<li data-event-id="4">"#,
            r#"starter → <strong>pro</strong>, by <a href="/lambda-url/api/console/events/4">event #4</a>"#,
        ],
    );
    // A fold that cannot say gives null: the page says so rather than draw nothing.
    let mut data = data;
    data["plan_timeline"] = Value::Null;
    let html = rendered(&account_page("kc_1"), &data, &[]);
    has(&html, &[r#"id="plan-timeline-none""#, "cannot be said"]);
}
