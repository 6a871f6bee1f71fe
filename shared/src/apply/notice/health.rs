//! A provider's notice that it failed to generate events, in the worker (docs/design.md §6.2;
//! Stripe's `v2.core.health.event_generation_failure.resolved`): events that no destination and
//! no events list will ever show, so reconciliation's walk cannot find them. What the notice
//! names is told by the notice or read from the provider (`Reads::generation_failure`). When
//! that is an object of a handled type's event, the object is read, stored and applied as a
//! thin event's is; when it names none, the source's subscriptions are swept
//! (`Reads::subscriptions_page`), each one stored as a read of its own at the notice's time,
//! whatever its register holds (so that what is stored does not depend on the events' order),
//! for the rescue to send. The sweep keeps its place between attempts (`inbox::sweep`): an
//! attempt reads pages while its budget lasts and gives the notice back to be continued.
//! Either way `EventGenerationFailures` counts it per source once it is done, and an alarm
//! watches that.

use std::time::Duration;

use chrono::Utc;
use serde_json::{json, Value};
use sqlx::PgConnection;
use tokio::time::Instant;

use super::thin::{read_object, view};
use super::Carried;
use crate::apply::{ApplyError, WorkerSource};
use crate::billing::registers::stored_subscriptions;
use crate::domain::{DedupeKey, EventStatus};
use crate::inbox::lease::{self, Claimed};
use crate::inbox::sweep::{self, SweepPosition, SweptPage};
use crate::inbox::thin as stored;
use crate::providers::{self, Carrier, GenerationFailure, Impact, MadeFor, ReadFor};

/// How long one attempt of a notice goes on starting pages of its sweep (the worker's
/// `sweep_budget`, at most half the event's budget, §1.2): a page read takes 5 s at most and
/// its writes well under one, so the attempt ends within its event's budget, and so within
/// the invocation. A sweep that is not done by then is continued by the next attempt.
pub const SWEEP_BUDGET: Duration = Duration::from_secs(10);

/// What the notice stands for; its sweep goes on until `budget` has passed since the attempt
/// began, and then the attempt ends as [`ApplyError::Unfinished`].
pub(super) async fn carried_within(
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    failure: &GenerationFailure,
    budget: Duration,
) -> Result<Carried, ApplyError> {
    let until = Instant::now() + budget;
    let carried = read_or_sweep(conn, event, source, failure, until).await?;
    crate::platform::metrics::emit(generation_failure_metric(&event.source, Utc::now()));
    Ok(carried)
}

async fn read_or_sweep(
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    failure: &GenerationFailure,
    until: Instant,
) -> Result<Carried, ApplyError> {
    let finish = |status, reason: String| Ok(Carried::Finish(status, reason));
    let (thin, provider) = (&failure.notice, failure.provider);
    // A read stored by an earlier attempt: applied again, nothing read (a replay).
    if let Some(key) = thin.read_key() {
        if let Some(read) = stored::find(conn, &event.source, &key).await? {
            return Ok(view(event, read));
        }
    }
    // A sweep begun by an earlier attempt: continued from its place, or, done, told again
    // without reading anything (a replay).
    if let Some(position) = sweep::position(conn, event.id).await? {
        return sweep_on(conn, event, source, failure, position, until).await;
    }
    let Some(reads) = &source.reads else {
        return finish(
            EventStatus::Unprocessable,
            format!(
                "{provider} failed to generate events; source '{}' needs an API key (api_key or api_key_secret_id) to read what they were about",
                event.source
            ),
        );
    };
    // What the notice names: told by the notice itself, else read.
    let named = match &failure.told {
        Some(told) => told.clone(),
        None => reads
            .generation_failure(thin)
            .await
            .map_err(ApplyError::fetch)?,
    };
    let alert = named.alert.as_deref().unwrap_or("unnamed").to_owned();
    match named.impact {
        Impact::Object {
            read_type,
            path,
            context,
        } => {
            let named = Carrier {
                read_type: Some(read_type),
                path: Ok(path),
                context: context.or_else(|| thin.context.clone()),
                twin: None,
                ..thin.clone()
            };
            read_object(conn, event, source, &named).await
        }
        Impact::NotBilling(event_type) => finish(
            EventStatus::Ignored,
            format!("{provider} failed to generate a {event_type} event (alert {alert}): not a billing event"),
        ),
        Impact::Unreadable(_) | Impact::Unnamed => {
            let position = sweep::start(conn, event.id, &alert).await?;
            sweep_on(conn, event, source, failure, position, until).await
        }
    }
}

/// The sweep from `position` on: one page after another while the attempt's time lasts
/// (each page's reads and the sweep's new place committed together), then the notice
/// finished with what the whole sweep found, or given back to be continued.
async fn sweep_on(
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    failure: &GenerationFailure,
    mut position: SweepPosition,
    until: Instant,
) -> Result<Carried, ApplyError> {
    let mut read_now = 0;
    while !position.finished {
        if read_now > 0 && Instant::now() >= until {
            return Err(ApplyError::Unfinished(progress(
                &position,
                "its time ran out",
            )));
        }
        match sweep_page(conn, event, source, &failure.notice, &position).await {
            Ok(next) => position = next,
            // A page that failed after others were read: their reads are kept, and the next
            // attempt goes on from there, not counted against the notice.
            Err(ApplyError::Fetch(error)) if read_now > 0 => {
                return Err(ApplyError::Unfinished(progress(
                    &position,
                    &format!("a page read failed: {error}"),
                )))
            }
            Err(other) => return Err(other),
        }
        read_now += 1;
    }
    Ok(Carried::Finish(
        EventStatus::Applied,
        format!(
            "{} failed to generate events (alert {}) and names no object this code reads: swept {} subscriptions in {} pages: {} differ from their registers, {} stored as reads",
            failure.provider, position.alert, position.listed, position.pages, position.differing, position.stored
        ),
    ))
}

/// How far a sweep got, as the notice's reason says while it is being continued.
fn progress(position: &SweepPosition, why: &str) -> String {
    format!(
        "sweeping the subscriptions, to be continued ({why}): {} read in {} pages so far, {} stored as reads",
        position.listed, position.pages, position.stored
    )
}

/// Reads the page after `position` and, in one transaction under the notice's lease, stores
/// every subscription on it as a `customer.subscription.updated` read at the notice's time
/// (keyed by the notice and the subscription, so a retry or a replay stores nothing twice),
/// and moves the sweep past the page. Every one, whatever its register holds: what is stored
/// is then the same in every order of the events, and so is the state, a function of what is
/// stored (docs/design.md §6.2). Stored only where the register differed, a read depended on
/// whether the subscription's own event came first: a change at 23:59 and a notice at 00:00
/// granted the new month from the read when the notice came first and not when the change did.
/// A read whose register is newer loses to it in provider order; one that shows the register's
/// state takes its version and grants its plan for the notice's month, as a snapshot event of
/// that time would. The registers are read only to count, for the reason, how many differed.
async fn sweep_page(
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    notice: &Carrier,
    position: &SweepPosition,
) -> Result<SweepPosition, ApplyError> {
    let Some(reads) = &source.reads else {
        return Err(ApplyError::Fetch("no API key to sweep with".into()));
    };
    // The read stands for the notice: its time, and so its period, are the notice's.
    let Some(at) = event.occurred_at.map(|t| t.as_datetime()) else {
        return Err(ApplyError::Fetch("the notice has no provider time".into()));
    };
    let provider = providers::provider(source.kind);
    let (listed, next) = reads
        .subscriptions_page(notice.context.as_deref(), position.page_after.as_deref())
        .await
        .map_err(ApplyError::fetch)?;
    let ids: Vec<&str> = listed
        .iter()
        .filter_map(|s| s.get("id").and_then(Value::as_str))
        .collect();
    let mut tx = crate::apply::begin(conn).await?;
    if !lease::still_held(&mut tx, event).await? {
        return Err(ApplyError::LeaseLost);
    }
    let registers = stored_subscriptions(&mut tx, &event.source, &ids).await?;
    let mut page = SweptPage {
        listed: i32::try_from(listed.len()).unwrap_or(i32::MAX),
        next,
        ..SweptPage::default()
    };
    for subscription in &listed {
        let Some(id) = subscription.get("id").and_then(Value::as_str) else {
            continue;
        };
        // Counted for the operator only: what is stored does not depend on the registers.
        if provider.subscription_differs(subscription, registers.get(id)) {
            page.differing += 1;
        }
        let Ok(key) = DedupeKey::parse(&format!("read:{}:{id}", notice.id)) else {
            continue;
        };
        let read = ReadFor {
            key,
            at,
            made_for: MadeFor::Swept(notice),
        };
        let Some(snapshot) = provider.read_as_event(&read, subscription) else {
            continue;
        };
        let (body, verified) = (&snapshot.body, &snapshot.event);
        let kept = sweep::store_read(&mut tx, &event.source, body, verified, event.id)
            .await
            .map_err(|e| ApplyError::Fetch(format!("storing a swept subscription: {e}")))?;
        if kept.verdict == crate::domain::Verdict::Stored {
            page.stored.push(kept.event_id);
        }
    }
    if !sweep::advance(&mut tx, event.id, position.page_after.as_deref(), &page).await? {
        return Err(ApplyError::LeaseLost);
    }
    tx.commit().await?;
    Ok(SweepPosition {
        alert: position.alert.clone(),
        page_after: page.next.clone(),
        pages: position.pages + 1,
        listed: position.listed + page.listed,
        differing: position.differing + page.differing,
        stored: position.stored + i32::try_from(page.stored.len()).unwrap_or(i32::MAX),
        finished: page.next.is_none(),
    })
}

/// The Embedded Metric Format line for each generation failure a source's worker handles:
/// `EventGenerationFailures` by `Stack` and `Source` (an alarm watches it: events a provider never
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
