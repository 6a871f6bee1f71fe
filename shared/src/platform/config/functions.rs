//! What each function reads: one configuration per function, from the variables its
//! template gives it.

use std::time::Duration;

use crate::domain::Catalog;
use crate::platform::api_keys::KeysConfig;

use super::{ConfigError, DatabaseConfig, EffectsConfig, Env, FromEnv, SourceConfig, EFFECTS_VAR};

/// Hours without a delivery after which the console's overview names a source as silent.
pub const SILENT_HOURS_VAR: &str = "INBOX_SOURCE_SILENT_HOURS";
pub const DEFAULT_SILENT_HOURS: f64 = 24.0;
/// What precedes `/console` in the console's links, when the path the function sees lacks it.
pub const CONSOLE_BASE_VAR: &str = "INBOX_CONSOLE_BASE";
/// `on` or `off`, as the stack's `MeterReports` says (deployed only): whether anything sends
/// the meter reports a metered source's debits write.
pub const METER_REPORTS_VAR: &str = "INBOX_METER_REPORTS";

/// A stack deployed with `MeterReports` off has no dispatcher to send meter reports, while a
/// source with a `meter` writes one with every debit: they would wait unsent (or die
/// unalarmed) and the provider would bill none of that usage. The api refuses to start, so the
/// first deploy's `InitErrorsAlarm` says it (unset, as locally: nothing to check).
fn meter_reports_sent(setting: Option<&str>, sources: &[SourceConfig]) -> Result<(), ConfigError> {
    match setting.map(str::trim) {
        None | Some("on") => Ok(()),
        Some("off") => match sources.iter().find(|s| s.meter.is_some()) {
            Some(source) => Err(ConfigError::new(
                METER_REPORTS_VAR,
                format!(
                    "is off, but source '{}' has a meter: its debits' reports would never be \
                     sent. Deploy with MeterReports on, or take the meter out of Sources",
                    source.name
                ),
            )),
            None => Ok(()),
        },
        Some(_) => Err(ConfigError::new(METER_REPORTS_VAR, "is on or off")),
    }
}

/// `/a/b`: a path prefix a link can start with (empty is none).
fn is_path_prefix(base: &str) -> bool {
    base.is_empty()
        || (base.starts_with('/')
            && !base.ends_with('/')
            && base
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'<' && b != b'>'))
}

/// What the intake function needs.
#[derive(Debug, Clone)]
pub struct IntakeConfig {
    pub database: DatabaseConfig,
    pub queue_url: String,
    pub sources: Vec<SourceConfig>,
    pub tolerance: Duration,
    /// The source its provider's event bus feeds, if any (the variable that names it is the
    /// provider's: `providers::bus_fed`): without signing secrets it is left off the intake,
    /// whose route for it says so.
    pub bus_fed: Option<String>,
}

/// What the worker function needs: each source's kind, mode and API (for the reads that
/// settle ties and link refunds), never its signing secrets' use.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub database: DatabaseConfig,
    /// As `INBOX_SOURCES` writes them: the providers' rules check them as every function
    /// does; what the worker reads of them is [`WorkerConfig::sources_read`].
    pub sources: Vec<SourceConfig>,
    /// `INBOX_PROVIDER_READS` (default `true`).
    pub provider_reads: bool,
    pub catalog: Catalog,
    /// Effects on: the worker writes them and sends their ids to the dispatcher's queue.
    pub effects: Option<EffectsConfig>,
    /// `QUEUE_URL`, the queue the intake sends to: an event the worker stores (the provider
    /// read of an invoice's subscription) is sent to it after the commit. Unset: the rescue
    /// sends such events.
    pub queue_url: Option<String>,
}

/// `INBOX_PROVIDER_READS`: `false` when the worker may not read the sources' API keys (the
/// template's `WorkerProviderReads`, whose role then grants no such read); default `true`.
pub const PROVIDER_READS_VAR: &str = "INBOX_PROVIDER_READS";

impl WorkerConfig {
    /// The sources as the worker reads them: with `INBOX_PROVIDER_READS=false`, without their
    /// API keys and the secrets that hold them, so the worker reads no such secret and makes
    /// no provider read (nothing the role would refuse at each cold start and each use: ties
    /// are settled by the status rank, thin events wait for a key, §6.2).
    pub fn sources_read(&self) -> Vec<SourceConfig> {
        let mut sources = self.sources.clone();
        if !self.provider_reads {
            for source in &mut sources {
                source.api_key = None;
                source.api_key_secret_id = None;
                source.secret_id = None;
            }
        }
        sources
    }
}

impl FromEnv for WorkerConfig {
    fn read<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<Self, ConfigError> {
        let provider_reads = match env.optional(PROVIDER_READS_VAR).as_deref() {
            None | Some("true") => true,
            Some("false") => false,
            Some(other) => {
                return Err(ConfigError::new(
                    PROVIDER_READS_VAR,
                    format!("'{other}' is neither 'true' nor 'false'"),
                ))
            }
        };
        Ok(Self {
            database: env.database()?,
            sources: env.sources()?,
            provider_reads,
            catalog: env.plans()?,
            effects: env.effects()?,
            queue_url: env.optional("QUEUE_URL"),
        })
    }
}

/// What the scheduler function needs.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub database: DatabaseConfig,
    pub queue_url: String,
    pub sources: Vec<SourceConfig>,
    /// The plan catalog the audit folds accounts with.
    pub catalog: Catalog,
    pub retention: Duration,
    /// Effects on: the scheduler rescues pending effects and reports dead ones.
    pub effects: Option<EffectsConfig>,
    /// `EFFECTS_QUEUE_URL`, the dispatcher's queue, whenever it is set (effects on, or a
    /// source with a meter): the scheduler rescues the meter reports the queue lost.
    pub outbox_queue_url: Option<String>,
}

impl FromEnv for SchedulerConfig {
    fn read<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<Self, ConfigError> {
        Ok(Self {
            database: env.database()?,
            queue_url: env.required("QUEUE_URL")?,
            sources: env.sources()?,
            catalog: env.plans()?,
            retention: env.retention()?,
            effects: env.effects()?,
            outbox_queue_url: env.outbox_queue_url(),
        })
    }
}

pub const API_KEYS_VAR: &str = "INBOX_API_KEYS";

/// Parses `INBOX_API_KEYS`: the list of keys, or `{"secret_id": …}` naming the secret that
/// holds it (docs/design.md §12.2).
pub fn parse_api_keys(raw: &str) -> Result<KeysConfig, ConfigError> {
    crate::platform::api_keys::parse(raw, true).map_err(|e| match e.field {
        Some(field) => ConfigError::at(API_KEYS_VAR, field, e.detail),
        None => ConfigError::new(API_KEYS_VAR, e.detail),
    })
}

/// What the app API function needs: its sources (each one's name, kind and mode, for
/// its routes and the fold `…/why` explains; its state keeps nothing else), the plan catalog, the
/// keys, the effects queue when effects are on (a debit that exhausts the allowance tells
/// the app), and the Engine Room when the deployment turns it on.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    pub database: DatabaseConfig,
    /// As `INBOX_SOURCES` writes them: the providers' rules check them as every function does
    /// (a metered source needs its API key, even where the api sends no report), then the
    /// api's state keeps of each its name, kind and mode.
    pub sources: Vec<SourceConfig>,
    pub catalog: Catalog,
    pub keys: KeysConfig,
    pub effects: Option<EffectsConfig>,
    /// `EFFECTS_QUEUE_URL`, the dispatcher's queue, whenever it is set: a debit's meter
    /// report is handed to it (unset, the scheduler's rescue sends it).
    pub outbox_queue_url: Option<String>,
    /// `QUEUE_URL`, the worker's queue a replay hands its events to; unset, a replayed event
    /// waits for the scheduler's rescue (at most a minute).
    pub queue_url: Option<String>,
    /// `INBOX_SOURCE_SILENT_HOURS` (default 24): a source with no delivery for longer needs a
    /// person, on the console's overview (the `SourceSilentHours` alarm's threshold).
    pub source_silent_hours: f64,
    /// `INBOX_CONSOLE_BASE` (default empty): what precedes `/console` in the console's links
    /// when the server in front of the function cut it from the path (`cargo lambda watch`
    /// serves the function at `/lambda-url/api` and hands it the path without).
    pub console_base: String,
    /// `INBOX_ENGINE_ROOM`; unset: the Engine Room is off.
    pub engine_room: Option<EngineRoomConfig>,
}

impl FromEnv for ApiConfig {
    fn read<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<Self, ConfigError> {
        let sources = env.sources()?;
        meter_reports_sent(env.optional(METER_REPORTS_VAR).as_deref(), &sources)?;
        // The sources as written keep their signing secrets: the Engine Room signs its
        // deliveries with its test-mode sources' ones.
        let engine_room = env.engine_room()?;
        Ok(Self {
            database: env.database()?,
            sources,
            catalog: env.plans()?,
            keys: parse_api_keys(&env.required(API_KEYS_VAR)?)?,
            effects: env.effects()?,
            outbox_queue_url: env.outbox_queue_url(),
            queue_url: env.optional("QUEUE_URL"),
            source_silent_hours: match env.optional(SILENT_HOURS_VAR) {
                None => DEFAULT_SILENT_HOURS,
                Some(raw) => raw
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|h| h.is_finite() && *h > 0.0)
                    .ok_or_else(|| {
                        ConfigError::new(SILENT_HOURS_VAR, "is a number of hours above 0")
                    })?,
            },
            console_base: match env.optional(CONSOLE_BASE_VAR) {
                None => String::new(),
                Some(base) if is_path_prefix(&base) => base,
                Some(_) => {
                    return Err(ConfigError::new(
                        CONSOLE_BASE_VAR,
                        "is a path prefix: '/' and visible characters, no '/' at its end (/lambda-url/api)",
                    ))
                }
            },
            engine_room,
        })
    }
}

/// `INBOX_ENGINE_ROOM`: the Engine Room's settings (docs/design.md §12.5), a JSON object
/// naming the test-mode sources it runs on; unset, the Engine Room is off.
pub const ENGINE_ROOM_VAR: &str = "INBOX_ENGINE_ROOM";

/// The Engine Room (docs/design.md §12.5): the reference scenarios run on test-mode sources
/// through the intake run in process by the api function.
#[derive(Debug, Clone)]
pub struct EngineRoomConfig {
    /// `INBOX_ENGINE_ROOM` as written: the Engine Room reads it against `INBOX_SOURCES` when it
    /// opens (`handlers::engine_room::settings`).
    pub settings: String,
    /// `QUEUE_URL`, the intake's queue: the worker takes the Engine Room's events from it.
    pub queue_url: String,
    /// `INBOX_TOLERANCE_SECS`, as the intake reads it.
    pub tolerance: Duration,
}

/// What the dispatcher function needs: the sinks (their secrets are resolved at cold start).
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    pub database: DatabaseConfig,
    /// Effects on: the sinks each effect is delivered to.
    pub effects: Option<EffectsConfig>,
    /// The sources (`INBOX_SOURCES`, optional here): those with a `meter` have their debits'
    /// reports sent by the dispatcher (docs/design.md §4.13), with their API keys.
    pub sources: Vec<SourceConfig>,
}

impl FromEnv for DispatcherConfig {
    fn read<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<Self, ConfigError> {
        let sources = env.sources_or_none()?;
        let effects = env.effects()?;
        if effects.is_none() && !sources.iter().any(|s| s.meter.is_some()) {
            return Err(ConfigError::new(
                EFFECTS_VAR,
                "is not set, and no source of INBOX_SOURCES has a meter: the dispatcher has nothing to send",
            ));
        }
        Ok(Self {
            database: env.database()?,
            effects,
            sources,
        })
    }
}
