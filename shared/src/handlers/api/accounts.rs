//! The app's routes (docs/api.md): read an account (or one of its features), `why` it is so,
//! debit its allowance, list its usage, through billing's `account` and `usage`. No SQL and
//! no billing rule lives here.

use http::{HeaderMap, Method, StatusCode};
use lambda_http::{Body, Request, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::super::json_response;
use super::answer::{
    authenticate, event_id_param, kind_of, limit_param, mark_replayed, on_held, replayed, require,
    serde_error_words, settle, time_param, ApiError, Query, MAX_CURSOR_LEN,
};
use super::state::ApiState;
use crate::audit::{self, Cut, FoldError};
use crate::billing::account::{self, AccountSnapshot};
use crate::billing::credits_read::{self, AccountCredits};
use crate::billing::usage::{self, Debit, DebitRequest, Invalid, Listed, Reversal, UsagePage};
use crate::domain::features::{self, BadKey};
use crate::domain::{AccountError, AccountRef, Period, SourceKind};
use crate::effects::outbox::Effects;
use crate::meters::outbox::MeterReports;
use crate::operate::{acts, log, Place};
use crate::platform::api_keys::Scope;
use crate::platform::queued;

/// What a request asks for, once routed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Account,
    /// One feature of the account, by its key as the path gives it (decoded, not checked yet).
    Feature(String),
    /// The account's prepaid credits (docs/design.md §4.14).
    Credits,
    Why,
    RecordUsage,
    ListUsage,
    /// A reversal of one of the account's debits, by its usage id as the path gives it.
    ReverseUsage(String),
    /// The account's event log.
    Events,
    /// A replay of one of the account's events, by its id as the path gives it.
    ReplayEvent(String),
}

impl Route {
    /// Its name in the log (a feature's key is the request's, so not part of it).
    fn name(&self) -> &'static str {
        match self {
            Self::Account => "Account",
            Self::Feature(_) => "Feature",
            Self::Credits => "Credits",
            Self::Why => "Why",
            Self::RecordUsage => "RecordUsage",
            Self::ListUsage => "ListUsage",
            Self::ReverseUsage(_) => "ReverseUsage",
            Self::Events => "Events",
            Self::ReplayEvent(_) => "ReplayEvent",
        }
    }

    /// The query parameters the route takes. Any other is refused: a misspelt `period` (or a
    /// `period` on a debit, which names it in the body) would otherwise be answered for the
    /// current month as if it had been understood.
    fn parameters(&self) -> &'static [&'static str] {
        match self {
            Self::Account => &["period", "stripe_account"],
            // Features hold for the account as it stands: no period.
            Self::Feature(_) => &["stripe_account"],
            Self::Credits => &["at", "stripe_account"],
            Self::Why => &["at", "received_before", "stripe_account"],
            Self::RecordUsage => &["stripe_account"],
            Self::ListUsage => &["period", "limit", "after", "stripe_account"],
            Self::ReverseUsage(_) => &["stripe_account"],
            Self::Events => &["limit", "after", "stripe_account"],
            Self::ReplayEvent(_) => &["stripe_account"],
        }
    }
}

/// The route and its path's source and customer, from a path ending in
/// `/v1/accounts/{source}/{customer}[/usage[/{usage_id}/reversal]|/why|/features/{key}|
/// /events[/{id}/replay]]` (API Gateway's path, or
/// `cargo lambda watch`'s with its `/lambda-url/api` prefix). Segments are percent-decoded. A
/// `…/features` path with no key (or an empty one) routes to the feature check, which refuses
/// the key by name rather than answer 404 for a route that exists.
fn route(method: &Method, path: &str) -> Result<(Route, String, String), ApiError> {
    let not_found = || ApiError::NotFound {
        method: method.clone(),
        path: path.chars().take(200).collect(),
    };
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let start = segments
        .windows(2)
        .position(|w| w == ["v1", "accounts"])
        .ok_or_else(not_found)?;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| ApiError::bad("bad_path", "a path segment is not UTF-8"))
    };
    let (route, source, customer) = match &segments[start + 2..] {
        [source, customer] => (Route::Account, source, customer),
        [source, customer, "features"] => (Route::Feature(String::new()), source, customer),
        [source, customer, "features", key] => (Route::Feature(decode(key)?), source, customer),
        [source, customer, "why"] => (Route::Why, source, customer),
        [source, customer, "credits"] => (Route::Credits, source, customer),
        [source, customer, "events"] => (Route::Events, source, customer),
        [source, customer, "events", id, "replay"] => {
            (Route::ReplayEvent(decode(id)?), source, customer)
        }
        [source, customer, "usage"] => match *method {
            Method::POST => (Route::RecordUsage, source, customer),
            _ => (Route::ListUsage, source, customer),
        },
        [source, customer, "usage", id, "reversal"] => {
            (Route::ReverseUsage(decode(id)?), source, customer)
        }
        _ => return Err(not_found()),
    };
    let allowed = match route {
        Route::Account | Route::Feature(_) | Route::Credits | Route::Why | Route::Events => {
            *method == Method::GET
        }
        Route::ReplayEvent(_) | Route::ReverseUsage(_) => *method == Method::POST,
        Route::RecordUsage | Route::ListUsage => matches!(*method, Method::GET | Method::POST),
    };
    if !allowed {
        return Err(ApiError::MethodNotAllowed(method.clone()));
    }
    Ok((route, decode(source)?, decode(customer)?))
}

/// A debit's body, as sent: `{"amount": N, "period"?: "YYYY-MM", "note"?: "…", "unit"?:
/// "credits"}`, checked by [`DebitRequest::checked`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DebitBody {
    amount: Value,
    #[serde(default)]
    period: Option<String>,
    #[serde(default)]
    note: Option<String>,
    #[serde(default)]
    unit: Option<String>,
}

/// An `Idempotency-Key`, given once: 1 to 255 visible ASCII characters, no comma. Two headers
/// reach the function as two values here, but behind API Gateway as one: an HTTP API joins
/// repeated headers with commas ("Duplicate headers are combined with commas and included in
/// the headers field", AWS's "Create AWS Lambda proxy integrations for HTTP APIs in API
/// Gateway", payload format 2.0), so `k1,k2` would otherwise be one key of the two.
fn idempotency_key(headers: &HeaderMap) -> Result<&str, ApiError> {
    let mut given = headers.get_all("idempotency-key").iter();
    let raw = given.next().ok_or_else(|| {
        ApiError::bad(
            "missing_idempotency_key",
            "a debit needs an Idempotency-Key header",
        )
    })?;
    if given.next().is_some() {
        return Err(ApiError::bad(
            "bad_idempotency_key",
            "a debit has one Idempotency-Key header, not several",
        ));
    }
    let key = raw.to_str().map_err(|_| Invalid::Key)?;
    usage::check_key(key)?;
    if key.contains(',') {
        return Err(ApiError::bad(
            "bad_idempotency_key",
            "a debit has one Idempotency-Key, with no comma: two headers are joined into one \
             with commas on their way here",
        ));
    }
    Ok(key)
}

/// A period named by a request: a real month, not after the current one.
fn period_param(raw: Option<&str>, now: &Period) -> Result<Period, ApiError> {
    match raw {
        None => Ok(now.clone()),
        Some(raw) => Ok(usage::asked_period(raw, now)?),
    }
}

/// An `after` cursor as given: what no usage id can be is refused before the store is asked.
fn cursor_param(raw: Option<&str>) -> Result<Option<&str>, ApiError> {
    match raw {
        Some(after)
            if after.is_empty()
                || after.len() > MAX_CURSOR_LEN
                || after.chars().any(char::is_control) =>
        {
            Err(bad_cursor())
        }
        other => Ok(other),
    }
}

fn bad_cursor() -> ApiError {
    ApiError::bad(
        "bad_cursor",
        "after is the next of an earlier page of this account and period",
    )
}

/// A feature key named by a request's path: what no feature can be named (an empty key, one
/// too long, one with control characters) is refused before the store is asked
/// (`domain::features::check_key`, the catalog's rule too).
fn feature_key(raw: &str) -> Result<&str, ApiError> {
    features::check_key(raw).map_err(|e| {
        let detail = match e {
            BadKey::Blank => "a feature check names its key: …/features/{key}".to_owned(),
            BadKey::TooLong | BadKey::Control => e.to_string(),
        };
        ApiError::bad("bad_feature_key", detail)
    })?;
    Ok(raw)
}

/// What a debit's body is: a JSON object with the fields of [`DebitBody`]. serde would take a
/// JSON array as the fields in order (`[3, "2026-12", "note"]`) and a `null` as a field left
/// out; neither is what the contract says, so each is refused with its own code. The amount
/// comes as it was written (a whole number, checked with the rest by
/// [`DebitRequest::checked`]).
fn debit_body(body: &[u8]) -> Result<(i64, DebitBody), ApiError> {
    const SHAPE: &str = r#"{"amount": N, "period"?: "YYYY-MM", "note"?: "…", "unit"?: "credits"}"#;
    let bad_body = |e: serde_json::Error| {
        ApiError::bad(
            "bad_body",
            format!("the body is not {SHAPE}: {}", serde_error_words(&e)),
        )
    };
    let value: Value = serde_json::from_slice(body).map_err(bad_body)?;
    let fields = match &value {
        Value::Object(fields) => fields,
        Value::Array(_) | Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Null => {
            return Err(ApiError::bad(
                "body_not_object",
                format!(
                    "the body is JSON {}; a debit is an object, {SHAPE}",
                    kind_of(&value)
                ),
            ))
        }
    };
    if let Some(name) = ["period", "note", "unit"]
        .into_iter()
        .find(|name| fields.get(*name) == Some(&Value::Null))
    {
        return Err(ApiError::bad(
            "null_field",
            format!("{name} is a string or left out, not null"),
        ));
    }
    // Read again from the text, not the value: a field given twice is refused there (a map
    // keeps the last one silently).
    let parsed: DebitBody = serde_json::from_slice(body).map_err(bad_body)?;
    let amount = parsed.amount.as_i64().ok_or(Invalid::Amount)?;
    Ok((amount, parsed))
}

/// Answers a request for one of the app's routes (`body` within the size limit).
#[tracing::instrument(skip_all, fields(source, caller, route))]
pub(super) async fn serve(
    state: &ApiState,
    request: &Request,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let (route, source, customer) = route(request.method(), request.uri().path())?;
    let caller = authenticate(&state.keys, request.headers())?;
    let span = tracing::Span::current();
    span.record("caller", caller.name.as_str());
    span.record("source", source.as_str());
    span.record("route", route.name());
    match &route {
        // An admin key reads `why` of any account (the console's account page).
        Route::Why if caller.may(Scope::Admin) => {}
        Route::ReplayEvent(_) => require(caller, Scope::Replay)?,
        // A debit and its reversal need `usage` alone (docs/api.md, Keys).
        Route::RecordUsage | Route::ReverseUsage(_) => require(caller, Scope::Usage)?,
        _ => require(caller, Scope::Read)?,
    }
    let query = Query::of(request);
    query.check(route.parameters())?;
    let target = target(state, source, &customer, query.first("stripe_account"))?;
    let now = Period::of(state.clock.now().into());
    match route {
        Route::Account => {
            let period = period_param(query.first("period"), &now)?;
            Ok(json_response(
                StatusCode::OK,
                &account_value(state, &target, &period).await?,
            ))
        }
        Route::Feature(key) => {
            let key = feature_key(&key)?;
            // Features do not depend on the period: the current one is read, as any is.
            let snapshot = on_held!(state, conn => account::snapshot(
                conn,
                &target.source,
                target.customer_id(),
                &now,
                &state.catalog,
            ))?
            .ok_or_else(|| ApiError::UnknownCustomer(customer.clone()))?;
            Ok(json_response(StatusCode::OK, &feature_body(key, &snapshot)))
        }
        Route::Credits => {
            let at = time_param(&query, "at")?;
            Ok(json_response(
                StatusCode::OK,
                &credits_value(state, &target, at).await?,
            ))
        }
        Route::Why => {
            let cut = Cut {
                at: time_param(&query, "at")?,
                received_before: time_param(&query, "received_before")?,
            };
            Ok(json_response(
                StatusCode::OK,
                &why_value(state, &target, cut).await?,
            ))
        }
        Route::ListUsage => {
            let period = period_param(query.first("period"), &now)?;
            let limit = limit_param(query.first("limit"))?;
            let after = cursor_param(query.first("after"))?;
            let listed = on_held!(state, conn => usage::list(
                conn,
                &target.source,
                target.customer_id(),
                &period,
                limit,
                after,
            ))?;
            match listed {
                Listed::Page(page) => Ok(json_response(StatusCode::OK, &usage_page_body(&page))),
                Listed::UnknownCustomer => Err(ApiError::UnknownCustomer(customer.clone())),
                Listed::UnknownCursor => Err(bad_cursor()),
            }
        }
        Route::Events => {
            let limit = limit_param(query.first("limit"))?;
            let body = events_value(state, &target, limit, query.first("after")).await?;
            Ok(json_response(StatusCode::OK, &body))
        }
        Route::ReplayEvent(raw) => {
            let event_id = event_id_param(&raw)?;
            let scope = acts::Scope::Account {
                source: &target.source,
                customer: target.customer_id(),
            };
            let replay = acts::replay_event(
                &state.pool,
                state.events.as_ref(),
                &caller.name,
                scope,
                event_id,
            )
            .await
            .map_err(ApiError::Unavailable)?;
            let body = replayed(replay, || format!("no event {event_id} of this account"))?;
            Ok(json_response(StatusCode::OK, &body))
        }
        Route::RecordUsage => {
            let key = idempotency_key(request.headers())?;
            let (amount, body) = debit_body(body)?;
            let mut ask = DebitRequest::checked(
                &target.source,
                target.customer_id(),
                key,
                amount,
                body.period.as_deref(),
                body.note.as_deref(),
                body.unit.as_deref(),
                &now,
            )?;
            ask.effects = state.effects.as_ref().map(|_| &state.catalog);
            ask.meter = state.meters.get(&target.source).map(String::as_str);
            let debited = on_held!(state, conn => usage::debit(conn, &ask))?;
            tell(state, debited.told.as_ref(), debited.reported.as_ref()).await;
            debit_answer(debited.debit, ask.unit, &customer)
        }
        Route::ReverseUsage(usage_id) => {
            let usage_id = usage_id_param(&usage_id)?;
            let effects = state.effects.as_ref().map(|_| &state.catalog);
            let account = (target.source.as_str(), target.customer_id());
            let reversed =
                on_held!(state, conn => usage::reverse(conn, account, usage_id, effects, &now))?;
            tell(state, reversed.told.as_ref(), reversed.correction.as_ref()).await;
            reversal_answer(reversed.reversal, usage_id)
        }
    }
}

/// The account as `GET /v1/accounts/{source}/{customer}` answers it, for `period`.
pub(super) async fn account_value(
    state: &ApiState,
    target: &AccountRef,
    period: &Period,
) -> Result<Value, ApiError> {
    let snapshot = on_held!(state, conn => account::snapshot(
        conn,
        &target.source,
        target.customer_id(),
        period,
        &state.catalog,
    ))?
    .ok_or_else(|| ApiError::UnknownCustomer(target.customer().to_owned()))?;
    Ok(account_body(target, &snapshot))
}

/// The account's credits as `GET …/credits` answers them, as of `at` (the store's clock when
/// `None`): one statement, folded by `billing::credits`.
pub(super) async fn credits_value(
    state: &ApiState,
    target: &AccountRef,
    at: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<Value, ApiError> {
    let read = on_held!(state, conn => credits_read::read(
        conn,
        &target.source,
        target.customer_id(),
        at,
    ))?
    .ok_or_else(|| ApiError::UnknownCustomer(target.customer().to_owned()))?;
    Ok(credits_body(&read))
}

/// The credits read's answer (docs/api.md): the time it is as of, the balances and the grants.
pub fn credits_body(read: &AccountCredits) -> Value {
    let mut body = serde_json::to_value(read.view()).unwrap_or_else(|_| json!({}));
    body["at"] = json!(chrono::DateTime::from_timestamp(read.at, 0));
    body
}

/// A page of the account's event log as `GET …/events` answers it.
pub(super) async fn events_value(
    state: &ApiState,
    target: &AccountRef,
    limit: i64,
    after: Option<&str>,
) -> Result<Value, ApiError> {
    let after = match after {
        None => None,
        Some(raw) => Some(Place::parse(raw).ok_or_else(bad_log_cursor)?),
    };
    let (logged, known) = on_held!(state, conn => async {
        let logged = log::account_events(
            &mut *conn,
            &target.source,
            target.customer_id(),
            limit,
            after.as_ref(),
        )
        .await?;
        // An empty first page is a customer with no event, or no customer at all; so is a
        // place of no event of theirs.
        let known = matches!(&logged, log::Logged::Page(page) if !page.events.is_empty())
            || account::exists(&mut *conn, &target.source, target.customer_id()).await?;
        Ok((logged, known))
    })?;
    match (logged, known) {
        (_, false) => Err(ApiError::UnknownCustomer(target.customer().to_owned())),
        (log::Logged::Page(page), true) => Ok(json!(page)),
        (log::Logged::UnknownPlace, true) => Err(bad_log_cursor()),
    }
}

fn bad_log_cursor() -> ApiError {
    ApiError::bad(
        "bad_cursor",
        "after is the next of an earlier page of this account's log",
    )
}

/// The account's fields explained as `GET …/why` answers them, as of `cut`.
pub(super) async fn why_value(
    state: &ApiState,
    target: &AccountRef,
    cut: Cut,
) -> Result<Value, ApiError> {
    let why = on_held!(state, conn => async {
        // The store's failure is retried or answered as any read's; the rest is the
        // fold's own answer.
        match audit::why(
            conn,
            &state.fold_sources,
            &state.catalog,
            (&target.source, target.customer_id()),
            cut,
        )
        .await
        {
            Err(FoldError::Database(e)) => Err(e),
            other => Ok(other),
        }
    })?
    .map_err(|e| match e {
        FoldError::UnknownSource(source) => ApiError::UnknownSource(source),
        other => ApiError::NotFolded(other.to_string()),
    })?
    .ok_or_else(|| ApiError::UnknownCustomer(target.customer().to_owned()))?;
    let body = serde_json::to_value(&why).unwrap_or_else(|_| json!({}));
    Ok(as_the_app_names(target, body))
}

/// The account a route names: the source, and the customer in the connected Stripe account
/// `stripe_account` names, if any (only a Stripe source has those).
pub(super) fn target(
    state: &ApiState,
    source: String,
    customer: &str,
    stripe_account: Option<&str>,
) -> Result<AccountRef, ApiError> {
    let kind = state
        .sources
        .iter()
        .find(|(name, _)| *name == source)
        .map(|(_, kind)| *kind)
        .ok_or_else(|| ApiError::UnknownSource(source.clone()))?;
    account_of(source, kind, customer, stripe_account)
}

/// The account a route names in a source of `kind` (docs/design.md §4.6a): the path's
/// `customer` is the customer, whichever id it is (`cus_…`, or `acct_…` for a customer that
/// is an Account), and `stripe_account` the Connect platform's connected account it lives in;
/// the two are never read from each other.
fn account_of(
    source: String,
    kind: SourceKind,
    customer: &str,
    stripe_account: Option<&str>,
) -> Result<AccountRef, ApiError> {
    let not_connected = || {
        ApiError::bad(
            "bad_stripe_account",
            "stripe_account is a connected account's id, acct_…",
        )
    };
    match stripe_account {
        Some(_) if kind != SourceKind::Stripe => {
            return Err(ApiError::bad(
                "bad_stripe_account",
                format!("stripe_account is for a Stripe source; '{source}' is not one"),
            ))
        }
        Some(account) if !account.starts_with("acct_") => return Err(not_connected()),
        _ => {}
    }
    AccountRef::new(source, customer, stripe_account).map_err(|e| match e {
        AccountError::CustomerHasSeparator => ApiError::bad(
            "bad_customer",
            "a customer id has no '/'; name a connected account with ?stripe_account=acct_…",
        ),
        AccountError::Customer(e) => ApiError::bad("bad_customer", e.to_string()),
        AccountError::Connected(_) | AccountError::ConnectedHasSeparator => not_connected(),
    })
}

/// Hands what a debit or a reversal wrote for the dispatcher to its queue: the new effect
/// (`allowance_exhausted`, `usage_reversed`) and the meter report (or correction). Both are
/// committed with it; if the queue refuses one, the scheduler's rescue sends it.
async fn tell(state: &ApiState, told: Option<&String>, reported: Option<&String>) {
    if let (Some(queue), Some(id)) = (&state.effects, told) {
        let ids = std::slice::from_ref(id);
        if let Err(e) = queued::enqueue_or_unmark::<Effects>(&state.pool, queue, ids).await {
            tracing::warn!(effect_id = %id, error = format!("{e:#}"), "could not hand the effect to its queue");
        }
    }
    if let (Some(queue), Some(id)) = (&state.outbox, reported) {
        let ids = std::slice::from_ref(id);
        if let Err(e) = queued::enqueue_or_unmark::<MeterReports>(&state.pool, queue, ids).await {
            tracing::warn!(report_id = %id, error = format!("{e:#}"), "could not hand the meter report to its queue");
        }
    }
}

/// The account as the app reads it: the store's customer id split back into the customer
/// and its connected account.
fn account_body(target: &AccountRef, snapshot: &AccountSnapshot) -> Value {
    let mut body = serde_json::to_value(snapshot).unwrap_or_else(|_| json!({}));
    body["credits"] = json!(snapshot.credits);
    as_the_app_names(target, body)
}

/// A body whose `customer_id` is the store's, with the customer named as the app names it:
/// a Connect customer's `cus_…`, with `stripe_account` beside it.
fn as_the_app_names(target: &AccountRef, mut body: Value) -> Value {
    body["customer_id"] = json!(target.customer());
    if let Some(account) = target.connected_account() {
        body["stripe_account"] = json!(account);
    }
    body
}

/// A feature check's answer (docs/api.md): whether the account may use `key`, its value, and
/// where the value comes from with the event behind it; a feature the account lacks is not
/// allowed, with nulls. `inboxctl features --json` lists each feature so.
pub fn feature_body(key: &str, snapshot: &AccountSnapshot) -> Value {
    let (allowed, value, origin) = snapshot.feature(key);
    json!({
        "key": key,
        "allowed": allowed,
        "value": value,
        "source": origin.map(|o| o.source),
        "decided_by": origin.and_then(|o| o.decided_by.as_ref()),
    })
}

fn usage_page_body(page: &UsagePage) -> Value {
    json!({
        "period": page.period,
        "allowance": page.allowance,
        "used": page.used,
        "remaining": page.remaining,
        "usage": page.usage.iter().map(|line| json!({
            "usage_id": line.usage_id,
            "amount": line.amount,
            "unit": line.unit,
            "idempotency_key": line.idempotency_key,
            "note": line.note,
            "recorded_at": line.recorded_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        })).collect::<Vec<_>>(),
        "next": page.next,
    })
}

/// A usage id named by a reversal's path: what no usage id can be is refused before the
/// store is asked, as a cursor is.
fn usage_id_param(raw: &str) -> Result<&str, ApiError> {
    match raw.is_empty() || raw.len() > MAX_CURSOR_LEN || raw.chars().any(char::is_control) {
        true => Err(ApiError::bad(
            "bad_usage_id",
            "a reversal names the usage_id its debit was answered with",
        )),
        false => Ok(raw),
    }
}

fn reversal_answer(reversal: Reversal, usage_id: &str) -> Result<Response<Body>, ApiError> {
    match reversal {
        Reversal::Reversed { replayed, .. } => {
            let body = reversal.body().unwrap_or_default();
            let mut response = json_response(StatusCode::OK, &body);
            if replayed {
                mark_replayed(response.headers_mut());
            }
            Ok(response)
        }
        Reversal::UnknownUsage => Err(ApiError::Missing(format!(
            "no debit {usage_id} of this account"
        ))),
        Reversal::NotAccepted => Err(ApiError::NotAccepted(usage_id.to_owned())),
    }
}

fn debit_answer(debit: Debit, unit: &str, customer: &str) -> Result<Response<Body>, ApiError> {
    match debit {
        Debit::Accepted { replayed, .. } => {
            let body = debit.accepted_body(unit).unwrap_or_default();
            let mut response = json_response(StatusCode::OK, &body);
            if replayed {
                mark_replayed(response.headers_mut());
            }
            Ok(response)
        }
        Debit::Exhausted {
            remaining,
            replayed,
            remains,
        } => Err(ApiError::AllowanceExhausted {
            remaining,
            replayed,
            grants: remains.map(|r| r.grants).unwrap_or_default(),
        }),
        Debit::KeyConflict => Err(ApiError::IdempotencyConflict),
        Debit::CustomerDeleted => Err(ApiError::CustomerDeleted),
        Debit::UnknownCustomer => Err(ApiError::UnknownCustomer(customer.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_read_from_the_end_of_the_path_and_decoded() {
        let get = Method::GET;
        assert_eq!(
            route(&get, "/v1/accounts/kinde/kc_demo").unwrap(),
            (Route::Account, "kinde".into(), "kc_demo".into())
        );
        assert_eq!(
            route(&get, "/lambda-url/api/v1/accounts/kinde/kc%20x/usage").unwrap(),
            (Route::ListUsage, "kinde".into(), "kc x".into())
        );
        assert_eq!(
            route(&Method::POST, "/v1/accounts/stripe/cus_1/usage/")
                .unwrap()
                .0,
            Route::RecordUsage
        );
        assert_eq!(
            route(&get, "/v1/accounts/stripe/cus_1/why").unwrap().0,
            Route::Why
        );
        assert_eq!(
            route(&get, "/v1/accounts/stripe/cus_1/features/team%20seats").unwrap(),
            (
                Route::Feature("team seats".into()),
                "stripe".into(),
                "cus_1".into()
            )
        );
        assert_eq!(
            route(&get, "/v1/accounts/stripe/cus_1/features/")
                .unwrap()
                .0,
            Route::Feature(String::new())
        );
        assert!(matches!(
            route(&Method::POST, "/v1/accounts/stripe/cus_1/features/sso"),
            Err(ApiError::MethodNotAllowed(_))
        ));
        assert!(matches!(
            route(&get, "/v1/accounts/stripe/cus_1/features/sso/more"),
            Err(ApiError::NotFound { .. })
        ));
        assert!(matches!(
            route(&Method::POST, "/v1/accounts/stripe/cus_1/why"),
            Err(ApiError::MethodNotAllowed(_))
        ));
        assert_eq!(
            route(&get, "/v1/accounts/stripe/cus_1/credits").unwrap(),
            (Route::Credits, "stripe".into(), "cus_1".into())
        );
        assert!(matches!(
            route(&Method::POST, "/v1/accounts/stripe/cus_1/credits"),
            Err(ApiError::MethodNotAllowed(_))
        ));
        assert!(matches!(
            route(&Method::POST, "/v1/accounts/kinde/kc_demo"),
            Err(ApiError::MethodNotAllowed(_))
        ));
        assert_eq!(
            route(&get, "/v1/accounts/kinde/kc_1/events").unwrap().0,
            Route::Events
        );
        assert_eq!(
            route(&Method::POST, "/v1/accounts/kinde/kc_1/events/42/replay").unwrap(),
            (
                Route::ReplayEvent("42".into()),
                "kinde".into(),
                "kc_1".into()
            )
        );
        assert!(matches!(
            route(&get, "/v1/accounts/kinde/kc_1/events/42/replay"),
            Err(ApiError::MethodNotAllowed(_))
        ));
        assert!(matches!(
            route(&Method::POST, "/v1/accounts/kinde/kc_1/events"),
            Err(ApiError::MethodNotAllowed(_))
        ));
        assert!(matches!(
            route(&get, "/webhooks/kinde"),
            Err(ApiError::NotFound { .. })
        ));
        assert!(matches!(
            route(&get, "/v1/accounts/kinde"),
            Err(ApiError::NotFound { .. })
        ));
    }

    /// A customer that is an Account is named by its `acct_…` in the path; a connected
    /// account only by `stripe_account` (docs/design.md §4.6a).
    #[test]
    fn a_customer_that_is_an_account_is_the_paths_customer_and_a_connected_account_the_querys() {
        let get = Method::GET;
        assert_eq!(
            route(&get, "/v1/accounts/stripe/acct_cust/why").unwrap(),
            (Route::Why, "stripe".into(), "acct_cust".into())
        );
        let own = account_of("stripe".into(), SourceKind::Stripe, "acct_cust", None).unwrap();
        assert_eq!(own.customer_id().as_str(), "acct_cust");
        assert_eq!(own.customer(), "acct_cust");
        assert_eq!(own.connected_account(), None);
        let connected = account_of(
            "stripe".into(),
            SourceKind::Stripe,
            "acct_cust",
            Some("acct_platformconnected"),
        )
        .unwrap();
        assert_eq!(
            connected.customer_id().as_str(),
            "acct_platformconnected/acct_cust"
        );
        assert_eq!(connected.customer(), "acct_cust");
        assert_eq!(
            connected.connected_account(),
            Some("acct_platformconnected")
        );
        let joined = account_of(
            "stripe".into(),
            SourceKind::Stripe,
            "acct_platformconnected/acct_cust",
            None,
        );
        assert!(
            matches!(joined, Err(ApiError::BadRequest { .. })),
            "{joined:?}"
        );
        let not_stripe = account_of(
            "polar".into(),
            SourceKind::StandardWebhooks,
            "acct_cust",
            Some("acct_1"),
        );
        assert!(
            matches!(not_stripe, Err(ApiError::BadRequest { .. })),
            "{not_stripe:?}"
        );
    }

    #[test]
    fn an_idempotency_key_is_one_to_255_visible_ascii_characters() {
        let with = |values: &[&[u8]]| {
            let mut headers = HeaderMap::new();
            for value in values {
                headers.append(
                    "idempotency-key",
                    http::HeaderValue::from_bytes(value).unwrap(),
                );
            }
            idempotency_key(&headers).map(str::to_owned)
        };
        assert_eq!(with(&[b"order-17"]).unwrap(), "order-17");
        assert!(with(&[&[b'k'; 255]]).is_ok());
        assert!(with(&[&[b'k'; 256]]).is_err());
        assert!(with(&[b"two words"]).is_err());
        assert!(with(&["caf\u{e9}".as_bytes()]).is_err());
        assert!(
            with(&[b"order-17", b"order-18"]).is_err(),
            "one key, not two"
        );
        assert!(
            with(&[b"order-17,order-18"]).is_err(),
            "one key, not two joined by API Gateway"
        );
        assert!(matches!(
            idempotency_key(&HeaderMap::new()),
            Err(ApiError::BadRequest {
                code: "missing_idempotency_key",
                ..
            })
        ));
    }

    #[test]
    fn a_debit_body_is_an_object_with_a_whole_amount_and_no_null_fields() {
        let (amount, body) = debit_body(br#"{"amount":3}"#).unwrap();
        assert_eq!((amount, body.period, body.note), (3, None, None));
        let (_, body) = debit_body(br#"{"amount":3,"period":"2026-11","note":"x"}"#).unwrap();
        assert_eq!(
            (body.period.as_deref(), body.note.as_deref()),
            (Some("2026-11"), Some("x"))
        );
        let code = |body: &[u8]| match debit_body(body) {
            Err(ApiError::BadRequest { code, .. }) => code,
            other => panic!("{other:?}"),
        };
        assert_eq!(code(br#"{"amount":1.5}"#), "bad_amount");
        assert_eq!(code(br#"{"amount":"3"}"#), "bad_amount");
        assert_eq!(code(br#"{"amount":null}"#), "bad_amount");
        assert_eq!(code(br#"[3, "2026-12", "note"]"#), "body_not_object");
        assert_eq!(code(br#"3"#), "body_not_object");
        assert_eq!(code(b"null"), "body_not_object");
        assert_eq!(code(br#"{"amount":3,"period":null}"#), "null_field");
        assert_eq!(code(br#"{"amount":3,"note":null}"#), "null_field");
        assert_eq!(code(br#"{"amount":3,"amount":4}"#), "bad_body");
        assert_eq!(code(br#"{"amount":3,"extra":1}"#), "bad_body");
        assert_eq!(code(b"not json"), "bad_body");
    }

    #[test]
    fn a_route_takes_its_own_parameters_each_once() {
        let query = |pairs: &[(&str, &str)]| {
            Query(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        let code = |q: Query, route: Route| match q.check(route.parameters()) {
            Err(ApiError::BadRequest { code, .. }) => code,
            other => panic!("{other:?}"),
        };
        assert!(
            query(&[("period", "2026-11"), ("limit", "5"), ("after", "use_1")])
                .check(Route::ListUsage.parameters())
                .is_ok()
        );
        assert!(query(&[("at", "2026-11-01T00:00:00Z")])
            .check(Route::Why.parameters())
            .is_ok());
        assert_eq!(
            code(query(&[("perod", "2026-11")]), Route::Account),
            "unknown_parameter"
        );
        assert_eq!(
            code(query(&[("period", "2026-11")]), Route::RecordUsage),
            "unknown_parameter"
        );
        assert_eq!(
            code(
                query(&[("period", "2026-11")]),
                Route::Feature("sso".into())
            ),
            "unknown_parameter"
        );
        assert!(query(&[("stripe_account", "acct_1")])
            .check(Route::Feature("sso".into()).parameters())
            .is_ok());
        assert_eq!(
            code(
                query(&[("period", "2026-10"), ("period", "2026-11")]),
                Route::Account
            ),
            "repeated_parameter"
        );
    }

    #[test]
    fn a_feature_key_that_no_feature_can_have_is_refused_by_name() {
        assert_eq!(feature_key("sso").unwrap(), "sso");
        for bad in ["", " ", "a\u{0}b", "\u{1b}[2J", &"k".repeat(256)] {
            assert!(
                matches!(
                    feature_key(bad),
                    Err(ApiError::BadRequest {
                        code: "bad_feature_key",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_cursor_that_no_usage_id_can_be_is_refused_before_the_store_is_asked() {
        assert_eq!(cursor_param(None).unwrap(), None);
        assert_eq!(cursor_param(Some("use_1")).unwrap(), Some("use_1"));
        for bad in ["", "use_\u{0}1", &"u".repeat(101)] {
            assert!(cursor_param(Some(bad)).is_err(), "{bad:?}");
        }
    }
}
