//! Lemon Squeezy's API as reconciliation reads it (docs/design.md §6.5): `GET /v1/subscriptions`
//! in JSON:API pages (`page[number]`, `page[size]`, `meta.page.lastPage`), as lemonsqueezy.js
//! `listSubscriptions` reads it. A subscription the local register shows in another state,
//! when the provider's `updated_at` is newer, becomes a corrective `subscription_updated`
//! event with the provider's time: the same ordering guard as any delivery applies to it.

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::decide::{ends, plan_keys, status};
use super::parse_event;
use crate::billing::registers::StoredSubscription;
use crate::domain::DedupeKey;
use crate::providers::{Api, Fetched, SubscriptionSweep, SweepPage};
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
