//! A debit told to a Kinde metered feature (docs/design.md §4.13): `POST
//! /api/v1/billing/meter_usage` with `{customer_agreement_id, billing_feature_code,
//! meter_value, meter_usage_timestamp, meter_type_code: "delta"}` (Kinde's Management API
//! specification, `createMeterUsageRecord`), the agreement being the customer's current one
//! that includes the feature (`GET /api/v1/billing/agreements?customer_id=…&feature_code=…`).
//!
//! Kinde documents no dedupe key and answers no record id, and no API reads usage back: a send
//! that went unanswered is never sent again by itself ([`Dedupe::Never`], no read-back). It
//! waits for an operator, who sees in Kinde whether the usage is there and replays it with
//! `--not-held` when it is not. A correction (a reversed debit's) is refused for the same
//! operator: Kinde documents neither an adjustment nor a negative usage.

use anyhow::Context;
use chrono::Utc;
use serde_json::{json, Value};

use super::api::KindeEntitlements;
use crate::domain::meter::MeterReport;
use crate::providers::meter::{answer, common, not_sent, Dedupe, Meter, Sent};
use crate::providers::Api;
use crate::BoxFuture;

/// The longest feature code taken.
pub const MAX_FEATURE_CODE: usize = 255;

pub struct KindeMeter {
    /// The token's holder: the same client-credentials grant as the entitlements read.
    api: KindeEntitlements,
    feature_code: String,
}

impl KindeMeter {
    pub fn new(api: Api, client_id: String, feature_code: &str) -> Self {
        Self {
            api: KindeEntitlements::new(api, client_id),
            feature_code: feature_code.to_owned(),
        }
    }

    async fn post(&self, report: &MeterReport) -> Sent {
        if report.take_back.is_some() {
            return Sent::Refused(
                "Kinde documents no correction of meter usage (no adjustment, and a delta is \
                 a usage): correct it in Kinde"
                    .to_owned(),
            );
        }
        let api = match self.api.authorized().await {
            Ok(api) => api,
            Err(error) => return not_sent("no access token", error),
        };
        let agreement = match self.agreement(&api, report.customer.as_str()).await {
            Ok(Some(agreement)) => agreement,
            Ok(None) => {
                return Sent::NotTaken(format!(
                    "no current agreement of the customer includes the feature '{}'",
                    self.feature_code
                ))
            }
            Err(error) => return not_sent("reading the agreements", error),
        };
        let key = match api.key.get().await {
            Ok(key) => key,
            Err(error) => return Sent::NotTaken(format!("no access token: {error:#}")),
        };
        let request = api
            .http
            .post(format!("{}/api/v1/billing/meter_usage", api.base_url))
            .bearer_auth(key)
            .json(&body(&agreement, &self.feature_code, report));
        answer(api.send(request).await, common).await
    }

    /// The customer's agreement that includes the feature and has not expired.
    async fn agreement(&self, api: &Api, customer: &str) -> anyhow::Result<Option<String>> {
        let query = [
            ("customer_id", customer.to_owned()),
            ("feature_code", self.feature_code.clone()),
        ];
        let Some(body) = api
            .get_found("/api/v1/billing/agreements", &query, &[])
            .await?
        else {
            return Ok(None);
        };
        let agreements = body
            .get("agreements")
            .and_then(Value::as_array)
            .context("the agreements read has no agreements")?;
        Ok(current_agreement(
            agreements,
            &self.feature_code,
            Utc::now(),
        ))
    }
}

/// The first agreement that has not expired and lists the feature among its entitlements (a
/// list filtered by Kinde on the feature already; checked again here).
fn current_agreement(
    agreements: &[Value],
    feature_code: &str,
    now: chrono::DateTime<Utc>,
) -> Option<String> {
    agreements
        .iter()
        .filter(|a| {
            a.get("expires_on")
                .and_then(Value::as_str)
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .is_none_or(|t| t > now)
        })
        .find(|a| {
            a.get("entitlements")
                .and_then(Value::as_array)
                .is_none_or(|es| {
                    es.iter().any(|e| {
                        e.get("feature_code").and_then(Value::as_str) == Some(feature_code)
                    })
                })
        })
        .and_then(|a| a.get("id"))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// The usage record of one report: its amount added to the cycle's (`delta`).
fn body(agreement: &str, feature_code: &str, report: &MeterReport) -> Value {
    json!({
        "customer_agreement_id": agreement,
        "billing_feature_code": feature_code,
        "meter_value": report.value.to_string(),
        "meter_usage_timestamp": report.occurred_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "meter_type_code": "delta",
    })
}

impl Meter for KindeMeter {
    fn send<'a>(&'a self, report: &'a MeterReport) -> BoxFuture<'a, Sent> {
        Box::pin(self.post(report))
    }

    fn dedupe(&self) -> Dedupe {
        Dedupe::Never
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_agreement_with_the_feature_is_reported_to() {
        let now: chrono::DateTime<Utc> = "2026-12-03T10:00:00Z".parse().unwrap();
        let agreements = vec![
            json!({"id": "agreement_old", "plan_code": "pro", "expires_on": "2026-11-01T00:00:00Z",
                   "entitlements": [{"feature_code": "api_calls", "entitlement_id": "entitlement_1"}]}),
            json!({"id": "agreement_other", "plan_code": "pro", "expires_on": null,
                   "entitlements": [{"feature_code": "seats", "entitlement_id": "entitlement_2"}]}),
            json!({"id": "agreement_now", "plan_code": "pro", "expires_on": null,
                   "entitlements": [{"feature_code": "api_calls", "entitlement_id": "entitlement_3"}]}),
        ];
        assert_eq!(
            current_agreement(&agreements, "api_calls", now).as_deref(),
            Some("agreement_now")
        );
        assert_eq!(current_agreement(&agreements[..2], "api_calls", now), None);
    }
}
