//! Paddle's API as reconciliation reads it (docs/design.md §6.5): `GET /events`, newest first
//! (`order_by=id[desc]`), paged by `after` (the last event id of a page), filtered to the
//! handled `event_type`s; Paddle lists events by id with no time filter, so a window's walk
//! skips what is newer than the window and stops at the first page that reaches past its
//! start. What Paddle failed to deliver is `GET /notifications` with
//! `status=failed,needs_retry` from the walk's start (`from`), each notification carrying its
//! event as `payload`.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;

use super::decide::HANDLED_TYPES;
use super::parse_event;
use crate::domain::ProviderTime;
use crate::providers::{Api, EventFeed, FeedPage, Fetched, Window};
use crate::BoxFuture;

/// The largest page Paddle serves.
const PER_PAGE: usize = 200;

pub struct PaddleEvents {
    api: Api,
}

impl PaddleEvents {
    pub fn new(api: Api) -> Self {
        Self { api }
    }

    /// One page of `path` with `query` and the position `after`: its items and the id the
    /// next page starts after, when Paddle says there is one.
    async fn list(
        &self,
        path: &str,
        mut query: Vec<(&str, String)>,
        after: Option<&str>,
    ) -> anyhow::Result<(Vec<Value>, Option<String>)> {
        use anyhow::Context;
        query.push(("per_page", PER_PAGE.to_string()));
        if let Some(after) = after {
            query.push(("after", after.to_owned()));
        }
        let mut page = self.api.get_json(path, &query).await?;
        let listed = match page.get_mut("data").map(Value::take) {
            Some(Value::Array(listed)) => listed,
            _ => anyhow::bail!("the {path} list has no data"),
        };
        let has_more = page
            .pointer("/meta/pagination/has_more")
            .and_then(Value::as_bool)
            .context("the list has no meta.pagination.has_more")?;
        let last = listed
            .last()
            .and_then(|item| item.get("event_id").or(item.get("id")))
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok((listed, last.filter(|_| has_more)))
    }
}

/// An event as a delivery of it would be read.
fn fetched(event: &Value) -> anyhow::Result<Fetched> {
    let body = serde_json::to_vec(event)?;
    let event = parse_event(&body, Utc::now());
    Ok(Fetched { body, event })
}

fn occurred_at(event: &Value) -> Option<DateTime<Utc>> {
    event
        .get("occurred_at")
        .and_then(|t| ProviderTime::from_json(t).ok())
        .map(|t| t.as_datetime())
}

impl EventFeed for PaddleEvents {
    fn page<'a>(
        &'a self,
        window: Window,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, anyhow::Result<FeedPage>> {
        Box::pin(async move {
            let query = vec![
                ("order_by", "id[desc]".to_owned()),
                ("event_type", HANDLED_TYPES.join(",")),
            ];
            let (listed, next) = self.list("/events", query, after).await?;
            let mut events = Vec::new();
            let mut past_the_start = false;
            for event in &listed {
                match occurred_at(event) {
                    Some(at) if at >= window.until => {}
                    Some(at) if at < window.from => past_the_start = true,
                    // In the window, or unreadable (stored with its reason).
                    _ => events.push(fetched(event)?),
                }
            }
            Ok(FeedPage {
                events,
                next: next.filter(|_| !past_the_start),
            })
        })
    }

    fn undelivered<'a>(
        &'a self,
        since: DateTime<Utc>,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, anyhow::Result<FeedPage>> {
        Box::pin(async move {
            let query = vec![
                ("status", "failed,needs_retry".to_owned()),
                ("from", since.to_rfc3339_opts(SecondsFormat::Micros, true)),
                ("order_by", "id[asc]".to_owned()),
            ];
            let (listed, next) = self.list("/notifications", query, after).await?;
            let mut events = Vec::new();
            for notification in &listed {
                let Some(payload) = notification.get("payload") else {
                    continue;
                };
                let handled = payload
                    .get("event_type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| HANDLED_TYPES.contains(&t));
                if handled {
                    events.push(fetched(payload)?);
                }
            }
            // The next page starts after the last notification (`id`, not its event's).
            let next = next.and(
                listed
                    .last()
                    .and_then(|n| n.get("id"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            );
            Ok(FeedPage { events, next })
        })
    }
}
