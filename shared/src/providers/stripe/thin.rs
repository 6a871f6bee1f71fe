//! Stripe's thin events (`"object": "v2.core.event"`): a notification that names the object
//! that changed (`related_object` `{id, type, url}`) and carries none of it; a `v1.*` type is
//! the thin twin of the snapshot type without the prefix (`v1.customer.subscription.updated`),
//! GA for API v1 resources from 2026-09-30.endive. The worker fetches the object
//! (`GET related_object.url`, with the event's `context` as the account to read as) and stores
//! what it read as a snapshot event of its own (docs/design.md §6.2).

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::decide::{ends, plan_keys, HANDLED_TYPES};
use super::parse_event;
use crate::billing::registers::StoredSubscription;
use crate::domain::DedupeKey;
use crate::providers::{path_id, Api, Fetched};

/// The API version the fetched objects are read in: the one `decide` reads in both
/// generations' shapes, and the one the worker's other reads pin (`api.rs`).
pub const FETCH_VERSION: &str = "2025-03-31.basil";

/// The prefix of the thin twins of API v1 snapshot types.
const V1_PREFIX: &str = "v1.";

/// What a thin event says, read from its stored payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinEvent {
    pub id: String,
    /// The thin type, as sent (`v1.customer.subscription.updated`).
    pub event_type: String,
    /// The snapshot type it stands for, when `decide` gives that type a meaning.
    pub snapshot_type: Option<&'static str>,
    /// `related_object.url`, when the event names an object.
    pub url: Option<String>,
    /// The account the object lives in (`acct_…` for a connected account), when not the
    /// platform's own.
    pub context: Option<String>,
    /// The id of the snapshot event Stripe sent for the same change to a snapshot destination
    /// (during a migration from snapshot to thin both run).
    pub snapshot_event: Option<String>,
    pub livemode: Option<bool>,
}

impl ThinEvent {
    /// The payload as a thin event; `None` for anything else (a snapshot event).
    pub fn read(payload: &Value) -> Option<Self> {
        if payload.get("object").and_then(Value::as_str) != Some("v2.core.event") {
            return None;
        }
        let text = |p: &str| {
            payload
                .pointer(p)
                .and_then(Value::as_str)
                .filter(|s| !s.trim().is_empty())
                .map(str::to_owned)
        };
        let event_type = text("/type").unwrap_or_default();
        let snapshot_type = event_type
            .strip_prefix(V1_PREFIX)
            .and_then(|t| HANDLED_TYPES.iter().copied().find(|h| *h == t));
        Some(Self {
            id: text("/id").unwrap_or_default(),
            event_type,
            snapshot_type,
            url: text("/related_object/url"),
            context: text("/context"),
            snapshot_event: text("/snapshot_event"),
            livemode: payload.get("livemode").and_then(Value::as_bool),
        })
    }

    /// The dedupe key of the read this event's object is stored as: one per thin event, so a
    /// retry or a replay finds the read instead of reading again.
    pub fn read_key(&self) -> Option<DedupeKey> {
        DedupeKey::parse(&format!("read:{}", self.id)).ok()
    }

    /// The object as read, stored as the snapshot event of the thin event's type: it stands
    /// for the thin event, so its time is the thin event's `made_for` (see [`Read::snapshot`]),
    /// its id [`Self::read_key`], and a connected account's read names the `account` as a
    /// Connect endpoint's snapshot event does.
    pub fn snapshot(&self, object: &Value, made_for: DateTime<Utc>) -> Option<Fetched> {
        let read = Read {
            key: self.read_key()?,
            event_type: self.snapshot_type?,
            livemode: self.livemode,
            account: self.account(),
            because: ("thin_event", &self.id),
        };
        read.snapshot(object, made_for)
    }

    /// The connected account the context names: a context of one `acct_…` segment. A
    /// deeper context (an organization's account path) is sent as `Stripe-Context` only.
    pub fn account(&self) -> Option<&str> {
        self.context
            .as_deref()
            .filter(|c| c.starts_with("acct_") && !c.contains('/'))
    }
}

/// An object read from the API, to be stored as the snapshot event `event_type` of its own
/// (docs/design.md §6.2): a thin event's related object, or the subscription of an invoice
/// whose plan its register does not know yet.
pub struct Read<'a> {
    /// The read's dedupe key: one per event that made it, so a retry or a replay finds it.
    pub key: DedupeKey,
    pub event_type: &'a str,
    pub livemode: Option<bool>,
    /// The connected account the object lives in, if not the platform's own.
    pub account: Option<&'a str>,
    /// The field that names the event the read was made for, and that event's id.
    pub because: (&'a str, &'a str),
}

impl Read<'_> {
    /// The object as read, as a snapshot event that stands for the event it was made for
    /// (docs/design.md §6.2): its time is that event's provider time `made_for`, never the
    /// clock's, so its place in the order and the period it grants in are the event's, and a
    /// read made after a month began grants in the month its event happened, as the event's
    /// snapshot would. In whole seconds, as Stripe's `created` is: a snapshot event of another
    /// change in the same second ties with it, and the tie's provider read settles which state
    /// is the later one (a finer time would let the read win over a later change). A
    /// connected account's read names the `account` as a Connect endpoint's snapshot event
    /// does.
    pub fn snapshot(&self, object: &Value, made_for: DateTime<Utc>) -> Option<Fetched> {
        let mut event = json!({
            "id": self.key.as_str(),
            "object": "event",
            "api_version": FETCH_VERSION,
            "created": made_for.timestamp(),
            "livemode": self.livemode,
            "type": self.event_type,
            "data": {"object": object},
        });
        event[self.because.0] = json!(self.because.1);
        if let Some(account) = self.account {
            event["account"] = json!(account);
        }
        let body = serde_json::to_vec(&event).ok()?;
        // Sent when it was read: the delivery row of the read says when that was.
        let event = parse_event(&body, Utc::now());
        Some(Fetched { body, event })
    }
}

/// Stripe's word that it failed to generate events (a public-preview thin event): those events
/// never reach a destination nor the events list, so reconciliation's walk cannot find them
/// (docs/design.md §6.2, "Event generation failures").
pub const GENERATION_FAILURE: &str = "v2.core.health.event_generation_failure.resolved";

/// The API version the v2 event is read in: the public preview that gave
/// `data.impact.related_object` its `{id, type, url}` and `context` (changelog 2025-11-17).
pub const V2_EVENT_VERSION: &str = "2025-11-17.preview";

/// What a generation failure's `data.impact` names: the event type Stripe failed to generate
/// and the object it was about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Impact {
    /// An object of a handled type's event: read at `path`, stored as the `snapshot_type`.
    Object {
        snapshot_type: &'static str,
        path: String,
        context: Option<String>,
    },
    /// An event of a type `decide` gives no meaning.
    NotBilling(String),
    /// An object, of a handled type's event, whose path is not one this code reads.
    Unreadable(String),
    /// No object: the window's events are unknown.
    Unnamed,
}

/// What a generation failure's `data` (`alert_id`, `grouping_key`, `impact`, `resolved_at`,
/// `summary`; stripe-node's `V2CoreHealthEventGenerationFailureResolvedEvent.Data`) names. The
/// `impact.related_object.url` is an API path in the SDKs' types and a Dashboard URL in
/// Stripe's guide: a `/v1/…` path is read as it is, else the path of a type this code reads
/// is made from `type` and `id`.
pub fn impact(data: &Value) -> Impact {
    let text = |p: &str| {
        data.pointer(p)
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
    };
    let Some(event_type) = text("/impact/event_type") else {
        return Impact::Unnamed;
    };
    let Some(id) = text("/impact/related_object/id").or(text("/impact/related_object_id")) else {
        return Impact::Unnamed;
    };
    let Some(snapshot_type) = HANDLED_TYPES.iter().copied().find(|t| *t == event_type) else {
        return Impact::NotBilling(event_type.to_owned());
    };
    let url = text("/impact/related_object/url");
    let path = match url.and_then(related_path) {
        Some(path) => Some(path.to_owned()),
        None => {
            let collection = match text("/impact/related_object/type") {
                Some("subscription") => Some("subscriptions"),
                Some("invoice") => Some("invoices"),
                Some("customer") => Some("customers"),
                Some("charge") => Some("charges"),
                Some("invoice_payment") => Some("invoice_payments"),
                _ => None,
            };
            collection.and_then(|c| path_id(id).ok().map(|id| format!("/v1/{c}/{id}")))
        }
    };
    match path {
        Some(path) => Impact::Object {
            snapshot_type,
            path,
            context: text("/impact/context").map(str::to_owned),
        },
        None => Impact::Unreadable(format!("{event_type} of {id}")),
    }
}

/// `GET /v2/core/events/{id}`: the generation failure as an event, its `data` included (the
/// notification carries none), read in the event's context.
pub async fn fetch_v2_event(api: &Api, thin: &ThinEvent) -> anyhow::Result<Option<Value>> {
    let path = format!("/v2/core/events/{}", path_id(&thin.id)?);
    let mut headers = vec![("Stripe-Version", V2_EVENT_VERSION)];
    if let Some(context) = thin.context.as_deref() {
        headers.push(("Stripe-Context", context));
    }
    api.get_found(&path, &[], &headers).await
}

/// One page of `GET /v1/subscriptions?status=all` (every status, canceled ones included),
/// after `after`, in the connected `account` when named: the subscriptions and the id the next
/// page starts after, if there is one.
pub async fn subscriptions_page(
    api: &Api,
    account: Option<&str>,
    after: Option<&str>,
) -> anyhow::Result<(Vec<Value>, Option<String>)> {
    use anyhow::Context;
    let mut query = vec![("status", "all".to_owned()), ("limit", "100".to_owned())];
    if let Some(after) = after {
        query.push(("starting_after", path_id(after)?.to_owned()));
    }
    let mut headers = vec![("Stripe-Version", FETCH_VERSION)];
    if let Some(account) = account {
        headers.push(("Stripe-Account", account));
    }
    let page = api
        .get_found("/v1/subscriptions", &query, &headers)
        .await?
        .context("GET /v1/subscriptions answered 404 Not Found")?;
    let listed = page
        .get("data")
        .and_then(Value::as_array)
        .context("the subscriptions list has no data")?
        .clone();
    let has_more = page.get("has_more").and_then(Value::as_bool) == Some(true);
    let next = listed
        .last()
        .and_then(|s| s.get("id"))
        .and_then(Value::as_str)
        .filter(|_| has_more)
        .map(str::to_owned);
    Ok((listed, next))
}

/// Whether a subscription as listed differs from its register (or the register has none):
/// status, plan, or ends, as `decide` reads them. A read is the provider's state at the read's
/// time, newer than anything the register holds, so only an agreement makes it unneeded.
pub fn differs(subscription: &Value, local: Option<&StoredSubscription>) -> bool {
    let Some(local) = local else {
        return true;
    };
    let status = subscription.get("status").and_then(Value::as_str);
    let keys = plan_keys(subscription);
    status != Some(local.status.as_str())
        || local
            .plan_key
            .as_deref()
            .is_some_and(|k| !keys.contains(&k))
        || ends(subscription).is_ok_and(|e| e != local.ends)
}

/// The path `related_object.url` names, if it is one of Stripe's v1 object paths: relative,
/// `/v1/` and id-like segments, and no query. Anything else is refused rather than sent (the
/// key goes only to the configured API, and only for an object read).
pub fn related_path(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("/v1/")?;
    let fine = !rest.is_empty() && rest.split('/').all(|segment| path_id(segment).is_ok());
    fine.then_some(url)
}

/// `GET {path}` as Stripe's SDKs fetch a thin event's related object: the key, the pinned
/// `Stripe-Version`, the event's context (`Stripe-Account` for a connected account,
/// `Stripe-Context` for any other), and `Stripe-Request-Trigger: event=…`. `None`: 404, the
/// object no longer exists.
pub async fn fetch_related(
    api: &Api,
    thin: &ThinEvent,
    path: &str,
) -> anyhow::Result<Option<Value>> {
    let trigger = format!("event={}", thin.id);
    let mut headers = vec![
        ("Stripe-Version", FETCH_VERSION),
        ("Stripe-Request-Trigger", trigger.as_str()),
    ];
    match (thin.account(), thin.context.as_deref()) {
        (Some(account), _) => headers.push(("Stripe-Account", account)),
        (None, Some(context)) => headers.push(("Stripe-Context", context)),
        (None, None) => {}
    }
    api.get_found(path, &[], &headers).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thin(event_type: &str) -> Value {
        json!({
            "id": "evt_test_65R1", "object": "v2.core.event", "type": event_type,
            "livemode": false, "created": "2026-10-01T12:00:00.123Z", "context": "acct_1Conn",
            "related_object": {"id": "sub_1", "type": "subscription", "url": "/v1/subscriptions/sub_1"},
            "snapshot_event": "evt_1Snap"
        })
    }

    #[test]
    fn a_v1_thin_event_names_its_snapshot_type_object_and_account() {
        let event = ThinEvent::read(&thin("v1.customer.subscription.updated")).unwrap();
        assert_eq!(event.snapshot_type, Some("customer.subscription.updated"));
        assert_eq!(event.url.as_deref(), Some("/v1/subscriptions/sub_1"));
        assert_eq!(event.account(), Some("acct_1Conn"));
        assert_eq!(event.snapshot_event.as_deref(), Some("evt_1Snap"));
        assert_eq!(event.read_key().unwrap().as_str(), "read:evt_test_65R1");
    }

    #[test]
    fn the_intake_keys_a_thin_event_by_its_id_and_times_it_by_its_rfc3339_created() {
        let body = serde_json::to_vec(&thin("v1.customer.subscription.updated")).unwrap();
        let event = parse_event(&body, Utc::now());
        assert_eq!(event.dedupe_key.as_str(), "evt_test_65R1");
        let meta = event.meta.unwrap();
        assert_eq!(meta.event_type, "v1.customer.subscription.updated");
        assert_eq!(
            meta.customer, None,
            "a thin event carries no object, so no customer"
        );
        let at = DateTime::parse_from_rfc3339("2026-10-01T12:00:00.123Z").unwrap();
        assert_eq!(meta.occurred_at.as_datetime(), at);
    }

    #[test]
    fn unknown_and_v2_types_name_no_snapshot_type_and_snapshots_are_not_thin() {
        for t in [
            "v1.billing.meter.no_meter_found",
            "v2.core.account.updated",
            "customer.subscription.updated",
        ] {
            assert_eq!(
                ThinEvent::read(&thin(t)).unwrap().snapshot_type,
                None,
                "{t}"
            );
        }
        assert_eq!(
            ThinEvent::read(&json!({"object": "event", "type": "invoice.paid"})),
            None
        );
    }

    #[test]
    fn only_v1_object_paths_are_fetched() {
        assert_eq!(
            related_path("/v1/subscriptions/sub_1"),
            Some("/v1/subscriptions/sub_1")
        );
        for bad in [
            "https://evil.example/v1/subscriptions/sub_1",
            "/v1/subscriptions/sub_1?expand[]=x",
            "/v1/../v2/x",
            "/v2/core/accounts/acct_1",
            "/v1/",
        ] {
            assert_eq!(related_path(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_read_is_a_snapshot_event_at_its_events_time_in_whole_seconds_of_the_connected_account() {
        let event = ThinEvent::read(&thin("v1.customer.subscription.updated")).unwrap();
        // The thin event's `created`; the read itself is made whenever the worker gets to it.
        let at = DateTime::parse_from_rfc3339("2026-10-01T12:00:00.123Z")
            .unwrap()
            .to_utc();
        let object = json!({"id": "sub_1", "object": "subscription", "customer": "cus_1", "status": "active"});
        let fetched = event.snapshot(&object, at).unwrap();
        let meta = fetched.event.meta.as_ref().unwrap();
        assert_eq!(fetched.event.dedupe_key.as_str(), "read:evt_test_65R1");
        assert_eq!(meta.event_type, "customer.subscription.updated");
        assert_eq!(meta.customer.as_ref().unwrap().as_str(), "acct_1Conn/cus_1");
        assert_eq!(
            meta.occurred_at.as_datetime(),
            DateTime::parse_from_rfc3339("2026-10-01T12:00:00Z").unwrap()
        );
    }

    /// `data.impact` as stripe-node's types give it (an API path) and as Stripe's guide shows
    /// it (a Dashboard URL, and the older `related_object_id`).
    #[test]
    fn a_generation_failure_names_the_object_by_its_path_or_its_type() {
        let data = |url: &str, event_type: &str| {
            json!({"alert_id": "halert_1", "impact": {"event_type": event_type, "context": "acct_1C",
                "related_object": {"id": "sub_1", "type": "subscription", "url": url}}})
        };
        let object = |path: &str| Impact::Object {
            snapshot_type: "customer.subscription.updated",
            path: path.into(),
            context: Some("acct_1C".into()),
        };
        assert_eq!(
            impact(&data(
                "/v1/subscriptions/sub_1",
                "customer.subscription.updated"
            )),
            object("/v1/subscriptions/sub_1")
        );
        assert_eq!(
            impact(&data(
                "https://dashboard.stripe.com/subscriptions/sub_1",
                "customer.subscription.updated"
            )),
            object("/v1/subscriptions/sub_1")
        );
        assert_eq!(
            impact(&data(
                "/v1/subscriptions/sub_1",
                "payment_intent.requires_action"
            )),
            Impact::NotBilling("payment_intent.requires_action".into())
        );
        let mut unknown = data("https://dashboard.stripe.com/x/sub_1", "invoice.paid");
        unknown["impact"]["related_object"]["type"] = json!("quote");
        assert_eq!(
            impact(&unknown),
            Impact::Unreadable("invoice.paid of sub_1".into())
        );
        assert_eq!(impact(&json!({"alert_id": "halert_1"})), Impact::Unnamed);
        let older = json!({"impact": {"event_type": "invoice.paid", "related_object_id": "in_1"}});
        assert_eq!(
            impact(&older),
            Impact::Unreadable("invoice.paid of in_1".into())
        );
    }
}
