//! `v2.core.health.event_generation_failure.resolved` in the worker (docs/design.md §6.2): Stripe
//! failed to generate events, which no destination and no events list will ever show, so
//! reconciliation's walk cannot find them. The thin notification carries no `data`: the event
//! is read (`GET /v2/core/events/{id}`) for its `data.impact`. When that names an object of a
//! handled type's event, the object is read, stored and applied as a thin event's is; when it
//! names none, the source's subscriptions are swept (`GET /v1/subscriptions?status=all`, as
//! Polar's reconciliation sweeps), each one its register does not show as the provider does
//! stored as a read of its own, for the rescue to send. Either way `EventGenerationFailures`
//! counts it per source, and an alarm watches that.

use chrono::Utc;
use serde_json::{json, Value};
use sqlx::PgConnection;

use super::thin::{read_object, view, Carried};
use super::{ApplyError, WorkerSource};
use crate::billing::registers::stored_subscription;
use crate::domain::{DedupeKey, EventStatus};
use crate::inbox::lease::Claimed;
use crate::inbox::thin as stored;
use crate::providers::stripe::thin::{differs, impact, Impact, Read, ThinEvent};

/// The most pages of 100 subscriptions one attempt sweeps; a larger account's sweep stops
/// there and says so (reconciliation's runs bound their pages the same way).
pub const MAX_SWEEP_PAGES: u32 = 20;

pub(super) async fn carried(
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    thin: &ThinEvent,
) -> Result<Carried, ApplyError> {
    let carried = decide(conn, event, source, thin).await?;
    println!("{}", generation_failure_metric(&event.source, Utc::now()));
    Ok(carried)
}

async fn decide(
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    thin: &ThinEvent,
) -> Result<Carried, ApplyError> {
    let finish = |status, reason: String| Ok(Carried::Finish(status, reason));
    // A read stored by an earlier attempt: applied again, nothing read (a replay).
    if let Some(key) = thin.read_key() {
        if let Some(read) = stored::find(conn, &event.source, &key).await? {
            return Ok(view(event, read));
        }
    }
    let Some(reads) = &source.reads else {
        return finish(
            EventStatus::Unprocessable,
            format!(
                "Stripe failed to generate events; source '{}' needs an API key (api_key or api_key_secret_id) to read what they were about",
                event.source
            ),
        );
    };
    // The notification carries no `data`; a payload that does (a test's, or a later shape)
    // is read as it is.
    let payload = event.payload.as_ref().unwrap_or(&Value::Null);
    let data = match payload.get("data").filter(|d| d.is_object()) {
        Some(data) => data.clone(),
        None => match reads.v2_event(thin).await {
            Ok(Some(read)) => read.get("data").cloned().unwrap_or(Value::Null),
            Ok(None) => Value::Null,
            Err(e) => return Err(ApplyError::Fetch(format!("{e:#}"))),
        },
    };
    let alert = data
        .get("alert_id")
        .and_then(Value::as_str)
        .unwrap_or("unnamed");
    match impact(&data) {
        Impact::Object {
            snapshot_type,
            path,
            context,
        } => {
            let named = ThinEvent {
                snapshot_type: Some(snapshot_type),
                url: Some(path),
                context: context.or_else(|| thin.context.clone()),
                snapshot_event: None,
                ..thin.clone()
            };
            read_object(conn, event, source, &named).await
        }
        Impact::NotBilling(event_type) => finish(
            EventStatus::Ignored,
            format!("Stripe failed to generate a {event_type} event (alert {alert}): not a billing event"),
        ),
        Impact::Unreadable(_) | Impact::Unnamed => {
            let swept = sweep(conn, event, source, thin).await?;
            finish(
                EventStatus::Applied,
                format!(
                    "Stripe failed to generate events (alert {alert}) and names no object this code reads: {swept}"
                ),
            )
        }
    }
}

/// Sweeps the source's subscriptions (in the event's connected account, if any): each one the
/// register does not show as the provider does is stored as a `customer.subscription.updated`
/// read at the read's time, keyed by this event and the subscription, so a retry or a replay
/// stores nothing twice. Says what it did.
async fn sweep(
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    thin: &ThinEvent,
) -> Result<String, ApplyError> {
    let Some(reads) = &source.reads else {
        return Ok("no API key to sweep with".into());
    };
    let account = thin.account();
    let (mut listed, mut differing, mut stored_new) = (0, 0, 0);
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let (page, next) = reads
            .subscriptions_page(account, after.as_deref())
            .await
            .map_err(|e| ApplyError::Fetch(format!("{e:#}")))?;
        pages += 1;
        let read_at = Utc::now();
        for subscription in &page {
            listed += 1;
            let Some(id) = subscription.get("id").and_then(Value::as_str) else {
                continue;
            };
            let local = stored_subscription(conn, &event.source, id).await?;
            if !differs(subscription, local.as_ref()) {
                continue;
            }
            differing += 1;
            let Ok(key) = DedupeKey::parse(&format!("read:{}:{id}", thin.id)) else {
                continue;
            };
            let Some(snapshot) = (Read {
                key,
                event_type: "customer.subscription.updated",
                livemode: thin.livemode,
                account,
                because: ("generation_failure_event", &thin.id),
            })
            .snapshot(subscription, read_at) else {
                continue;
            };
            let kept = stored::store_subscription_read(
                conn,
                &event.source,
                &snapshot.body,
                &snapshot.event,
            )
            .await
            .map_err(|e| ApplyError::Fetch(format!("storing a swept subscription: {e}")))?;
            if kept.verdict == crate::domain::Verdict::Stored {
                stored_new += 1;
            }
        }
        after = next;
        if after.is_none() {
            break;
        }
        if pages == MAX_SWEEP_PAGES {
            return Ok(format!(
                "swept {listed} subscriptions in {pages} pages and stopped (more remain; reconciliation and later events carry the rest): {differing} differ from their registers, {stored_new} stored as reads"
            ));
        }
    }
    Ok(format!(
        "swept {listed} subscriptions: {differing} differ from their registers, {stored_new} stored as reads"
    ))
}

/// The Embedded Metric Format line for each generation failure a source's worker handles:
/// `EventGenerationFailures` by `Stack` and `Source` (an alarm watches it: events Stripe never
/// generated are found only through it).
pub fn generation_failure_metric(source: &str, now: chrono::DateTime<Utc>) -> Value {
    let mut line = crate::platform::metrics::document(
        now,
        &[&["Source"]],
        &[("EventGenerationFailures", "Count")],
    );
    line["Source"] = json!(source);
    line["EventGenerationFailures"] = json!(1);
    line
}
