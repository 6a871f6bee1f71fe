//! Kinde's Management API as reconciliation reads it (docs/design.md §6.1). Kinde has no event
//! feed; it shows one billing customer's current plans and entitlements:
//! `GET /api/v1/billing/entitlements?customer_id=…&expand=plans` (scope
//! `read:billing_entitlements`), answered `{"plans": [{"code", "subscribed_on"}],
//! "entitlements": [{"id", "feature_code", "entitlement_limit_max", …}], "has_more"}`, paged
//! by `starting_after` (the last entitlement's id). The call takes an M2M access token,
//! fetched with the client-credentials grant (`POST /oauth2/token`, audience `{base}/api`) and
//! kept until shortly before it expires.
//!
//! A customer whose plan register shows another plan than Kinde does becomes a corrective
//! event, `customer.plan_changed` (or `customer.agreement_cancelled` when Kinde shows none);
//! one whose Kinde entitlements register shows other features than Kinde lists becomes a
//! `customer.entitlements_read` carrying the whole list. Each is stored under a key derived
//! from what was read, so the same finding is stored once however many runs read it, and
//! applied through the same ordering guard as any delivery. A list Kinde pages is read to its
//! end: a partial list is never stored.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use sha2::{Digest, Sha256};

use super::decide::{entitlement_features, ENTITLEMENTS_GRANT, ENTITLEMENTS_READ};
use super::parse_claims;
use crate::billing::registers::{StoredEntitlement, StoredPlan};
use crate::providers::{Api, CustomerPlans, Fetched, StoredCustomer};
use crate::BoxFuture;

/// A token is renewed this long before Kinde says it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(60);
/// A register that moved this recently is not corrected yet.
pub const SETTLE: chrono::Duration = chrono::Duration::minutes(15);
/// The most pages of one customer's entitlements a read takes (Kinde's page is 10 by default);
/// a longer list fails the read rather than store part of it.
pub const MAX_ENTITLEMENT_PAGES: usize = 20;

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

/// One customer as the entitlements read shows it: its plans (from the first page) and every
/// page of its entitlements, each as Kinde lists it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CustomerNow {
    pub plans: Vec<PlanNow>,
    pub entitlements: Vec<Value>,
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
        let request = self.api.http.post(format!("{base}/oauth2/token")).form(&[
            ("grant_type", "client_credentials"),
            ("client_id", self.client_id.as_str()),
            ("client_secret", secret.as_str()),
            ("audience", &format!("{base}/api")),
        ]);
        let response = self
            .api
            .send(request)
            .await
            .map_err(crate::providers::CallError::into_error)
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

    /// The Management API, with a current access token as its key.
    pub(super) async fn authorized(&self) -> anyhow::Result<Api> {
        Ok(Api {
            key: self.token().await?.into(),
            ..self.api.clone()
        })
    }

    /// The customer's current plans and entitlements, every page; `None` when Kinde does not
    /// know the customer.
    async fn read(&self, customer: &str) -> anyhow::Result<Option<CustomerNow>> {
        let api = self.authorized().await?;
        let mut now = CustomerNow::default();
        let mut after: Option<String> = None;
        for page in 0..MAX_ENTITLEMENT_PAGES {
            let mut query = vec![
                ("customer_id", customer.to_owned()),
                ("expand", "plans".to_owned()),
            ];
            query.extend(after.take().map(|id| ("starting_after", id)));
            let Some(body) = api
                .get_found("/api/v1/billing/entitlements", &query, &[])
                .await?
            else {
                anyhow::ensure!(page == 0, "a later page of the entitlements answered 404");
                return Ok(None);
            };
            if page == 0 {
                now.plans = match body.get("plans") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(plans) => serde_json::from_value(plans.clone())
                        .context("the entitlements read lists plans Kinde does not document")?,
                };
            }
            let listed = match body.get("entitlements") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(listed)) => listed.clone(),
                Some(_) => bail!("the entitlements read's entitlements are not a list"),
            };
            let last = listed
                .last()
                .and_then(|e| e.get("id"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            now.entitlements.extend(listed);
            if !body
                .get("has_more")
                .and_then(Value::as_bool)
                .unwrap_or(false)
            {
                return Ok(Some(now));
            }
            after = Some(last.context(
                "Kinde has more entitlements, but the page's last names no id to read on from",
            )?);
        }
        bail!(
            "the entitlements run past {MAX_ENTITLEMENT_PAGES} pages: a partial list is never \
             stored"
        )
    }

    async fn check(
        &self,
        customer: &str,
        local: &StoredCustomer,
        read_at: DateTime<Utc>,
    ) -> anyhow::Result<Vec<Fetched>> {
        let Some(now) = self.read(customer).await? else {
            return Ok(Vec::new());
        };
        let held = local
            .entitlements
            .iter()
            .find(|e| e.grant == ENTITLEMENTS_GRANT);
        let mut found: Vec<Fetched> =
            correction(customer, &now.plans, local.plan.as_ref(), read_at)
                .into_iter()
                .collect();
        found.extend(entitlements_correction(
            customer,
            &now.entitlements,
            held,
            read_at,
        )?);
        Ok(found)
    }
}

impl CustomerPlans for KindeEntitlements {
    fn corrections<'a>(
        &'a self,
        customer: &'a str,
        local: &'a StoredCustomer,
        read_at: DateTime<Utc>,
    ) -> BoxFuture<'a, anyhow::Result<Vec<Fetched>>> {
        Box::pin(self.check(customer, local, read_at))
    }
}

/// The corrective event for a Kinde entitlements register that holds other features than
/// Kinde lists, read at `read_at`: a `customer.entitlements_read` carrying the whole list as
/// read (its decision maps it to features, docs/design.md §6.1); `None` when they agree. No
/// webhook writes this register, so nothing can be crossing the read and no settling time
/// applies. Its time is the read's, and its key is derived from the list read and the
/// register it corrects: a later run that finds the same stores a copy.
pub fn entitlements_correction(
    customer: &str,
    entitlements: &[Value],
    held: Option<&StoredEntitlement>,
    read_at: DateTime<Utc>,
) -> anyhow::Result<Option<Fetched>> {
    let features = entitlement_features(entitlements)
        .map_err(|p| anyhow::anyhow!("the entitlements read: {}", p.0))?;
    let agrees = match held {
        None => features.is_empty(),
        Some(held) => held.active && held.features == features,
    };
    if agrees {
        return Ok(None);
    }
    let list = Value::Array(entitlements.to_vec());
    let digest = hex::encode(&Sha256::digest(serde_json::to_vec(&list)?)[..8]);
    let since = held.map_or(0, |h| h.version_at.timestamp_millis());
    let claims = json!({
        "type": ENTITLEMENTS_READ,
        "event_id": format!("reconcile:{customer}:entitlements:{digest}:after:{since}"),
        "timestamp": read_at.to_rfc3339_opts(SecondsFormat::Millis, true),
        "source": "reconcile",
        "data": {"customer_id": customer, "entitlements": list},
    });
    let body = serde_json::to_vec(&claims)?;
    Ok(Some(Fetched {
        body,
        event: parse_claims(claims, None, read_at),
    }))
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

    /// An entitlement as Kinde's `GET /api/v1/billing/entitlements` lists it.
    fn entitlement(code: &str, max: Option<i64>) -> Value {
        json!({"id": format!("entitlement_{code}"), "fixed_charge": null,
               "price_name": code, "unit_amount": null, "feature_code": code,
               "feature_name": code, "entitlement_limit_max": max,
               "entitlement_limit_min": null})
    }

    fn held(features: Value, at: &str) -> StoredEntitlement {
        StoredEntitlement {
            grant: ENTITLEMENTS_GRANT.into(),
            active: true,
            features: crate::domain::features::of_json_object(features.as_object().unwrap())
                .unwrap(),
            version_at: at.parse().unwrap(),
        }
    }

    #[test]
    fn entitlements_unlike_the_register_become_one_read_event_at_the_read_time() {
        let read = [entitlement("seats", Some(10)), entitlement("sso", None)];
        let fetched = entitlements_correction("kc_1", &read, None, read_at())
            .unwrap()
            .expect("a customer with no register but features at Kinde is corrected");
        let payload = fetched.event.payload.as_ref().unwrap();
        assert_eq!(payload["type"], ENTITLEMENTS_READ);
        assert_eq!(
            payload["data"]["entitlements"],
            json!(read),
            "the list as read"
        );
        let meta = fetched.event.meta.as_ref().unwrap();
        assert_eq!(meta.customer.as_ref().map(|c| c.as_str()), Some("kc_1"));
        assert_eq!(meta.occurred_at.as_datetime(), read_at());
        let key = fetched.event.dedupe_key.as_str();
        assert!(
            key.starts_with("reconcile:kc_1:entitlements:") && key.ends_with(":after:0"),
            "{key}"
        );
        // Its decision is the register Kinde's list gives.
        let decision = crate::providers::decide(
            crate::domain::SourceKind::Kinde,
            ENTITLEMENTS_READ,
            payload,
            &crate::domain::Catalog::parse("{}").unwrap(),
        );
        assert_eq!(
            decision,
            crate::billing::Decision::apply(vec![crate::billing::Effect::Entitlement {
                grant: ENTITLEMENTS_GRANT.into(),
                active: true,
                features: held(json!({"seats": 10, "sso": true}), "2026-01-01T00:00:00Z").features,
                rank: crate::billing::Rank(0),
            }])
        );
        // Another register: another finding, named after the register it corrects.
        let other = held(json!({"seats": 5}), "2026-02-01T00:00:00Z");
        let fetched = entitlements_correction("kc_1", &read, Some(&other), read_at())
            .unwrap()
            .unwrap();
        assert!(fetched
            .event
            .dedupe_key
            .as_str()
            .ends_with(&format!(":after:{}", other.version_at.timestamp_millis())));
    }

    #[test]
    fn entitlements_that_agree_with_the_register_correct_nothing() {
        let read = [entitlement("seats", Some(10))];
        let same = held(json!({"seats": 10}), "2026-03-10T11:59:00Z");
        assert!(entitlements_correction("c", &read, Some(&same), read_at())
            .unwrap()
            .is_none());
        assert!(entitlements_correction("c", &[], None, read_at())
            .unwrap()
            .is_none());
        // Kinde lists none, the register gives some: corrected to none.
        let fetched = entitlements_correction("c", &[], Some(&same), read_at())
            .unwrap()
            .unwrap();
        assert_eq!(
            fetched.event.payload.unwrap()["data"]["entitlements"],
            json!([])
        );
    }

    #[test]
    fn the_same_entitlements_finding_is_the_same_event_on_every_run() {
        let read = [entitlement("seats", Some(10))];
        let first = entitlements_correction("c", &read, None, read_at())
            .unwrap()
            .unwrap();
        let later =
            entitlements_correction("c", &read, None, read_at() + chrono::Duration::hours(1))
                .unwrap()
                .unwrap();
        assert_eq!(first.event.dedupe_key, later.event.dedupe_key);
        assert_eq!(first.event.content_hash, later.event.content_hash);
        let more = [entitlement("seats", Some(20))];
        let other = entitlements_correction("c", &more, None, read_at())
            .unwrap()
            .unwrap();
        assert_ne!(
            first.event.dedupe_key, other.event.dedupe_key,
            "another list read"
        );
        let odd = [
            entitlement("seats", None),
            json!({"feature_code": "x", "entitlement_limit_max": "10"}),
        ];
        assert!(entitlements_correction("c", &odd, None, read_at()).is_err());
    }

    #[test]
    fn a_register_that_just_moved_is_left_to_settle() {
        let plans = [plan("pro", "2026-01-01T00:00:00Z")];
        let local = stored(Some("basic"), "2026-03-10T11:50:00Z");
        assert!(correction("c", &plans, Some(&local), read_at()).is_none());
    }
}
