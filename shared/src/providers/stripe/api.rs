//! Stripe's API as reconciliation reads it: `GET /v1/events` from a time, newest first,
//! paginated with `starting_after` (Stripe keeps 30 days of events).

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::parse_event;
use crate::providers::{Api, BoxFuture, EventFeed, FeedPage, Fetched};

/// The largest page Stripe serves.
const PAGE_SIZE: usize = 100;

pub struct StripeEvents {
    api: Api,
}

impl StripeEvents {
    pub fn new(api: Api) -> Self {
        Self { api }
    }

    async fn fetch(&self, since: DateTime<Utc>, after: Option<&str>) -> anyhow::Result<FeedPage> {
        use anyhow::Context;
        let mut query = vec![
            ("limit", PAGE_SIZE.to_string()),
            ("created[gte]", since.timestamp().to_string()),
        ];
        if let Some(after) = after {
            query.push(("starting_after", after.to_owned()));
        }
        let page = self.api.get_json("/v1/events", &query).await?;
        let listed = page
            .get("data")
            .and_then(Value::as_array)
            .context("the events list has no data")?;
        let mut events = Vec::with_capacity(listed.len());
        for event in listed {
            let body = serde_json::to_vec(event)?;
            let event = parse_event(&body, Utc::now());
            events.push(Fetched { body, event });
        }
        let last_id = listed
            .last()
            .and_then(|e| e.get("id"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let has_more = page.get("has_more").and_then(Value::as_bool) == Some(true);
        Ok(FeedPage {
            events,
            next: last_id.filter(|_| has_more),
        })
    }
}

impl EventFeed for StripeEvents {
    fn page<'a>(
        &'a self,
        since: DateTime<Utc>,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, anyhow::Result<FeedPage>> {
        Box::pin(self.fetch(since, after))
    }
}
