//! A debit told to Polar's meters (docs/design.md §4.13): `POST /v1/events/ingest` with one
//! event, `{name, customer_id, external_id, timestamp, metadata: {value}}` — `name` the
//! source's `meter.event_name`, `customer_id` the account's Polar customer, `external_id` the
//! report's identifier (Polar keeps one event per organization and `external_id`, with no time
//! window, and answers a repeat with `duplicates: 1`: a resend is always harmless) and
//! `metadata.value` the amount as a number, which a meter aggregating
//! `{"func": "sum", "property": "value"}` adds up.
//!
//! A correction (a reversed debit's) is a compensating event of the negative value under its
//! own `external_id`: Polar documents no adjustment of an ingested event, and a meter that sums
//! `value` adds it.
//!
//! Polar refuses a `timestamp` in its future ("Timestamp must be in the past.", 422): a
//! report timed by a clock ahead of Polar's is sent again later, not dead.

use serde_json::{json, Value};

use crate::domain::meter::MeterReport;
use crate::providers::meter::{answer, Dedupe, Meter, Sent};
use crate::providers::Api;
use crate::BoxFuture;

/// Polar's longest event `name`.
pub const MAX_EVENT_NAME: usize = 128;

pub struct PolarMeter {
    api: Api,
    event_name: String,
}

impl PolarMeter {
    pub fn new(api: Api, event_name: &str) -> Self {
        Self {
            api,
            event_name: event_name.to_owned(),
        }
    }

    async fn post(&self, report: &MeterReport) -> Sent {
        let key = match self.api.key.get().await {
            Ok(key) => key,
            Err(error) => return Sent::NotTaken(format!("no API key: {error:#}")),
        };
        let request = self
            .api
            .http
            .post(format!("{}/v1/events/ingest", self.api.base_url))
            .bearer_auth(key)
            .json(&body(&self.event_name, report));
        answer(request.send().await, clock_behind).await
    }
}

/// The ingest request of one report.
fn body(event_name: &str, report: &MeterReport) -> Value {
    json!({"events": [{
        "name": event_name,
        "customer_id": report.customer.as_str(),
        "external_id": report.identifier,
        "timestamp": report.occurred_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "metadata": {"value": report.signed_value()},
    }]})
}

/// A 422 that names only the timestamp as in Polar's future: Polar's clock is behind ours, and
/// the same report is taken a little later.
fn clock_behind(status: reqwest::StatusCode, body: &Value) -> Option<Sent> {
    let errors = body.get("detail").and_then(Value::as_array)?;
    let only_time = !errors.is_empty()
        && errors.iter().all(|e| {
            e.get("msg")
                .and_then(Value::as_str)
                .is_some_and(|m| m.contains("Timestamp must be in the past"))
        });
    (status.as_u16() == 422 && only_time)
        .then(|| Sent::NotTaken("Polar's clock is behind this report's timestamp".to_owned()))
}

impl Meter for PolarMeter {
    fn send<'a>(&'a self, report: &'a MeterReport) -> BoxFuture<'a, Sent> {
        Box::pin(self.post(report))
    }

    fn dedupe(&self) -> Dedupe {
        Dedupe::Always
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::CustomerId;

    #[test]
    fn a_report_is_one_ingested_event_with_its_identifier_and_a_numeric_value() {
        let report = MeterReport {
            id: "mrp_1".into(),
            source: "polar".into(),
            customer: CustomerId::parse("992fae2a-2a17-4b7a-8d9e-e287cf90131b").unwrap(),
            identifier: "bi_abc".into(),
            meter: "api_calls".into(),
            value: 7,
            occurred_at: "2026-12-03T10:00:00.250Z".parse().unwrap(),
            first_sent_at: None,
            unanswered: false,
            take_back: None,
        };
        assert_eq!(
            body("api_calls", &report),
            json!({"events": [{"name": "api_calls",
                "customer_id": "992fae2a-2a17-4b7a-8d9e-e287cf90131b", "external_id": "bi_abc",
                "timestamp": "2026-12-03T10:00:00.250Z", "metadata": {"value": 7}}]})
        );
    }

    #[test]
    fn a_timestamp_in_polars_future_is_sent_again_later() {
        let ahead = json!({"detail": [{"type": "value_error", "loc": ["body", "events", 0, "timestamp"],
            "msg": "Value error, Timestamp must be in the past.", "input": "2026-12-03T10:00:00Z"}]});
        let unprocessable = reqwest::StatusCode::UNPROCESSABLE_ENTITY;
        assert!(matches!(
            clock_behind(unprocessable, &ahead),
            Some(Sent::NotTaken(_))
        ));
        let customer = json!({"detail": [{"loc": ["body", "events", 0, "customer_id"], "msg": "Customer not found."}]});
        assert_eq!(clock_behind(unprocessable, &customer), None);
    }
}
