//! Paddle's API as reconciliation reads it (docs/design.md §6.4): `GET /events`, newest first
//! (`order_by=id[desc]`), paged by `after` (the last event id of a page), filtered to the
//! handled `event_type`s; Paddle lists events by id with no time filter, so a window's walk
//! skips what is newer than the window and stops at the first page that reaches past its
//! start. What Paddle failed to deliver is `GET /notifications` with
//! `status=failed,needs_retry` from the walk's start (`from`), each notification carrying its
//! event as `payload`. And the one object read the worker makes: `GET /subscriptions/{id}`,
//! to settle a same-second tie (docs/design.md §4.2).

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};

use super::decide::{ends, plan_keys, HANDLED_TYPES};
use super::parse_event;
use crate::domain::{CustomerId, ProviderTime};
use crate::providers::{
    path_id, Api, EventFeed, FeedPage, Fetched, MadeFor, ReadFor, Reads, SubscriptionNow, Window,
};
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

/// The type a subscription read is stored as: the state of the subscription, as Paddle's
/// `subscription.updated` carries it.
pub const SUBSCRIPTION_READ_TYPE: &str = "subscription.updated";

/// The subscription a transaction asked the plan of, read, as the event it is stored as
/// (docs/design.md §6.2, §6.4): a `subscription.updated` whose `event_id` is the read's key
/// and whose `occurred_at` is the transaction's (never the clock's), so its place in the
/// order and the period it grants in are the transaction's; `transaction_event` names the
/// event it was read for. Only a transaction's read is made for Paddle.
pub fn read_as_event(read: &ReadFor<'_>, object: &Value) -> Option<Fetched> {
    let MadeFor::Invoice { key, .. } = &read.made_for else {
        return None;
    };
    let event = json!({
        "event_id": read.key.as_str(),
        "event_type": SUBSCRIPTION_READ_TYPE,
        "occurred_at": read.at.to_rfc3339_opts(SecondsFormat::Micros, true),
        "data": object,
        "transaction_event": key.as_str(),
    });
    fetched(&event).ok()
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

pub struct PaddleReads {
    api: Api,
}

impl PaddleReads {
    pub fn new(api: Api) -> Self {
        Self { api }
    }

    /// `GET /subscriptions/{id}`: the subscription, the answer's `data`; `None` on a 404.
    async fn subscription_data(&self, id: &str) -> anyhow::Result<Option<Value>> {
        let path = format!("/subscriptions/{}", path_id(id)?);
        self.api
            .object(
                &path,
                &[],
                "/data",
                &[],
                "the subscription read has no data",
            )
            .await
    }

    /// The subscription read as `decide` reads a subscription event's.
    async fn read_subscription(&self, id: &str) -> anyhow::Result<Option<SubscriptionNow>> {
        let Some(subscription) = self.subscription_data(id).await? else {
            return Ok(None);
        };
        SubscriptionNow::read(
            subscription.get("status").and_then(Value::as_str),
            plan_keys(&subscription)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            ends(&subscription),
        )
        .map(Some)
    }
}

impl Reads for PaddleReads {
    fn subscription<'a>(
        &'a self,
        _customer: &'a CustomerId,
        id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<SubscriptionNow>>> {
        Box::pin(self.read_subscription(id))
    }

    /// A transaction whose items name no known price, before any event of its subscription
    /// (docs/design.md §6.4).
    fn subscription_object<'a>(
        &'a self,
        _customer: &'a CustomerId,
        id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<Value>>> {
        Box::pin(self.subscription_data(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::secrets::ApiKey;
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    /// The python SDK's `GET /subscriptions/{id}` answer
    /// (`tests/Functional/Resources/Subscriptions/_fixtures/response/full_entity.json`).
    fn answer() -> Value {
        let file = format!(
            "{}/../testdata/providers/paddle/api/subscription.get.json",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap()
    }

    #[tokio::test]
    async fn a_subscription_read_is_its_data_read_as_decide_reads_it() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/subscriptions/sub_01hp463gxfvndqjjyqn2n7tkth"))
            .and(header("authorization", "Bearer pdl_sdbx_apikey_test"))
            .respond_with(ResponseTemplate::new(200).set_body_json(answer()))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/subscriptions/sub_without_data"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"meta": {}})))
            .mount(&server)
            .await;
        let reads = PaddleReads::new(Api {
            base_url: server.uri(),
            key: ApiKey::Known("pdl_sdbx_apikey_test".into()),
            client_id: None,
            http: reqwest::Client::new(),
            budget: None,
        });
        let customer = CustomerId::parse("ctm_01hp462x4578nc20acj9g956yy").unwrap();
        let now = reads
            .subscription(&customer, "sub_01hp463gxfvndqjjyqn2n7tkth")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(now.status, "active");
        assert_eq!(now.plan_keys[0], "pri_01gsz8x8sawmvhz1pv30nge1ke");
        assert_eq!(
            now.ends.current_period_end.unwrap().to_rfc3339(),
            "2024-03-08T11:02:03.946454+00:00"
        );
        // Unknown to Paddle: none; an id that is not one is never sent.
        assert!(reads
            .subscription(&customer, "sub_gone")
            .await
            .unwrap()
            .is_none());
        assert!(reads.subscription(&customer, "../x").await.is_err());
        // An answer without its data is an error, not a subscription.
        let error = reads
            .subscription_object(&customer, "sub_without_data")
            .await
            .unwrap_err();
        assert_eq!(error.to_string(), "the subscription read has no data");
    }
}
