//! The provider read of an invoice's subscription (docs/design.md §6.2): a paid invoice whose
//! lines name no known price takes its subscription's plan from the register; when the
//! register holds none of the subscriptions it names yet (the invoice came before any event of
//! its subscription), the first of them is read from the provider, after the account's read
//! and before any lock, as a tie's read is. The read is stored as an event of its own (the
//! snapshot `customer.subscription.updated` at the read's time, keyed by the invoice's event),
//! so a retry or a replay of the invoice finds it and reads nothing again, and the billing
//! state stays a function of stored events. It stands for the invoice (its time and period
//! are the invoice's, never the clock's) and is sent to the queue after the invoice's commit,
//! as every stored event is; applied, it is the subscription's state at the invoice's time.

use sqlx::PgConnection;

use super::{ApplyError, WorkerSource};
use crate::billing::rules::{Registers, ShownSubscription, SubscriptionRead};
use crate::billing::{Decision, Effect, EventContext};
use crate::domain::{Catalog, DedupeKey, EventStatus, SourceKind};
use crate::inbox::lease::Claimed;
use crate::inbox::thin::{self as stored, StoredEvent};
use crate::providers::{self, MadeFor, ReadFor};

/// What the provider showed of the invoice's subscription, and the stored read to send to
/// the queue once the invoice's attempt committed (one not finished yet).
pub(super) struct Shown {
    pub read: SubscriptionRead,
    pub to_send: Option<i64>,
}

impl Shown {
    fn not_read(read: SubscriptionRead) -> Self {
        Self {
            read,
            to_send: None,
        }
    }

    fn stored(kind: SourceKind, id: &str, read: &StoredEvent, catalog: &Catalog) -> Self {
        // Not applied yet: stored by this attempt, or by one that failed before its send.
        let waiting = read.status == EventStatus::Received.as_str();
        Self {
            read: shown(kind, id, read, catalog),
            to_send: waiting.then_some(read.id),
        }
    }
}

/// What the provider shows of the invoice's subscription, when the event asks for its
/// subscription's plan and the register holds none of the subscriptions it names: the read
/// stored for this event if there is one, else a read made now and stored. A read that fails
/// fails the attempt (the event's own retry schedule); a 404 is decided.
pub(super) async fn read(
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    ctx: &EventContext<'_>,
    registers: &Registers,
    effects: &[Effect],
    catalog: &Catalog,
) -> Result<Shown, ApplyError> {
    let Some(id) = unread_subscription(registers, effects) else {
        return Ok(Shown::not_read(SubscriptionRead::NotRead));
    };
    let Some(key) = read_key(&event.dedupe_key, id) else {
        return Ok(Shown::not_read(SubscriptionRead::NotRead));
    };
    if let Some(read) = stored::find(conn, &event.source, &key).await? {
        return Ok(Shown::stored(source.kind, id, &read, catalog));
    }
    let Some(reads) = &source.reads else {
        return Ok(Shown::not_read(SubscriptionRead::NoApiKey));
    };
    // The invoice's time: the read stands for it (docs/design.md §6.2).
    let Some(made_for) = super::stands_at(event) else {
        return Ok(Shown::not_read(SubscriptionRead::NotRead));
    };
    let object = match reads.subscription_object(ctx.customer, id).await {
        Ok(Some(object)) => object,
        Ok(None) => return Ok(Shown::not_read(SubscriptionRead::Unknown(id.to_owned()))),
        Err(e) => return Err(ApplyError::fetch(e)),
    };
    let read = ReadFor {
        key: key.clone(),
        at: made_for,
        made_for: MadeFor::Invoice {
            key: &event.dedupe_key,
            payload: event.payload.as_ref(),
            customer: ctx.customer,
        },
    };
    let snapshot = providers::provider(source.kind)
        .read_as_event(&read, &object)
        .ok_or_else(|| {
            ApplyError::Fetch("the subscription read could not be written as an event".into())
        })?;
    // The read names the row it was made for (the invoice's, or the thin event that carried
    // it), so the purge keeps it as long as that row (docs/design.md §3.9).
    let (body, verified) = (&snapshot.body, &snapshot.event);
    stored::store_subscription_read(conn, &event.source, body, verified, event.id)
        .await
        .map_err(|e| ApplyError::Fetch(format!("storing the subscription read: {e}")))?;
    match stored::find(conn, &event.source, &key).await? {
        Some(read) => Ok(Shown::stored(source.kind, id, &read, catalog)),
        None => Err(ApplyError::Fetch(
            "the stored subscription read is not found".into(),
        )),
    }
}

/// The first subscription an invoice asks the plan of, when the register holds none of those
/// it names.
fn unread_subscription<'a>(registers: &Registers, effects: &'a [Effect]) -> Option<&'a str> {
    effects.iter().find_map(|effect| match effect {
        Effect::GrantOfSubscription { subscriptions, .. }
            if subscriptions
                .iter()
                .all(|id| !registers.subscriptions.contains_key(id.as_str())) =>
        {
            subscriptions.first().map(String::as_str)
        }
        _ => None,
    })
}

/// The key of the read event `dedupe_key` makes of subscription `id`: one per event and
/// subscription, so a retry or a replay of the event finds it.
pub(crate) fn read_key(dedupe_key: &DedupeKey, id: &str) -> Option<DedupeKey> {
    DedupeKey::parse(&format!("read:{}:{id}", dedupe_key.as_str())).ok()
}

/// What a stored read shows: its customer, and the plan its own decision resolves (the
/// subscription's price, as a subscription event of that shape is read).
pub(crate) fn shown(
    kind: SourceKind,
    id: &str,
    read: &StoredEvent,
    catalog: &Catalog,
) -> SubscriptionRead {
    let plan = read.payload.as_ref().and_then(|payload| {
        match providers::decide(kind, &read.event_type, payload, catalog) {
            Decision::Apply { effects, .. } => effects.into_iter().find_map(|e| match e {
                Effect::Subscription { plan, .. } => plan,
                _ => None,
            }),
            _ => None,
        }
    });
    SubscriptionRead::Read(ShownSubscription {
        id: id.to_owned(),
        customer: read
            .customer
            .as_ref()
            .map(|c| c.as_str().to_owned())
            .unwrap_or_default(),
        plan,
        event_id: read.id,
    })
}
