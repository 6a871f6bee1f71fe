//! `INBOX_SOURCES`, the sources, and `INBOX_PLANS`, the plan catalog.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use crate::domain::{Catalog, SourceKind};
use crate::platform::provider_key::ApiKeyOnUse;
use crate::signing::standard_webhooks::SecretEncoding;

use super::{value_free, ConfigError};

pub const SOURCES_VAR: &str = "INBOX_SOURCES";
pub const PLANS_VAR: &str = "INBOX_PLANS";

/// One entry of `INBOX_SOURCES`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    pub name: String,
    pub kind: SourceKind,
    #[serde(default)]
    pub jwks_url: Option<String>,
    #[serde(default)]
    pub secrets: Vec<String>,
    #[serde(default)]
    pub secret_encoding: Option<SecretEncoding>,
    #[serde(default)]
    pub tolerance_secs: Option<u64>,
    /// The provider's API key, for reconciliation; without it the source is not reconciled.
    #[serde(default)]
    pub api_key: Option<String>,
    /// The provider's API base URL (default: the one its provider says, `Provider::api_base`).
    #[serde(default)]
    pub api_base_url: Option<String>,
    /// The OAuth client whose secret `api_key` is, for a provider whose API takes client
    /// credentials (its rules say which, `Provider::own_settings`).
    #[serde(default)]
    pub api_client_id: Option<String>,
    /// The mode this source takes, for a provider whose events or keys have one: an event of
    /// the other mode is stored and ignored (`Provider::out_of_scope`).
    #[serde(default)]
    pub livemode: Option<bool>,
    /// The AWS Secrets Manager secret (ARN or name) holding the source's signing secrets,
    /// `{"secrets": [...]}`, read by the intake once per cold start ([`crate::platform::secrets`]);
    /// inline values are for local use. (Before `api_key_secret_id`, the same secret also held
    /// the API key: that combined layout still works, with a warning.)
    #[serde(default)]
    pub secret_id: Option<String>,
    /// The Secrets Manager secret (ARN or name) holding the source's API key alone,
    /// `{"api_key": "..."}`, read by the scheduler and the worker once per cold start: a
    /// secret of its own, so that IAM can keep the key from the intake (docs/design.md §5.3).
    #[serde(default)]
    pub api_key_secret_id: Option<String>,
    /// The provider's meter every accepted debit of this source is reported to
    /// (docs/design.md §4.13); each provider says which field it takes
    /// (`providers::check_sources`).
    #[serde(default)]
    pub meter: Option<MeterSetting>,
    /// The source's budget of provider API calls (docs/design.md §6.7), over its provider's
    /// documented default for its mode: `{"per_second", "burst", "reserved"}`.
    #[serde(default)]
    pub api_budget: Option<LimitSetting>,
    /// The API key's read from its secret, when it failed at cold start: a provider read
    /// tries it again (set by [`crate::platform::secrets::resolve`], never by the configuration).
    #[serde(skip)]
    pub api_key_read: Option<std::sync::Arc<dyn ApiKeyOnUse>>,
}

/// A source's `api_budget` setting: any of the three, the rest the provider's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSetting {
    #[serde(default)]
    pub per_second: Option<f64>,
    #[serde(default)]
    pub burst: Option<u32>,
    #[serde(default)]
    pub reserved: Option<u32>,
}

/// A source's meter, `"meter"` in its `INBOX_SOURCES` entry: what its provider calls the meter
/// a debit is reported to (docs/design.md §4.13).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeterSetting {
    /// The name of the events the provider's meter counts (the field a provider reads is its
    /// own, `Provider::meter_field`).
    #[serde(default)]
    pub event_name: Option<String>,
    /// The code of the provider's metered feature.
    #[serde(default)]
    pub feature_code: Option<String>,
}

impl MeterSetting {
    /// The meter's name, as a report row keeps it.
    pub fn name(&self) -> Option<&str> {
        self.event_name.as_deref().or(self.feature_code.as_deref())
    }
}

/// Secrets never reach a log line, not even through `{:?}`.
impl fmt::Debug for SourceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceConfig")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("jwks_url", &self.jwks_url)
            .field(
                "secrets",
                &format_args!("[{} redacted]", self.secrets.len()),
            )
            .field("secret_encoding", &self.secret_encoding)
            .field("tolerance_secs", &self.tolerance_secs)
            .field("api_key", &self.api_key.as_ref().map(|_| "redacted"))
            .field("api_base_url", &self.api_base_url)
            .field("api_client_id", &self.api_client_id)
            .field("livemode", &self.livemode)
            .field("secret_id", &self.secret_id)
            .field("api_key_secret_id", &self.api_key_secret_id)
            .field("api_key_read", &self.api_key_read)
            .field("meter", &self.meter)
            .finish()
    }
}

impl SourceConfig {
    /// The signing secrets, which a source of a signing kind must have.
    pub fn required_secrets(&self) -> Result<&[String], ConfigError> {
        if self.secrets.is_empty() || self.secrets.iter().any(|s| s.trim().is_empty()) {
            return Err(ConfigError::source(
                &self.name,
                "secrets must be a non-empty list of non-empty strings (inline, or in the secret_id secret)",
            ));
        }
        Ok(&self.secrets)
    }

    /// The signature tolerance: the source's own, else the default.
    pub fn tolerance(&self, default: Duration) -> Duration {
        self.tolerance_secs
            .map(Duration::from_secs)
            .unwrap_or(default)
    }
}

/// Parses `INBOX_SOURCES`: a JSON list of sources with unique, route-safe names, whose
/// secrets are each in one place. What a setting means to one provider is that provider's
/// rule (`providers::check_sources`).
pub fn parse_sources(raw: &str) -> Result<Vec<SourceConfig>, ConfigError> {
    let sources: Vec<SourceConfig> = serde_json::from_str(raw)
        .map_err(|e| ConfigError::new(SOURCES_VAR, value_free(&e, "a valid list of sources")))?;
    if sources.is_empty() {
        return Err(ConfigError::new(SOURCES_VAR, "lists no source"));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, source) in sources.iter().enumerate() {
        let name_ok = !source.name.is_empty()
            && source
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            return Err(ConfigError::at(
                SOURCES_VAR,
                format!("[{i}].name"),
                format!(
                    "'{}' must be non-empty letters, digits, '-' or '_'",
                    source.name
                ),
            ));
        }
        if !seen.insert(source.name.as_str()) {
            return Err(ConfigError::source(&source.name, "is configured twice"));
        }
        check_secret_ids(source)?;
    }
    Ok(sources)
}

/// Where a source's secrets are: each secret id non-empty, the API key in one place, and in
/// a secret of its own — never the signing secret's, which the intake may read.
fn check_secret_ids(source: &SourceConfig) -> Result<(), ConfigError> {
    let at = |field: &str| format!("source '{}': {field}", source.name);
    for (field, id) in [
        ("secret_id", &source.secret_id),
        ("api_key_secret_id", &source.api_key_secret_id),
    ] {
        if id.as_deref().is_some_and(|id| id.trim().is_empty()) {
            return Err(ConfigError::at(
                SOURCES_VAR,
                at(field),
                "is empty: name a Secrets Manager secret (ARN or name), or leave the field out",
            ));
        }
    }
    let Some(key_id) = &source.api_key_secret_id else {
        return Ok(());
    };
    if source.api_key.is_some() {
        return Err(ConfigError::at(
            SOURCES_VAR,
            at("api_key"),
            "is given inline and in api_key_secret_id: the API key must be in one place \
             (deployed: its secret; remove the inline api_key)",
        ));
    }
    if source.secret_id.as_deref() == Some(key_id.as_str()) {
        return Err(ConfigError::at(
            SOURCES_VAR,
            at("api_key_secret_id"),
            "names the secret_id secret: the API key needs a secret of its own, \
             {\"api_key\": \"...\"}, so that the intake may not read it",
        ));
    }
    Ok(())
}

/// Parses `INBOX_PLANS`, the plan catalog: the one reader for the functions and `inboxctl`.
pub fn parse_plans(raw: &str) -> Result<Catalog, ConfigError> {
    Catalog::parse(raw).map_err(|e| ConfigError::at(PLANS_VAR, e.key, e.detail))
}
