//! The app API's handler (docs/design.md §12, docs/api.md): route, authenticate the caller
//! by its key's scopes, read the account (or one of its features) or debit its allowance
//! through billing's `account` and `usage`, answer. Every error is mapped to its status code in one place, and every
//! answer comes within the invocation's time. No SQL and no billing rule lives here.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use http::{HeaderMap, Method, StatusCode};
use lambda_http::{Body, Request, RequestExt, Response};

use serde::Deserialize;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::time::Instant;

use super::{body_bytes, json_response};
use crate::audit::{self, Cut, FoldError};
use crate::billing::account::{self, AccountSnapshot};
use crate::billing::usage::{self, Debit, DebitRequest, Debited, Invalid, Listed, UsagePage};
use crate::domain::features::{self, BadKey};
use crate::domain::Catalog;
use crate::domain::{AccountError, AccountRef, Period, SourceKind};
use crate::platform::api_keys::{Caller, Keys, Scope};
use crate::platform::config::ApiConfig;
use crate::platform::db::{Held, HeldConnection};
use crate::platform::queue::Queue;

pub use crate::billing::usage::{MAX_AMOUNT, MAX_KEY_LEN, MAX_NOTE_CHARS};

/// Largest request body accepted: a debit is a few dozen bytes.
pub const MAX_BODY_BYTES: usize = 4096;
/// The longest `after` cursor: a usage id is 36 characters.
const MAX_CURSOR_LEN: usize = 100;
/// A usage page's default and largest sizes.
pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 100;
/// The time an answer may take when the invocation sets no deadline (`cargo lambda watch`).
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(5);
/// What is kept back from the invocation's deadline to send the answer.
const ANSWER_MARGIN: Duration = Duration::from_millis(250);
/// Seconds a caller is asked to wait before retrying when the store cannot answer.
pub const RETRY_AFTER_SECS: u64 = 2;

/// The clock that says which month a request arrives in: the system's, or one a test sets
/// (a debit at 23:59:59.9 and its retry at 00:00:01, without waiting for midnight).
#[derive(Debug, Clone, Default)]
pub enum Clock {
    #[default]
    System,
    Set(SetClock),
}

impl Clock {
    pub fn now(&self) -> DateTime<Utc> {
        match self {
            Self::System => Utc::now(),
            Self::Set(clock) => clock.now(),
        }
    }
}

/// A clock that shows the time it was last set to.
#[derive(Debug, Clone)]
pub struct SetClock(Arc<Mutex<DateTime<Utc>>>);

impl SetClock {
    pub fn at(time: DateTime<Utc>) -> Self {
        Self(Arc::new(Mutex::new(time)))
    }

    pub fn set(&self, time: DateTime<Utc>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = time;
    }

    pub fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub struct ApiState {
    /// The instance's own connection: one round trip per read.
    pub conn: Held,
    /// For what is rare (unmarking an effect the queue refused).
    pub pool: PgPool,
    pub sources: Vec<(String, SourceKind)>,
    /// The same sources with their Stripe modes, as the fold `…/why` explains takes them.
    pub fold_sources: audit::Sources,
    pub catalog: Catalog,
    pub keys: Keys,
    /// Effects on: the queue an `allowance_exhausted` effect's id is handed to.
    pub effects: Option<Queue>,
    /// The current month's clock.
    pub clock: Clock,
}

impl ApiState {
    /// Builds the connection settings, reads the keys (from their secret, when they are in
    /// one) and the effects queue once, at cold start; nothing connects to Postgres before
    /// the first request.
    pub async fn from_config(config: &ApiConfig) -> anyhow::Result<Self> {
        crate::providers::check_sources(&config.sources)?;
        let database = crate::platform::database::Database::open(&config.database).await?;
        let pool = database.pool(1);
        let entries = crate::platform::secrets::resolve_api_keys(&config.keys).await?;
        let effects = match &config.effects {
            Some(effects) => Some(Queue::from_env(effects.queue_url.clone()).await),
            None => None,
        };
        Ok(Self {
            conn: Held::on(database),
            pool,
            sources: config
                .sources
                .iter()
                .map(|s| (s.name.clone(), s.kind))
                .collect(),
            fold_sources: audit::sources_of(&config.sources),
            catalog: config.catalog.clone(),
            keys: Keys::new(&entries),
            effects,
            clock: Clock::System,
        })
    }
}

/// Everything the API can answer besides success, mapped to a status in one place.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("no route for {method} {path}")]
    NotFound { method: Method, path: String },
    #[error("{0} is not allowed here")]
    MethodNotAllowed(Method),
    #[error("a valid API key is required: Authorization: Bearer <key>")]
    Unauthorized,
    #[error("this key lacks the '{0}' scope")]
    Forbidden(&'static str),
    #[error("unknown source '{0}'")]
    UnknownSource(String),
    #[error("no customer '{0}' in this source")]
    UnknownCustomer(String),
    #[error("{detail}")]
    BadRequest { code: &'static str, detail: String },
    #[error("the body is {0} bytes; the limit is {MAX_BODY_BYTES}")]
    PayloadTooLarge(usize),
    #[error("the period's allowance has {remaining} left")]
    AllowanceExhausted { remaining: i64, replayed: bool },
    #[error("the customer is deleted")]
    CustomerDeleted,
    #[error("this Idempotency-Key was used with another request body")]
    IdempotencyConflict,
    #[error("{0}")]
    NotFolded(String),
    #[error("the billing state could not be reached; retry later")]
    Unavailable(#[source] sqlx::Error),
    #[error("no answer in time; retry later")]
    Timeout,
}

impl From<Invalid> for ApiError {
    fn from(invalid: Invalid) -> Self {
        Self::bad(invalid.code(), invalid.to_string())
    }
}

impl ApiError {
    fn bad(code: &'static str, detail: impl Into<String>) -> Self {
        Self::BadRequest {
            code,
            detail: detail.into(),
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            Self::NotFound { .. } | Self::UnknownSource(_) | Self::UnknownCustomer(_) => {
                StatusCode::NOT_FOUND
            }
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::AllowanceExhausted { .. } | Self::CustomerDeleted => StatusCode::CONFLICT,
            Self::IdempotencyConflict | Self::NotFolded(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable(_) | Self::Timeout => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "not_found",
            Self::MethodNotAllowed(_) => "method_not_allowed",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden(_) => "forbidden",
            Self::UnknownSource(_) => "unknown_source",
            Self::UnknownCustomer(_) => "unknown_customer",
            Self::BadRequest { code, .. } => code,
            Self::PayloadTooLarge(_) => "payload_too_large",
            Self::AllowanceExhausted { .. } => "allowance_exhausted",
            Self::CustomerDeleted => "customer_deleted",
            Self::IdempotencyConflict => "idempotency_conflict",
            Self::NotFolded(_) => "not_folded",
            Self::Unavailable(_) => "unavailable",
            Self::Timeout => "timeout",
        }
    }

    /// The answer: 4xx say what was wrong, 5xx say nothing of the cause (it goes to the log).
    pub fn into_response(self) -> Response<Body> {
        let status = self.status();
        match &self {
            Self::Unavailable(e) => tracing::error!(error = %e, code = self.code(), "api failed"),
            Self::Timeout => tracing::error!(code = self.code(), "api answered late"),
            _ => tracing::info!(code = self.code(), detail = %self, "request refused"),
        }
        if status.is_server_error() {
            // The alarm's count (ApiServerErrorsAlarm): API Gateway's own 5xx metric mixes the
            // webhook route in.
            println!("{}", server_error_metric(self.code(), chrono::Utc::now()));
        }
        let mut body = json!({"code": self.code(), "detail": self.to_string()});
        if let Self::AllowanceExhausted { remaining, .. } = &self {
            body["remaining"] = json!(remaining);
        }
        let mut response = json_response(status, &body);
        let headers = response.headers_mut();
        match &self {
            Self::Unavailable(_) | Self::Timeout => {
                headers.insert(http::header::RETRY_AFTER, RETRY_AFTER_SECS.into());
            }
            Self::Unauthorized => {
                headers.insert(
                    http::header::WWW_AUTHENTICATE,
                    http::HeaderValue::from_static("Bearer"),
                );
            }
            Self::AllowanceExhausted { replayed: true, .. } => mark_replayed(headers),
            _ => {}
        }
        response
    }
}

/// The Embedded Metric Format line for a 5xx answer: `ApiServerErrors` by `Stack`, with its
/// code as a field.
pub fn server_error_metric(code: &str, now: chrono::DateTime<chrono::Utc>) -> Value {
    let mut line = crate::platform::metrics::document(now, &[&[]], &[("ApiServerErrors", "Count")]);
    line["Code"] = json!(code);
    line["ApiServerErrors"] = json!(1);
    line
}

/// Stripe's header for an answer given before, under the same key.
fn mark_replayed(headers: &mut HeaderMap) {
    headers.insert(
        "idempotent-replayed",
        http::HeaderValue::from_static("true"),
    );
}

/// What a request asks for, once routed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Account,
    /// One feature of the account, by its key as the path gives it (decoded, not checked yet).
    Feature(String),
    Why,
    RecordUsage,
    ListUsage,
}

impl Route {
    /// Its name in the log (a feature's key is the request's, so not part of it).
    fn name(&self) -> &'static str {
        match self {
            Self::Account => "Account",
            Self::Feature(_) => "Feature",
            Self::Why => "Why",
            Self::RecordUsage => "RecordUsage",
            Self::ListUsage => "ListUsage",
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
            Self::Why => &["at", "received_before", "stripe_account"],
            Self::RecordUsage => &["stripe_account"],
            Self::ListUsage => &["period", "limit", "after", "stripe_account"],
        }
    }
}

/// The route and its path's source and customer, from a path ending in
/// `/v1/accounts/{source}/{customer}[/usage|/why|/features/{key}]` (API Gateway's path, or
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
        [source, customer, "usage"] => match *method {
            Method::POST => (Route::RecordUsage, source, customer),
            _ => (Route::ListUsage, source, customer),
        },
        _ => return Err(not_found()),
    };
    let allowed = match route {
        Route::Account | Route::Feature(_) | Route::Why => *method == Method::GET,
        Route::RecordUsage | Route::ListUsage => matches!(*method, Method::GET | Method::POST),
    };
    if !allowed {
        return Err(ApiError::MethodNotAllowed(method.clone()));
    }
    Ok((route, decode(source)?, decode(customer)?))
}

/// The caller behind `Authorization: Bearer <key>`, if the key is one of the listed ones.
fn authenticate<'a>(keys: &'a Keys, headers: &HeaderMap) -> Result<&'a Caller, ApiError> {
    let header = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or(ApiError::Unauthorized)?;
    let (scheme, key) = header
        .trim()
        .split_once(' ')
        .ok_or(ApiError::Unauthorized)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(ApiError::Unauthorized);
    }
    keys.check(key.trim()).ok_or(ApiError::Unauthorized)
}

fn require(caller: &Caller, scope: Scope) -> Result<(), ApiError> {
    match caller.may(scope) {
        true => Ok(()),
        false => Err(ApiError::Forbidden(scope.as_str())),
    }
}

/// A request's query parameters, from its URI (API Gateway and function URLs put the raw
/// query string there) or, when it has none, from what the Lambda event listed.
struct Query(Vec<(String, String)>);

impl Query {
    fn of(request: &Request) -> Self {
        if let Some(raw) = request.uri().query().filter(|q| !q.is_empty()) {
            let pairs = url::form_urlencoded::parse(raw.as_bytes())
                .into_owned()
                .collect();
            return Self(pairs);
        }
        let listed = request.query_string_parameters();
        Self(
            listed
                .iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    /// The value of `name`, once checked by [`Query::check`] to be given at most once.
    fn first(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Each parameter is one `route` takes, and is given once: of two values, neither is
    /// known to be the one meant.
    fn check(&self, route: &Route) -> Result<(), ApiError> {
        let taken = route.parameters();
        for (i, (name, _)) in self.0.iter().enumerate() {
            if !taken.contains(&name.as_str()) {
                let name: String = name.chars().take(40).collect();
                return Err(ApiError::bad(
                    "unknown_parameter",
                    format!(
                        "this route takes no parameter '{}'; it takes {}",
                        name.escape_debug(),
                        taken.join(", ")
                    ),
                ));
            }
            if self.0[..i].iter().any(|(seen, _)| seen == name) {
                return Err(ApiError::bad(
                    "repeated_parameter",
                    format!("{name} is given more than once"),
                ));
            }
        }
        Ok(())
    }
}

/// A debit's body, as sent: `{"amount": N, "period"?: "YYYY-MM", "note"?: "…"}`, checked by
/// [`DebitRequest::checked`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DebitBody {
    amount: Value,
    #[serde(default)]
    period: Option<String>,
    #[serde(default)]
    note: Option<String>,
}

/// An `Idempotency-Key`, given once: 1 to 255 visible ASCII characters.
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

/// A time named by a request: RFC 3339.
fn time_param(
    query: &Query,
    name: &'static str,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, ApiError> {
    let Some(raw) = query.first(name) else {
        return Ok(None);
    };
    chrono::DateTime::parse_from_rfc3339(raw)
        .map(|t| Some(t.with_timezone(&chrono::Utc)))
        .map_err(|_| {
            ApiError::bad(
                "bad_time",
                format!("{name} is an RFC 3339 time (2026-03-05T10:00:00Z), not '{raw}'"),
            )
        })
}

/// What a debit's body is: a JSON object with the fields of [`DebitBody`]. serde would take a
/// JSON array as the fields in order (`[3, "2026-12", "note"]`) and a `null` as a field left
/// out; neither is what the contract says, so each is refused with its own code. The amount
/// comes as it was written (a whole number, checked with the rest by
/// [`DebitRequest::checked`]).
fn debit_body(body: &[u8]) -> Result<(i64, DebitBody), ApiError> {
    const SHAPE: &str = r#"{"amount": N, "period"?: "YYYY-MM", "note"?: "…"}"#;
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
    if let Some(name) = ["period", "note"]
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

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Object(_) => "an object",
        Value::Array(_) => "an array",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
    }
}

/// What serde says of a body, without quoting the body.
fn serde_error_words(e: &serde_json::Error) -> String {
    match e.classify() {
        serde_json::error::Category::Data => e.to_string(),
        _ => format!("not JSON (line {}, column {})", e.line(), e.column()),
    }
}

/// Runs one library call (`conn => call`) on the held connection, once more on a new
/// connection when the first is found broken (an instance frozen while Postgres closed it).
/// Reads are safe to repeat, and so are debits: the key answers a repeat the same way.
macro_rules! on_held {
    ($state:expr, $conn:ident => $call:expr) => {{
        let mut held = $state.conn.lock().await;
        let mut retried = false;
        loop {
            let result = match held.get().await {
                Ok($conn) => $call.await,
                Err(e) => Err(e),
            };
            if let Some(answer) = settle(&mut held, &mut retried, result) {
                break answer;
            }
        }
    }};
}

/// What a call on the held connection comes to: its value, a retry (`None`: the connection
/// broke and this was the first try), or the store's failure.
fn settle<T>(
    held: &mut HeldConnection<'_>,
    retried: &mut bool,
    result: Result<T, sqlx::Error>,
) -> Option<Result<T, ApiError>> {
    match result {
        Ok(value) => Some(Ok(value)),
        Err(e) if is_connection_error(&e) && !*retried => {
            held.discard();
            tracing::info!(error = %e, "the held connection failed; trying a new one");
            *retried = true;
            None
        }
        Err(e) => {
            if is_connection_error(&e) {
                held.discard();
            }
            Some(Err(ApiError::Unavailable(e)))
        }
    }
}

/// Handles one HTTP request within `until` (the invocation's deadline; [`DEFAULT_BUDGET`]
/// from now without one); every outcome is an HTTP answer.
pub async fn handle(state: &ApiState, request: Request, until: Option<Instant>) -> Response<Body> {
    let until = until.map_or_else(
        || Instant::now() + DEFAULT_BUDGET,
        |until| until.checked_sub(ANSWER_MARGIN).unwrap_or(until),
    );
    let answer = match tokio::time::timeout_at(until, serve(state, &request)).await {
        Ok(answer) => answer,
        Err(_) => {
            // A statement cut off mid-way leaves its connection in no known state.
            state.conn.lock().await.discard();
            Err(ApiError::Timeout)
        }
    };
    answer.unwrap_or_else(ApiError::into_response)
}

#[tracing::instrument(skip_all, fields(source, caller, route))]
async fn serve(state: &ApiState, request: &Request) -> Result<Response<Body>, ApiError> {
    let body = body_bytes(request.body());
    if body.len() > MAX_BODY_BYTES {
        return Err(ApiError::PayloadTooLarge(body.len()));
    }
    let (route, source, customer) = route(request.method(), request.uri().path())?;
    let caller = authenticate(&state.keys, request.headers())?;
    let span = tracing::Span::current();
    span.record("caller", caller.name.as_str());
    span.record("source", source.as_str());
    span.record("route", route.name());
    require(caller, Scope::Read)?;
    let query = Query::of(request);
    query.check(&route)?;
    let target = target(state, source, &customer, query.first("stripe_account"))?;
    let now = Period::of(state.clock.now().into());
    match route {
        Route::Account => {
            let period = period_param(query.first("period"), &now)?;
            let snapshot = on_held!(state, conn => account::snapshot(
                conn,
                &target.source,
                target.customer_id(),
                &period,
                &state.catalog,
            ))?
            .ok_or_else(|| ApiError::UnknownCustomer(customer.clone()))?;
            Ok(json_response(
                StatusCode::OK,
                &account_body(&target, &snapshot),
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
        Route::Why => {
            let cut = Cut {
                at: time_param(&query, "at")?,
                received_before: time_param(&query, "received_before")?,
            };
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
            .ok_or_else(|| ApiError::UnknownCustomer(customer.clone()))?;
            let body = serde_json::to_value(&why).unwrap_or_else(|_| json!({}));
            Ok(json_response(
                StatusCode::OK,
                &as_the_app_names(&target, body),
            ))
        }
        Route::ListUsage => {
            let period = period_param(query.first("period"), &now)?;
            let limit = match query.first("limit") {
                None => DEFAULT_LIMIT,
                Some(raw) => raw
                    .parse::<i64>()
                    .ok()
                    .filter(|l| (1..=MAX_LIMIT).contains(l))
                    .ok_or_else(|| {
                        ApiError::bad("bad_limit", format!("limit is from 1 to {MAX_LIMIT}"))
                    })?,
            };
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
        Route::RecordUsage => {
            require(caller, Scope::Usage)?;
            let key = idempotency_key(request.headers())?;
            let (amount, body) = debit_body(body)?;
            let mut ask = DebitRequest::checked(
                &target.source,
                target.customer_id(),
                key,
                amount,
                body.period.as_deref(),
                body.note.as_deref(),
                &now,
            )?;
            ask.effects = state.effects.as_ref().map(|_| &state.catalog);
            let debited = on_held!(state, conn => usage::debit(conn, &ask))?;
            tell(state, &debited).await;
            debit_answer(debited.debit, &customer)
        }
    }
}

/// The account a route names: the source, and the customer in the connected Stripe account
/// `stripe_account` names, if any (only a Stripe source has those).
fn target(
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

fn is_connection_error(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
    )
}

/// Hands a new `allowance_exhausted` effect to the dispatcher's queue. The effect is
/// committed with the debit; if the queue refuses it, the scheduler's rescue sends it.
async fn tell(state: &ApiState, debited: &Debited) {
    let (Some(queue), Some(id)) = (&state.effects, &debited.told) else {
        return;
    };
    let ids = std::slice::from_ref(id);
    if let Err(e) = crate::effects::outbox::enqueue_or_unmark(&state.pool, queue, ids).await {
        tracing::warn!(effect_id = %id, error = format!("{e:#}"), "could not hand the effect to its queue");
    }
}

/// The account as the app reads it: the store's customer id split back into the customer
/// and its connected account.
fn account_body(target: &AccountRef, snapshot: &AccountSnapshot) -> Value {
    as_the_app_names(
        target,
        serde_json::to_value(snapshot).unwrap_or_else(|_| json!({})),
    )
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
            "idempotency_key": line.idempotency_key,
            "note": line.note,
            "recorded_at": line.recorded_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        })).collect::<Vec<_>>(),
        "next": page.next,
    })
}

fn debit_answer(debit: Debit, customer: &str) -> Result<Response<Body>, ApiError> {
    match debit {
        Debit::Accepted { replayed, .. } => {
            let body = debit.accepted_body().unwrap_or_default();
            let mut response = json_response(StatusCode::OK, &body);
            if replayed {
                mark_replayed(response.headers_mut());
            }
            Ok(response)
        }
        Debit::Exhausted {
            remaining,
            replayed,
        } => Err(ApiError::AllowanceExhausted {
            remaining,
            replayed,
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
        assert!(matches!(
            route(&Method::POST, "/v1/accounts/kinde/kc_demo"),
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
        let code = |q: Query, route: Route| match q.check(&route) {
            Err(ApiError::BadRequest { code, .. }) => code,
            other => panic!("{other:?}"),
        };
        assert!(
            query(&[("period", "2026-11"), ("limit", "5"), ("after", "use_1")])
                .check(&Route::ListUsage)
                .is_ok()
        );
        assert!(query(&[("at", "2026-11-01T00:00:00Z")])
            .check(&Route::Why)
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
            .check(&Route::Feature("sso".into()))
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
