//! One event's whole story: its status and reason, its attempts and retry, every delivery
//! that reported it, the payload as stored, the effects it caused, a Replay button and the
//! account it is about.

use maud::{html, Markup};
use serde_json::Value;

use super::view::{int, list, shown, status, text, time, tone, Links};

pub(super) fn render(id: i64, data: &Value, links: Links) -> Markup {
    let event = &data["event"];
    let source = text(event, "source");
    let customer = event["customer_id"].as_str();
    let deliveries = list(data, "deliveries");
    let effects = list(data, "effects");
    html! {
        h1 { "Event #" (id) }
        p.meta {
            code { (text(event, "type")) } " from " (source)
            @if let Some(customer) = customer {
                " about " a href=(links.account(source, customer)) { (customer) }
            }
        }
        div.actions {
            form.inline data-action="POST" action=(links.api(&format!("/v1/admin/events/{id}/replay"))) {
                button #replay type="submit" { "Replay" }
            }
            @if let Some(customer) = customer {
                " "
                a.button href=(links.account(source, customer)) { "Open the account" }
            }
        }
        dl.facts {
            dt { "Status" }
            dd { span #event-status class={ "status tone-" (tone(text(event, "status"))) } { (text(event, "status")) } }
            dt { "Outcome" }
            dd { (status(text(event, "outcome"))) }
            dt { "Reason" }
            dd #event-reason { (shown(&event["reason"])) }
            dt { "Provider event id" }
            dd { code { (shown(&event["provider_event_id"])) } }
            dt { "Occurred (provider time)" }
            dd { (time(&event["occurred_at"])) }
            dt { "Received" }
            dd { (time(&event["received_at"])) }
            dt { "Via" }
            dd { (shown(&event["via"])) }
            dt { "Seen" }
            dd { (shown(&event["seen_count"])) " times" }
            dt { "Attempts" }
            dd #event-attempts { (shown(&event["attempts"])) }
            dt { "Last error" }
            dd #event-last-error {
                @match event["last_error"].as_str() {
                    Some(error) => code.error { (error) },
                    None => "—",
                }
            }
            dt { "Next retry" }
            dd #event-next-retry { (time(&event["next_attempt_at"])) }
            dt { "Locked until" }
            dd { (time(&event["locked_until"])) }
            dt { "Enqueued" }
            dd { (time(&event["enqueued_at"])) }
            dt { "Processed" }
            dd { (time(&event["processed_at"])) }
            dt { "Replays" }
            dd { (shown(&event["replays"])) }
        }
        section aria-labelledby="deliveries-title" {
            h2 #deliveries-title { "Deliveries" }
            div.scroll {
                table #deliveries {
                    thead {
                        tr {
                            th scope="col" { "Delivery" }
                            th scope="col" { "Received" }
                            th scope="col" { "Verdict" }
                            th scope="col" { "Provider delivery id" }
                            th scope="col" { "Sent" }
                            th scope="col" { "Headers" }
                        }
                    }
                    tbody {
                        @for delivery in deliveries {
                            tr data-delivery-id=(shown(&delivery["delivery_id"])) {
                                th scope="row" { (shown(&delivery["delivery_id"])) }
                                td { (time(&delivery["received_at"])) }
                                td { (status(text(delivery, "verdict"))) }
                                td { code { (shown(&delivery["provider_delivery_id"])) } }
                                td { (time(&delivery["sent_at"])) }
                                td { (headers(&delivery["headers"])) }
                            }
                        }
                    }
                }
            }
            @if deliveries.is_empty() { p.empty { "No delivery is kept (the event came by another way, or the purge took them)." } }
        }
        section aria-labelledby="effects-title" {
            h2 #effects-title { "Effects it caused" }
            @if effects.is_empty() {
                p.empty { "None." }
            } @else {
                table #event-effects {
                    thead { tr { th scope="col" { "Effect" } th scope="col" { "Kind" } th scope="col" { "Status" } } }
                    tbody {
                        @for effect in effects {
                            tr data-effect-id=(shown(&effect["effect_id"])) {
                                th scope="row" { code { (shown(&effect["effect_id"])) } }
                                td { (text(effect, "kind")) }
                                td { (status(text(effect, "status"))) }
                            }
                        }
                    }
                }
            }
        }
        section aria-labelledby="payload-title" {
            h2 #payload-title { "Payload" }
            @if data["payload"].is_null() {
                p.empty #payload-gone { "The payload is no longer kept." }
            } @else {
                pre #payload tabindex="0" { (payload(&data["payload"])) }
            }
        }
        @if int(event, "event_id").is_some_and(|shown_id| shown_id != id) {
            p.note { "The answer is about event #" (shown(&event["event_id"])) "." }
        }
    }
}

/// The payload, indented when it is JSON (a JWT or other text as it came).
fn payload(value: &Value) -> String {
    let parsed;
    let json = match value {
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(value) => {
                parsed = value;
                &parsed
            }
            Err(_) => return text.clone(),
        },
        other => other,
    };
    serde_json::to_string_pretty(json).unwrap_or_default()
}

/// A delivery's headers, one per line.
fn headers(value: &Value) -> Markup {
    html! {
        @match value {
            Value::Object(map) if !map.is_empty() => {
                ul.headers {
                    @for (name, value) in map {
                        li { code { (name) ": " (shown(value)) } }
                    }
                }
            }
            Value::Array(items) if !items.is_empty() => {
                ul.headers {
                    @for item in items { li { code { (shown(item)) } } }
                }
            }
            other => (shown(other)),
        }
    }
}
