//! The dispatcher function's handler: each SQS message names one effect or one meter report.
//! An effect is claimed under a hold, delivered to every configured sink that does not have
//! it yet, and what landed recorded (docs/design.md §11); a meter report is sent to its
//! provider's meter by `meters::send` (§4.13). A delivery that failed is retried on the
//! events' retry policy (`domain::retry`; the scheduler's rescue enqueues due rows again);
//! only a database that cannot be reached is reported back to SQS.

use std::time::Duration;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use sqlx::PgPool;
use tokio::time::Instant;
use tracing::Instrument;

use crate::domain::retry::{RetryPolicy, RETRY};
use crate::effects::outbox::{self, Attempt, EffectStatus, DISPATCH_LEASE};
use crate::effects::sinks::{Outgoing, Sinks};
use crate::meters::{self, Meters};
use crate::platform::config::DispatcherConfig;
use crate::platform::queue::message_traceparent;

#[cfg(feature = "dev")]
pub use faults::Faults;

pub struct DispatcherState {
    pub pool: PgPool,
    pub sinks: Sinks,
    /// The meters of the sources that report their debits.
    pub meters: Meters,
    pub lease: Duration,
    /// The waits after a failed delivery ([`RETRY`], the events' own; the tests wait less).
    pub retry: RetryPolicy,
    /// Injected faults, for tests that prove a crash between send and record loses nothing.
    #[cfg(feature = "dev")]
    pub faults: Faults,
    /// Where the pool's options come from, when it is a secret that a rotation changes
    /// (`None`: fixed options).
    pub database: Option<std::sync::Arc<crate::platform::database::Database>>,
}

impl DispatcherState {
    pub fn new(pool: PgPool, sinks: Sinks) -> Self {
        Self {
            pool,
            sinks,
            meters: Meters::default(),
            lease: DISPATCH_LEASE,
            retry: RETRY,
            #[cfg(feature = "dev")]
            faults: Faults::default(),
            database: None,
        }
    }

    /// Builds the pool, the sinks (their signing secrets read from Secrets Manager) and the
    /// meters (their sources' API keys read the same way).
    pub async fn from_config(
        config: &DispatcherConfig,
        max_connections: u32,
    ) -> anyhow::Result<Self> {
        crate::providers::check_sources(&config.sources)?;
        let database = crate::platform::database::Database::open(&config.database).await?;
        let pool = database.pool(max_connections);
        let sinks = match &config.effects {
            Some(effects) => Sinks::resolve(&effects.sinks).await?,
            None => Sinks::resolve(&[]).await?,
        };
        let metered: Vec<_> = config
            .sources
            .iter()
            .filter(|s| s.meter.is_some())
            .cloned()
            .collect();
        let metered = crate::platform::secrets::resolve(
            &metered,
            crate::platform::secrets::Needs::ApiKey,
            crate::platform::secrets::OnFailure::RetryOnUse("dispatcher"),
        )
        .await?;
        let http = reqwest::Client::builder()
            .timeout(meters::SEND_TIMEOUT)
            .build()?;
        // Meter reports take from their sources' budgets, from the share reads leave them.
        let client = crate::providers::ApiClient::budgeted(
            &http,
            crate::platform::budget::Budgets::new(pool.clone()),
            crate::platform::budget::Lane::Meter,
        );
        Ok(Self {
            database: Some(database),
            meters: Meters::build(&metered, &client),
            ..Self::new(pool, sinks)
        })
    }

    /// Whether a crash is injected at this point (never, without the `dev` feature).
    fn crashes_at(&self, _point: FaultPoint) -> bool {
        #[cfg(feature = "dev")]
        if self.faults.hit(_point) {
            return true;
        }
        false
    }
}

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dispatched {
    /// Every sink has the effect now.
    Sent,
    /// Some sink failed: retried later (`pending`), or not any more (`dead`).
    Failed { status: EffectStatus, error: String },
    /// Nothing to do: the effect is sent or dead, held by another dispatcher, not due, or gone.
    Skipped,
    /// The attempt ended between the sends and the record (an injected crash): the hold
    /// expires and the effect is delivered again, with the same `webhook-id`.
    Crashed,
}

/// Delivers one effect. An error means the database could not be reached; every delivery
/// failure is recorded on the effect.
#[tracing::instrument(
    name = "dispatch",
    skip_all,
    fields(effect_id = id, kind, source, event_id, account)
)]
pub async fn dispatch(state: &DispatcherState, id: &str) -> Result<Dispatched, sqlx::Error> {
    let Some(effect) = outbox::claim(&state.pool, id, state.lease).await? else {
        return Ok(Dispatched::Skipped);
    };
    record_cause(&effect);
    // Serialized once: the bytes signed are the bytes every sink receives.
    let body = serde_json::to_vec(&effect.body).unwrap_or_default();
    let outgoing = Outgoing {
        id: &effect.id,
        kind: &effect.kind,
        body: &body,
    };
    let mut sent_to = effect.sent_to.clone();
    let mut errors = Vec::new();
    for sink in state.sinks.iter() {
        if sent_to.iter().any(|name| name == &sink.name) {
            continue;
        }
        match state.sinks.deliver(sink, outgoing).await {
            Ok(()) => {
                tracing::info!(effect_id = %effect.id, sink = %sink.name, "effect delivered");
                sent_to.push(sink.name.clone());
            }
            Err(error) => errors.push(error.to_string()),
        }
    }
    if state.crashes_at(FaultPoint::AfterSendBeforeRecord) {
        tracing::warn!(effect_id = %effect.id, "injected crash after the sends, before the record");
        return Ok(Dispatched::Crashed);
    }
    let complete = state
        .sinks
        .iter()
        .all(|sink| sent_to.iter().any(|name| name == &sink.name));
    let error = (!errors.is_empty()).then(|| errors.join("; "));
    let attempt = Attempt {
        sent_to,
        complete,
        error: error.clone(),
    };
    let status = outbox::record(&state.pool, &effect, &attempt, &state.retry).await?;
    Ok(match (status, error) {
        (EffectStatus::Sent, _) => Dispatched::Sent,
        (status, error) => Dispatched::Failed {
            status,
            error: error.unwrap_or_default(),
        },
    })
}

/// The effect's cause on its span, read from its body's common part (`data.source`,
/// `data.event_id`, `data.customer_id`): an effect is followed by the event that made it.
fn record_cause(effect: &outbox::Claimed) {
    let span = tracing::Span::current();
    span.record("kind", effect.kind.as_str());
    let data = &effect.body["data"];
    if let Some(source) = data["source"].as_str() {
        span.record("source", source);
    }
    if let Some(event_id) = data["event_id"].as_i64() {
        span.record("event_id", event_id);
    }
    if let Some(account) = data["customer_id"].as_str() {
        span.record("account", account);
    }
}

/// The longest one message can take: a meter report's read-back (the meter, then its
/// summary) and its send, each within [`meters::SEND_TIMEOUT`]; an effect's webhook takes one
/// request of at most as long.
pub const ITEM_BUDGET: Duration = Duration::from_secs(3 * meters::SEND_TIMEOUT.as_secs());

/// Handles an SQS batch: every message names one effect. Only messages whose effect could
/// not be reached in the database (or whose attempt crashed) are reported, so SQS delivers
/// them again; a delivery failure is the outbox's to retry.
pub async fn handle_batch(state: &DispatcherState, event: SqsEvent) -> SqsBatchResponse {
    handle_batch_until(state, event, None).await
}

/// [`handle_batch`] within an invocation that ends at `until` (the Lambda deadline): a
/// message is worked on only while its whole [`ITEM_BUDGET`] is left, so a batch of reports
/// that each read back and send never runs past the function's timeout (which would leave
/// holds to expire, and each of their attempts counted as unanswered); the rest are given
/// back to the queue, untouched.
pub async fn handle_batch_until(
    state: &DispatcherState,
    event: SqsEvent,
    until: Option<Instant>,
) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for message in event.records {
        let Some(message_id) = message.message_id.clone() else {
            continue;
        };
        if until.is_some_and(|until| Instant::now() + ITEM_BUDGET > until) {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = message_id;
            response.batch_item_failures.push(failure);
            continue;
        }
        let body = message.body.as_deref().unwrap_or_default().trim();
        // The message's span continues the trace of whoever sent it (the worker's event, the
        // rescue, the app API's debit); the effect's or report's own span sits inside it.
        let span = tracing::info_span!("dispatcher message", id = body);
        crate::platform::telemetry::continue_trace(&span, message_traceparent(&message));
        let handled = async {
            if crate::domain::meter::is_report_id(body) {
                let sent = meters::send(
                    &state.pool,
                    &state.meters,
                    body,
                    meters::outbox::SEND_LEASE,
                    &state.retry,
                )
                .await
                .map(|_| false);
                Some(sent)
            } else if let Some(id) = parse_effect_id(body) {
                Some(
                    dispatch(state, id)
                        .await
                        .map(|dispatched| dispatched == Dispatched::Crashed),
                )
            } else {
                // Not ours to retry: a body that names nothing never will.
                tracing::error!(
                    message_id,
                    "message body is neither an effect id nor a meter report id; dropping it"
                );
                None
            }
        }
        .instrument(span)
        .await;
        let Some(handled) = handled else {
            continue;
        };
        let retry = match handled {
            Ok(crashed) => crashed,
            Err(error) => {
                tracing::error!(id = body, error = %error, "database unavailable; the message will be delivered again");
                if let Some(database) = &state.database {
                    database.after_pool_error().await;
                }
                true
            }
        };
        if retry {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = message_id;
            response.batch_item_failures.push(failure);
        }
    }
    response
}

/// An effect id as a message carries it: `eff_` and 32 hex digits.
pub fn parse_effect_id(body: &str) -> Option<&str> {
    let id = body.trim();
    let hex = id.strip_prefix("eff_")?;
    (hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// Where a fault can be injected, to prove that a crash at that point loses nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// After the sinks were sent to, before the attempt is recorded.
    AfterSendBeforeRecord,
}

#[cfg(feature = "dev")]
mod faults {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::FaultPoint;

    /// Injected faults: how many more attempts crash at each point. Each dispatcher state
    /// has its own, so tests that run side by side do not see each other's.
    #[derive(Debug, Default)]
    pub struct Faults(Mutex<HashMap<FaultPoint, u32>>);

    impl Faults {
        /// The next `times` attempts end at `point` without going further, as a crash would.
        pub fn crash(&self, point: FaultPoint, times: u32) {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(point, times);
        }

        pub(super) fn hit(&self, point: FaultPoint) -> bool {
            let mut faults = self.0.lock().unwrap_or_else(|e| e.into_inner());
            match faults.get_mut(&point) {
                Some(left) if *left > 0 => {
                    *left -= 1;
                    true
                }
                _ => false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_names_an_effect_by_its_id() {
        let id = "eff_0123456789abcdef0123456789abcdef";
        assert_eq!(parse_effect_id(id), Some(id));
        assert_eq!(parse_effect_id(&format!(" {id}\n")), Some(id));
        assert_eq!(parse_effect_id("42"), None);
        assert_eq!(parse_effect_id("eff_xyz"), None);
    }
}
