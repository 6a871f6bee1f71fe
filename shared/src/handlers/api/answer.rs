//! What every route of the API shares: its errors and their statuses, the caller's key and
//! scopes, the query's parameters, and the held connection's one retry (docs/design.md §12.3).

use std::time::Duration;

use http::{HeaderMap, Method, StatusCode};
use lambda_http::{Body, Request, RequestExt, Response};
use serde_json::{json, Value};

use super::super::json_response;
use crate::billing::usage::Invalid;
use crate::operate::acts::Replay;
use crate::platform::api_keys::{Caller, Keys, Scope};
use crate::platform::db::HeldConnection;

/// Largest request body accepted: a debit is a few dozen bytes.
pub const MAX_BODY_BYTES: usize = 4096;
/// The longest `after` cursor: a usage id is 36 characters.
pub(super) const MAX_CURSOR_LEN: usize = 100;
/// A usage page's default and largest sizes.
pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 100;
/// The time an answer may take when the invocation sets no deadline (`cargo lambda watch`).
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(5);
/// What is kept back from the invocation's deadline to send the answer.
pub(super) const ANSWER_MARGIN: Duration = Duration::from_millis(250);
/// Seconds a caller is asked to wait before retrying when the store cannot answer.
pub const RETRY_AFTER_SECS: u64 = 2;

/// Everything the API can answer besides success, mapped to a status in one place.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("no route for {method} {path}")]
    NotFound { method: Method, path: String },
    /// A thing the route names is not there (or is another account's, told the same way).
    #[error("{0}")]
    Missing(String),
    #[error("the event's body was purged; there is nothing left to replay")]
    Purged,
    #[error("this key has had its replays for the minute; retry in {0} s")]
    RateLimited(u64),
    #[error(transparent)]
    EngineRoom(#[from] crate::handlers::engine_room::EngineError),
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
    #[error(
        "the period's allowance has {remaining} left, and the grants of the debit's unit {}",
        grants_left(grants)
    )]
    AllowanceExhausted {
        remaining: i64,
        replayed: bool,
        /// What each grant of the debit's unit still had, in the burn order.
        grants: Vec<crate::billing::usage::GrantRemaining>,
    },
    #[error("the customer is deleted")]
    CustomerDeleted,
    #[error("the debit {0} was refused: it spent nothing, so there is nothing to reverse")]
    NotAccepted(String),
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
    pub(super) fn bad(code: &'static str, detail: impl Into<String>) -> Self {
        Self::BadRequest {
            code,
            detail: detail.into(),
        }
    }

    pub(super) fn status(&self) -> StatusCode {
        match self {
            Self::NotFound { .. }
            | Self::Missing(_)
            | Self::UnknownSource(_)
            | Self::UnknownCustomer(_) => StatusCode::NOT_FOUND,
            Self::Purged => StatusCode::CONFLICT,
            Self::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::EngineRoom(e) => e.status(),
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::AllowanceExhausted { .. } | Self::CustomerDeleted | Self::NotAccepted(_) => {
                StatusCode::CONFLICT
            }
            Self::IdempotencyConflict | Self::NotFolded(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable(_) | Self::Timeout => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    pub(super) fn code(&self) -> &'static str {
        match self {
            Self::NotFound { .. } | Self::Missing(_) => "not_found",
            Self::Purged => "event_purged",
            Self::RateLimited(_) => "rate_limited",
            Self::EngineRoom(e) => e.code(),
            Self::MethodNotAllowed(_) => "method_not_allowed",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden(_) => "forbidden",
            Self::UnknownSource(_) => "unknown_source",
            Self::UnknownCustomer(_) => "unknown_customer",
            Self::BadRequest { code, .. } => code,
            Self::PayloadTooLarge(_) => "payload_too_large",
            Self::AllowanceExhausted { .. } => "allowance_exhausted",
            Self::CustomerDeleted => "customer_deleted",
            Self::NotAccepted(_) => "not_accepted",
            Self::IdempotencyConflict => "idempotency_conflict",
            Self::NotFolded(_) => "not_folded",
            Self::Unavailable(_) => "unavailable",
            Self::Timeout => "timeout",
        }
    }

    /// The answer: 4xx say what was wrong, 5xx say nothing of the cause (it goes to the log).
    pub fn into_response(self) -> Response<Body> {
        let headers = self.report();
        let mut body = json!({"code": self.code(), "detail": self.to_string()});
        if let Self::AllowanceExhausted {
            remaining, grants, ..
        } = &self
        {
            body["remaining"] = json!(remaining);
            body["grants"] = json!(grants);
        }
        let mut response = json_response(self.status(), &body);
        response.headers_mut().extend(headers);
        response
    }

    /// What every answer of this error does besides its body, whether a route answers it in
    /// JSON or a console page in HTML: the log line, with the cause of a 5xx; the
    /// `ApiServerErrors` count of a 5xx (the alarm's: API Gateway's own 5xx metric mixes the
    /// webhook route in); and the headers the answer carries (`Retry-After`,
    /// `WWW-Authenticate`, the replay mark).
    pub(super) fn report(&self) -> HeaderMap {
        match self {
            Self::Unavailable(e) => tracing::error!(error = %e, code = self.code(), "api failed"),
            Self::Timeout => tracing::error!(code = self.code(), "api answered late"),
            _ => tracing::info!(code = self.code(), detail = %self, "request refused"),
        }
        if self.status().is_server_error() {
            crate::platform::metrics::emit(server_error_metric(self.code(), chrono::Utc::now()));
        }
        let mut headers = HeaderMap::new();
        match self {
            Self::Unavailable(_) | Self::Timeout => {
                headers.insert(http::header::RETRY_AFTER, RETRY_AFTER_SECS.into());
            }
            Self::RateLimited(secs) => {
                headers.insert(http::header::RETRY_AFTER, (*secs).into());
            }
            Self::Unauthorized => {
                headers.insert(
                    http::header::WWW_AUTHENTICATE,
                    http::HeaderValue::from_static("Bearer"),
                );
            }
            Self::AllowanceExhausted { replayed: true, .. } => mark_replayed(&mut headers),
            _ => {}
        }
        headers
    }
}

/// The grants' remains in words, for the exhaustion's `detail`.
fn grants_left(grants: &[crate::billing::usage::GrantRemaining]) -> String {
    match grants {
        [] => "have nothing".to_owned(),
        _ => {
            let each: Vec<String> = grants
                .iter()
                .map(|g| format!("{} has {}", g.grant_id, g.remaining))
                .collect();
            format!("have too little: {}", each.join(", "))
        }
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
pub(super) fn mark_replayed(headers: &mut HeaderMap) {
    headers.insert(
        "idempotent-replayed",
        http::HeaderValue::from_static("true"),
    );
}

/// The caller behind `Authorization: Bearer <key>`, if the key is one of the listed ones.
pub(super) fn authenticate<'a>(
    keys: &'a Keys,
    headers: &HeaderMap,
) -> Result<&'a Caller, ApiError> {
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

pub(super) fn require(caller: &Caller, scope: Scope) -> Result<(), ApiError> {
    match caller.may(scope) {
        true => Ok(()),
        false => Err(ApiError::Forbidden(scope.as_str())),
    }
}

/// A request's query parameters, from its URI (API Gateway and function URLs put the raw
/// query string there) or, when it has none, from what the Lambda event listed.
pub(super) struct Query(pub(super) Vec<(String, String)>);

impl Query {
    pub(super) fn of(request: &Request) -> Self {
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
    pub(super) fn first(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Each parameter is one `route` takes, and is given once: of two values, neither is
    /// known to be the one meant. No value holds a control character: none of the API's
    /// parameters can (a time, a cursor, a status, an id), and a NUL asked of the store would
    /// fail its statement, a 503 for a bad request.
    pub(super) fn check(&self, taken: &[&str]) -> Result<(), ApiError> {
        for (i, (name, value)) in self.0.iter().enumerate() {
            if !taken.contains(&name.as_str()) {
                let name: String = name.chars().take(40).collect();
                let name = name.escape_debug();
                return Err(ApiError::bad(
                    "unknown_parameter",
                    match taken {
                        [] => format!("this route takes no query parameter ('{name}' given)"),
                        _ => format!(
                            "this route takes no parameter '{name}'; it takes {}",
                            taken.join(", ")
                        ),
                    },
                ));
            }
            if self.0[..i].iter().any(|(seen, _)| seen == name) {
                return Err(ApiError::bad(
                    "repeated_parameter",
                    format!("{name} is given more than once"),
                ));
            }
            if value.chars().any(char::is_control) {
                return Err(ApiError::bad(
                    "bad_parameter",
                    format!("{name} holds a control character; no value of it can"),
                ));
            }
        }
        Ok(())
    }
}

/// A time named by a request: RFC 3339.
pub(super) fn time_param(
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

pub(super) fn kind_of(value: &Value) -> &'static str {
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
pub(super) fn serde_error_words(e: &serde_json::Error) -> String {
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
pub(super) fn settle<T>(
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

pub(super) fn is_connection_error(e: &sqlx::Error) -> bool {
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

pub(super) use on_held;

/// A page's size as a request names it: 1 to [`MAX_LIMIT`], [`DEFAULT_LIMIT`] when not named.
pub(super) fn limit_param(raw: Option<&str>) -> Result<i64, ApiError> {
    match raw {
        None => Ok(DEFAULT_LIMIT),
        Some(raw) => raw
            .parse::<i64>()
            .ok()
            .filter(|l| (1..=MAX_LIMIT).contains(l))
            .ok_or_else(|| ApiError::bad("bad_limit", format!("limit is from 1 to {MAX_LIMIT}"))),
    }
}

/// An event's id as a path names it: a positive whole number.
pub(super) fn event_id_param(raw: &str) -> Result<i64, ApiError> {
    raw.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| ApiError::bad("bad_event_id", "an event's id is a positive whole number"))
}

/// What a replay came to, as its answer's body, or why not (`missing` says what was not
/// found).
pub(super) fn replayed<T: serde::Serialize>(
    replay: Replay<T>,
    missing: impl FnOnce() -> String,
) -> Result<Value, ApiError> {
    match replay {
        Replay::Done(done) => Ok(json!(done)),
        Replay::NotFound => Err(ApiError::Missing(missing())),
        Replay::Purged => Err(ApiError::Purged),
        Replay::Limited(limited) => Err(ApiError::RateLimited(limited.retry_after_secs)),
    }
}
