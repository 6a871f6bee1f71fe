//! The Engine Room (docs/design.md §12.5): a reference scenario run on a fresh customer of a
//! test-mode source through the real intake — its handler in process: verification, storage,
//! the hand-off to the queue — and the real worker, which consumes that queue; each delivery's
//! answer and the account after it, beside what applying on arrival gives. The api function
//! serves it; nothing here applies an event or keeps a run: a run is its id.

pub mod scenario;
pub mod settings;

use std::time::Duration;

use chrono::{DateTime, Duration as Span, Utc};
use http::StatusCode;
use lambda_http::Body;
use serde::Serialize;
use serde_json::Value;
use sqlx::PgConnection;

use crate::domain::{Catalog, CustomerId, Period, ProviderTime};
use crate::handlers::intake::{self, IntakeState};
use crate::inbox::read::event_detail;
use crate::platform::config::{
    ApiConfig, ConfigError, IntakeConfig, SourceConfig, ENGINE_ROOM_VAR,
};
use crate::platform::secrets::{Needs, OnFailure};
use crate::providers::fixtures::{self, KindeKey, Spec};
use scenario::{AccountLine, OnArrival, Scenario, Script};

/// How long a step waits, at most, for the worker to finish its events.
pub const STEP_WAIT: Duration = Duration::from_secs(3);
/// How often a waiting step reads its event's row.
const POLL: Duration = Duration::from_millis(100);
/// A run's customers: `er_`, the run's start in Unix seconds, `_`, 12 hex digits.
const CUSTOMER_PREFIX: &str = "er_";
/// Where a provider fake is told to hold an object (`POST`, the object as the body): the
/// fakes' own route (fakes/src/hold.rs, `inboxctl fakes`), which no provider has.
const FAKE_HOLD: &str = "/_fake/objects";
/// How long telling the fake to hold an object may take.
const HOLD_TIMEOUT: Duration = Duration::from_secs(5);
/// A run's latest provider time is this long before the run itself: every delivery happened
/// in the past, as a provider's do (the worker does not trust a time more than a day ahead).
const BACKDATE: Span = Span::days(1);

/// The Engine Room of one api instance: the intake it runs in process, over the test-mode
/// sources it may use, with what signs their deliveries.
pub struct EngineRoom {
    intake: IntakeState,
    /// The test-mode sources, with their signing secrets.
    sources: Vec<SourceConfig>,
    catalog: Catalog,
    /// The key a source whose provider signs with a private key (Kinde) is signed with.
    kinde_key: Option<KindeKey>,
    /// How long a step waits for the worker ([`STEP_WAIT`]).
    pub wait: Duration,
    /// What tells a provider fake to hold a thin event's object.
    http: reqwest::Client,
}

/// A scenario as the Engine Room offers it.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioInfo {
    pub name: &'static str,
    /// The test-mode source it runs on; `None` when the Engine Room has no source of its kind.
    pub source: Option<String>,
    /// The delivery step 1 sends first, so the account starts where the scenario says (none:
    /// the account starts free).
    pub setup: Option<String>,
    pub steps: Vec<StepInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StepInfo {
    pub step: usize,
    pub what: String,
}

/// A run, started: its id names the scenario and the fresh customer, whose id holds the
/// start time its provider times derive from.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub run: String,
    pub scenario: &'static str,
    pub source: String,
    pub customer: String,
    pub steps: usize,
}

/// One step, delivered: the intake's answer, the event as the worker left it, the account
/// after it, and the account as applying steps 1 to n on arrival leaves it.
#[derive(Debug, Clone, Serialize)]
pub struct StepAnswer {
    pub step: usize,
    pub what: String,
    /// The step's event time at the provider.
    pub provider_time: DateTime<Utc>,
    pub answer: DeliveryAnswer,
    /// `None` when the intake stored nothing (it refused the delivery).
    pub event: Option<EventAfter>,
    pub account: AccountLine,
    pub on_arrival: OnArrival,
}

/// What the intake answered: its status and, for a 200, the delivery's verdict (`stored`,
/// `duplicate`, `conflict`), else its error code with the detail.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryAnswer {
    pub status: u16,
    pub verdict: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The step's event as it stands when the step answers: final, or still where the worker is
/// when the wait ran out.
#[derive(Debug, Clone, Serialize)]
pub struct EventAfter {
    pub event_id: i64,
    pub status: &'static str,
    /// The account log's outcome for it (`applied`, `ignored`), once it has one.
    pub outcome: Option<String>,
    pub reason: Option<String>,
}

/// Everything the Engine Room refuses or fails at, each with its code and status.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("the Engine Room is off in this deployment ({ENGINE_ROOM_VAR} is not set)")]
    Off,
    #[error(
        "unknown scenario '{0}'; the scenarios are nine-deliveries, subscriptions, status, refund, status-paddle, refund-lemonsqueezy and status-thin"
    )]
    UnknownScenario(String),
    #[error(
        "scenario {scenario} runs on a {kind} source, and {ENGINE_ROOM_VAR} names no test-mode one"
    )]
    ScenarioUnavailable {
        scenario: &'static str,
        kind: &'static str,
    },
    #[error(
        "'{0}' is not a run of the Engine Room: a run is <scenario>.er_<start, Unix seconds>_<12 hex digits>, as starting one answers"
    )]
    BadRun(String),
    #[error("step {step} is not a step of {scenario}: its steps are 1 to {steps}")]
    BadStep {
        step: usize,
        scenario: &'static str,
        steps: usize,
    },
    #[error("the database could not be read; retry later")]
    Unavailable(#[source] sqlx::Error),
    #[error("the delivery could not be built: {0}")]
    Delivery(String),
}

impl EngineError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Off => "engine_room_off",
            Self::UnknownScenario(_) => "unknown_scenario",
            Self::ScenarioUnavailable { .. } => "scenario_unavailable",
            Self::BadRun(_) => "bad_run",
            Self::BadStep { .. } => "bad_step",
            Self::Unavailable(_) => "store_unavailable",
            Self::Delivery(_) => "delivery_not_built",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::Off | Self::BadRun(_) | Self::BadStep { .. } => StatusCode::NOT_FOUND,
            Self::UnknownScenario(_) => StatusCode::BAD_REQUEST,
            Self::ScenarioUnavailable { .. } => StatusCode::CONFLICT,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Delivery(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<sqlx::Error> for EngineError {
    fn from(e: sqlx::Error) -> Self {
        Self::Unavailable(e)
    }
}

/// A run's id taken apart.
struct RunId {
    scenario: Scenario,
    customer: String,
    /// What makes the run's event and object ids its own: the customer's id after `er_`.
    tag: String,
    /// The start of its provider times: its latest step [`BACKDATE`] before the run began.
    start: DateTime<Utc>,
}

impl RunId {
    fn parse(run: &str) -> Result<Self, EngineError> {
        let bad = || EngineError::BadRun(run.chars().take(100).collect());
        let (name, customer) = run.split_once('.').ok_or_else(bad)?;
        let scenario = Scenario::parse(name).ok_or_else(bad)?;
        let tag = customer.strip_prefix(CUSTOMER_PREFIX).ok_or_else(bad)?;
        let (secs, hex) = tag.split_once('_').ok_or_else(bad)?;
        let digits = |s: &str, n: std::ops::RangeInclusive<usize>, ok: fn(&char) -> bool| {
            n.contains(&s.len()) && s.chars().all(|c| ok(&c))
        };
        if !digits(secs, 1..=12, char::is_ascii_digit)
            || !digits(hex, 12..=12, |c| {
                c.is_ascii_hexdigit() && !c.is_ascii_uppercase()
            })
        {
            return Err(bad());
        }
        let started = secs
            .parse::<i64>()
            .ok()
            .and_then(|s| DateTime::from_timestamp(s, 0))
            .ok_or_else(bad)?;
        Ok(Self {
            scenario,
            customer: customer.to_owned(),
            tag: tag.to_owned(),
            start: started - BACKDATE - Span::minutes(scenario.script().last_minute()),
        })
    }
}

impl EngineRoom {
    /// At cold start: the Engine Room `INBOX_ENGINE_ROOM` asks for, or `None` when it is off.
    /// Its sources' signing secrets are read here (once: the intake it runs is handed them),
    /// and a source it cannot sign for stops the cold start.
    pub async fn open(config: &ApiConfig) -> anyhow::Result<Option<Self>> {
        let Some(room) = &config.engine_room else {
            return Ok(None);
        };
        let settings = settings::parse(&room.settings, &config.sources)?;
        crate::providers::check_sources(&settings.sources)?;
        let resolved: Vec<SourceConfig> =
            crate::platform::secrets::resolve(&settings.sources, Needs::Signing, OnFailure::Stop)
                .await?
                .into_iter()
                .map(|mut source| {
                    // Signing is all it needs of them.
                    source.secret_id = None;
                    source.api_key = None;
                    source.api_key_secret_id = None;
                    source
                })
                .collect();
        let intake = IntakeState::from_config(&IntakeConfig {
            database: config.database.clone(),
            queue_url: room.queue_url.clone(),
            sources: resolved.clone(),
            tolerance: room.tolerance,
            bus_fed: None,
        })
        .await?;
        Ok(Some(Self::from_config(
            &settings,
            resolved,
            config.catalog.clone(),
            intake,
        )?))
    }

    /// The Engine Room over `sources` (`settings`', their signing secrets read) and the intake
    /// `intake` runs them through. A source it cannot sign for — one whose provider signs with
    /// a private key (Kinde), without `kinde_key_file` — is refused, naming it.
    pub fn from_config(
        settings: &settings::Settings,
        sources: Vec<SourceConfig>,
        catalog: Catalog,
        intake: IntakeState,
    ) -> Result<Self, ConfigError> {
        let kinde_key = match &settings.kinde_key {
            Some(file) => Some(KindeKey {
                pem: std::fs::read(&file.path).map_err(|e| {
                    ConfigError::at(
                        ENGINE_ROOM_VAR,
                        "kinde_key_file",
                        format!("{} cannot be read: {e}", file.path.display()),
                    )
                })?,
                kid: file.kid.clone(),
            }),
            None => None,
        };
        for source in &sources {
            if fixtures::signs_with_a_key(source.kind) && kinde_key.is_none() {
                return Err(ConfigError::at(
                    ENGINE_ROOM_VAR,
                    "sources",
                    format!(
                        "'{}' is a {} source, whose provider signs with a private key of its \
                         own: the Engine Room signs for it only with the key whose public half \
                         its jwks_url serves (kinde_key_file and kinde_kid; locally the dev \
                         stack's INBOX_DEV_KINDE_KEY)",
                        source.name,
                        source.kind.as_str()
                    ),
                ));
            }
        }
        let room = Self {
            intake,
            sources,
            catalog,
            kinde_key,
            wait: STEP_WAIT,
            http: reqwest::Client::builder()
                .timeout(HOLD_TIMEOUT)
                .build()
                .map_err(|e| ConfigError::at(ENGINE_ROOM_VAR, "sources", e.to_string()))?,
        };
        for scenario in Scenario::ALL {
            let script = scenario.script();
            if room.source_for(&script).is_none() {
                continue;
            }
            let unknown: Vec<&str> = script
                .plan_keys()
                .into_iter()
                .filter(|key| room.catalog.get(key).is_none())
                .collect();
            if !unknown.is_empty() {
                // Not refused: the run shows these deliveries ignored for an unknown plan.
                tracing::warn!(
                    scenario = scenario.name(),
                    unknown = unknown.join(", "),
                    "INBOX_PLANS lacks plan keys this Engine Room scenario names"
                );
            }
        }
        Ok(room)
    }

    /// The reference scenarios, each with the source it runs on and its steps.
    pub fn scenarios(&self) -> Vec<ScenarioInfo> {
        Scenario::ALL
            .into_iter()
            .map(|scenario| {
                let script = scenario.script();
                ScenarioInfo {
                    name: scenario.name(),
                    source: self.source_for(&script).map(|s| s.name.clone()),
                    setup: script.setup(),
                    steps: (1..=script.steps.len())
                        .map(|step| StepInfo {
                            step,
                            what: script.what(step),
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// Starts a run of `scenario` on a fresh customer: nothing is stored until its first step.
    pub fn start(&self, scenario: &str) -> Result<Run, EngineError> {
        self.start_at(scenario, Utc::now())
    }

    fn start_at(&self, name: &str, now: DateTime<Utc>) -> Result<Run, EngineError> {
        let scenario = Scenario::parse(name)
            .ok_or_else(|| EngineError::UnknownScenario(name.chars().take(64).collect()))?;
        let script = scenario.script();
        let source = self.available(scenario, &script)?;
        let random = uuid::Uuid::new_v4().simple().to_string();
        let customer = format!("{CUSTOMER_PREFIX}{}_{}", now.timestamp(), &random[..12]);
        Ok(Run {
            run: format!("{}.{customer}", scenario.name()),
            scenario: scenario.name(),
            source: source.name.clone(),
            customer,
            steps: script.steps.len(),
        })
    }

    /// Delivers step `step` (1-based) of `run` through the intake in process, waits (at most
    /// [`EngineRoom::wait`]) for the worker to finish its event, and reads the account after
    /// it on `conn`. The first step of a scenario with a starting point delivers that first.
    #[tracing::instrument(skip_all, fields(run, step))]
    pub async fn step(
        &self,
        conn: &mut PgConnection,
        run: &str,
        step: usize,
    ) -> Result<StepAnswer, EngineError> {
        let id = RunId::parse(run)?;
        let script = id.scenario.script();
        let source = self.available(id.scenario, &script)?;
        if !(1..=script.steps.len()).contains(&step) {
            return Err(EngineError::BadStep {
                step,
                scenario: id.scenario.name(),
                steps: script.steps.len(),
            });
        }
        let until = tokio::time::Instant::now() + self.wait;
        if let (1, Some(start)) = (step, &script.start) {
            let spec = start.spec(&id.customer, &id.tag, id.start);
            if let (_, Some(event_id)) = self.deliver(source, &spec, script.thin).await? {
                self.wait_for(conn, event_id, until).await?;
            }
        }
        let this = &script.steps[step - 1];
        let spec = this.spec(&id.customer, &id.tag, id.start);
        let (answer, event_id) = self.deliver(source, &spec, script.thin).await?;
        let status = match event_id {
            Some(event_id) => self.wait_for(conn, event_id, until).await?,
            None => None,
        };
        let customer = CustomerId::parse(&id.customer)
            .map_err(|e| EngineError::Delivery(format!("the run's customer: {e}")))?;
        let period = Period::of(ProviderTime::from(spec.at));
        let account =
            crate::billing::account::load(conn, &source.name, &customer, &period, &self.catalog)
                .await?;
        let event = event_id.zip(status).map(|(event_id, (status, reason))| {
            let logged = account
                .as_ref()
                .and_then(|a| a.log.iter().find(|line| line.event_id == event_id));
            EventAfter {
                event_id,
                status,
                outcome: logged.map(|line| line.outcome.clone()),
                reason: logged.map(|line| line.reason.clone()).or(reason),
            }
        });
        Ok(StepAnswer {
            step,
            what: script.what(step),
            provider_time: spec.at,
            answer,
            event,
            account: AccountLine::of(account.as_ref()),
            on_arrival: OnArrival::after(&script, step, &self.catalog),
        })
    }

    /// The test-mode source a script runs on: the first of the Engine Room's of its kind; for a
    /// script of thin events, the first whose provider API is given (`api_base_url`: the
    /// fakes', which can be told what to hold; a provider's own API holds only what was made
    /// in it).
    fn source_for(&self, script: &Script) -> Option<&SourceConfig> {
        self.sources
            .iter()
            .find(|s| s.kind == script.kind && (!script.thin || s.api_base_url.is_some()))
    }

    fn available(&self, scenario: Scenario, script: &Script) -> Result<&SourceConfig, EngineError> {
        self.source_for(script)
            .ok_or(EngineError::ScenarioUnavailable {
                scenario: scenario.name(),
                kind: script.kind.as_str(),
            })
    }

    /// Builds and signs a delivery as the source's provider does, and hands it to the intake
    /// handler: its answer, and the event id it names. `thin`: the delivery is the thin twin of
    /// the (Stripe) snapshot event, once the provider fake holds the snapshot's object.
    async fn deliver(
        &self,
        source: &SourceConfig,
        spec: &Spec,
        thin: bool,
    ) -> Result<(DeliveryAnswer, Option<i64>), EngineError> {
        let (id, payload) = fixtures::payload(source.kind, spec).map_err(EngineError::Delivery)?;
        let (id, payload) = match thin {
            true => self.thin_twin(source, &payload).await?,
            false => (id, payload),
        };
        let signed = fixtures::sign_delivery(source, &id, &payload, self.kinde_key.as_ref())
            .map_err(EngineError::Delivery)?;
        let mut request = http::Request::builder()
            .method("POST")
            .uri(format!("/webhooks/{}", source.name));
        for (name, value) in &signed.headers {
            request = request.header(name, value);
        }
        let request = request
            .body(Body::from(signed.body))
            .map_err(|e| EngineError::Delivery(e.to_string()))?;
        let response = intake::handle(&self.intake, request).await;
        let status = response.status().as_u16();
        let body: Value = match response.body() {
            Body::Text(text) => serde_json::from_str(text).unwrap_or(Value::Null),
            Body::Binary(bytes) => serde_json::from_slice(bytes).unwrap_or(Value::Null),
            _ => Value::Null,
        };
        let text = |field: &str| body[field].as_str().map(str::to_owned);
        Ok(match status {
            200 => (
                DeliveryAnswer {
                    status,
                    verdict: text("status").unwrap_or_default(),
                    detail: None,
                },
                body["event_id"].as_i64(),
            ),
            _ => (
                DeliveryAnswer {
                    status,
                    verdict: text("code").unwrap_or_default(),
                    detail: text("detail"),
                },
                None,
            ),
        })
    }

    /// The thin twin of the Stripe snapshot `payload`, with its id, once the provider fake at
    /// the source's `api_base_url` holds the snapshot's object: the worker reads it there.
    async fn thin_twin(
        &self,
        source: &SourceConfig,
        payload: &Value,
    ) -> Result<(String, Value), EngineError> {
        let twin = crate::providers::stripe::fixtures::thin_twin(payload).ok_or_else(|| {
            EngineError::Delivery("this kind of event has no thin twin".to_owned())
        })?;
        let id = twin["id"].as_str().unwrap_or_default().to_owned();
        let base = source.api_base_url.as_deref().ok_or_else(|| {
            EngineError::Delivery(format!(
                "'{}' has no api_base_url to read from",
                source.name
            ))
        })?;
        let url = format!("{}{FAKE_HOLD}", base.trim_end_matches('/'));
        let held = self
            .http
            .post(&url)
            .json(&payload["data"]["object"])
            .send()
            .await
            .map_err(|e| {
                EngineError::Delivery(format!("telling the fake at {url} to hold the object: {e}"))
            })?;
        if !held.status().is_success() {
            return Err(EngineError::Delivery(format!(
                "the fake at {url} answered {} (only the provider fakes, `inboxctl fakes`, hold objects)",
                held.status()
            )));
        }
        Ok((id, twin))
    }

    /// Reads the event's row until the worker has finished it or `until` has passed: its
    /// status and reason then (`None` if it is gone).
    async fn wait_for(
        &self,
        conn: &mut PgConnection,
        event_id: i64,
        until: tokio::time::Instant,
    ) -> Result<Option<(&'static str, Option<String>)>, EngineError> {
        loop {
            let row = event_detail(conn, event_id).await?;
            let Some(event) = row else {
                return Ok(None);
            };
            let status = event.summary.status;
            if status.is_final() || tokio::time::Instant::now() + POLL > until {
                return Ok(Some((status.as_str(), event.summary.reason)));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_id_names_its_scenario_and_a_fresh_customer_and_nothing_else() {
        let run = RunId::parse("nine-deliveries.er_1764790000_0123456789ab").unwrap();
        assert_eq!(run.scenario, Scenario::NineDeliveries);
        assert_eq!(run.customer, "er_1764790000_0123456789ab");
        assert_eq!(run.tag, "1764790000_0123456789ab");
        assert_eq!(
            run.start,
            DateTime::from_timestamp(1_764_790_000, 0).unwrap() - BACKDATE - Span::minutes(11)
        );
        for bad in [
            "",
            "nine-deliveries",
            "ten-deliveries.er_1764790000_0123456789ab",
            "nine-deliveries.cus_live",
            "nine-deliveries.er_1764790000_0123456789aB",
            "nine-deliveries.er_1764790000_0123456789",
            "nine-deliveries.er_1764790000_0123456789abc",
            "nine-deliveries.er__0123456789ab",
            "nine-deliveries.er_17x4790000_0123456789ab",
            "nine-deliveries.er_1764790000_0123456789ab.x",
        ] {
            assert_eq!(
                RunId::parse(bad).err().map(|e| e.code()),
                Some("bad_run"),
                "{bad}"
            );
        }
    }
}
