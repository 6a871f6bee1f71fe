//! Stripe's API as reconciliation reads it: `GET /v1/events` within a window of `created`,
//! newest first, paginated with `starting_after`, filtered to the handled `types[]`; and
//! `delivery_success=false`, what Stripe failed to deliver (Stripe keeps 30 days of events). And the object reads the
//! worker makes: a subscription, to settle a same-second tie, the invoice payment of a
//! payment intent, to link a refund, and a payment intent's customer, for a refund whose charge
//! names none (docs/design.md §4.2, §4.5, §6.2).

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::decide::{ends, plan_keys, HANDLED_TYPES};
use super::parse_event;
use super::verify::object_customer;
use crate::domain::CustomerId;
use crate::providers::{
    path_id, Api, Carrier, EventFeed, Failure, FeedPage, Fetched, Reads, SubscriptionNow, Window,
};
use crate::BoxFuture;

/// The API version the object reads are written against (invoice payments exist from it on).
const READ_VERSION: &str = "2025-03-31.basil";

/// The largest page Stripe serves.
const PAGE_SIZE: usize = 100;

pub struct StripeEvents {
    api: Api,
}

impl StripeEvents {
    pub fn new(api: Api) -> Self {
        Self { api }
    }

    /// `GET /v1/events` with `filters`, the handled types, and the page position.
    async fn fetch(
        &self,
        filters: &[(&str, String)],
        after: Option<&str>,
    ) -> anyhow::Result<FeedPage> {
        use anyhow::Context;
        let mut query: Vec<(&str, String)> = vec![("limit", PAGE_SIZE.to_string())];
        query.extend(filters.iter().cloned());
        query.extend(HANDLED_TYPES.iter().map(|t| ("types[]", (*t).to_owned())));
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
        window: Window,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, anyhow::Result<FeedPage>> {
        Box::pin(async move {
            let filters = [
                ("created[gte]", window.from.timestamp().to_string()),
                ("created[lt]", window.until.timestamp().to_string()),
            ];
            self.fetch(&filters, after).await
        })
    }

    fn undelivered<'a>(
        &'a self,
        since: DateTime<Utc>,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, anyhow::Result<FeedPage>> {
        Box::pin(async move {
            let filters = [
                ("delivery_success", "false".to_owned()),
                ("created[gte]", since.timestamp().to_string()),
            ];
            self.fetch(&filters, after).await
        })
    }
}

/// The headers of an object read for an event about `customer`: the API version, and, for a
/// connected account's customer (`acct_…/cus_…`, docs/design.md §4.6a), `Stripe-Account`, without
/// which Stripe looks for the object on the platform's own account and does not find it.
fn read_headers(customer: &CustomerId) -> Vec<(&'static str, &str)> {
    let mut headers = vec![("Stripe-Version", READ_VERSION)];
    if let Some(account) = customer.connected_account() {
        headers.push(("Stripe-Account", account));
    }
    headers
}

pub struct StripeReads {
    api: Api,
}

impl StripeReads {
    pub fn new(api: Api) -> Self {
        Self { api }
    }

    async fn read_subscription(
        &self,
        customer: &CustomerId,
        id: &str,
    ) -> anyhow::Result<Option<SubscriptionNow>> {
        let path = format!("/v1/subscriptions/{}", path_id(id)?);
        let headers = read_headers(customer);
        self.api
            .subscription_now(&path, &headers, plan_keys, ends)
            .await
    }

    /// `GET /v1/subscriptions/{id}`, whole, as the account the customer lives in.
    async fn read_subscription_object(
        &self,
        customer: &CustomerId,
        id: &str,
    ) -> anyhow::Result<Option<Value>> {
        let path = format!("/v1/subscriptions/{}", path_id(id)?);
        self.api
            .get_found(&path, &[], &read_headers(customer))
            .await
    }

    async fn read_invoice_of(
        &self,
        customer: &CustomerId,
        payment_intent: &str,
    ) -> anyhow::Result<Option<String>> {
        let query = [
            ("payment[type]", "payment_intent".to_owned()),
            (
                "payment[payment_intent]",
                path_id(payment_intent)?.to_owned(),
            ),
            ("limit", "1".to_owned()),
        ];
        let headers = read_headers(customer);
        let Some(list) = self
            .api
            .get_found("/v1/invoice_payments", &query, &headers)
            .await?
        else {
            return Ok(None);
        };
        let first = list.pointer("/data/0");
        Ok(first
            .and_then(|p| {
                p.get("invoice")
                    .and_then(|i| i.as_str().or_else(|| i.get("id").and_then(Value::as_str)))
            })
            .map(str::to_owned))
    }

    /// `GET /v1/payment_intents/{id}`, as the connected account the event names (its
    /// `account`, as the event's own customer would be keyed): the customer the intent names,
    /// read as an event's object is (`customer`, else `customer_account`), in that account.
    async fn read_payment_intent_customer(
        &self,
        payload: &Value,
        payment_intent: &str,
    ) -> anyhow::Result<Option<CustomerId>> {
        let path = format!("/v1/payment_intents/{}", path_id(payment_intent)?);
        let connected = payload
            .get("account")
            .and_then(Value::as_str)
            .filter(|a| !a.trim().is_empty());
        let mut headers = vec![("Stripe-Version", READ_VERSION)];
        if let Some(account) = connected {
            headers.push(("Stripe-Account", account));
        }
        let Some(intent) = self.api.get_found(&path, &[], &headers).await? else {
            return Ok(None);
        };
        Ok(object_customer(&intent)
            .and_then(|customer| CustomerId::of_account(customer.as_str(), connected).ok()))
    }
}

impl Reads for StripeReads {
    fn subscription<'a>(
        &'a self,
        customer: &'a CustomerId,
        id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<SubscriptionNow>>> {
        Box::pin(self.read_subscription(customer, id))
    }

    fn invoice_of_payment_intent<'a>(
        &'a self,
        customer: &'a CustomerId,
        payment_intent: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<String>>> {
        Box::pin(self.read_invoice_of(customer, payment_intent))
    }

    fn payment_intent_customer<'a>(
        &'a self,
        payload: &'a Value,
        payment_intent: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<CustomerId>>> {
        Box::pin(self.read_payment_intent_customer(payload, payment_intent))
    }

    fn subscription_object<'a>(
        &'a self,
        customer: &'a CustomerId,
        id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<Value>>> {
        Box::pin(self.read_subscription_object(customer, id))
    }

    fn generation_failure<'a>(
        &'a self,
        notice: &'a Carrier,
    ) -> BoxFuture<'a, anyhow::Result<Failure>> {
        Box::pin(super::thin::generation_failure(&self.api, notice))
    }

    fn meter_errors<'a>(
        &'a self,
        notice: &'a Carrier,
    ) -> BoxFuture<'a, anyhow::Result<crate::providers::MeterErrors>> {
        Box::pin(super::thin::meter_errors(&self.api, notice))
    }

    fn subscriptions_page<'a>(
        &'a self,
        context: Option<&'a str>,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, anyhow::Result<(Vec<Value>, Option<String>)>> {
        Box::pin(super::thin::subscriptions_page(&self.api, context, after))
    }

    fn carried_object<'a>(
        &'a self,
        thin: &'a Carrier,
        path: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<Value>>> {
        Box::pin(super::thin::fetch_related(&self.api, thin, path))
    }
}
