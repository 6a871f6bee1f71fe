//! Polar's API as reconciliation reads it: `GET /v1/subscriptions/` (the current state, the
//! most recently started first). A subscription the local register shows in another state, when
//! the provider's `modified_at` is newer, becomes a corrective `subscription.updated` event
//! with the provider's time: it goes through the same ordering guard as any delivery and can
//! never overwrite newer state.

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::decide::{ends, plan_keys};
use super::parse_event;
use crate::billing::registers::StoredSubscription;
use crate::domain::CustomerId;
use crate::providers::{
    path_id, Api, Fetched, Reads, SubscriptionNow, SubscriptionSweep, SweepPage,
};
use crate::BoxFuture;

const PAGE_SIZE: usize = 100;

/// The order the sweep reads in: Polar's own default, the most recently started first. Polar
/// sorts subscriptions by none of their times but `started_at`, `ended_at`, `ends_at` and
/// `current_period_end` (`SubscriptionSortProperty` in its OpenAPI); any other `sorting` is
/// refused with a 422.
const SORTING: &str = "-started_at";

pub struct PolarSubscriptions {
    api: Api,
}

impl PolarSubscriptions {
    pub fn new(api: Api) -> Self {
        Self { api }
    }

    async fn fetch(&self, page: u32) -> anyhow::Result<SweepPage> {
        let query = [
            ("page", page.to_string()),
            ("limit", PAGE_SIZE.to_string()),
            ("sorting", SORTING.to_owned()),
        ];
        let body = self.api.get_json("/v1/subscriptions/", &query).await?;
        SweepPage::of(&body, "/items", "/pagination/max_page", page)
    }
}

impl SubscriptionSweep for PolarSubscriptions {
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
        let text = |p: &str| subscription.pointer(p).and_then(Value::as_str);
        let (Some(id), Some(status)) = (text("/id"), text("/status")) else {
            return Ok(None);
        };
        let Some(time) = text("/modified_at").or(text("/created_at")) else {
            return Ok(None);
        };
        let remote_at = DateTime::parse_from_rfc3339(time)
            .context("subscription modified_at")?
            .with_timezone(&Utc);
        let remote_plan = text("/product_id");
        // Ends that cannot be read are no reason to store a correction: the event's own
        // reading would find it unprocessable.
        let remote_ends = ends(subscription).ok();
        let differs = match local {
            None => true,
            Some(l) => {
                remote_at > l.version_at
                    && (l.status != status
                        || (remote_plan.is_some() && l.plan_key.as_deref() != remote_plan)
                        || remote_ends.is_some_and(|ends| ends != l.ends))
            }
        };
        if !differs {
            return Ok(None);
        }
        let message_id = format!("reconcile:{id}:{}", remote_at.timestamp_millis());
        let body = serde_json::to_vec(&json!({
            "type": "subscription.updated",
            "timestamp": time,
            "data": subscription,
        }))?;
        let event = parse_event(&message_id, &body, Utc::now());
        Ok(Some(Fetched { body, event }))
    }
}

/// Polar's subscription read (`GET /v1/subscriptions/{id}`), to settle a same-second tie.
pub struct PolarReads {
    api: Api,
}

impl PolarReads {
    pub fn new(api: Api) -> Self {
        Self { api }
    }

    async fn read_subscription(&self, id: &str) -> anyhow::Result<Option<SubscriptionNow>> {
        let path = format!("/v1/subscriptions/{}", path_id(id)?);
        self.api.subscription_now(&path, &[], plan_keys, ends).await
    }
}

impl Reads for PolarReads {
    fn subscription<'a>(
        &'a self,
        _customer: &'a CustomerId,
        id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<SubscriptionNow>>> {
        Box::pin(self.read_subscription(id))
    }
}
