//! Stripe's thin events (`"object": "v2.core.event"`): a notification that names the object
//! that changed (`related_object` `{id, type, url}`) and carries none of it; a `v1.*` type is
//! the thin twin of the snapshot type without the prefix (`v1.customer.subscription.updated`),
//! GA for API v1 resources from 2026-09-30.endive. The worker fetches the object
//! (`GET related_object.url`, with the event's `context` as the account to read as) and stores
//! what it read as a snapshot event of its own (docs/design.md §6.2). Here is what is Stripe's
//! of that, and of its event generation failures, behind the provider's hooks: how the events
//! read (`notice`), the paths and headers of their reads, and the snapshot event a read is
//! stored as (`read_as_event`); the worker's side is `apply/notice/thin.rs` and
//! `apply/notice/health.rs`. An entitlement summary whose list is incomplete is read the same
//! way (`entitlements`).

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::decide::{ends, plan_keys, HANDLED_TYPES};
use super::fetch::{account, FETCH_VERSION};
use super::{entitlements, parse_event};
use crate::billing::registers::StoredSubscription;
use crate::domain::DedupeKey;
use crate::providers::{
    path_id, Api, Carrier, Failure, Fetched, GenerationFailure, Impact, MadeFor, MeterErrorSample,
    MeterErrors, MeterErrorsNotice, Notice, ReadFor,
};

/// The prefix of the thin twins of API v1 snapshot types.
const V1_PREFIX: &str = "v1.";

/// The type the reads of a subscription are stored as (an invoice's, a sweep's).
const SUBSCRIPTION_READ_TYPE: &str = "customer.subscription.updated";

/// The payload as a thin event, a generation failure's notice or an object's carrier; `None`
/// for anything else (a snapshot event).
pub fn notice(payload: &Value) -> Option<Notice> {
    let carrier = read(payload)?;
    if METER_ERRORS.contains(&carrier.event_type.as_str()) {
        // As a generation failure's, the notification carries no `data`.
        let told = payload
            .get("data")
            .filter(|d| d.is_object())
            .map(meter_errors_named);
        return Some(Notice::MeterErrors(MeterErrorsNotice {
            notice: carrier,
            told,
        }));
    }
    if carrier.event_type != GENERATION_FAILURE {
        return Some(Notice::Carrier(carrier));
    }
    // The notification carries no `data`; a payload that does (a test's, or a later shape)
    // is read as it is.
    let told = payload
        .get("data")
        .filter(|d| d.is_object())
        .map(failure_named);
    Some(Notice::GenerationFailure(GenerationFailure {
        notice: carrier,
        provider: "Stripe",
        told,
    }))
}

/// What a thin event says, read from its stored payload; `None` for anything else.
fn read(payload: &Value) -> Option<Carrier> {
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
    let read_type = event_type
        .strip_prefix(V1_PREFIX)
        .and_then(|t| HANDLED_TYPES.iter().copied().find(|h| *h == t));
    let path = match text("/related_object/url") {
        // A thin summary names no related object: its read starts from its snapshot event.
        None if read_type == Some(entitlements::SUMMARY_TYPE) => {
            entitlements::thin_path(text("/snapshot_event").as_deref())
        }
        None => Err("the thin event names no related_object.url".to_owned()),
        Some(url) => match related_path(&url) {
            Some(path) => Ok(path.to_owned()),
            None => Err(format!(
                "related_object.url '{url}' is not a Stripe API v1 object path"
            )),
        },
    };
    Some(Carrier {
        id: text("/id").unwrap_or_default(),
        event_type,
        read_type,
        path,
        context: text("/context"),
        twin: text("/snapshot_event"),
        livemode: payload.get("livemode").and_then(Value::as_bool),
    })
}

/// A read the worker made for an event, as the snapshot event it is stored as: a thin event's
/// object as the thin event's snapshot type, a swept or an invoice's subscription as
/// `customer.subscription.updated`; each names the event it was made for, and a connected
/// account's read the `account`, as a Connect endpoint's snapshot event does.
pub fn read_as_event(read: &ReadFor<'_>, object: &Value) -> Option<Fetched> {
    let snapshot = match &read.made_for {
        MadeFor::Carrier(thin) => Read {
            key: read.key.clone(),
            event_type: thin.read_type?,
            livemode: thin.livemode,
            account: account(thin.context.as_deref()),
            // An entitlement summary whose list was incomplete, or tied with another's, is a
            // snapshot event itself.
            because: match thin.event_type == entitlements::SUMMARY_TYPE {
                true => ("summary_event", &thin.id),
                false => ("thin_event", &thin.id),
            },
            // A summary's list is Stripe's word on the customer's set when it was read: the
            // later read of two in one second is the newer (`entitlements::decide_summary`).
            read_at: (thin.read_type == Some(entitlements::SUMMARY_TYPE)).then(Utc::now),
        },
        MadeFor::Swept(notice) => Read {
            key: read.key.clone(),
            event_type: SUBSCRIPTION_READ_TYPE,
            livemode: notice.livemode,
            account: account(notice.context.as_deref()),
            because: ("generation_failure_event", &notice.id),
            read_at: None,
        },
        MadeFor::Invoice {
            key,
            payload,
            customer,
        } => Read {
            key: read.key.clone(),
            event_type: SUBSCRIPTION_READ_TYPE,
            livemode: payload
                .and_then(|p| p.get("livemode"))
                .and_then(Value::as_bool),
            account: customer.connected_account(),
            because: ("invoice_event", key.as_str()),
            read_at: None,
        },
    };
    snapshot.snapshot(object, read.at)
}

/// An object read from the API, to be stored as the snapshot event `event_type` of its own
/// (docs/design.md §6.2): a thin event's related object, or the subscription of an invoice
/// whose plan its register does not know yet.
struct Read<'a> {
    /// The read's dedupe key: one per event that made it, so a retry or a replay finds it.
    pub key: DedupeKey,
    pub event_type: &'a str,
    pub livemode: Option<bool>,
    /// The connected account the object lives in, if not the platform's own.
    pub account: Option<&'a str>,
    /// The field that names the event the read was made for, and that event's id.
    pub because: (&'a str, &'a str),
    /// When it was read, where the read's rank depends on it (an entitlement summary's list).
    pub read_at: Option<DateTime<Utc>>,
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
        if let Some(read_at) = self.read_at {
            event[entitlements::READ_AT] = json!(read_at.to_rfc3339());
        }
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

/// What a generation failure's `data` names: its alert and its impact.
fn failure_named(data: &Value) -> Failure {
    Failure {
        alert: data
            .get("alert_id")
            .and_then(Value::as_str)
            .map(str::to_owned),
        impact: impact(data),
    }
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
            read_type: snapshot_type,
            path,
            context: text("/impact/context").map(str::to_owned),
        },
        None => Impact::Unreadable(format!("{event_type} of {id}")),
    }
}

/// Stripe's notices that meter events it took could not be counted: their `data` (stripe-node
/// `V1BillingMeterErrorReportTriggeredEvent`, `V1BillingMeterNoMeterFoundEvent`) is
/// `{developer_message_summary, validation_start, validation_end, reason: {error_count,
/// error_types: [{code, error_count, sample_errors: [{error_message, request: {identifier}}]}]}}`.
pub const METER_ERRORS: [&str; 2] = [
    "v1.billing.meter.error_report_triggered",
    "v1.billing.meter.no_meter_found",
];

/// What a meter error notice's `data` says; the samples it names by their identifier (the
/// request's idempotency key, which a report sends as its `identifier` too).
pub fn meter_errors_named(data: &Value) -> MeterErrors {
    let text = |v: &Value, p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let mut samples = Vec::new();
    let types = data
        .pointer("/reason/error_types")
        .and_then(Value::as_array);
    for kind in types.into_iter().flatten() {
        let code = text(kind, "/code");
        let errors = kind.get("sample_errors").and_then(Value::as_array);
        for sample in errors.into_iter().flatten() {
            let identifier = text(sample, "/request/identifier");
            if !identifier.is_empty() {
                samples.push(MeterErrorSample {
                    identifier,
                    code: code.clone(),
                    message: text(sample, "/error_message"),
                });
            }
        }
    }
    MeterErrors {
        summary: text(data, "/developer_message_summary"),
        error_count: data
            .pointer("/reason/error_count")
            .and_then(Value::as_i64)
            .unwrap_or(samples.len() as i64),
        samples,
    }
}

/// What a meter error notice says, read as `GET /v2/core/events/{id}` in its context.
pub async fn meter_errors(api: &Api, notice: &Carrier) -> anyhow::Result<MeterErrors> {
    let data = match fetch_v2_event(api, notice).await? {
        Some(read) => read.get("data").cloned().unwrap_or(Value::Null),
        None => anyhow::bail!(
            "Stripe does not know the event {} (events are kept 30 days)",
            notice.id
        ),
    };
    Ok(meter_errors_named(&data))
}

/// What the generation failure `notice` names, read as `GET /v2/core/events/{id}`: the event,
/// its `data` included (the notification carries none), in the event's context; the window's
/// events unknown when Stripe does not know it.
pub async fn generation_failure(api: &Api, notice: &Carrier) -> anyhow::Result<Failure> {
    let data = match fetch_v2_event(api, notice).await? {
        Some(read) => read.get("data").cloned().unwrap_or(Value::Null),
        None => Value::Null,
    };
    Ok(failure_named(&data))
}

/// `GET /v2/core/events/{id}`: the generation failure as an event, read in its context.
async fn fetch_v2_event(api: &Api, notice: &Carrier) -> anyhow::Result<Option<Value>> {
    let path = format!("/v2/core/events/{}", path_id(&notice.id)?);
    let mut headers = vec![("Stripe-Version", V2_EVENT_VERSION)];
    if let Some(context) = notice.context.as_deref() {
        headers.push(("Stripe-Context", context));
    }
    api.get_found(&path, &[], &headers).await
}

/// One page of `GET /v1/subscriptions?status=all` (every status, canceled ones included),
/// after `after`, in the connected account the `context` names, if it names one: the
/// subscriptions and the id the next page starts after, if there is one.
pub async fn subscriptions_page(
    api: &Api,
    context: Option<&str>,
    after: Option<&str>,
) -> anyhow::Result<(Vec<Value>, Option<String>)> {
    use anyhow::Context;
    let account = account(context);
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
pub async fn fetch_related(api: &Api, thin: &Carrier, path: &str) -> anyhow::Result<Option<Value>> {
    // An entitlement summary is no object of its own: it is its customer's list, read whole.
    if thin.read_type == Some(entitlements::SUMMARY_TYPE) {
        return entitlements::read_summary(api, thin, path).await;
    }
    let trigger = format!("event={}", thin.id);
    let mut headers = vec![
        ("Stripe-Version", FETCH_VERSION),
        ("Stripe-Request-Trigger", trigger.as_str()),
    ];
    let context = thin.context.as_deref();
    match (account(context), context) {
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
        let event = read(&thin("v1.customer.subscription.updated")).unwrap();
        assert_eq!(event.read_type, Some("customer.subscription.updated"));
        assert_eq!(event.path.as_deref(), Ok("/v1/subscriptions/sub_1"));
        assert_eq!(account(event.context.as_deref()), Some("acct_1Conn"));
        assert_eq!(event.twin.as_deref(), Some("evt_1Snap"));
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
            assert_eq!(read(&thin(t)).unwrap().read_type, None, "{t}");
        }
        assert_eq!(
            read(&json!({"object": "event", "type": "invoice.paid"})),
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
        let event = read(&thin("v1.customer.subscription.updated")).unwrap();
        // The thin event's `created`; the read itself is made whenever the worker gets to it.
        let at = DateTime::parse_from_rfc3339("2026-10-01T12:00:00.123Z")
            .unwrap()
            .to_utc();
        let object = json!({"id": "sub_1", "object": "subscription", "customer": "cus_1", "status": "active"});
        let read = ReadFor {
            key: event.read_key().unwrap(),
            at,
            made_for: MadeFor::Carrier(&event),
        };
        let fetched = read_as_event(&read, &object).unwrap();
        let meta = fetched.event.meta.as_ref().unwrap();
        assert_eq!(fetched.event.dedupe_key.as_str(), "read:evt_test_65R1");
        assert_eq!(meta.event_type, "customer.subscription.updated");
        assert_eq!(meta.customer.as_ref().unwrap().as_str(), "acct_1Conn/cus_1");
        assert_eq!(
            meta.occurred_at.as_datetime(),
            DateTime::parse_from_rfc3339("2026-10-01T12:00:00Z").unwrap()
        );
    }

    /// A thin event's object of a customer that is an Account (`customer` null,
    /// `customer_account` set): the read is that Account's, under the connected account the
    /// thin event's `context` names, and the platform's own with no context.
    #[test]
    fn a_read_of_a_customer_accounts_object_is_that_accounts() {
        let object = json!({"id": "sub_1", "object": "subscription", "customer": null,
            "customer_account": "acct_1Cust", "status": "active"});
        let at = DateTime::from_timestamp(1_790_000_000, 0).unwrap();
        let connected = read(&thin("v1.customer.subscription.updated")).unwrap();
        let mut own = thin("v1.customer.subscription.updated");
        own["context"] = Value::Null;
        let own = read(&own).unwrap();
        for (carrier, customer, account) in [
            (&connected, "acct_1Conn/acct_1Cust", Some("acct_1Conn")),
            (&own, "acct_1Cust", None),
        ] {
            let read = ReadFor {
                key: carrier.read_key().unwrap(),
                at,
                made_for: MadeFor::Carrier(carrier),
            };
            let fetched = read_as_event(&read, &object).unwrap();
            let meta = fetched.event.meta.as_ref().unwrap();
            let stored = meta.customer.as_ref().unwrap();
            assert_eq!(stored.as_str(), customer);
            assert_eq!(stored.connected_account(), account);
            assert_eq!(stored.at_provider(), "acct_1Cust");
        }
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
            read_type: "customer.subscription.updated",
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

    /// The thin twin of a summary names no related object (stripe-ruby's
    /// `V1EntitlementsActiveEntitlementSummaryUpdatedEventNotification` has none): its read
    /// starts from the snapshot event it names.
    #[test]
    fn a_thin_summary_reads_its_customer_from_its_snapshot_event() {
        let mut event = thin("v1.entitlements.active_entitlement_summary.updated");
        event.as_object_mut().unwrap().remove("related_object");
        let carrier = read(&event).unwrap();
        assert_eq!(carrier.read_type, Some(entitlements::SUMMARY_TYPE));
        assert_eq!(carrier.path.as_deref(), Ok("/v1/events/evt_1Snap"));
        event.as_object_mut().unwrap().remove("snapshot_event");
        assert_eq!(
            read(&event).unwrap().path,
            Err("the thin summary names no snapshot_event to read its customer from".into())
        );
    }

    /// The complete list read for an incomplete summary is the summary event again, whole, at
    /// the summary's time, under `read:` + its id, naming the event it was made for.
    #[test]
    fn the_complete_list_is_stored_as_a_summary_event_of_its_own() {
        use crate::providers::stripe::fixtures::{
            active_entitlement, entitlement_summary, summary_event,
        };
        let listed: Vec<Value> = (0..12)
            .map(|n| active_entitlement(&n.to_string(), &format!("f{n}")))
            .collect();
        let mut partial = summary_event(
            "evt_1EntMore",
            1_767_225_600,
            entitlement_summary("cus_Ent1", listed[..10].to_vec(), true),
            None,
        );
        partial["account"] = json!("acct_1EntConnect01");
        let Some(Notice::Carrier(carrier)) = entitlements::notice(&partial) else {
            panic!("a notice")
        };
        let mut whole = entitlement_summary("cus_Ent1", listed, false);
        whole["entitlements"]["url"] = json!(entitlements::LIST_PATH);
        let at = DateTime::from_timestamp(1_767_225_600, 0).unwrap();
        let read = ReadFor {
            key: carrier.read_key().unwrap(),
            at,
            made_for: MadeFor::Carrier(&carrier),
        };
        let fetched = read_as_event(&read, &whole).unwrap();
        let meta = fetched.event.meta.as_ref().unwrap();
        assert_eq!(fetched.event.dedupe_key.as_str(), "read:evt_1EntMore");
        assert_eq!(meta.event_type, entitlements::SUMMARY_TYPE);
        assert_eq!(
            meta.customer.as_ref().unwrap().as_str(),
            "acct_1EntConnect01/cus_Ent1"
        );
        assert_eq!(meta.occurred_at.as_datetime(), at);
        let stored = fetched.event.payload.as_ref().unwrap();
        assert_eq!(stored["summary_event"], "evt_1EntMore");
        assert_eq!(stored["data"]["object"], whole);
        assert_eq!(
            entitlements::notice(stored),
            None,
            "complete: applied as it is"
        );
    }
}
