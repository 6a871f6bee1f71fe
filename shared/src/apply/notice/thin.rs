//! A thin event in the worker (docs/design.md §6.2): an event that names an object and carries
//! none of it (its provider's `Notice::Carrier`), and what it stands for, decided before any
//! register is read. Its first attempt fetches its related object with the source's API key
//! and stores the read as a snapshot event of its own, at the thin event's time; that attempt
//! and every later one (a retry, a replay) apply the stored read under the thin event's
//! lease, so a replay re-applies what was read, never reads again, and the billing state
//! stays a function of stored events. A thin event whose snapshot twin is stored is carried
//! by the twin. A Stripe entitlement summary whose list is incomplete is a notice too: its
//! read is the complete list, stored and applied the same way; so is the list read for a
//! summary that meets another of its second in the register (`settled_by_read`, §4.2).

use chrono::Utc;
use serde_json::{json, Value};
use sqlx::PgConnection;

use super::Carried;
use crate::apply::{stands_at, ApplyError, WorkerSource};
use crate::domain::{DedupeKey, EventStatus};
use crate::inbox::lease::Claimed;
use crate::inbox::thin::{self as stored, StoredEvent};
use crate::platform::sim::{planted, Bug};
use crate::providers::{self, Carrier, MadeFor, ReadFor};

/// What the thin event `event` (read as `thin`) stands for; its object fetched and stored
/// when no attempt has yet. A fetch that fails fails the attempt (the event's own retry
/// schedule); a 404 is decided: the object is gone, and a deletion, if there was one, has its
/// own event.
pub(super) async fn carried(
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    thin: &Carrier,
) -> Result<Carried, ApplyError> {
    let finish = |status, reason: String| Ok(Carried::Finish(status, reason));
    let payload = event.payload.as_ref().unwrap_or(&Value::Null);
    if let Some(reason) = providers::provider(source.kind).out_of_scope(payload, source.livemode) {
        return finish(EventStatus::Ignored, reason);
    }
    // The words an unknown snapshot type gets (`billing::model::not_billing`).
    let Some(_) = thin.read_type else {
        return finish(
            EventStatus::Ignored,
            format!("event type {} is not a billing event", thin.event_type),
        );
    };
    let Some(read_key) = thin.read_key() else {
        return finish(
            EventStatus::Unprocessable,
            "the thin event has no id".into(),
        );
    };
    if let Some(read) = stored::find(conn, &event.source, &read_key).await? {
        return Ok(view(event, read));
    }
    // Applied once, and its read gone: a purge from before reads were kept with their events
    // took it. A replay applies what was read; reading now would apply the provider's state of
    // today as the thin event's, so nothing is read and the registers stay as they are.
    if stored::applied_a_read(conn, event.id).await? {
        return finish(
            EventStatus::Ignored,
            format!("its read {read_key} is no longer stored (purged); a replay applies what was read and reads nothing again"),
        );
    }
    // During a migration from snapshot to thin events both destinations run, and the
    // provider's guide keys the work by the twin: the twin stored, it carries the change, and
    // no read is made. A twin that comes later is older than the read and changes nothing.
    let twin = thin
        .twin
        .as_deref()
        .filter(|_| !planted(Bug::ThinSkipsTwin));
    if let Some(twin) = twin {
        let found = match DedupeKey::parse(twin) {
            Ok(key) => stored::find(conn, &event.source, &key).await?,
            Err(_) => None,
        };
        if let Some(found) = found {
            return finish(
                EventStatus::Ignored,
                format!(
                    "its snapshot event {twin} (event {}) carries the change",
                    found.id
                ),
            );
        }
    }
    read_object(conn, event, source, thin).await
}

/// The read that settles a same-second tie for `event` (a Stripe summary's list, docs/design.md
/// §4.2): found when an attempt stored it already — a retry or a replay applies what was read
/// and reads nothing again — else read now and stored; applied in the event's place.
pub(super) async fn settled_by_read(
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    carrier: &Carrier,
) -> Result<Carried, ApplyError> {
    if let Some(key) = carrier.read_key() {
        if let Some(read) = stored::find(conn, &event.source, &key).await? {
            return Ok(view(event, read));
        }
    }
    read_object(conn, event, source, carrier).await
}

/// The thin event's related object: read now, stored, and the read applied under the thin
/// event's id and lease.
pub(super) async fn read_object(
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    thin: &Carrier,
) -> Result<Carried, ApplyError> {
    let finish = |status, reason: String| Ok(Carried::Finish(status, reason));
    let Some(read_key) = thin.read_key() else {
        return finish(
            EventStatus::Unprocessable,
            "the thin event has no id".into(),
        );
    };
    let path = match &thin.path {
        Ok(path) => path.as_str(),
        Err(reason) => return finish(EventStatus::Unprocessable, reason.clone()),
    };
    let Some(reads) = &source.reads else {
        crate::platform::metrics::emit(thin_without_api_key_metric(&event.source, Utc::now()));
        return finish(
            EventStatus::Unprocessable,
            format!(
                "source '{}' needs an API key (api_key or api_key_secret_id) to fetch the object the event names ({path})",
                event.source
            ),
        );
    };
    let Some(made_for) = stands_at(event) else {
        return finish(
            EventStatus::Unprocessable,
            "the thin event has no provider time for its read to stand at".into(),
        );
    };
    let provider = providers::provider(source.kind);
    let object = match reads.carried_object(thin, path).await {
        Ok(Some(object)) => object,
        // A read whose absence tells nothing of the state (a customer the key cannot see)
        // leaves the registers as they are and needs an operator: unprocessable, alerted once.
        Ok(None) => match provider.missing_read(thin, path) {
            Some(reason) => return finish(EventStatus::Unprocessable, reason),
            None => {
                return finish(
                    EventStatus::Ignored,
                    format!(
                        "the object no longer exists at the provider (GET {path} answered 404)"
                    ),
                )
            }
        },
        Err(e) => return Err(ApplyError::fetch(e)),
    };
    let read = ReadFor {
        key: read_key.clone(),
        at: made_for,
        made_for: MadeFor::Carrier(thin),
    };
    let Some(fetched) = provider.read_as_event(&read, &object) else {
        return finish(
            EventStatus::Unprocessable,
            "the thin event's read could not be written as an event".into(),
        );
    };
    stored::store_read(conn, &event.source, &fetched.body, &fetched.event, event.id)
        .await
        .map_err(|e| ApplyError::Fetch(format!("storing the read: {e}")))?;
    match stored::find(conn, &event.source, &read_key).await? {
        Some(read) => Ok(view(event, read)),
        None => Err(ApplyError::Fetch("the stored read is not found".into())),
    }
}

/// The read, applied under the thin event's id and lease: its version (time, key) is the
/// read's, so the read's own row, applied later or replayed, finds the work done.
pub(super) fn view(event: &Claimed, read: StoredEvent) -> Carried {
    Carried::Read {
        read_id: read.id,
        view: Claimed {
            id: event.id,
            source: event.source.clone(),
            dedupe_key: read.dedupe_key,
            event_type: read.event_type,
            payload: read.payload,
            customer: read.customer,
            occurred_at: read.occurred_at,
            attempts: event.attempts,
            claim: event.claim,
        },
    }
}

/// Finishes the read's own row once the thin event applied it. A failure leaves it pending:
/// the rescue sends it, and it applies as a replay would, finding its work done.
pub(super) async fn finish_read(conn: &mut PgConnection, read_id: i64, thin_id: i64) {
    if let Err(e) = stored::finish_read(conn, read_id, thin_id).await {
        tracing::warn!(read_id, thin_id, error = %e, "could not finish a thin event's read");
    }
}

/// The Embedded Metric Format line for a thin event that cannot be applied because its source
/// has no API key to fetch its object with: `ThinEventsWithoutApiKey` by `Stack` and `Source`.
pub fn thin_without_api_key_metric(source: &str, now: chrono::DateTime<Utc>) -> Value {
    let mut line = crate::platform::metrics::document(
        now,
        &[&["Source"]],
        &[("ThinEventsWithoutApiKey", "Count")],
    );
    line["Source"] = json!(source);
    line["ThinEventsWithoutApiKey"] = json!(1);
    line
}
