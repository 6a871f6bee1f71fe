//! The intake function's handler: route, authenticate a delivery (its provider's verifier),
//! store it once (the inbox's one statement), hand its id to the queue, answer. Every error
//! is mapped to its status code in one place (docs/design.md §5). 200 means *stored*, never
//! *applied*; no billing work and no SQL happens here.

use std::time::Duration;

use chrono::Utc;
use http::{HeaderMap, Method, StatusCode};
use lambda_http::{Body, Request, RequestExt, Response};

use serde_json::{json, Map, Value};
use sqlx::PgPool;

use super::{body_bytes, json_response};
use crate::domain::Verdict;
use crate::inbox::enqueue_or_unmark;
use crate::inbox::store::{store_verified_held, Origin, StoreError};
use crate::platform::config::{ConfigError, Env, FromEnv, IntakeConfig};
use crate::platform::db::Held;
use crate::platform::queue::Queue;
use crate::platform::secrets::Needs;
use crate::platform::sim::{planted, Bug};
use crate::providers::Sources;
use crate::signing::AuthError;

/// The intake's variables: the ground floor's values, and the source a provider's event bus
/// feeds, in the variable that provider names.
impl FromEnv for IntakeConfig {
    fn read<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<Self, ConfigError> {
        Ok(Self {
            database: env.database()?,
            queue_url: env.required("QUEUE_URL")?,
            sources: env.sources()?,
            tolerance: env.tolerance()?,
            bus_fed: crate::providers::bus_fed(|var| env.optional(var)),
        })
    }
}

/// Largest body accepted (1 MiB); providers send far less.
pub const MAX_BODY_BYTES: usize = 1_048_576;
/// Seconds a provider is asked to wait before retrying when we cannot store.
pub const RETRY_AFTER_SECS: u64 = 10;

/// Delivery headers worth keeping beside the event; never a signature or a secret.
const KEPT_HEADERS: &[&str] = &[
    "user-agent",
    "content-type",
    "webhook-id",
    "webhook-timestamp",
    "svix-id",
    "svix-timestamp",
    "x-forwarded-for",
];

pub struct IntakeState {
    /// The instance's own connection, for the store: one round trip per delivery.
    pub conn: Held,
    /// For what is rare (unmarking an event the queue refused).
    pub pool: PgPool,
    pub queue: Queue,
    pub sources: Sources,
    /// Sources that take their events through Amazon EventBridge alone (no signing secret):
    /// not verifiable here, so their route answers that it is not theirs.
    pub bus_only: Vec<String>,
    /// The deliveries refused 401 and not written yet (`operate::refusals`).
    pub refusals: crate::operate::refusals::Tally,
    /// The time the tally's window is read on.
    pub clock: crate::platform::clock::Clock,
}

impl IntakeState {
    /// A state whose held connection goes where `pool` does.
    pub fn new(pool: PgPool, queue: Queue, sources: Sources) -> Self {
        Self {
            conn: Held::new(pool.connect_options().as_ref().clone()),
            pool,
            queue,
            sources,
            bus_only: Vec::new(),
            refusals: Default::default(),
            clock: Default::default(),
        }
    }

    /// Builds the connection settings, the queue client and the sources once, at cold start;
    /// nothing connects before the first delivery.
    pub async fn from_config(config: &IntakeConfig) -> anyhow::Result<Self> {
        crate::providers::check_sources(&config.sources)?;
        // The database's secret is read here, once; the options it gives serve the held
        // connection and the pool, and are replaced after a refused login (a rotation).
        let database = crate::platform::database::Database::open(&config.database).await?;
        let pool = database.pool(2);
        let queue = Queue::from_env(config.queue_url.clone()).await;
        // Only a Kinde key fetch uses it: built then, not at cold start.
        let http = crate::platform::http_client::LazyClient::with_timeout(Duration::from_secs(5));
        // The source the EventBridge bridge feeds needs no signing secret (docs/deploy.md,
        // *Stripe through Amazon EventBridge*); given none, it has no verifier here. Any other
        // source without its secrets still stops the cold start.
        let (bus_only, signed): (Vec<_>, Vec<_>) = config.sources.iter().cloned().partition(|s| {
            config.bus_fed.as_deref() == Some(s.name.as_str())
                && s.secrets.is_empty()
                && s.secret_id.is_none()
        });
        let bus_only: Vec<String> = bus_only.into_iter().map(|s| s.name).collect();
        for name in &bus_only {
            tracing::info!(
                source = %name,
                "the source takes its events through Amazon EventBridge only: no HTTPS route"
            );
        }
        let configs = crate::platform::secrets::resolve(
            &signed,
            Needs::Signing,
            crate::platform::secrets::OnFailure::Stop,
        )
        .await?;
        let sources = Sources::build(&configs, config.tolerance, http)?;
        Ok(Self {
            conn: Held::on(database),
            pool,
            queue,
            sources,
            bus_only,
            refusals: Default::default(),
            clock: Default::default(),
        })
    }
}

/// Everything the intake can answer besides success, mapped to a status in one place.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    #[error("no route for {method} {path}")]
    NotFound { method: Method, path: String },
    #[error("use POST to deliver a webhook")]
    MethodNotAllowed,
    #[error("unknown source '{0}'")]
    UnknownSource(String),
    #[error("source '{0}' takes its events through Amazon EventBridge, not over HTTPS")]
    EventBridgeOnly(String),
    #[error("body is {0} bytes; the limit is {MAX_BODY_BYTES}")]
    PayloadTooLarge(usize),
    #[error(transparent)]
    Unauthorized(AuthError),
    #[error("the event could not be stored; retry later")]
    StoreUnavailable(#[source] StoreError),
    /// The database refused even the bare record of a verified delivery: the provider
    /// retries, and the log says why.
    #[error("the event could not be stored; retry later")]
    StoreRefused(#[source] StoreError),
}

impl IntakeError {
    fn status(&self) -> StatusCode {
        match self {
            Self::NotFound { .. } | Self::UnknownSource(_) | Self::EventBridgeOnly(_) => {
                StatusCode::NOT_FOUND
            }
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unauthorized(AuthError::KeysUnavailable) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::StoreRefused(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::UnknownSource(_) => "unknown_source",
            Self::EventBridgeOnly(_) => "eventbridge_only",
            Self::PayloadTooLarge(_) => "payload_too_large",
            Self::Unauthorized(AuthError::KeysUnavailable) => "keys_unavailable",
            Self::Unauthorized(_) => "unauthorized",
            Self::StoreUnavailable(_) => "store_unavailable",
            Self::StoreRefused(_) => "store_refused",
        }
    }

    /// The answer: 4xx say what was wrong, 5xx say nothing of the cause (it goes to the log).
    pub fn into_response(self) -> Response<Body> {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(error = ?self.source_chain(), code = self.code(), "intake failed");
        } else {
            tracing::warn!(code = self.code(), detail = %self, "delivery refused");
        }
        let mut response = json_response(
            status,
            &json!({"code": self.code(), "detail": self.to_string()}),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, RETRY_AFTER_SECS.into());
        }
        response
    }

    fn source_chain(&self) -> anyhow::Error {
        match self {
            Self::StoreUnavailable(e) | Self::StoreRefused(e) => anyhow::anyhow!("{self}: {e:#}"),
            other => anyhow::anyhow!("{other}"),
        }
    }
}

/// The source named by the route: API Gateway's `{source}` path parameter when present,
/// else the last segment of a path ending in `/webhooks/{source}`.
fn route_source(request: &Request) -> Option<String> {
    if let Some(source) = request.path_parameters().first("source") {
        return Some(source.to_owned());
    }
    let segments: Vec<&str> = request
        .uri()
        .path()
        .trim_end_matches('/')
        .split('/')
        .collect();
    match segments.as_slice() {
        [.., "webhooks", source] if !source.is_empty() => Some((*source).to_owned()),
        _ => None,
    }
}

/// The delivery headers stored beside the event ([`KEPT_HEADERS`]), each cut to 512 characters.
pub fn kept_headers(headers: &HeaderMap) -> Value {
    let kept: Map<String, Value> = KEPT_HEADERS
        .iter()
        .filter_map(|name| {
            let value = headers.get(*name)?.to_str().ok()?;
            Some((
                (*name).to_owned(),
                Value::String(value.chars().take(512).collect()),
            ))
        })
        .collect();
    Value::Object(kept)
}

/// Handles one HTTP request; every outcome is an HTTP answer. Whatever it was, the refusals
/// the instance holds are written once their window is over (the first at once).
pub async fn handle(state: &IntakeState, request: Request) -> Response<Body> {
    let response = match accept(state, &request).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    };
    crate::operate::refusals::write_due(&state.conn, &state.refusals, state.clock.now()).await;
    response
}

/// The delivery's span (docs/operating.md "Following one event"): the source, then what the
/// signature proved (the provider's key, its delivery id, the account), then the stored row.
#[tracing::instrument(
    name = "intake",
    skip_all,
    fields(source, dedupe_key, delivery_id, account, event_id, verdict)
)]
async fn accept(state: &IntakeState, request: &Request) -> Result<Response<Body>, IntakeError> {
    let Some(source_name) = route_source(request) else {
        return Err(IntakeError::NotFound {
            method: request.method().clone(),
            path: request.uri().path().to_owned(),
        });
    };
    if request.method() != Method::POST {
        return Err(IntakeError::MethodNotAllowed);
    }
    tracing::Span::current().record("source", source_name.as_str());
    let source = state.sources.get(&source_name).ok_or_else(|| {
        if state.bus_only.contains(&source_name) {
            IntakeError::EventBridgeOnly(source_name.clone())
        } else {
            IntakeError::UnknownSource(source_name.clone())
        }
    })?;
    let body = body_bytes(request.body());
    if body.len() > MAX_BODY_BYTES {
        return Err(IntakeError::PayloadTooLarge(body.len()));
    }
    let verified = match source.verify(request.headers(), body, Utc::now()).await {
        Ok(verified) => verified,
        Err(refused) => {
            // A known source's delivery refused as the sender's fault: counted, so that a
            // signing secret that no longer matches pages someone (the metric line, each) and
            // shows in the overview (the tally, written at most once a window: no database
            // write per junk request). KeysUnavailable is ours, a 503 that the intake's 5xx
            // alarm covers.
            if refused != AuthError::KeysUnavailable {
                crate::platform::metrics::emit(rejected_delivery_metric(
                    &source_name,
                    refused.reason(),
                    Utc::now(),
                ));
                state.refusals.count(&source_name, state.clock.now());
            }
            return Err(IntakeError::Unauthorized(refused));
        }
    };
    record_verified(&verified);
    if let Some(index) = verified.signed_with.filter(|i| *i > 0) {
        // Verified only by a secret after the first listed: while a secret rolls, this shows
        // which source still signs with the old one. One line per such delivery, no more.
        crate::platform::metrics::emit(older_secret_metric(&source_name, index, Utc::now()));
    }
    let headers = kept_headers(request.headers());
    let stored = store_verified_held(
        &state.conn,
        &source_name,
        body,
        &verified,
        Origin::Delivery(&headers),
    )
    .await
    .map_err(|e| {
        if e.is_unavailable() {
            IntakeError::StoreUnavailable(e)
        } else {
            IntakeError::StoreRefused(e)
        }
    })?;
    let stored = match stored.verdict == Verdict::Duplicate && planted(Bug::CopyCountsNew) {
        true => planted_copy(state, &source_name, body, &verified, &headers).await?,
        false => stored,
    };
    if stored_needs_enqueue(&stored, &source_name, &verified) {
        crate::platform::sim::point(crate::platform::sim::Point::IntakeStored, stored.event_id)
            .await;
        enqueue(state, stored.event_id).await;
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"status": stored.verdict.as_str(), "event_id": stored.event_id}),
    ))
}

/// What the signature proved, on the delivery's span: keys and ids only, never the payload.
fn record_verified(verified: &crate::domain::VerifiedEvent) {
    let span = tracing::Span::current();
    span.record("dedupe_key", verified.dedupe_key.as_str());
    if let Some(delivery_id) = &verified.delivery_id {
        span.record("delivery_id", delivery_id.as_str());
    }
    if let Some(customer) = verified
        .meta
        .as_ref()
        .ok()
        .and_then(|m| m.customer.as_ref())
    {
        span.record("account", customer.as_str());
    }
}

/// What a way in says of a stored delivery (this one, the EventBridge adapter): the span's
/// `event_id` and `verdict`, a conflict's alert (the stored event stands; the differing copy
/// is on record for the operator), and whether the event is marked for its send.
pub(crate) fn stored_needs_enqueue(
    stored: &crate::inbox::store::Stored,
    source: &str,
    verified: &crate::domain::VerifiedEvent,
) -> bool {
    let span = tracing::Span::current();
    span.record("event_id", stored.event_id);
    span.record("verdict", stored.verdict.as_str());
    if stored.verdict == Verdict::Conflict {
        tracing::warn!(
            alert = "conflict",
            event_id = stored.event_id,
            source = %source,
            dedupe_key = verified.dedupe_key.as_str(),
            "a delivery reused a stored event's key with different content"
        );
        return false;
    }
    stored.marked
}

/// A planted bug (simulation only): the copy stored as a new event.
async fn planted_copy(
    state: &IntakeState,
    source: &str,
    body: &[u8],
    verified: &crate::domain::VerifiedEvent,
    headers: &Value,
) -> Result<crate::inbox::store::Stored, IntakeError> {
    let mut copy = verified.clone();
    copy.dedupe_key =
        crate::domain::DedupeKey::parse(&format!("{}~copy", verified.dedupe_key.as_str()))
            .unwrap_or_else(|_| verified.dedupe_key.clone());
    store_verified_held(&state.conn, source, body, &copy, Origin::Delivery(headers))
        .await
        .map_err(IntakeError::StoreUnavailable)
}

/// The Embedded Metric Format line for a delivery that only an older secret verified:
/// `OldSecretDeliveries` by `Stack` and `Source`, with the secret's index (never its value) as
/// a field.
pub fn older_secret_metric(source: &str, index: usize, now: chrono::DateTime<Utc>) -> Value {
    let mut line = crate::platform::metrics::document(
        now,
        &[&["Source"]],
        &[("OldSecretDeliveries", "Count")],
    );
    line["Source"] = json!(source);
    line["SecretIndex"] = json!(index);
    line["OldSecretDeliveries"] = json!(1);
    line
}

/// The Embedded Metric Format line for a delivery of a known source refused 401:
/// `RejectedDeliveries` by `Stack` and `Source`, and by `Stack`, `Source` and `Reason` (what
/// failed, never the signature or the body). A signing secret rotated at the provider and not
/// here makes every delivery of that source one of these, while the provider retries for days
/// and then disables the endpoint: the alarm on it is the only sign.
pub fn rejected_delivery_metric(source: &str, reason: &str, now: chrono::DateTime<Utc>) -> Value {
    let mut line = crate::platform::metrics::document(
        now,
        &[&["Source"], &["Source", "Reason"]],
        &[("RejectedDeliveries", "Count")],
    );
    line["Source"] = json!(source);
    line["Reason"] = json!(reason);
    line["RejectedDeliveries"] = json!(1);
    line
}

/// Hands the event to the queue after the commit. A failure here is not the provider's
/// problem: the event is stored, and the scheduler enqueues what was never enqueued.
async fn enqueue(state: &IntakeState, event_id: i64) {
    if let Err(e) = enqueue_or_unmark(&state.pool, &state.queue, &[event_id]).await {
        // Still marked: the rescue of stuck rows sends it, a few minutes later.
        tracing::warn!(
            event_id,
            error = format!("{e:#}"),
            "could not clear enqueued_at"
        );
    }
}
