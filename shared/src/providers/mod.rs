//! Providers: everything one billing provider means, one folder each — how its deliveries are
//! verified and read (type, customer, provider time, dedupe key), what its event types mean
//! for the billing registers (`decide`), its API for reconciliation, and realistic payloads
//! with the signer for test deliveries (the tests, `inboxctl` and the Engine Room's, docs/design.md
//! §6, §12.5).
//!
//! This module is the registry: the [`Provider`] contract each folder implements and
//! [`provider`], the one line per provider that registers it. Adding a provider is its folder,
//! a [`SourceKind`] variant and that line.

mod common;
pub mod fixtures;
pub mod kinde;
pub mod lemonsqueezy;
pub mod meter;
pub mod paddle;
mod settings;
pub mod standard_webhooks;
pub mod stripe;

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use http::HeaderMap;
use serde_json::Value;

use crate::billing::registers::{StoredEntitlement, StoredPlan, StoredSubscription};
use crate::billing::{Decided, Decision, Problem, SubscriptionEnds};
use crate::domain::{Catalog, CustomerId, DedupeKey, SourceKind, VerifiedEvent};
use crate::platform::budget::{self, Budget, Budgets, Lane, Limit, Throttled};
use crate::platform::config::{ConfigError, SourceConfig};
use crate::platform::http_client::LazyClient;
use crate::platform::secrets::ApiKey;
use crate::signing::AuthError;
use crate::BoxFuture;
pub use settings::{check_sources, refused, Setting};

/// The registration: which folder serves which kind of source.
pub fn provider(kind: SourceKind) -> &'static dyn Provider {
    match kind {
        SourceKind::Kinde => &kinde::Kinde,
        SourceKind::Stripe => &stripe::Stripe,
        SourceKind::StandardWebhooks => &standard_webhooks::StandardWebhooks,
        SourceKind::LemonSqueezy => &lemonsqueezy::LemonSqueezy,
        SourceKind::Paddle => &paddle::Paddle,
    }
}

/// What a provider folder provides.
pub trait Provider: Sync {
    /// The verifier for one configured source of this kind.
    fn verifier(
        &self,
        config: &SourceConfig,
        tolerance: Duration,
        http: &LazyClient,
    ) -> Result<Box<dyn Verify>, ConfigError>;

    /// What one of this provider's events means for the billing state, from the event alone.
    fn decide(&self, event_type: &str, payload: &Value, catalog: &Catalog) -> Decided;

    /// How this provider's API finds what the webhooks missed; `None`: not reconciled.
    fn reconciliation(&self, _api: Api) -> Option<Reconciliation> {
        None
    }

    /// The base URL of the provider's API for this source, when it has one this code reads
    /// (a source's `api_base_url` overrides it).
    fn api_base(&self, _config: &SourceConfig) -> Option<String> {
        None
    }

    /// The object reads the worker uses to settle same-second ties and to link refunds;
    /// `None` when the provider has no such API here.
    fn reads(&self, _api: Api) -> Option<Box<dyn Reads>> {
        None
    }

    /// Why a verified event is not for this source at all (Stripe: the other mode than the
    /// source's `livemode`); `None` when it is.
    fn out_of_scope(&self, _payload: &Value, _livemode: Option<bool>) -> Option<String> {
        None
    }

    /// The settings of `INBOX_SOURCES` only this provider takes, each with the reason a
    /// source of another kind that names it is refused.
    fn own_settings(&self) -> &'static [(Setting, &'static str)] {
        &[]
    }

    /// This provider's rules for one source's settings together ([`check_sources`]).
    fn check(&self, _config: &SourceConfig) -> Result<(), ConfigError> {
        Ok(())
    }

    /// What a stored event is when it carries no billing state of its own (docs/design.md
    /// §6.2): a [`Notice`] the worker settles by reading; `None` for every other event.
    fn notice(&self, _payload: &Value) -> Option<Notice> {
        None
    }

    /// An object read from the provider's API, written as the event of its own it is stored
    /// as: the one [`ReadFor`] says, at its time and under its key (docs/design.md §6.2).
    /// `None` when it cannot be written as one.
    fn read_as_event(&self, _read: &ReadFor<'_>, _object: &Value) -> Option<Fetched> {
        None
    }

    /// The read that settles a same-second tie on the register `effect` writes, when this
    /// provider's word on it is a read stored as an event of its own and applied in the
    /// event's place (Stripe's entitlement summaries: the customer's list, docs/design.md
    /// §4.2); `None` for every other effect, and for an event that is such a read.
    fn tie_read(&self, _payload: &Value, _effect: &crate::billing::Effect) -> Option<Carrier> {
        None
    }

    /// Why a carrier whose object the provider does not find (404) is unprocessable, when it
    /// is: a read whose absence says nothing about the state (Stripe's list of a customer's
    /// entitlements). `None`: the object is gone, and the carrier is ignored.
    fn missing_read(&self, _carrier: &Carrier, _path: &str) -> Option<String> {
        None
    }

    /// Whether a subscription as its API lists it differs from its register (or the register
    /// has none), as `decide` would read it: a generation failure's sweep stores a read only
    /// of those (docs/design.md §6.2).
    fn subscription_differs(
        &self,
        _subscription: &Value,
        _local: Option<&StoredSubscription>,
    ) -> bool {
        true
    }

    /// The field of a source's `meter` this provider reads, and the longest value it takes;
    /// `None`: this provider's meters take no reports from here (docs/design.md §4.13).
    fn meter_field(&self) -> Option<(&'static str, usize)> {
        None
    }

    /// The sender of one source's meter reports; `meter` is the meter's name there.
    fn meter(&self, _api: Api, _meter: &str) -> Option<Box<dyn meter::Meter>> {
        None
    }

    /// The default budget of a source's API calls (docs/design.md §6.7): under the rate limit
    /// the provider documents for the source's mode, each default beside the page that says
    /// so. This one is for a provider that publishes no number.
    fn api_limit(&self, _config: &SourceConfig) -> Limit {
        UNPUBLISHED_LIMIT
    }

    /// How the provider's endpoints are limited apart, inside the source's limit, when its
    /// documentation says they are (Stripe's); `None`: only the source's limit.
    fn api_endpoints(&self, _config: &SourceConfig) -> Option<budget::Endpoints> {
        None
    }

    /// The variable naming the source this provider's event bus feeds, when the provider has
    /// such a door besides signed deliveries (Stripe's Amazon EventBridge destination): that
    /// source needs no signing secret on the intake ([`bus_fed`]).
    fn bus_fed_var(&self) -> Option<&'static str> {
        None
    }

    /// Realistic payloads and the signer for test deliveries (the tests', `inboxctl`'s and
    /// the Engine Room's).
    fn fixtures(&self) -> &'static dyn fixtures::Fixtures;
}

/// The budget of a provider that publishes no rate limit: two calls a second, five at once,
/// one of them kept for meter reports.
pub const UNPUBLISHED_LIMIT: Limit = Limit {
    per_second: 2.0,
    burst: 5,
    reserved: 1,
    window: budget::PER_MINUTE,
};

/// The source an event bus feeds, as the variable its provider names says (read once, at the
/// intake's cold start); `None` when no provider's variable is set.
pub fn bus_fed(lookup: impl Fn(&str) -> Option<String>) -> Option<String> {
    SourceKind::ALL
        .iter()
        .filter_map(|&kind| provider(kind).bus_fed_var())
        .find_map(lookup)
}

/// Decides an event's effects from the event alone (never from what is stored).
pub fn decide(kind: SourceKind, event_type: &str, payload: &Value, catalog: &Catalog) -> Decision {
    provider(kind)
        .decide(event_type, payload, catalog)
        .unwrap_or_else(Decision::from)
}

/// Checks a delivery's signature and time, then parses what it can of the envelope.
pub trait Verify: Send + Sync {
    fn verify<'a>(
        &'a self,
        headers: &'a HeaderMap,
        body: &'a [u8],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<VerifiedEvent, AuthError>>;
}

/// A verifier that needs no I/O (HMAC schemes): checked on the spot.
pub trait CheckNow: Send + Sync {
    fn check(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<VerifiedEvent, AuthError>;
}

impl<T: CheckNow> Verify for T {
    fn verify<'a>(
        &'a self,
        headers: &'a HeaderMap,
        body: &'a [u8],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<VerifiedEvent, AuthError>> {
        Box::pin(std::future::ready(self.check(headers, body, now)))
    }
}

/// One configured source: its name in the route and how its deliveries are verified.
pub struct Source {
    pub name: String,
    verifier: Box<dyn Verify>,
}

impl Source {
    pub fn from_config(
        config: &SourceConfig,
        default_tolerance: Duration,
        http: &LazyClient,
    ) -> Result<Self, ConfigError> {
        let tolerance = config.tolerance(default_tolerance);
        Ok(Self {
            name: config.name.clone(),
            verifier: provider(config.kind).verifier(config, tolerance, http)?,
        })
    }

    pub async fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<VerifiedEvent, AuthError> {
        self.verifier.verify(headers, body, now).await
    }
}

/// The configured sources by route name.
#[derive(Default)]
pub struct Sources(HashMap<String, Source>);

impl Sources {
    pub fn build(
        configs: &[SourceConfig],
        default_tolerance: Duration,
        http: impl Into<LazyClient>,
    ) -> Result<Self, ConfigError> {
        let http = http.into();
        let mut sources = HashMap::new();
        for config in configs {
            let source = Source::from_config(config, default_tolerance, &http)?;
            if sources.insert(config.name.clone(), source).is_some() {
                return Err(ConfigError::source(&config.name, "is configured twice"));
            }
        }
        Ok(Self(sources))
    }

    pub fn get(&self, name: &str) -> Option<&Source> {
        self.0.get(name)
    }
}

/// What a source's provider API is called through: the HTTP client, and the store of the
/// sources' budgets (`None`: calls are not budgeted, as in tests of other things) with the
/// lane the calls take from (docs/design.md §6.7).
#[derive(Clone)]
pub struct ApiClient {
    pub http: reqwest::Client,
    pub budgets: Option<Budgets>,
    pub lane: Lane,
}

impl ApiClient {
    /// Calls through `http`, each taking from its source's budget in `budgets`.
    pub fn budgeted(http: &reqwest::Client, budgets: Budgets, lane: Lane) -> Self {
        Self {
            http: http.clone(),
            budgets: Some(budgets),
            lane,
        }
    }
}

impl From<&reqwest::Client> for ApiClient {
    fn from(http: &reqwest::Client) -> Self {
        Self {
            http: http.clone(),
            budgets: None,
            lane: Lane::Reads,
        }
    }
}

impl From<&ApiClient> for ApiClient {
    fn from(client: &ApiClient) -> Self {
        client.clone()
    }
}

/// A provider's API, as reconciliation reads it.
#[derive(Clone)]
pub struct Api {
    pub base_url: String,
    pub key: ApiKey,
    /// The OAuth client the key is the secret of, for an API that takes client credentials
    /// (Kinde's Management API).
    pub client_id: Option<String>,
    pub http: reqwest::Client,
    /// The source's budget every call takes from (docs/design.md §6.7); `None`: unbudgeted.
    pub budget: Option<Budget>,
}

/// Why a call to a provider's API got no answer of its own.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Not sent, or answered 429: the item waits until the time said, its attempt not spent.
    #[error(transparent)]
    Throttled(#[from] Throttled),
    /// Not sent: the budget could not be read.
    #[error("the source's API budget: {0:#}")]
    Budget(anyhow::Error),
    /// Sent, and no answer came (or none could be read).
    #[error(transparent)]
    Http(#[from] reqwest::Error),
}

impl CallError {
    /// As an error whose chain holds the [`Throttled`] itself, for [`Throttled::find`].
    pub fn into_error(self) -> anyhow::Error {
        match self {
            Self::Throttled(throttled) => throttled.into(),
            other => other.into(),
        }
    }
}

impl Api {
    /// The API of a source that has an API key and whose provider has an API; else `None`.
    /// Its calls take from the source's budget when `client` has the store of budgets.
    pub fn for_source(config: &SourceConfig, client: impl Into<ApiClient>) -> Option<Self> {
        let client = client.into();
        let key = match (&config.api_key, &config.api_key_read) {
            (Some(key), _) => ApiKey::Known(key.clone()),
            (None, Some(read)) => ApiKey::OnUse(read.clone()),
            (None, None) => return None,
        };
        let base_url = config
            .api_base_url
            .clone()
            .or_else(|| provider(config.kind).api_base(config))?;
        let budget = client.budgets.as_ref().map(|budgets| {
            budgets
                .of(&config.name, api_limit(config), client.lane)
                .by_endpoint(provider(config.kind).api_endpoints(config))
        });
        Some(Self {
            base_url: base_url.trim_end_matches('/').to_owned(),
            key,
            client_id: config.api_client_id.clone(),
            http: client.http.clone(),
            budget,
        })
    }

    /// Sends a request to the provider, every call of the source through this one door: a
    /// token of the source's budget first (and of its endpoint's, where the provider limits
    /// endpoints apart; docs/design.md §6.7), then the request; a 429 that asks for a pause
    /// holds every instance off that source (or that endpoint, when the provider says its
    /// limit was the one met) for as long as the provider asked, and comes back as
    /// [`Throttled`]. Any other answer is the caller's to read.
    pub async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, CallError> {
        let (http, request) = request.build_split();
        let request = request?;
        let method = request.method().clone();
        let path = request.url().path().to_owned();
        if let Some(budget) = &self.budget {
            budget.take_for(&method, &path).await.map_err(|error| {
                match Throttled::find(&error) {
                    Some(throttled) => CallError::Throttled(throttled.clone()),
                    None => CallError::Budget(error),
                }
            })?;
        }
        let response = http.execute(request).await?;
        let now = chrono::Utc::now();
        let unnamed = match &self.budget {
            Some(budget) => budget.limit().window,
            None => budget::PER_SECOND,
        };
        let Some(pause) = budget::pause_asked(response.status(), response.headers(), now, unnamed)
        else {
            return Ok(response);
        };
        let until = match &self.budget {
            Some(budget) => budget
                .hold_off(
                    budget::Pause {
                        wait: pause,
                        endpoint: budget::endpoint_limited(response.headers()),
                    },
                    &method,
                    &path,
                )
                .await
                .map_err(|e| CallError::Budget(e.into()))?,
            None => now + chrono::Duration::from_std(pause).unwrap_or_default(),
        };
        let source = match &self.budget {
            Some(budget) => budget.source(),
            None => &self.base_url,
        };
        Err(CallError::Throttled(Throttled {
            source_name: source.to_owned(),
            until,
            why: format!("the provider answered {}", response.status()),
        }))
    }

    /// `GET {base}{path}?{query}` with the key as a bearer token; the body as JSON.
    pub async fn get_json(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<Value> {
        self.get_found(path, query, &[])
            .await?
            .with_context(|| format!("GET {path} answered 404 Not Found"))
    }

    /// Like `get_json`, with extra headers, and `None` when the object is not found (404).
    pub async fn get_found(
        &self,
        path: &str,
        query: &[(&str, String)],
        headers: &[(&str, &str)],
    ) -> anyhow::Result<Option<Value>> {
        let mut request = self
            .http
            .get(format!("{}{path}", self.base_url))
            .bearer_auth(self.key.get().await?)
            .query(query);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = self
            .send(request)
            .await
            .map_err(CallError::into_error)
            .with_context(|| format!("GET {path}"))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            bail!("GET {path} answered {status}");
        }
        response
            .json()
            .await
            .map(Some)
            .with_context(|| format!("reading GET {path} as JSON"))
    }
}

/// A source's budget of API calls: its `api_budget` over its provider's documented default
/// for its mode (checked by [`check_sources`], so a refused setting never gets here). A source
/// without a meter keeps no share for meter reports.
pub fn api_limit(config: &SourceConfig) -> Limit {
    let default = provider(config.kind).api_limit(config);
    let limit = match &config.api_budget {
        Some(setting) => Limit::set(default, setting).unwrap_or(default),
        None => default,
    };
    match config.meter {
        Some(_) => limit,
        None => Limit {
            reserved: 0,
            ..limit
        },
    }
}

impl Api {
    /// A subscription read (`GET {path}`) as its status and the plan keys `plan_keys` finds in
    /// it; `None` when the provider does not know it.
    pub async fn subscription_now(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        plan_keys: fn(&Value) -> Vec<&str>,
        ends: fn(&Value) -> Result<SubscriptionEnds, Problem>,
    ) -> anyhow::Result<Option<SubscriptionNow>> {
        let Some(object) = self.get_found(path, &[], headers).await? else {
            return Ok(None);
        };
        SubscriptionNow::read(
            object.get("status").and_then(Value::as_str),
            plan_keys(&object).into_iter().map(str::to_owned).collect(),
            ends(&object),
        )
        .map(Some)
    }

    /// An object read (`GET {path}` with `headers`): what stands at `pointer` in the answer,
    /// taken out of it, which must hold each of `members`; `None` when the provider does not
    /// know the object. An answer without it is the error `missing`.
    pub async fn object(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        pointer: &str,
        members: &[&str],
        missing: &'static str,
    ) -> anyhow::Result<Option<Value>> {
        let Some(mut answer) = self.get_found(path, &[], headers).await? else {
            return Ok(None);
        };
        answer
            .pointer_mut(pointer)
            .map(Value::take)
            .filter(|object| members.iter().all(|m| object.get(m).is_some()))
            .context(missing)
            .map(Some)
    }
}

/// An object id as a path segment: provider ids are letters, digits, `_` and `-`; anything
/// else is refused rather than sent.
pub(crate) fn path_id(id: &str) -> anyhow::Result<&str> {
    if !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        Ok(id)
    } else {
        bail!("'{id}' is not an object id")
    }
}

/// What a provider says a subscription is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionNow {
    pub status: String,
    /// The price, product or plan ids it names, as the events' `decide` reads them.
    pub plan_keys: Vec<String>,
    pub ends: SubscriptionEnds,
}

/// Which of two same-second states a provider read shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    This,
    Tie,
    Neither,
}

impl SubscriptionNow {
    /// What a subscription read shows: its status (in the model's words), and the plan keys
    /// and ends its provider's `decide` reads in it.
    pub fn read(
        status: Option<&str>,
        plan_keys: Vec<String>,
        ends: Result<SubscriptionEnds, Problem>,
    ) -> anyhow::Result<Self> {
        let status = status.context("the subscription read has no status")?;
        let ends =
            ends.map_err(|problem| anyhow::anyhow!("the subscription read: {}", problem.0))?;
        Ok(Self {
            status: status.to_owned(),
            plan_keys,
            ends,
        })
    }

    /// Whether a register state (status and plan key) is what the provider shows.
    pub fn shows(&self, status: &str, plan_key: Option<&str>) -> bool {
        self.status == status && plan_key.is_none_or(|key| self.plan_keys.iter().any(|k| k == key))
    }

    /// Which of an event's state and its same-second tie's (status, plan key, ends) the
    /// provider shows: the one whose status and plan it shows, and of two such, the one whose
    /// ends it shows too (a cancellation scheduled and withdrawn in one second differ only
    /// there); the event's own when the read tells them no further apart.
    pub fn settles(
        &self,
        this: (&str, Option<&str>, &SubscriptionEnds),
        tie: (&str, Option<&str>, &SubscriptionEnds),
    ) -> Shown {
        let score = |(status, plan_key, ends): (&str, Option<&str>, &SubscriptionEnds)| {
            let shown = self.shows(status, plan_key);
            (shown, shown && self.ends == *ends)
        };
        let (this, tie) = (score(this), score(tie));
        if this.0 && this >= tie {
            Shown::This
        } else if tie.0 {
            Shown::Tie
        } else {
            Shown::Neither
        }
    }
}

/// Reads of single objects from a provider's API (docs/design.md §4.2, §4.5), each made for
/// an event about `customer` (the account's id as the event's envelope gave it: a provider
/// whose accounts live inside another's, as Stripe Connect's do, reads as that account).
pub trait Reads: Send + Sync {
    /// The subscription as the provider shows it now; `None` when it does not know it.
    fn subscription<'a>(
        &'a self,
        customer: &'a CustomerId,
        id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<SubscriptionNow>>>;

    /// The invoice a payment intent paid, when the provider links them.
    fn invoice_of_payment_intent<'a>(
        &'a self,
        _customer: &'a CustomerId,
        _payment_intent: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<String>>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// The customer a payment intent is for, read from the provider for an event about it that
    /// names no customer (`payload`, the event as stored: Stripe's charge of a customer that is
    /// an Account names neither `customer` nor `customer_account`, docs/design.md §6.2); `None`
    /// when the provider does not know the intent or it names no customer.
    fn payment_intent_customer<'a>(
        &'a self,
        _payload: &'a Value,
        _payment_intent: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<CustomerId>>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    /// The subscription object as the provider shows it now, whole (Stripe: an invoice whose
    /// plan its subscription's register does not know yet, docs/design.md §6.2); `None` when
    /// the provider does not know it (404).
    fn subscription_object<'a>(
        &'a self,
        _customer: &'a CustomerId,
        _id: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<Value>>> {
        Box::pin(std::future::ready(Err(anyhow::anyhow!(
            "this provider's API has no subscription object reads"
        ))))
    }

    /// What a generation failure's notice names, read from the provider when the notice does
    /// not carry it (Stripe: the v2 event, `GET /v2/core/events/{id}`, its `data` included);
    /// the window's events unknown when the provider does not know the notice.
    fn generation_failure<'a>(
        &'a self,
        _notice: &'a Carrier,
    ) -> BoxFuture<'a, anyhow::Result<Failure>> {
        Box::pin(std::future::ready(Err(anyhow::anyhow!(
            "this provider's API has no v2 events"
        ))))
    }

    /// What a meter error notice says, when the notification does not carry it (Stripe: the
    /// v2 event, `GET /v2/core/events/{id}`, its `data` included).
    fn meter_errors<'a>(
        &'a self,
        _notice: &'a Carrier,
    ) -> BoxFuture<'a, anyhow::Result<MeterErrors>> {
        Box::pin(std::future::ready(Err(anyhow::anyhow!(
            "this provider's API has no v2 events"
        ))))
    }

    /// One page of every subscription (Stripe: `status=all`), in the account the `context`
    /// names (a notice's [`Carrier::context`]), after `after`: the subscriptions and where
    /// the next page starts.
    fn subscriptions_page<'a>(
        &'a self,
        _context: Option<&'a str>,
        _after: Option<&'a str>,
    ) -> BoxFuture<'a, anyhow::Result<(Vec<Value>, Option<String>)>> {
        Box::pin(std::future::ready(Err(anyhow::anyhow!(
            "this provider's API lists no subscriptions here"
        ))))
    }

    /// The object a carrier names, `GET path` in the account its context names
    /// (docs/design.md §6.2); `None` when the provider no longer has it (404).
    fn carried_object<'a>(
        &'a self,
        _carrier: &'a Carrier,
        _path: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Option<Value>>> {
        Box::pin(std::future::ready(Err(anyhow::anyhow!(
            "this provider's API has no thin events"
        ))))
    }
}

/// An event that carries no billing state of its own, as its provider reads it
/// (docs/design.md §6.2). The worker stores what it reads for one as an event of its own, at
/// the notice's time, and applies that under the notice's lease.
/// A notice that the provider could not count meter reports it took: the notification, and
/// what it says when it carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeterErrorsNotice {
    pub notice: Carrier,
    pub told: Option<MeterErrors>,
}

/// What a meter error notice says: the provider's summary, how many reports it could not
/// count in its window, and the samples it names (by the report's identifier).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeterErrors {
    pub summary: String,
    pub error_count: i64,
    pub samples: Vec<MeterErrorSample>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeterErrorSample {
    pub identifier: String,
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// It names an object that changed and carries none of it (Stripe's thin events): the
    /// object, read, is what it stands for.
    Carrier(Carrier),
    /// The provider failed to generate events (Stripe's event generation failures): the
    /// object they were about is read, or the source's subscriptions are swept.
    GenerationFailure(GenerationFailure),
    /// The provider took meter reports it then could not count (Stripe's
    /// `v1.billing.meter.error_report_triggered` and `v1.billing.meter.no_meter_found`): the
    /// reports it names are marked (docs/design.md §4.13).
    MeterErrors(MeterErrorsNotice),
}

/// A provider's notice that it failed to generate events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationFailure {
    pub notice: Carrier,
    /// The provider's name, as the notice's reasons say it.
    pub provider: &'static str,
    /// What the failure names, when the notice carries it; else it is read
    /// ([`Reads::generation_failure`]).
    pub told: Option<Failure>,
}

/// What a notice names, read before anything is read from the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carrier {
    /// The provider's id of the notice.
    pub id: String,
    /// Its type, as sent.
    pub event_type: String,
    /// The type of the event its read is stored as, when `decide` gives that type a meaning.
    pub read_type: Option<&'static str>,
    /// The API path of the object it names, or the reason it names none this code reads.
    pub path: Result<String, String>,
    /// The account the object lives in, as the provider names it (Stripe's `context`), when
    /// not the platform's own.
    pub context: Option<String>,
    /// The key of the event the provider sent for the same change to a destination that
    /// takes whole events (during a migration both run): stored, it carries the change.
    pub twin: Option<String>,
    pub livemode: Option<bool>,
}

impl Carrier {
    /// The dedupe key its read is stored under: one per notice, so a retry or a replay finds
    /// the read instead of reading again.
    pub fn read_key(&self) -> Option<DedupeKey> {
        DedupeKey::parse(&format!("read:{}", self.id)).ok()
    }
}

/// What a generation failure names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The provider's alert about it.
    pub alert: Option<String>,
    pub impact: Impact,
}

/// The event a provider failed to generate and the object it was about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Impact {
    /// An object of a handled type's event: read at `path`, stored as the `read_type`.
    Object {
        read_type: &'static str,
        path: String,
        context: Option<String>,
    },
    /// An event of a type `decide` gives no meaning.
    NotBilling(String),
    /// An object, of a handled type's event, whose path is not one this code reads.
    Unreadable(String),
    /// No object: the window's events are unknown.
    Unnamed,
}

/// A read the worker stores as an event of its own, and the event it stands for
/// (docs/design.md §6.2): its dedupe key, and that event's provider time `at`, never the
/// clock's, so the read's place in the order and the period it grants in are the event's.
pub struct ReadFor<'a> {
    pub key: DedupeKey,
    pub at: DateTime<Utc>,
    pub made_for: MadeFor<'a>,
}

/// The event a read is made for.
pub enum MadeFor<'a> {
    /// A carrier's object (or the one a generation failure names), stored as the carrier's
    /// `read_type`.
    Carrier(&'a Carrier),
    /// A subscription a generation failure's sweep found differing from its register.
    Swept(&'a Carrier),
    /// The subscription of an invoice whose plan its register does not know yet: the
    /// invoice's event (its key and payload) and the account it is about.
    Invoice {
        key: &'a DedupeKey,
        payload: Option<&'a Value>,
        customer: &'a CustomerId,
    },
}

/// An event read back from a provider's API, parsed as a delivery of it would be.
pub struct Fetched {
    pub body: Vec<u8>,
    pub event: VerifiedEvent,
}

/// One page of a provider's event feed.
pub struct FeedPage {
    pub events: Vec<Fetched>,
    /// Where the next page starts; `None` when this was the last.
    pub next: Option<String>,
}

/// A span of provider time, `from` included, `until` not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub from: DateTime<Utc>,
    pub until: DateTime<Utc>,
}

/// A provider's change feed (Stripe's `/v1/events`), filtered to the types this code reads.
pub trait EventFeed: Send + Sync {
    /// One page of the events created in `window`, after the position `after`.
    fn page<'a>(
        &'a self,
        window: Window,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, anyhow::Result<FeedPage>>;

    /// One page of the events created since `since` that the provider failed to deliver (and
    /// may still be retrying).
    fn undelivered<'a>(
        &'a self,
        since: DateTime<Utc>,
        after: Option<&'a str>,
    ) -> BoxFuture<'a, anyhow::Result<FeedPage>>;
}

/// One page of a provider's current subscriptions.
pub struct SweepPage {
    pub subscriptions: Vec<Value>,
    pub last: bool,
}

impl SweepPage {
    /// Page `page` (numbered from 1) of a list answered as `body`: its subscriptions the
    /// array at `items` (a JSON pointer), the last page the number at `last_page` (1 when
    /// absent); an empty page is the last too.
    pub fn of(body: &Value, items: &str, last_page: &str, page: u32) -> anyhow::Result<Self> {
        let subscriptions = body
            .pointer(items)
            .and_then(Value::as_array)
            .with_context(|| format!("the subscriptions list has no {items}"))?
            .clone();
        let last_page = body.pointer(last_page).and_then(Value::as_u64).unwrap_or(1);
        Ok(Self {
            last: subscriptions.is_empty() || u64::from(page) >= last_page,
            subscriptions,
        })
    }
}

/// A provider's current subscriptions, page by page (Polar's `/v1/subscriptions/`), and the
/// corrective event for one the local register shows in an older, different state.
pub trait SubscriptionSweep: Send + Sync {
    fn page(&self, page: u32) -> BoxFuture<'_, anyhow::Result<SweepPage>>;

    fn subscription_id<'a>(&self, subscription: &'a Value) -> Option<&'a str>;

    /// `None` when the provider and the register agree, or the register is newer.
    fn correction(
        &self,
        subscription: &Value,
        local: Option<&StoredSubscription>,
    ) -> anyhow::Result<Option<Fetched>>;
}

/// A customer's registers as a customer sweep compares them with the provider: its plan
/// register and its entitlement registers.
#[derive(Debug, Clone, Default)]
pub struct StoredCustomer {
    pub plan: Option<StoredPlan>,
    pub entitlements: Vec<StoredEntitlement>,
}

/// A provider that shows one customer's current plans and entitlements (Kinde's billing
/// entitlements), and the corrective events for the registers that show otherwise.
pub trait CustomerPlans: Send + Sync {
    /// Reads the customer at the provider at `read_at`: one corrective event for each register
    /// that differs from what the provider shows; none when they agree, or the provider does
    /// not know the customer.
    fn corrections<'a>(
        &'a self,
        customer: &'a str,
        local: &'a StoredCustomer,
        read_at: DateTime<Utc>,
    ) -> BoxFuture<'a, anyhow::Result<Vec<Fetched>>>;
}

/// How a provider is reconciled.
pub enum Reconciliation {
    Feed(Box<dyn EventFeed>),
    Sweep(Box<dyn SubscriptionSweep>),
    /// The customers with recent events, one read each.
    Customers(Box<dyn CustomerPlans>),
}
