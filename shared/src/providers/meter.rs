//! The contract of a provider's meter (docs/design.md §4.13): how one report is sent, how long
//! the provider takes a resend under the same dedupe key as the same report, and how a report
//! whose send went unanswered is read back. What a send's answer says is read here, once for
//! every provider: a report the provider may hold is never taken for one it does not.

use std::time::Duration;

use serde_json::Value;

use chrono::{DateTime, TimeDelta, Utc};

use crate::domain::meter::MeterReport;
use crate::domain::CustomerId;
use crate::platform::budget::Throttled;
use crate::providers::CallError;
use crate::BoxFuture;

/// What became of one send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// The provider took it, or answered that it holds it already.
    Taken,
    /// The provider will never take it as it is (an unknown customer or meter, a time out of
    /// its window): retrying changes nothing.
    Refused(String),
    /// The provider did not take it (no connection, refused for the rate or the key): a send
    /// later is the first it sees.
    NotTaken(String),
    /// No answer, or one that does not say (a timeout after the request went out, a 5xx): the
    /// provider may hold it.
    Unanswered(String),
    /// Not sent for the rate: the source's budget is spent, or the provider answered 429
    /// (which takes nothing). Tried again from the time said, the attempt not spent.
    Throttled(Throttled),
}

/// How long the provider takes a resend under the same dedupe key for the report it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedupe {
    /// For as long as it keeps the report (Polar's `external_id`).
    Always,
    /// Within this long of its first receipt (Stripe's `identifier`: a rolling 24 hours).
    Within(Duration),
    /// No dedupe key: a resend is a second report (Kinde).
    Never,
}

/// One source's meter at its provider.
pub trait Meter: Send + Sync {
    /// Sends one report.
    fn send<'a>(&'a self, report: &'a MeterReport) -> BoxFuture<'a, Sent>;

    /// How a resend of the same report is taken.
    fn dedupe(&self) -> Dedupe;

    /// How long after its receipt the provider's own adjustment cancels a report it took
    /// (`MeterReport::take_back` = `Cancel`); `None`: it has none, and a correction is a
    /// compensating report.
    fn cancel_window(&self) -> Option<Duration> {
        None
    }

    /// The provider's total for the report's customer over the report's UTC minute (Stripe's
    /// event summaries), for a provider that reads back totals rather than reports;
    /// `Ok(None)` when it cannot be read back. Whether the report is in it is decided with
    /// the other reports of that minute (`meters::read_back`).
    fn minute_total<'a>(
        &'a self,
        _report: &'a MeterReport,
    ) -> BoxFuture<'a, anyhow::Result<Option<f64>>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// The step the times of a [`Meter::total`] fall on (docs/design.md §4.13a): Stripe's
    /// summaries take whole minutes (the default), Polar's quantities whole UTC hours. The
    /// meter audit ends its window on one, so the provider is asked for exactly its window.
    fn total_step(&self) -> TimeDelta {
        TimeDelta::minutes(1)
    }

    /// The total the provider's meter counts for this customer over `[start, end)` (by the
    /// reports' timestamps), for the meter audit: `Ok(None)` when the provider cannot be read.
    fn total<'a>(
        &'a self,
        _customer: &'a CustomerId,
        _start: DateTime<Utc>,
        _end: DateTime<Utc>,
    ) -> BoxFuture<'a, anyhow::Result<Option<f64>>> {
        Box::pin(std::future::ready(Ok(None)))
    }
}

/// What a provider's answer to a send says, the same for every provider but what `own`
/// reads first (Stripe's "already exists", a provider's clock behind ours): a 2xx took it; a
/// 429 that asks for a pause, or no token of the source's budget, is [`Sent::Throttled`]
/// (`Api::send`); 408, any other 429, 401 and 403 did not take it; a 5xx or no answer may
/// have; any other 4xx refuses it for good.
pub async fn answer(
    response: Result<reqwest::Response, CallError>,
    own: fn(reqwest::StatusCode, &Value) -> Option<Sent>,
) -> Sent {
    let response = match response {
        Ok(response) => response,
        Err(CallError::Throttled(throttled)) => return Sent::Throttled(throttled),
        // The budget could not be read: nothing went out.
        Err(CallError::Budget(error)) => return Sent::NotTaken(format!("not sent: {error:#}")),
        Err(CallError::Http(error)) => return sent_without_answer(error),
    };
    let status = response.status();
    if status.is_success() {
        return Sent::Taken;
    }
    // A body that does not come whole is read as none: the status alone decides.
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if let Some(sent) = own(status, &body) {
        return sent;
    }
    let said = message(&body)
        .map(|m| format!("{status}: {m}"))
        .unwrap_or_else(|| status.to_string());
    match status.as_u16() {
        408 | 429 | 401 | 403 => Sent::NotTaken(said),
        500..=599 => Sent::Unanswered(said),
        _ => Sent::Refused(said),
    }
}

/// A send that got no answer: never connected, the request did not go out; else the provider
/// may hold it.
fn sent_without_answer(error: reqwest::Error) -> Sent {
    match error.is_connect() {
        true => Sent::NotTaken(format!("no connection: {error}")),
        false => Sent::Unanswered(format!("no answer: {error}")),
    }
}

/// A send given up before its request, for `what` failed: [`Sent::Throttled`] when that was
/// the rate (a read it needs first found the budget spent), else not taken.
pub fn not_sent(what: &str, error: anyhow::Error) -> Sent {
    match Throttled::find(&error) {
        Some(throttled) => Sent::Throttled(throttled.clone()),
        None => Sent::NotTaken(format!("{what}: {error:#}")),
    }
}

/// No answer of the provider's own: the common reading decides.
pub fn common(_status: reqwest::StatusCode, _body: &Value) -> Option<Sent> {
    None
}

/// The provider's words in an error body: Stripe's `error.message`, Polar's `detail`, Kinde's
/// `errors[0].message`; at most 300 characters of it.
fn message(body: &Value) -> Option<String> {
    let text = body
        .pointer("/error/message")
        .or_else(|| body.get("detail"))
        .or_else(|| body.pointer("/errors/0/message"))?;
    let text = match text {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    Some(text.chars().take(300).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_gives_the_providers_words() {
        let stripe = serde_json::json!({"error": {"message": "No such customer", "type": "invalid_request_error"}});
        assert_eq!(message(&stripe).as_deref(), Some("No such customer"));
        let polar = serde_json::json!({"detail": [{"loc": ["body"], "msg": "x"}]});
        assert!(message(&polar).unwrap().contains("\"msg\""));
        let kinde =
            serde_json::json!({"errors": [{"code": "X", "message": "Agreement not found"}]});
        assert_eq!(message(&kinde).as_deref(), Some("Agreement not found"));
        assert_eq!(message(&Value::Null), None);
    }
}
