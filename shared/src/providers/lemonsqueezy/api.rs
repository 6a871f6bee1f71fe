//! Lemon Squeezy's API as reconciliation reads it (docs/design.md §6.5): `GET /v1/subscriptions`
//! in JSON:API pages (`page[number]`, `page[size]`, `meta.page.lastPage`), as lemonsqueezy.js
//! `listSubscriptions` reads it. A subscription the local register shows in another state,
//! when the provider's `updated_at` is newer, becomes a corrective `subscription_updated`
//! event with the provider's time: the same ordering guard as any delivery applies to it.
//! And the one object read the worker makes: `GET /v1/subscriptions/{id}` (lemonsqueezy.js
//! `getSubscription`), for a subscription payment before any event of its subscription, or to
//! settle a tie.

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::decide::{ends, plan_keys, status};
use super::parse_event;
use crate::billing::registers::StoredSubscription;
use crate::domain::{CustomerId, DedupeKey};
use crate::providers::{
    path_id, Api, Fetched, MadeFor, ReadFor, Reads, SubscriptionNow, SubscriptionSweep, SweepPage,
};
use crate::BoxFuture;

/// The largest page Lemon Squeezy serves.
const PAGE_SIZE: usize = 100;

/// JSON:API's media type, which Lemon Squeezy's API speaks.
const JSON_API: &str = "application/vnd.api+json";

pub struct LemonSqueezySubscriptions {
    api: Api,
}

impl LemonSqueezySubscriptions {
    pub fn new(api: Api) -> Self {
        Self { api }
    }

    async fn fetch(&self, page: u32) -> anyhow::Result<SweepPage> {
        let query = [
            ("page[number]", page.to_string()),
            ("page[size]", PAGE_SIZE.to_string()),
        ];
        let body = self
            .api
            .get_found("/v1/subscriptions", &query, &[("accept", JSON_API)])
            .await?
            .context("GET /v1/subscriptions answered 404 Not Found")?;
        SweepPage::of(&body, "/data", "/meta/page/lastPage", page)
    }
}

impl SubscriptionSweep for LemonSqueezySubscriptions {
    fn page(&self, page: u32) -> BoxFuture<'_, anyhow::Result<SweepPage>> {
        Box::pin(self.fetch(page))
    }

    fn subscription_id<'a>(&self, subscription: &'a Value) -> Option<&'a str> {
        subscription.get("id").and_then(Value::as_str)
    }

    fn correction(
        &self,
        subscription: &Value,
        local: Option<&StoredSubscription>,
    ) -> anyhow::Result<Option<Fetched>> {
        let Some(attributes) = subscription.get("attributes") else {
            return Ok(None);
        };
        let text = |p: &str| attributes.pointer(p).and_then(Value::as_str);
        let (Some(id), Some(ls_status), Some(time)) = (
            self.subscription_id(subscription),
            text("/status"),
            text("/updated_at"),
        ) else {
            return Ok(None);
        };
        let remote_at = DateTime::parse_from_rfc3339(time)
            .context("subscription updated_at")?
            .with_timezone(&Utc);
        let keys = plan_keys(attributes);
        // Ends that cannot be read are no reason to store a correction: the event's own
        // reading would find it unprocessable.
        let remote_ends = ends(attributes).ok();
        let differs = match local {
            None => true,
            Some(l) => {
                remote_at > l.version_at
                    && (l.status != status(ls_status)
                        || l.plan_key.as_ref().is_some_and(|key| !keys.contains(key))
                        || remote_ends.is_some_and(|ends| ends != l.ends))
            }
        };
        if !differs {
            return Ok(None);
        }
        let body = serde_json::to_vec(&json!({
            "meta": {"event_name": "subscription_updated",
                     "test_mode": attributes.get("test_mode").cloned().unwrap_or(Value::Null)},
            "data": subscription,
        }))?;
        let mut event = parse_event(&body, Utc::now());
        // One key a state read: a sweep that reads it again finds it stored.
        event.dedupe_key =
            DedupeKey::parse(&format!("reconcile:{id}:{}", remote_at.timestamp_millis()))?;
        Ok(Some(Fetched { body, event }))
    }
}

/// The type a subscription read is stored as: the subscription's state, as Lemon Squeezy's
/// `subscription_updated` carries it.
pub const SUBSCRIPTION_READ_TYPE: &str = "subscription_updated";

pub struct LemonSqueezyReads {
    api: Api,
}

impl LemonSqueezyReads {
    pub fn new(api: Api) -> Self {
        Self { api }
    }

    /// `GET /v1/subscriptions/{id}`: the subscription, the answer's JSON:API `data`; `None` on
    /// a 404.
    async fn subscription_data(&self, id: &str) -> anyhow::Result<Option<Value>> {
        let path = format!("/v1/subscriptions/{}", path_id(id)?);
        self.api
            .object(
                &path,
                &[("accept", JSON_API)],
                "/data",
                &["attributes"],
                "the subscription read has no data.attributes",
            )
            .await
    }

    /// The subscription read as `decide` reads a subscription event's.
    async fn read_subscription(&self, id: &str) -> anyhow::Result<Option<SubscriptionNow>> {
        let Some(subscription) = self.subscription_data(id).await? else {
            return Ok(None);
        };
        let attributes = &subscription["attributes"];
        SubscriptionNow::read(
            attributes.get("status").and_then(Value::as_str).map(status),
            plan_keys(attributes),
            ends(attributes),
        )
        .map(Some)
    }
}

impl Reads for LemonSqueezyReads {
    fn subscription<'a>(
        &'a self,
        _customer: &'a CustomerId,
        id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<SubscriptionNow>>> {
        Box::pin(self.read_subscription(id))
    }

    /// A subscription payment before any event of its subscription (docs/design.md §6.5).
    fn subscription_object<'a>(
        &'a self,
        _customer: &'a CustomerId,
        id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<Value>>> {
        Box::pin(self.subscription_data(id))
    }
}

/// The subscription a payment asked the plan of, read, as the event it is stored as
/// (docs/design.md §6.2, §6.5): a `subscription_updated` of the object as read, in the
/// payment's mode, whose key is the read's and whose provider time is the payment's (never
/// the clock's, nor the object's `updated_at`), so its place in the order and the period it
/// grants in are the payment's; `meta.payment_event` names the event it was read for. Only a
/// payment's read is made for Lemon Squeezy.
pub fn read_as_event(read: &ReadFor<'_>, object: &Value) -> Option<Fetched> {
    let MadeFor::Invoice { key, payload, .. } = &read.made_for else {
        return None;
    };
    let test_mode = payload
        .and_then(|p| p.pointer("/meta/test_mode"))
        .cloned()
        .unwrap_or(Value::Null);
    let body = serde_json::to_vec(&json!({
        "meta": {"event_name": SUBSCRIPTION_READ_TYPE, "test_mode": test_mode,
                 "payment_event": key.as_str()},
        "data": object,
    }))
    .ok()?;
    let mut event = parse_event(&body, Utc::now());
    event.dedupe_key = read.key.clone();
    // The object's time is when it was read; the read stands for the payment.
    event.meta.as_mut().ok()?.occurred_at = read.at.into();
    Some(Fetched { body, event })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::secrets::ApiKey;
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    /// `GET /v1/subscriptions/1` as lemonsqueezy.js v4.0.0 types it (testdata/providers/README.md).
    fn answer() -> Value {
        let file = format!(
            "{}/../testdata/providers/lemonsqueezy/api/subscription.get.json",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
    }

    #[tokio::test]
    async fn a_subscription_read_is_its_data_read_as_decide_reads_it() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/v1/subscriptions/1"))
            .and(header("authorization", "Bearer ls_test_key"))
            .and(header("accept", JSON_API))
            .respond_with(ResponseTemplate::new(200).set_body_json(answer()))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/subscriptions/3"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!({"data": {"type": "subscriptions", "id": "3"}})),
            )
            .mount(&server)
            .await;
        let reads = LemonSqueezyReads::new(Api {
            base_url: server.uri(),
            key: ApiKey::Known("ls_test_key".into()),
            client_id: None,
            http: reqwest::Client::new(),
            budget: None,
        });
        let customer = CustomerId::parse("1").unwrap();
        let now = reads.subscription(&customer, "1").await.unwrap().unwrap();
        assert_eq!(now.status, "active");
        // The variant first, then the product (both 1 in the example).
        assert_eq!(now.plan_keys, vec!["1".to_owned(), "1".to_owned()]);
        assert_eq!(
            now.ends.current_period_end.unwrap().to_rfc3339(),
            "2025-12-01T10:00:00+00:00"
        );
        let object = reads.subscription_object(&customer, "1").await.unwrap();
        assert_eq!(object.unwrap()["type"], "subscriptions");
        // Unknown to Lemon Squeezy: none; an id that is not one is never sent.
        assert!(reads.subscription(&customer, "2").await.unwrap().is_none());
        assert!(reads.subscription(&customer, "../x").await.is_err());
        // An answer without the subscription's attributes is an error, not a subscription.
        let error = reads.subscription_object(&customer, "3").await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "the subscription read has no data.attributes"
        );
    }

    #[test]
    fn a_payments_read_is_a_subscription_updated_at_the_payments_time_under_the_reads_key() {
        let object = answer()["data"].clone();
        let payment_key = DedupeKey::parse("subscription_payment_success:x").unwrap();
        let customer = CustomerId::parse("1").unwrap();
        let payload = serde_json::json!({"meta": {"test_mode": true}});
        let at = DateTime::parse_from_rfc3339("2025-11-01T10:00:02Z")
            .unwrap()
            .with_timezone(&Utc);
        let read = ReadFor {
            key: DedupeKey::parse("read:subscription_payment_success:x:1").unwrap(),
            at,
            made_for: MadeFor::Invoice {
                key: &payment_key,
                payload: Some(&payload),
                customer: &customer,
            },
        };
        let fetched = read_as_event(&read, &object).unwrap();
        assert_eq!(
            fetched.event.dedupe_key.as_str(),
            "read:subscription_payment_success:x:1"
        );
        let meta = fetched.event.meta.unwrap();
        assert_eq!(meta.event_type, "subscription_updated");
        assert_eq!(meta.occurred_at.as_datetime(), at);
        assert_eq!(meta.customer.unwrap().as_str(), "1");
        let body: Value = serde_json::from_slice(&fetched.body).unwrap();
        assert_eq!(body["meta"]["test_mode"], true);
        assert_eq!(
            body["meta"]["payment_event"],
            "subscription_payment_success:x"
        );
    }
}
