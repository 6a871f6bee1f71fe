//! Where variables come from, and how a configuration is read from them once.

use std::time::Duration;

use crate::domain::Catalog;

use super::{
    parse_plans, parse_sinks, parse_sources, ConfigError, DatabaseConfig, EffectsConfig,
    EngineRoomConfig, SourceConfig, EFFECTS_QUEUE_VAR, EFFECTS_VAR, ENGINE_ROOM_VAR, PLANS_VAR,
    SOURCES_VAR,
};

pub const DEFAULT_TOLERANCE_SECS: u64 = 300;
/// How long the purge keeps finished events when `INBOX_RETENTION_DAYS` is not set
/// (docs/design.md §3.9).
pub const DEFAULT_RETENTION_DAYS: u64 = 30;
/// Twice the longest provider retry window (three days, docs/design.md §3.9): a webhook copy
/// comes while its event is still stored.
pub const MIN_RETENTION_DAYS: u64 = 6;

/// Where variables come from: the process environment, or a map in tests.
pub struct Env<F>(F);

impl Env<fn(&str) -> Option<String>> {
    pub fn process() -> Self {
        Env(|var| std::env::var(var).ok())
    }
}

impl<F: Fn(&str) -> Option<String>> Env<F> {
    pub fn from_lookup(lookup: F) -> Self {
        Env(lookup)
    }

    pub fn optional(&self, var: &str) -> Option<String> {
        (self.0)(var)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    pub fn required(&self, var: &'static str) -> Result<String, ConfigError> {
        self.optional(var)
            .ok_or_else(|| ConfigError::new(var, "is not set"))
    }

    /// `DATABASE_SECRET_ID` or `DATABASE_URL`, and `DATABASE_CA_FILE` ([`crate::platform::database`]).
    pub fn database(&self) -> Result<DatabaseConfig, ConfigError> {
        DatabaseConfig::read(|var| (self.0)(var))
    }

    pub fn sources(&self) -> Result<Vec<SourceConfig>, ConfigError> {
        parse_sources(&self.required(SOURCES_VAR)?)
    }

    /// `INBOX_SOURCES` when it is set, else none (for tools that only look a source up).
    pub fn sources_or_none(&self) -> Result<Vec<SourceConfig>, ConfigError> {
        match self.optional(SOURCES_VAR) {
            Some(raw) => parse_sources(&raw),
            None => Ok(Vec::new()),
        }
    }

    /// `EFFECTS_QUEUE_URL`, the dispatcher's queue, when it is set.
    pub fn outbox_queue_url(&self) -> Option<String> {
        self.optional(EFFECTS_QUEUE_VAR)
    }

    pub fn plans(&self) -> Result<Catalog, ConfigError> {
        parse_plans(&self.required(PLANS_VAR)?)
    }

    /// The catalog when `INBOX_PLANS` is set, else an empty one (for read-only tools).
    pub fn plans_or_empty(&self) -> Result<Catalog, ConfigError> {
        match self.optional(PLANS_VAR) {
            Some(raw) => parse_plans(&raw),
            None => Ok(Catalog::default()),
        }
    }

    /// `INBOX_EFFECTS` and, when it is set, `EFFECTS_QUEUE_URL`; unset: effects are off.
    pub fn effects(&self) -> Result<Option<EffectsConfig>, ConfigError> {
        let Some(raw) = self.optional(EFFECTS_VAR) else {
            return Ok(None);
        };
        Ok(Some(EffectsConfig {
            sinks: parse_sinks(&raw)?,
            queue_url: self.required(EFFECTS_QUEUE_VAR)?,
        }))
    }

    /// `INBOX_ENGINE_ROOM` as written, and when it is set the intake's `QUEUE_URL` and
    /// tolerance; unset: the Engine Room is off. The Engine Room reads its settings against the
    /// sources when it opens, at the same cold start.
    pub fn engine_room(&self) -> Result<Option<EngineRoomConfig>, ConfigError> {
        let Some(settings) = self.optional(ENGINE_ROOM_VAR) else {
            return Ok(None);
        };
        let queue_url = self.optional("QUEUE_URL").ok_or_else(|| {
            ConfigError::new(
                "QUEUE_URL",
                "is not set: the Engine Room (INBOX_ENGINE_ROOM) hands its events to the intake's queue",
            )
        })?;
        Ok(Some(EngineRoomConfig {
            settings,
            queue_url,
            tolerance: self.tolerance()?,
        }))
    }

    /// A whole number at least `min`, or `default` when the variable is unset.
    fn number(&self, var: &'static str, default: u64, min: u64) -> Result<u64, ConfigError> {
        match self.optional(var) {
            None => Ok(default),
            Some(raw) => raw
                .parse::<u64>()
                .ok()
                .filter(|n| *n >= min)
                .ok_or_else(|| {
                    ConfigError::new(
                        var,
                        format!("'{raw}' is not a whole number of at least {min}"),
                    )
                }),
        }
    }

    pub fn tolerance(&self) -> Result<Duration, ConfigError> {
        self.number("INBOX_TOLERANCE_SECS", DEFAULT_TOLERANCE_SECS, 1)
            .map(Duration::from_secs)
    }

    pub fn retention(&self) -> Result<Duration, ConfigError> {
        self.number(
            "INBOX_RETENTION_DAYS",
            DEFAULT_RETENTION_DAYS,
            MIN_RETENTION_DAYS,
        )
        .map(|days| Duration::from_secs(days * 86_400))
    }
}

/// A configuration read from the environment once, at cold start.
pub trait FromEnv: Sized {
    fn read<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<Self, ConfigError>;

    fn from_env() -> Result<Self, ConfigError> {
        Self::read(&Env::process())
    }

    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Self::read(&Env::from_lookup(lookup))
    }
}
