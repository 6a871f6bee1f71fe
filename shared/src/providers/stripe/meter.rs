//! A debit told to a Stripe meter (docs/design.md §4.13): `POST /v1/billing/meter_events`
//! with the report's `identifier` (Stripe dedupes it within a rolling 24 hours), `timestamp`
//! the debit's second, `payload[stripe_customer_id]` the customer's id at Stripe (`cus_…`, or
//! `acct_…` for a customer that is an Account) and `payload[value]` the amount; a connected
//! account's customer's report is made as that account (`Stripe-Account`). The request's
//! `Idempotency-Key` is the attempt's own (`MeterReport::send_key`), never the identifier:
//! Stripe saves the first answer to a key for 24 hours, 500s included.
//!
//! A correction (a reversed debit's) within 24 hours of the report's receipt is Stripe's meter
//! event adjustment, `POST /v1/billing/meter_event_adjustments` `{event_name, type: cancel,
//! cancel[identifier]}` (stripe-node `types/Billing/MeterEventAdjustmentsResource.d.ts`: "You
//! can only cancel events within 24 hours of Stripe receiving them"); after that, a meter
//! event of the negative value under the correction's identifier (Stripe: "You can also fix
//! incorrectly recorded usage data by recording negative quantities").
//!
//! A report whose send went unanswered more than a day ago is read back from the meter's event
//! summaries (`GET /v1/billing/meters/{id}/event_summaries`, the meter found by its event name
//! in `GET /v1/billing/meters`): the total of its minute, which `meters::read_back` explains
//! with the other reports of that minute before it is sent again. The meter audit reads the
//! same summaries over a month (one summary: no grouping window), its end never past the
//! current minute (Stripe takes only whole minutes).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde_json::Value;

use super::fetch::FETCH_VERSION;
use crate::domain::meter::{MeterReport, TakeBack};
use crate::domain::CustomerId;
use crate::providers::meter::{answer, Dedupe, Meter, Sent};
use crate::providers::{path_id, Api};
use crate::BoxFuture;

/// Stripe's longest meter `event_name` and `identifier`.
pub const MAX_EVENT_NAME: usize = 100;
/// How long Stripe dedupes an `identifier`: "a rolling period of at least 24 hours".
pub const DEDUPE_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// How long after its receipt Stripe cancels a meter event by an adjustment.
pub const CANCEL_WINDOW: Duration = Duration::from_secs(24 * 3600);

pub struct StripeMeter {
    api: Api,
    event_name: String,
    /// The meter's id in each account, found once by its event name.
    meter_ids: Mutex<HashMap<Option<String>, String>>,
}

impl StripeMeter {
    pub fn new(api: Api, event_name: &str) -> Self {
        Self {
            api,
            event_name: event_name.to_owned(),
            meter_ids: Mutex::new(HashMap::new()),
        }
    }

    async fn post(&self, report: &MeterReport) -> Sent {
        let key = match self.api.key.get().await {
            Ok(key) => key,
            Err(error) => return Sent::NotTaken(format!("no API key: {error:#}")),
        };
        let customer = report.customer.at_provider();
        let (path, form) = match &report.take_back {
            // A correction within Stripe's window: the report it corrects, cancelled.
            Some(TakeBack::Cancel { identifier }) => (
                "/v1/billing/meter_event_adjustments",
                vec![
                    ("event_name", self.event_name.clone()),
                    ("type", "cancel".to_owned()),
                    ("cancel[identifier]", identifier.clone()),
                ],
            ),
            // A report, or a correction as a report of the opposite value.
            _ => (
                "/v1/billing/meter_events",
                vec![
                    ("event_name", self.event_name.clone()),
                    ("identifier", report.identifier.clone()),
                    ("timestamp", report.occurred_at.timestamp().to_string()),
                    ("payload[stripe_customer_id]", customer.to_owned()),
                    ("payload[value]", report.signed_value().to_string()),
                ],
            ),
        };
        let mut request = self
            .api
            .http
            .post(format!("{}{path}", self.api.base_url))
            .bearer_auth(key)
            .header("Stripe-Version", FETCH_VERSION)
            .form(&form);
        // This attempt's key, never the identifier: Stripe saves the first answer to a key
        // for 24 hours, 500s included, and would give every later attempt that one.
        if let Some(send_key) = &report.send_key {
            request = request.header("Idempotency-Key", send_key);
        }
        if let Some(account) = report.customer.connected_account() {
            request = request.header("Stripe-Account", account);
        }
        answer(self.api.send(request).await, stripes_own).await
    }

    /// The meter's id: the active meter whose `event_name` is this source's, in the platform's
    /// account or, for a connected account's customer, in that account (a connected account's
    /// meters are its own).
    async fn meter_id(&self, account: Option<&str>) -> anyhow::Result<String> {
        let known = self
            .meter_ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&account.map(str::to_owned))
            .cloned();
        if let Some(id) = known {
            return Ok(id);
        }
        let headers: Vec<(&str, &str)> = account.iter().map(|a| ("Stripe-Account", *a)).collect();
        let mut after: Option<String> = None;
        loop {
            let mut query = vec![("limit", "100".to_owned()), ("status", "active".to_owned())];
            if let Some(after) = &after {
                query.push(("starting_after", after.clone()));
            }
            let page = self
                .api
                .get_found("/v1/billing/meters", &query, &headers)
                .await?
                .context("GET /v1/billing/meters answered 404 Not Found")?;
            let meters = page
                .get("data")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let found = meters
                .iter()
                .find(|m| m.get("event_name").and_then(Value::as_str) == Some(&self.event_name));
            if let Some(id) = found.and_then(|m| m.get("id")).and_then(Value::as_str) {
                self.meter_ids
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(account.map(str::to_owned), id.to_owned());
                return Ok(id.to_owned());
            }
            let more = page.get("has_more").and_then(Value::as_bool) == Some(true);
            after = meters
                .last()
                .and_then(|m| m.get("id"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            if !more || after.is_none() {
                anyhow::bail!(
                    "no active Stripe meter has the event name '{}'",
                    self.event_name
                );
            }
        }
    }

    /// The meter's total for the report's customer over the report's minute.
    async fn minute(&self, report: &MeterReport) -> anyhow::Result<Option<f64>> {
        let start = report
            .occurred_at
            .duration_trunc(TimeDelta::minutes(1))
            .map_err(|e| anyhow::anyhow!("the report's minute: {e}"))?;
        self.summed(&report.customer, start, start + TimeDelta::minutes(1))
            .await
    }

    /// The meter's total for the customer over `[start, end)`, both taken to the minute; a
    /// connected account's customer is read as that account. The times are the caller's, on
    /// the store's clock (a report's minute, an audit's settled window): no machine clock cuts
    /// them (Stripe documents no limit on `end_time` but its minute alignment,
    /// docs.stripe.com/api/billing/meter-event-summary/list).
    async fn summed(
        &self,
        customer: &CustomerId,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> anyhow::Result<Option<f64>> {
        let minute = |t: DateTime<Utc>| {
            t.duration_trunc(TimeDelta::minutes(1))
                .map_err(|e| anyhow::anyhow!("a time to the minute: {e}"))
        };
        let start = minute(start)?;
        let end = minute(end)?;
        if end <= start {
            return Ok(Some(0.0));
        }
        let account = customer.connected_account();
        let meter = self.meter_id(account).await?;
        let query = [
            ("customer", customer.at_provider().to_owned()),
            ("start_time", start.timestamp().to_string()),
            ("end_time", end.timestamp().to_string()),
        ];
        let headers: Vec<(&str, &str)> = account.iter().map(|a| ("Stripe-Account", *a)).collect();
        let path = format!("/v1/billing/meters/{}/event_summaries", path_id(&meter)?);
        let summaries = self
            .api
            .get_found(&path, &query, &headers)
            .await?
            .with_context(|| format!("GET {path} answered 404 Not Found"))?;
        Ok(Some(aggregated(&summaries)))
    }
}

/// The sum of a list of event summaries' `aggregated_value`.
fn aggregated(summaries: &Value) -> f64 {
    summaries
        .get("data")
        .and_then(Value::as_array)
        .map(|data| {
            data.iter()
                .filter_map(|s| s.get("aggregated_value").and_then(Value::as_f64))
                .sum()
        })
        .unwrap_or_default()
}

/// What Stripe's answers say beyond the common reading:
/// - a 400 saying the `identifier` is held already, within its window ("An event already
///   exists with identifier …"; Stripe documents no code for it): taken, not refused;
/// - a 409, the same `Idempotency-Key` still executing ("the request conflicted with another
///   that was executing concurrently", Stripe's idempotent-requests reference): that request
///   may yet land, so this one is unanswered, tried again;
/// - a 400 `idempotency_error`, the key used before with other parameters: Stripe executed
///   nothing, so it is not taken, tried again under the next attempt's key.
fn stripes_own(status: reqwest::StatusCode, body: &Value) -> Option<Sent> {
    let code = body.pointer("/error/code").and_then(Value::as_str);
    let kind = body.pointer("/error/type").and_then(Value::as_str);
    let message = body
        .pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let lower = message.to_ascii_lowercase();
    match status.as_u16() {
        400 if code == Some("resource_already_exists")
            || (lower.contains("identifier") && lower.contains("already")) =>
        {
            Some(Sent::Taken)
        }
        400 if kind == Some("idempotency_error") => {
            Some(Sent::NotTaken(format!("400 idempotency_error: {message}")))
        }
        409 => Some(Sent::Unanswered(format!(
            "409: the same key still executing at Stripe: {message}"
        ))),
        _ => None,
    }
}

impl Meter for StripeMeter {
    fn send<'a>(&'a self, report: &'a MeterReport) -> BoxFuture<'a, Sent> {
        Box::pin(self.post(report))
    }

    fn dedupe(&self) -> Dedupe {
        Dedupe::Within(DEDUPE_WINDOW)
    }

    fn cancel_window(&self) -> Option<Duration> {
        Some(CANCEL_WINDOW)
    }

    fn minute_total<'a>(
        &'a self,
        report: &'a MeterReport,
    ) -> BoxFuture<'a, anyhow::Result<Option<f64>>> {
        Box::pin(self.minute(report))
    }

    fn total<'a>(
        &'a self,
        customer: &'a CustomerId,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> BoxFuture<'a, anyhow::Result<Option<f64>>> {
        Box::pin(self.summed(customer, start, end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_identifier_stripe_holds_already_is_taken() {
        let bad = reqwest::StatusCode::BAD_REQUEST;
        let held = json!({"error": {"type": "invalid_request_error",
            "message": "An event already exists with identifier bi_1."}});
        assert_eq!(stripes_own(bad, &held), Some(Sent::Taken));
        let coded = json!({"error": {"code": "resource_already_exists", "message": "x"}});
        assert_eq!(stripes_own(bad, &coded), Some(Sent::Taken));
        let other =
            json!({"error": {"code": "resource_missing", "message": "No such customer: 'cus_1'"}});
        assert_eq!(stripes_own(bad, &other), None);
        assert_eq!(
            stripes_own(reqwest::StatusCode::INTERNAL_SERVER_ERROR, &held),
            None
        );
    }

    #[test]
    fn a_key_still_executing_is_tried_again_and_one_used_with_other_parameters_was_not_taken() {
        let executing = json!({"error": {"type": "idempotency_error",
            "message": "There is currently another in-progress request using this Idempotent Key."}});
        assert!(matches!(
            stripes_own(reqwest::StatusCode::CONFLICT, &executing),
            Some(Sent::Unanswered(_))
        ));
        let reused = json!({"error": {"type": "idempotency_error",
            "message": "Keys for idempotent requests can only be used with the same parameters they were first used with."}});
        assert!(matches!(
            stripes_own(reqwest::StatusCode::BAD_REQUEST, &reused),
            Some(Sent::NotTaken(_))
        ));
    }
}
