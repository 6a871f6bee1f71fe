//! Kinde's Management API as reconciliation reads it (docs/design.md §6.1). Kinde has no event
//! feed; it shows one billing customer's current plans:
//! `GET /api/v1/billing/entitlements?customer_id=…&expand=plans` (scope
//! `read:billing_entitlements`), answered `{"plans": [{"code", "subscribed_on"}], …}`. The
//! call takes an M2M access token, fetched with the client-credentials grant
//! (`POST /oauth2/token`, audience `{base}/api`) and kept until shortly before it expires.
//!
//! A customer whose plan register shows another plan than Kinde does becomes a corrective
//! event, `customer.plan_changed` (or `customer.agreement_cancelled` when Kinde shows none),
//! stored under a key derived from what was read, so the same finding is stored once however
//! many runs read it, and applied through the same ordering guard as any delivery.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use super::parse_claims;
use crate::billing::registers::StoredPlan;
use crate::providers::{Api, CustomerPlans, Fetched};
use crate::BoxFuture;

/// A token is renewed this long before Kinde says it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(60);
/// A register that moved this recently is not corrected yet.
pub const SETTLE: chrono::Duration = chrono::Duration::minutes(15);

pub struct KindeEntitlements {
    api: Api,
    client_id: String,
    token: Mutex<Option<Token>>,
}

#[derive(Clone)]
struct Token {
    value: String,
    until: Instant,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// A plan as the entitlements read lists it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PlanNow {
    pub code: String,
    #[serde(default)]
    pub subscribed_on: Option<DateTime<Utc>>,
}

impl KindeEntitlements {
    pub fn new(api: Api, client_id: String) -> Self {
        Self {
            api,
            client_id,
            token: Mutex::new(None),
        }
    }

    /// The cached access token, or a new one. The lock is never held across the request: the
    /// scheduler reads one source at a time, so two fetches at once cost one spare token.
    async fn token(&self) -> anyhow::Result<String> {
        let now = Instant::now();
        if let Some(token) = self.held().filter(|t| now < t.until) {
            return Ok(token.value);
        }
        let base = &self.api.base_url;
        let secret = self.api.key.get().await?;
        let response = self
            .api
            .http
            .post(format!("{base}/oauth2/token"))
            .form(&[
                ("grant_type", "client_credentials"),
                ("client_id", self.client_id.as_str()),
                ("client_secret", secret.as_str()),
                ("audience", &format!("{base}/api")),
            ])
            .send()
            .await
            .context("POST /oauth2/token")?;
        let status = response.status();
        if !status.is_success() {
            bail!(
                "POST /oauth2/token answered {status}: check the source's api_client_id and \
                 its client secret (api_key), and that the M2M application may call the \
                 Management API with read:billing_entitlements"
            );
        }
        let issued: TokenResponse = response
            .json()
            .await
            .context("reading the token response")?;
        let lifetime = Duration::from_secs(issued.expires_in.unwrap_or(3600));
        let token = Token {
            value: issued.access_token,
            until: now + lifetime.saturating_sub(TOKEN_MARGIN),
        };
        *self.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(token.clone());
        Ok(token.value)
    }

    fn held(&self) -> Option<Token> {
        self.token.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The customer's current plans; `None` when Kinde does not know the customer.
    async fn plans(&self, customer: &str) -> anyhow::Result<Option<Vec<PlanNow>>> {
        let api = Api {
            key: self.token().await?.into(),
            ..self.api.clone()
        };
        let query = [
            ("customer_id", customer.to_owned()),
            ("expand", "plans".to_owned()),
        ];
        let Some(body) = api
            .get_found("/api/v1/billing/entitlements", &query, &[])
            .await?
        else {
            return Ok(None);
        };
        let plans = match body.get("plans") {
            None | Some(Value::Null) => Vec::new(),
            Some(plans) => serde_json::from_value(plans.clone())
                .context("the entitlements read lists plans Kinde does not document")?,
        };
        Ok(Some(plans))
    }

    async fn check(
        &self,
        customer: &str,
        local: Option<&StoredPlan>,
        read_at: DateTime<Utc>,
    ) -> anyhow::Result<Option<Fetched>> {
        let Some(plans) = self.plans(customer).await? else {
            return Ok(None);
        };
        Ok(correction(customer, &plans, local, read_at))
    }
}

impl CustomerPlans for KindeEntitlements {
    fn correction<'a>(
        &'a self,
        customer: &'a str,
        local: Option<&'a StoredPlan>,
        read_at: DateTime<Utc>,
    ) -> BoxFuture<'a, anyhow::Result<Option<Fetched>>> {
        Box::pin(self.check(customer, local, read_at))
    }
}

/// The corrective event for a plan register that shows another plan than Kinde, read at
/// `read_at`; `None` when they agree, or when the register moved within [`SETTLE`] (a change
/// and its webhook may still be crossing the read).
///
/// Kinde's `subscribed_on` is when the customer took a plan and says nothing of later changes,
/// so the event's time is the read's: the plan Kinde shows is the plan now, and any event
/// after the read still wins over it. The time is the envelope's `timestamp` (no
/// `event_timestamp`), which the content hash leaves out, and the key is derived from the
/// finding (the register state it corrects and what Kinde showed): a later run that finds the
/// same before the correction is applied stores a copy, not a second event or a conflict.
pub fn correction(
    customer: &str,
    plans: &[PlanNow],
    local: Option<&StoredPlan>,
    read_at: DateTime<Utc>,
) -> Option<Fetched> {
    // Several plans at once: the one taken last is the one in force.
    let current = plans.iter().max_by_key(|p| p.subscribed_on);
    if local.is_some_and(|l| l.version_at > read_at - SETTLE) {
        return None;
    }
    let local_key = local.and_then(|l| l.plan_key.as_deref());
    let (event_type, code) = match (current, local_key) {
        (Some(plan), Some(key)) if plan.code == key => return None,
        (None, None) => return None,
        (Some(plan), _) => ("customer.plan_changed", Some(plan.code.as_str())),
        (None, Some(_)) => ("customer.agreement_cancelled", None),
    };
    // Stable per finding: the register state it corrects and what Kinde showed.
    let since = local.map_or(0, |l| l.version_at.timestamp_millis());
    let event_id = format!(
        "reconcile:{customer}:{}:after:{since}",
        code.unwrap_or("none")
    );
    let at = read_at.to_rfc3339_opts(SecondsFormat::Millis, true);
    let mut data = json!({"customer_id": customer});
    if let Some(code) = code {
        data["plan"] = json!({"code": code});
    }
    let claims = json!({
        "type": event_type,
        "event_id": event_id,
        "timestamp": at,
        "source": "reconcile",
        "data": data,
    });
    let body = serde_json::to_vec(&claims).ok()?;
    Some(Fetched {
        body,
        event: parse_claims(claims, None, read_at),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(code: &str, on: &str) -> PlanNow {
        PlanNow {
            code: code.into(),
            subscribed_on: Some(on.parse().unwrap()),
        }
    }

    fn stored(key: Option<&str>, at: &str) -> StoredPlan {
        StoredPlan {
            plan_key: key.map(str::to_owned),
            version_at: at.parse().unwrap(),
        }
    }

    fn read_at() -> DateTime<Utc> {
        "2026-03-10T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn agreeing_views_correct_nothing() {
        let plans = [plan("pro", "2026-01-01T00:00:00Z")];
        let local = stored(Some("pro"), "2026-02-01T00:00:00Z");
        assert!(correction("c", &plans, Some(&local), read_at()).is_none());
        assert!(correction("c", &[], None, read_at()).is_none());
        assert!(correction(
            "c",
            &[],
            Some(&stored(None, "2026-02-01T00:00:00Z")),
            read_at()
        )
        .is_none());
    }

    #[test]
    fn another_plan_becomes_a_plan_change_at_the_read_time() {
        let plans = [
            plan("basic", "2025-01-01T00:00:00Z"),
            plan("pro", "2026-01-01T00:00:00Z"),
        ];
        let local = stored(Some("basic"), "2026-02-01T00:00:00Z");
        let fetched = correction("kc_1", &plans, Some(&local), read_at()).unwrap();
        let payload = fetched.event.payload.as_ref().unwrap();
        assert_eq!(payload["type"], "customer.plan_changed");
        assert_eq!(payload["data"]["plan"]["code"], "pro");
        let meta = fetched.event.meta.as_ref().unwrap();
        assert_eq!(meta.customer.as_ref().map(|c| c.as_str()), Some("kc_1"));
        assert_eq!(meta.occurred_at.as_datetime(), read_at());
        assert_eq!(
            fetched.event.dedupe_key.as_str(),
            format!(
                "reconcile:kc_1:pro:after:{}",
                local.version_at.timestamp_millis()
            )
        );
    }

    #[test]
    fn no_plan_at_kinde_cancels_a_stored_plan() {
        let local = stored(Some("pro"), "2026-02-01T00:00:00Z");
        let fetched = correction("kc_1", &[], Some(&local), read_at()).unwrap();
        let payload = fetched.event.payload.unwrap();
        assert_eq!(payload["type"], "customer.agreement_cancelled");
        assert!(payload["data"].get("plan").is_none());
    }

    #[test]
    fn the_same_finding_is_the_same_event_on_every_run() {
        let plans = [plan("pro", "2026-01-01T00:00:00Z")];
        let first = correction("c", &plans, None, read_at()).unwrap();
        let later = correction("c", &plans, None, read_at() + chrono::Duration::hours(1)).unwrap();
        assert_eq!(first.event.dedupe_key, later.event.dedupe_key);
        assert_eq!(first.event.content_hash, later.event.content_hash);
    }

    #[test]
    fn a_register_that_just_moved_is_left_to_settle() {
        let plans = [plan("pro", "2026-01-01T00:00:00Z")];
        let local = stored(Some("basic"), "2026-03-10T11:50:00Z");
        assert!(correction("c", &plans, Some(&local), read_at()).is_none());
    }
}
