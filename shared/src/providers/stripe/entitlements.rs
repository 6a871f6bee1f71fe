//! Stripe Entitlements (docs/design.md §6.2, §4.12): `entitlements.active_entitlement_summary.updated`
//! carries the customer's active entitlements as a snapshot, an `Entitlements.ActiveEntitlementSummary`
//! `{object, customer, entitlements: {object: "list", data, has_more, url}, livemode}` whose
//! `data[]` are `Entitlements.ActiveEntitlement` `{id, object, feature, livemode, lookup_key}`
//! (stripe-node). A complete list is one entitlement register, `active_entitlement_summary`,
//! `{lookup_key: true}` for each. A list that says `has_more` (Stripe embeds at most a page of a
//! list in an event) is never applied: the summary is a notice, and the complete list, read from
//! `GET /v1/entitlements/active_entitlements?customer=…` page by page, is stored as an event of
//! its own and applied as a thin event's read is (`apply::notice`). So is a complete summary that
//! finds the register holding another summary of its second: Stripe's `created` has one-second
//! resolution and its ids are random, so the list read settles the tie (§4.2). A list Stripe
//! does not find (404) leaves the summary unprocessable, the features as they were.
//! `previous_attributes` is never read: what changed is the account's features before and
//! after (§4.12).

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::fetch::{account, FETCH_VERSION};
use crate::billing::{Decision, Effect, Problem, Rank};
use crate::domain::features::{FeatureValue, Features};
use crate::platform::sim::{planted, Bug};
use crate::providers::{path_id, Api, Carrier, Notice};

/// The event type of a summary, and (with `v1.`) of its thin twin.
pub const SUMMARY_TYPE: &str = "entitlements.active_entitlement_summary.updated";

/// The summary's `object`.
const SUMMARY_OBJECT: &str = "entitlements.active_entitlement_summary";

/// The grant id of the customer's one entitlement register the summaries write: each summary
/// is the whole set and replaces the one before.
pub const GRANT: &str = "active_entitlement_summary";

/// Where a customer's active entitlements are listed.
pub const LIST_PATH: &str = "/v1/entitlements/active_entitlements";

/// Stripe's largest page.
const PAGE_SIZE: usize = 100;

/// Pages read at most for one customer (10,000 entitlements): a list that goes on past them is
/// a failed read, not a shorter list.
const MAX_PAGES: usize = 100;

/// Why a summary's list is not the whole set, if it is not: it says `has_more` (or does not
/// say it has no more), or it holds fewer entries than its `total_count`.
pub fn incomplete(summary: &Value) -> Option<String> {
    let Some(list) = summary.get("entitlements").filter(|l| l.is_object()) else {
        return Some("the summary carries no entitlements list".into());
    };
    let Some(data) = list.get("data").and_then(Value::as_array) else {
        return Some("the summary's entitlements list has no data".into());
    };
    match list.get("has_more").and_then(Value::as_bool) {
        Some(false) => {}
        Some(true) => {
            return Some(format!(
                "the summary's entitlements list holds {} and says has_more",
                data.len()
            ))
        }
        None => return Some("the summary's entitlements list does not say has_more".into()),
    }
    match list.get("total_count").and_then(Value::as_u64) {
        Some(total) if total > data.len() as u64 => Some(format!(
            "the summary's entitlements list holds {} of its total_count {total}",
            data.len()
        )),
        _ => None,
    }
}

/// The field of a summary read (an event the worker stores, docs/design.md §6.2) that says
/// when Stripe's list was read.
pub const READ_AT: &str = "read_at";

/// What a summary means: with a complete list, the customer's entitlement register holds the
/// list's `lookup_key`s (an empty list: no features); an incomplete one is never applied. A
/// summary read from Stripe's list (`payload` says when) is Stripe's word on the customer's
/// set at that moment: its write takes a confirmed rank at the read's time, above every
/// summary stamped with the same second, and below a later read (docs/design.md §4.2).
pub fn decide_summary(payload: &Value, summary: &Value) -> Result<Decision, Problem> {
    if let Some(why) = incomplete(summary).filter(|_| !partial_applied()) {
        return Ok(Decision::Unprocessable(format!(
            "{why}: a partial list is never applied (the complete list is read from the provider)"
        )));
    }
    let listed = summary
        .pointer("/entitlements/data")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    let mut features = Features::new();
    for (n, entitlement) in listed.enumerate() {
        let key = entitlement
            .get("lookup_key")
            .and_then(Value::as_str)
            .filter(|k| !k.trim().is_empty())
            .ok_or_else(|| Problem(format!("entitlements.data[{n}] has no lookup_key")))?;
        features.insert(key.to_owned(), FeatureValue::Flag(true));
    }
    let rank = match payload.get(READ_AT) {
        None => Rank(0),
        Some(at) => at
            .as_str()
            .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
            .map(|at| Rank::confirmed(at.with_timezone(&Utc)))
            .ok_or_else(|| Problem(format!("the summary read's {READ_AT} is not a time")))?,
    };
    Ok(Decision::apply(vec![Effect::Entitlement {
        grant: GRANT.to_owned(),
        active: true,
        features,
        rank,
    }]))
}

/// Whether a stored summary is a read of Stripe's list the worker made, not Stripe's event.
fn is_read(payload: &Value) -> bool {
    payload.get(READ_AT).is_some()
}

/// A summary event whose list is incomplete, as the notice the worker settles by reading the
/// complete list; `None` for a complete one (applied as it is) and for any other event.
pub fn notice(payload: &Value) -> Option<Notice> {
    let carrier = carrier(payload)?;
    incomplete(payload.pointer("/data/object")?).filter(|_| !partial_applied())?;
    Some(Notice::Carrier(carrier))
}

/// The read that settles a tie on the summary register (docs/design.md §4.2, §4.12): when the
/// register holds another summary stamped with the same second as this one (Stripe's
/// `created` has one-second resolution, its event ids are random), the customer's list as
/// Stripe shows it, read for this summary and stored as an event of its own that is applied
/// in its place, as an incomplete summary's list is. `None` for another effect, and for a
/// summary that is itself such a read (it is Stripe's word already).
pub fn tie_read(payload: &Value, effect: &Effect) -> Option<Carrier> {
    let Effect::Entitlement { grant, .. } = effect else {
        return None;
    };
    if grant != GRANT || is_read(payload) {
        return None;
    }
    carrier(payload)
}

/// Why a summary whose list Stripe does not find (404) is unprocessable: the customer's features
/// cannot be known, and they stay as they were until an operator looks. Stripe answers 404
/// `resource_missing` for a customer it does not have, and so for one of the other mode or
/// another account than the key's (a test-mode key reading a live customer).
/// A thin summary's first read, its snapshot event, is missing for the same reasons, or
/// because Stripe keeps events 30 days.
pub fn missing(carrier: &Carrier, path: &str) -> Option<String> {
    if carrier.read_type != Some(SUMMARY_TYPE) {
        return None;
    }
    Some(match path.starts_with("/v1/events/") {
        true => format!(
            "Stripe does not find the summary's snapshot event (GET {path} answered 404): it is \
             past Stripe's 30 days of events, or of the other mode or another account than the \
             source's API key; the features stay as they were"
        ),
        false => format!(
            "Stripe does not find the customer's active entitlements (GET {path} answered 404): \
             the customer is unknown to the source's API key (deleted, or of the other mode or \
             another account than the key); the features stay as they were"
        ),
    })
}

/// The summary event as the carrier of its list's read; `None` for any other event.
fn carrier(payload: &Value) -> Option<Carrier> {
    if payload.get("type").and_then(Value::as_str) != Some(SUMMARY_TYPE) {
        return None;
    }
    let summary = payload.pointer("/data/object")?;
    let text = |p: &str| {
        payload
            .pointer(p)
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
            .map(str::to_owned)
    };
    let path = match customer(summary) {
        Some(customer) => path_id(customer)
            .map(list_of)
            .map_err(|_| format!("the summary's customer '{customer}' is not a customer id")),
        None => Err("the summary names no customer".to_owned()),
    };
    Some(Carrier {
        id: text("/id").unwrap_or_default(),
        event_type: SUMMARY_TYPE.to_owned(),
        read_type: Some(SUMMARY_TYPE),
        path,
        // A Connect endpoint's event names the connected account the customer lives in.
        context: text("/account"),
        twin: None,
        livemode: payload.get("livemode").and_then(Value::as_bool),
    })
}

/// Whether the simulation running this task planted the bug of applying a partial list as it
/// is embedded (docs/design.md §10); never outside one.
fn partial_applied() -> bool {
    planted(Bug::PartialSummaryApplied)
}

/// The path a thin summary reads its customer from: the snapshot event it names
/// (`snapshot_event`), since the thin summary names no related object (stripe-ruby,
/// stripe-java: `V1EntitlementsActiveEntitlementSummaryUpdatedEventNotification` has none).
pub fn thin_path(snapshot_event: Option<&str>) -> Result<String, String> {
    let twin = snapshot_event
        .ok_or("the thin summary names no snapshot_event to read its customer from")?;
    path_id(twin)
        .map(|id| format!("/v1/events/{id}"))
        .map_err(|_| format!("snapshot_event '{twin}' is not an event id"))
}

/// The list read of one customer's active entitlements, as a carrier's path says it.
fn list_of(customer: &str) -> String {
    format!("{LIST_PATH}?customer={customer}")
}

/// The summary's customer: an id, or an expanded customer's. stripe-node types the summary
/// with `customer` alone (no `customer_account`, unlike the v1 billing objects), and the list
/// it is read from takes `customer` alone: a customer that is an Account is whatever id the
/// summary names, and is listed by it. A `customer_account` beside it is read as the event's
/// customer is (`verify::object_customer`), so the notice and the event name one customer.
fn customer(summary: &Value) -> Option<&str> {
    fn id(found: &Value) -> Option<&str> {
        found
            .as_str()
            .or_else(|| found.get("id").and_then(Value::as_str))
            .filter(|c| !c.trim().is_empty())
            .map(str::trim)
    }
    summary
        .get("customer")
        .and_then(id)
        .or_else(|| summary.get("customer_account").and_then(id))
}

/// The complete summary the carrier stands for, read from Stripe: the customer its path names
/// (a list path's `customer`, a customer's path, or the snapshot event a thin summary names,
/// read first), then every page of its active entitlements. `None` when Stripe does not know
/// the customer or the snapshot event (404).
pub async fn read_summary(
    api: &Api,
    carrier: &Carrier,
    path: &str,
) -> anyhow::Result<Option<Value>> {
    let trigger = format!("event={}", carrier.id);
    let context = carrier.context.as_deref();
    let mut headers = vec![
        ("Stripe-Version", FETCH_VERSION),
        ("Stripe-Request-Trigger", trigger.as_str()),
    ];
    match (account(context), context) {
        (Some(account), _) => headers.push(("Stripe-Account", account)),
        (None, Some(context)) => headers.push(("Stripe-Context", context)),
        (None, None) => {}
    }
    let customer = if let Some(customer) = path
        .strip_prefix(LIST_PATH)
        .and_then(|q| q.strip_prefix("?customer="))
        .or_else(|| path.strip_prefix("/v1/customers/"))
    {
        path_id(customer)?.to_owned()
    } else if path.starts_with("/v1/events/") {
        let Some(event) = api.get_found(path, &[], &headers).await? else {
            return Ok(None);
        };
        if event.get("type").and_then(Value::as_str) != Some(SUMMARY_TYPE) {
            bail!("GET {path} is not an {SUMMARY_TYPE} event");
        }
        let summary = event.pointer("/data/object").unwrap_or(&Value::Null);
        let customer =
            customer(summary).context("the snapshot event's summary names no customer")?;
        path_id(customer)?.to_owned()
    } else {
        bail!("{path} is not where an entitlement summary is read from");
    };
    let Some(data) = list_all(api, &customer, &headers).await? else {
        return Ok(None);
    };
    Ok(Some(json!({
        "object": SUMMARY_OBJECT,
        "customer": customer,
        "entitlements": {"object": "list", "data": data, "has_more": false, "url": LIST_PATH},
        "livemode": carrier.livemode,
    })))
}

/// Every page of `GET /v1/entitlements/active_entitlements?customer=…` (`limit=100`, paged
/// with `starting_after` the last id while the page says `has_more`); `None` on a 404.
async fn list_all(
    api: &Api,
    customer: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<Option<Vec<Value>>> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let mut query = vec![
            ("customer", customer.to_owned()),
            ("limit", PAGE_SIZE.to_string()),
        ];
        if let Some(after) = &after {
            query.push(("starting_after", after.clone()));
        }
        let Some(page) = api.get_found(LIST_PATH, &query, headers).await? else {
            return Ok(None);
        };
        let listed = page
            .get("data")
            .and_then(Value::as_array)
            .with_context(|| format!("the list of {LIST_PATH} has no data"))?;
        all.extend(listed.iter().cloned());
        if page.get("has_more").and_then(Value::as_bool) != Some(true) {
            return Ok(Some(all));
        }
        let last = listed
            .last()
            .and_then(|e| e.get("id"))
            .and_then(Value::as_str)
            .with_context(|| format!("a page of {LIST_PATH} says has_more and ends in no id"))?;
        if after.as_deref() == Some(last) {
            bail!("a page of {LIST_PATH} after {last} starts at {last} again");
        }
        after = Some(path_id(last)?.to_owned());
    }
    bail!("{LIST_PATH} for {customer} goes on past {MAX_PAGES} pages of {PAGE_SIZE}")
}
