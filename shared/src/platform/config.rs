//! Configuration: every environment variable the functions and `inboxctl` read, parsed and
//! validated once at cold start (docs/design.md §5). One error type names the variable, and
//! the field within it, that is missing or malformed.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;
use sqlx::postgres::PgConnectOptions;

use crate::domain::{Catalog, SourceKind};
use crate::platform::api_keys::KeysConfig;
use crate::signing::standard_webhooks::{decode_secret, SecretEncoding};

pub const DEFAULT_TOLERANCE_SECS: u64 = 300;
/// How long the purge keeps finished events when `INBOX_RETENTION_DAYS` is not set
/// (docs/design.md §3.9).
pub const DEFAULT_RETENTION_DAYS: u64 = 30;
/// Twice the longest provider retry window (Stripe retries for 3 days): a webhook copy comes
/// while its event is still stored.
pub const MIN_RETENTION_DAYS: u64 = 6;

/// A variable that is missing or malformed; the message names it, and the field within it.
#[derive(thiserror::Error, PartialEq, Eq)]
pub struct ConfigError {
    pub var: &'static str,
    /// Where in the variable's value, e.g. `source 'polar': secrets[0]`.
    pub field: Option<String>,
    pub detail: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{}: {field}: {}", self.var, self.detail),
            None => write!(f, "{}: {}", self.var, self.detail),
        }
    }
}

/// Shown as its message: a function that fails at start prints its error with `{:?}`.
impl fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl ConfigError {
    pub fn new(var: &'static str, detail: impl Into<String>) -> Self {
        Self {
            var,
            field: None,
            detail: detail.into(),
        }
    }

    pub fn at(var: &'static str, field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            var,
            field: Some(field.into()),
            detail: detail.into(),
        }
    }

    /// An error in one source of `INBOX_SOURCES`.
    pub fn source(name: &str, detail: impl Into<String>) -> Self {
        Self::at(SOURCES_VAR, format!("source '{name}'"), detail)
    }
}

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
    /// The provider's API base URL (default: the provider's public API; Kinde: the origin of
    /// `jwks_url`).
    #[serde(default)]
    pub api_base_url: Option<String>,
    /// Kinde: the M2M application's client id; `api_key` is its client secret.
    #[serde(default)]
    pub api_client_id: Option<String>,
    /// Stripe: the mode this source takes; an event of the other mode is stored and ignored.
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
    /// Stripe: the meter's `event_name`; Polar: the name of the events its meter counts.
    #[serde(default)]
    pub event_name: Option<String>,
    /// Kinde: the metered feature's code (`billing_feature_code`).
    #[serde(default)]
    pub feature_code: Option<String>,
}

impl MeterSetting {
    /// The meter's name, as a report row keeps it.
    pub fn name(&self) -> Option<&str> {
        self.event_name.as_deref().or(self.feature_code.as_deref())
    }
}

/// A source's API key whose read failed at cold start, read again when a provider read needs
/// it ([`crate::platform::secrets::ApiKeyRead`], with a backoff). The configuration only
/// carries it beside its source; the secrets module makes it.
pub trait ApiKeyOnUse: fmt::Debug + Send + Sync {
    /// The key: the one read, or a read now when the backoff allows it, or why not.
    fn key(&self) -> crate::BoxFuture<'_, anyhow::Result<String>>;
    /// Failed reads of its secret so far.
    fn failures(&self) -> u32;
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

/// A JSON error without the value it quotes: a serde message can repeat the offending
/// string, which in `INBOX_SOURCES` may be a secret. Field names are kept (they are not).
pub(crate) fn value_free(error: &serde_json::Error, expected: &str) -> String {
    let message = error.to_string();
    let what = if message.starts_with("unknown field") || message.starts_with("missing field") {
        message
            .split(" at line")
            .next()
            .unwrap_or_default()
            .to_owned()
    } else {
        match error.classify() {
            serde_json::error::Category::Syntax => "malformed JSON".to_owned(),
            serde_json::error::Category::Eof => "the JSON ends early".to_owned(),
            _ => "a value has the wrong type".to_owned(),
        }
    };
    format!(
        "not {expected}: {what} (line {}, column {})",
        error.line(),
        error.column()
    )
}

pub const EFFECTS_VAR: &str = "INBOX_EFFECTS";
pub const EFFECTS_QUEUE_VAR: &str = "EFFECTS_QUEUE_URL";
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// An HTTPS endpoint of the app, signed as Standard Webhooks.
    Webhook,
    /// An Amazon EventBridge bus (`PutEvents`).
    Eventbridge,
}

/// One entry of `INBOX_EFFECTS`: where effects are delivered (docs/design.md §11).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    pub name: String,
    pub kind: SinkKind,
    /// Webhook: the endpoint.
    #[serde(default)]
    pub url: Option<String>,
    /// Webhook: the signing secret, `whsec_<base64>` (inline, for local use and tests).
    #[serde(default)]
    pub secret: Option<String>,
    /// Webhook: the Secrets Manager secret (ARN or name) holding `{"secret": "whsec_…"}`.
    #[serde(default)]
    pub secret_id: Option<String>,
    /// EventBridge: the bus name or ARN.
    #[serde(default)]
    pub bus: Option<String>,
}

/// The signing secret never reaches a log line.
impl fmt::Debug for SinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkConfig")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("url", &self.url)
            .field("secret", &self.secret.as_ref().map(|_| "redacted"))
            .field("secret_id", &self.secret_id)
            .field("bus", &self.bus)
            .finish()
    }
}

/// Effects are on: where they go, and the queue that hands their ids to the dispatcher.
#[derive(Debug, Clone)]
pub struct EffectsConfig {
    pub sinks: Vec<SinkConfig>,
    pub queue_url: String,
}

/// Parses `INBOX_EFFECTS`: a JSON list of sinks with unique names, each with the fields its
/// kind takes and no others.
pub fn parse_sinks(raw: &str) -> Result<Vec<SinkConfig>, ConfigError> {
    let sinks: Vec<SinkConfig> = serde_json::from_str(raw)
        .map_err(|e| ConfigError::new(EFFECTS_VAR, value_free(&e, "a valid list of sinks")))?;
    if sinks.is_empty() {
        return Err(ConfigError::new(
            EFFECTS_VAR,
            "lists no sink (leave it unset to write no effects)",
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, sink) in sinks.iter().enumerate() {
        let at = |field: &str| format!("sink '{}': {field}", sink.name);
        let name_ok = !sink.name.is_empty()
            && sink
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            return Err(ConfigError::at(
                EFFECTS_VAR,
                format!("[{i}].name"),
                format!(
                    "'{}' must be non-empty letters, digits, '-' or '_'",
                    sink.name
                ),
            ));
        }
        if !seen.insert(sink.name.as_str()) {
            return Err(ConfigError::at(
                EFFECTS_VAR,
                at("name"),
                "is configured twice",
            ));
        }
        match sink.kind {
            SinkKind::Webhook => {
                let url = sink.url.as_deref().unwrap_or_default();
                match url::Url::parse(url) {
                    Ok(u) if matches!(u.scheme(), "https" | "http") && u.host().is_some() => {}
                    _ => {
                        return Err(ConfigError::at(
                            EFFECTS_VAR,
                            at("url"),
                            "must be an http(s) URL with a host",
                        ))
                    }
                }
                if sink.secret.is_some() == sink.secret_id.is_some() {
                    return Err(ConfigError::at(
                        EFFECTS_VAR,
                        at("secret"),
                        "a webhook sink takes exactly one of secret (whsec_<base64>) or secret_id",
                    ));
                }
                if let Some(secret) = &sink.secret {
                    decode_secret(secret, SecretEncoding::Base64).map_err(|_| {
                        ConfigError::at(
                            EFFECTS_VAR,
                            at("secret"),
                            "must be whsec_ followed by base64 (of the signing key)",
                        )
                    })?;
                }
                if sink.bus.is_some() {
                    return Err(ConfigError::at(
                        EFFECTS_VAR,
                        at("bus"),
                        "is an eventbridge setting",
                    ));
                }
            }
            SinkKind::Eventbridge => {
                if sink.bus.as_deref().is_none_or(|b| b.trim().is_empty()) {
                    return Err(ConfigError::at(EFFECTS_VAR, at("bus"), "is required"));
                }
                if sink.url.is_some() || sink.secret.is_some() || sink.secret_id.is_some() {
                    return Err(ConfigError::at(
                        EFFECTS_VAR,
                        at("url"),
                        "url, secret and secret_id are webhook settings",
                    ));
                }
            }
        }
    }
    Ok(sinks)
}

/// Parses `INBOX_PLANS`, the plan catalog: the one reader for the functions and `inboxctl`.
pub fn parse_plans(raw: &str) -> Result<Catalog, ConfigError> {
    Catalog::parse(raw).map_err(|e| ConfigError::at(PLANS_VAR, e.key, e.detail))
}

// Where the functions' database is: `DATABASE_URL` (local use and tests), or the secret
// `DATABASE_SECRET_ID` names, which `platform::database` reads into connection options at
// cold start, and how its server is checked (docs/design.md §5.3).
pub const DATABASE_URL_VAR: &str = "DATABASE_URL";
pub const DATABASE_SECRET_VAR: &str = "DATABASE_SECRET_ID";
pub const DATABASE_CA_VAR: &str = "DATABASE_CA_FILE";
pub const DATABASE_TLS_VAR: &str = "DATABASE_TLS";
pub const DATABASE_HOST_VAR: &str = "DATABASE_HOST";
pub const DATABASE_PORT_VAR: &str = "DATABASE_PORT";
pub const DATABASE_NAME_VAR: &str = "DATABASE_NAME";
pub const DATABASE_POOLER_VAR: &str = "DATABASE_POOLER";

/// `DATABASE_TLS`: what a connection asks of the server, by libpq's `sslmode` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tls {
    /// TLS, with a certificate that chains to the roots and names the host: the default of a
    /// secret's connections.
    VerifyFull,
    /// TLS, with a certificate that chains to the roots, whatever name it holds (a tunnel
    /// reached as `localhost`).
    VerifyCa,
    /// TLS, the certificate unchecked: encrypted, the server not authenticated.
    Require,
    /// TLS when the server offers it, unchecked; else none (a URL without `sslmode`).
    Prefer,
    /// No TLS.
    Disable,
}

impl Tls {
    fn parse(value: &str) -> Result<Self, ConfigError> {
        match value {
            "verify-full" => Ok(Self::VerifyFull),
            "verify-ca" => Ok(Self::VerifyCa),
            "require" => Ok(Self::Require),
            "prefer" => Ok(Self::Prefer),
            "disable" => Ok(Self::Disable),
            other => Err(ConfigError::new(
                DATABASE_TLS_VAR,
                format!("'{other}' is not one of verify-full, verify-ca, require, prefer, disable"),
            )),
        }
    }

    /// Whether the server's certificate is checked against roots.
    pub fn verifies(self) -> bool {
        matches!(self, Self::VerifyFull | Self::VerifyCa)
    }

    pub fn ssl_mode(self) -> sqlx::postgres::PgSslMode {
        use sqlx::postgres::PgSslMode;
        match self {
            Self::VerifyFull => PgSslMode::VerifyFull,
            Self::VerifyCa => PgSslMode::VerifyCa,
            Self::Require => PgSslMode::Require,
            Self::Prefer => PgSslMode::Prefer,
            Self::Disable => PgSslMode::Disable,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::VerifyFull => "verify-full",
            Self::VerifyCa => "verify-ca",
            Self::Require => "require",
            Self::Prefer => "prefer",
            Self::Disable => "disable",
        }
    }
}

/// Where the connection settings come from.
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseSource {
    /// `DATABASE_URL`, fixed for the process.
    Url(String),
    /// `DATABASE_SECRET_ID`: the secret's ARN or name.
    Secret(String),
}

/// `DATABASE_URL` holds a password: never shown.
impl fmt::Debug for DatabaseSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Url(_) => f.write_str("Url(redacted)"),
            Self::Secret(id) => f.debug_tuple("Secret").field(id).finish(),
        }
    }
}

/// What a function reads about its database at cold start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseConfig {
    pub source: DatabaseSource,
    /// `DATABASE_TLS` as given; [`Self::tls_mode`] says what the connections do.
    pub tls: Option<Tls>,
    /// `DATABASE_CA_FILE`: a PEM bundle that a verifying connection checks the server
    /// against instead of [`crate::platform::database::AWS_DATABASE_ROOTS`]; with it the default is `verify-full`, for a
    /// URL too. A relative path is taken from the function's package (`LAMBDA_TASK_ROOT`).
    pub ca_file: Option<PathBuf>,
    /// Where the database is when its secret does not say: the secret RDS manages for a
    /// master user holds only `username` and `password`.
    pub endpoint: Endpoint,
    /// `DATABASE_POOLER`: what is between the functions and Postgres.
    pub pooler: Pooler,
}

/// `DATABASE_POOLER`: `none` (the default) when the functions reach Postgres itself, or
/// `transaction` through a pooler that may hand each transaction to another server
/// connection: RDS Proxy, PgBouncer's `pool_mode = transaction` (docs/deploy.md, RDS Proxy).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pooler {
    /// Each statement is prepared once per connection under a name and cached: one round
    /// trip each after the first.
    #[default]
    None,
    /// No session state: every statement is unnamed (one round trip more each), and the
    /// worker bounds its transactions through a function, not a `SET` (RDS Proxy pins a
    /// session that runs `SET` or names a prepared statement).
    Transaction,
}

impl Pooler {
    fn parse(value: &str) -> Result<Self, ConfigError> {
        match value {
            "none" => Ok(Self::None),
            "transaction" => Ok(Self::Transaction),
            other => Err(ConfigError::new(
                DATABASE_POOLER_VAR,
                format!(
                    "'{other}' is neither 'none' nor 'transaction' (RDS Proxy is 'transaction')"
                ),
            )),
        }
    }
}

/// `DATABASE_HOST`, `DATABASE_PORT`, `DATABASE_NAME`: what a JSON secret's `host`, `port`
/// and `dbname` fall back to (the secret's own win).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoint {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub dbname: Option<String>,
}

impl DatabaseConfig {
    /// Reads `DATABASE_SECRET_ID` or `DATABASE_URL` (exactly one), `DATABASE_TLS` and
    /// `DATABASE_CA_FILE`.
    pub fn read(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |var: &str| {
            lookup(var)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let source = match (get(DATABASE_SECRET_VAR), get(DATABASE_URL_VAR)) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    DATABASE_SECRET_VAR,
                    "is set beside DATABASE_URL: set one (the secret when deployed, the URL for local use)",
                ))
            }
            (Some(id), None) => DatabaseSource::Secret(id),
            (None, Some(url)) => {
                PgConnectOptions::from_str(&url).map_err(|_| {
                    ConfigError::new(
                        DATABASE_URL_VAR,
                        "is not a postgres:// URL (a password's #, %, ? or / must be percent-encoded)",
                    )
                })?;
                DatabaseSource::Url(url)
            }
            (None, None) => {
                return Err(ConfigError::new(
                    DATABASE_SECRET_VAR,
                    "is not set (nor DATABASE_URL): name the database's secret",
                ))
            }
        };
        let ca_file = get(DATABASE_CA_VAR).map(|path| {
            let path = PathBuf::from(path);
            match (path.is_relative(), get("LAMBDA_TASK_ROOT")) {
                (true, Some(root)) => Path::new(&root).join(path),
                _ => path,
            }
        });
        let tls = get(DATABASE_TLS_VAR)
            .map(|value| Tls::parse(&value))
            .transpose()?;
        if let (Some(tls), Some(ca_file)) = (tls, &ca_file) {
            if !tls.verifies() {
                return Err(ConfigError::new(
                    DATABASE_CA_VAR,
                    format!(
                        "names a CA bundle ('{}'), but DATABASE_TLS '{}' checks no certificate: \
                         set DATABASE_TLS to verify-full (or verify-ca), or leave DATABASE_CA_FILE unset",
                        ca_file.display(),
                        tls.name()
                    ),
                ));
            }
        }
        let port = match get(DATABASE_PORT_VAR) {
            None => None,
            Some(port) => Some(port.parse().map_err(|_| {
                ConfigError::new(DATABASE_PORT_VAR, format!("'{port}' is not a port number"))
            })?),
        };
        let endpoint = Endpoint {
            host: get(DATABASE_HOST_VAR),
            port,
            dbname: get(DATABASE_NAME_VAR),
        };
        let pooler = get(DATABASE_POOLER_VAR)
            .map(|value| Pooler::parse(&value))
            .transpose()?
            .unwrap_or_default();
        Ok(Self {
            source,
            tls,
            ca_file,
            endpoint,
            pooler,
        })
    }

    /// A configuration of `url` alone, as tests and tools build one.
    pub fn url(url: impl Into<String>) -> Self {
        Self {
            source: DatabaseSource::Url(url.into()),
            tls: None,
            ca_file: None,
            endpoint: Endpoint::default(),
            pooler: Pooler::None,
        }
    }

    /// What every connection asks of the server: `DATABASE_TLS` when set; else `verify-full`
    /// for a secret's connections (a deployed function's) and with `DATABASE_CA_FILE`; else
    /// `None`, what the `DATABASE_URL` says (`prefer` when it names no `sslmode`: local use
    /// and tests, where Postgres is on 127.0.0.1).
    pub fn tls_mode(&self) -> Option<Tls> {
        match (self.tls, &self.source, &self.ca_file) {
            (Some(tls), _, _) => Some(tls),
            (None, DatabaseSource::Secret(_), _) | (None, _, Some(_)) => Some(Tls::VerifyFull),
            (None, DatabaseSource::Url(_), None) => None,
        }
    }
}

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

    fn optional(&self, var: &str) -> Option<String> {
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

    /// `INBOX_ENGINE_ROOM` against `sources` (with their secrets), and when it is set the
    /// intake's `QUEUE_URL` and tolerance; unset: the Engine Room is off.
    pub fn engine_room(
        &self,
        sources: &[SourceConfig],
    ) -> Result<Option<EngineRoomConfig>, ConfigError> {
        let Some(raw) = self.optional(ENGINE_ROOM_VAR) else {
            return Ok(None);
        };
        let (sources, kinde_key) = parse_engine_room(&raw, sources)?;
        let queue_url = self.optional("QUEUE_URL").ok_or_else(|| {
            ConfigError::new(
                "QUEUE_URL",
                "is not set: the Engine Room (INBOX_ENGINE_ROOM) hands its events to the intake's queue",
            )
        })?;
        Ok(Some(EngineRoomConfig {
            sources,
            queue_url,
            tolerance: self.tolerance()?,
            kinde_key,
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

/// What the intake function needs.
#[derive(Debug, Clone)]
pub struct IntakeConfig {
    pub database: DatabaseConfig,
    pub queue_url: String,
    pub sources: Vec<SourceConfig>,
    pub tolerance: Duration,
    /// The Stripe source the EventBridge bridge feeds (`INBOX_STRIPE_EVENT_SOURCE_FOR`), if
    /// any: without signing secrets it is left off the intake, whose route for it says so.
    pub bus_fed: Option<String>,
}

impl FromEnv for IntakeConfig {
    fn read<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<Self, ConfigError> {
        Ok(Self {
            database: env.database()?,
            queue_url: env.required("QUEUE_URL")?,
            sources: env.sources()?,
            tolerance: env.tolerance()?,
            bus_fed: env.optional(EVENT_SOURCE_FOR_VAR),
        })
    }
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

/// What the app API function needs: its sources (each one's name, kind and Stripe mode, for
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
        // The Engine Room signs its deliveries with its test-mode sources' signing secrets.
        let engine_room = env.engine_room(&sources)?;
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

/// `INBOX_ENGINE_ROOM`: the Engine Room's settings (docs/design.md §12.5), e.g.
/// `{"sources": ["kinde", "polar", "stripe"]}`; unset, the Engine Room is off.
pub const ENGINE_ROOM_VAR: &str = "INBOX_ENGINE_ROOM";

/// `INBOX_ENGINE_ROOM` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EngineRoomSettings {
    sources: Vec<String>,
    #[serde(default)]
    kinde_key_file: Option<PathBuf>,
    #[serde(default)]
    kinde_kid: Option<String>,
}

/// The Engine Room (docs/design.md §12.5): the test-mode sources the reference scenarios may
/// run on, through the intake run in process by the api function.
#[derive(Debug, Clone)]
pub struct EngineRoomConfig {
    /// The sources `INBOX_ENGINE_ROOM` names, as `INBOX_SOURCES` gives them, signing secrets
    /// (or their `secret_id`) kept: the Engine Room signs its deliveries with them, and the
    /// intake it runs verifies them with them. Never a live-mode source.
    pub sources: Vec<SourceConfig>,
    /// `QUEUE_URL`, the intake's queue: the worker takes the Engine Room's events from it.
    pub queue_url: String,
    /// `INBOX_TOLERANCE_SECS`, as the intake reads it.
    pub tolerance: Duration,
    /// For a source whose provider signs with a private key of its own (Kinde): the PEM key
    /// whose public half the source's `jwks_url` serves (the dev stack's
    /// `INBOX_DEV_KINDE_KEY`), and the `kid` it names.
    pub kinde_key: Option<KeyFile>,
}

/// A private key in a file, and the `kid` its JWKS names it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFile {
    pub path: PathBuf,
    pub kid: String,
}

/// Parses `INBOX_ENGINE_ROOM` against the sources: each name a source of `INBOX_SOURCES`,
/// once, none of them live-mode (a Stripe source's `livemode: true`). What a source needs to
/// be signed for (a Kinde source's key) is checked where the Engine Room is built.
fn parse_engine_room(
    raw: &str,
    sources: &[SourceConfig],
) -> Result<(Vec<SourceConfig>, Option<KeyFile>), ConfigError> {
    let settings: EngineRoomSettings = serde_json::from_str(raw).map_err(|e| {
        ConfigError::new(
            ENGINE_ROOM_VAR,
            value_free(&e, r#"{"sources": [the names of test-mode sources]}"#),
        )
    })?;
    if settings.sources.is_empty() {
        return Err(ConfigError::at(
            ENGINE_ROOM_VAR,
            "sources",
            "lists no source (leave INBOX_ENGINE_ROOM unset to keep the Engine Room off)",
        ));
    }
    let mut chosen: Vec<SourceConfig> = Vec::new();
    for name in &settings.sources {
        let name = name.trim();
        let Some(source) = sources.iter().find(|s| s.name == name) else {
            let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
            return Err(ConfigError::at(
                ENGINE_ROOM_VAR,
                "sources",
                format!(
                    "'{name}' is not a source of {SOURCES_VAR} (its sources: {})",
                    names.join(", ")
                ),
            ));
        };
        if chosen.iter().any(|s| s.name == name) {
            return Err(ConfigError::at(
                ENGINE_ROOM_VAR,
                "sources",
                format!("'{name}' is named twice"),
            ));
        }
        if source.livemode == Some(true) {
            return Err(ConfigError::at(
                ENGINE_ROOM_VAR,
                "sources",
                format!(
                    "'{name}' is a live-mode source (livemode: true in {SOURCES_VAR}): the \
                     Engine Room runs only on test-mode sources"
                ),
            ));
        }
        chosen.push(source.clone());
    }
    let kinde_key = match (settings.kinde_key_file, settings.kinde_kid) {
        (None, None) => None,
        (Some(path), Some(kid)) if !kid.trim().is_empty() => Some(KeyFile {
            path,
            kid: kid.trim().to_owned(),
        }),
        _ => {
            return Err(ConfigError::at(
                ENGINE_ROOM_VAR,
                "kinde_key_file",
                "kinde_key_file and kinde_kid go together: the key's PEM file and the kid \
                 its JWKS names it by",
            ))
        }
    };
    Ok((chosen, kinde_key))
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

/// The variable naming the Stripe partner event source whose events the bridge takes.
pub const EVENT_SOURCE_VAR: &str = "INBOX_STRIPE_EVENT_SOURCE";
/// The variable naming the `INBOX_SOURCES` source those events are stored as.
pub const EVENT_SOURCE_FOR_VAR: &str = "INBOX_STRIPE_EVENT_SOURCE_FOR";
/// How every Stripe partner event source is named: `aws.partner/stripe.com/` and the
/// destination's own part (AWS's partner source names, docs/deploy.md).
pub const STRIPE_PARTNER_PREFIX: &str = "aws.partner/stripe.com/";

/// What the EventBridge function needs: the database and the queue as the intake's, the
/// partner event source it accepts, and the Stripe source its events are stored as. No
/// signing secret: the bus is the trust (docs/design.md §1.1).
#[derive(Debug, Clone)]
pub struct BridgeConfig {
    pub database: DatabaseConfig,
    pub queue_url: String,
    /// The only EventBridge `source` taken, `aws.partner/stripe.com/…`.
    pub event_source: String,
    /// The `INBOX_SOURCES` source (of kind `stripe`) its events are stored as: the same rows,
    /// keys and dedupe as that source's HTTPS deliveries.
    pub source: String,
}

impl FromEnv for BridgeConfig {
    fn read<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<Self, ConfigError> {
        let event_source = env.required(EVENT_SOURCE_VAR)?;
        let part = event_source
            .strip_prefix(STRIPE_PARTNER_PREFIX)
            .ok_or_else(|| {
                ConfigError::new(
                    EVENT_SOURCE_VAR,
                    format!("is not a Stripe partner event source ({STRIPE_PARTNER_PREFIX}…)"),
                )
            })?;
        let allowed = |c: char| c.is_ascii_alphanumeric() || "._-/".contains(c);
        if part.is_empty() || !part.chars().all(allowed) || event_source.len() > 256 {
            return Err(ConfigError::new(
                EVENT_SOURCE_VAR,
                "is not an event source name (letters, digits, '.', '-', '_', '/'; 256 at most)",
            ));
        }
        let source = env.required(EVENT_SOURCE_FOR_VAR)?;
        // Refused here, at cold start: events stored under a source the worker does not
        // know, or reads as another provider's, would all end unprocessable.
        match env.sources()?.iter().find(|s| s.name == source) {
            Some(config) if config.kind == crate::domain::SourceKind::Stripe => {}
            Some(_) => {
                return Err(ConfigError::new(
                    EVENT_SOURCE_FOR_VAR,
                    format!("names '{source}', which is not a Stripe source in {SOURCES_VAR}"),
                ))
            }
            None => {
                return Err(ConfigError::new(
                    EVENT_SOURCE_FOR_VAR,
                    format!("names '{source}', which is not in {SOURCES_VAR}"),
                ))
            }
        }
        Ok(Self {
            database: env.database()?,
            queue_url: env.required("QUEUE_URL")?,
            event_source,
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn database(vars: &[(&str, &str)]) -> Result<DatabaseConfig, ConfigError> {
        DatabaseConfig::read(lookup(vars))
    }

    #[test]
    fn the_secret_or_the_url_exactly_one() {
        assert_eq!(
            database(&[(
                DATABASE_SECRET_VAR,
                "arn:aws:secretsmanager:eu-west-1:1:secret:db"
            )])
            .unwrap()
            .source,
            DatabaseSource::Secret("arn:aws:secretsmanager:eu-west-1:1:secret:db".into())
        );
        assert!(matches!(
            database(&[(DATABASE_URL_VAR, "postgres://u:p@h/d")])
                .unwrap()
                .source,
            DatabaseSource::Url(_)
        ));
        let both = database(&[
            (DATABASE_SECRET_VAR, "db"),
            (DATABASE_URL_VAR, "postgres://u:p@h/d"),
        ])
        .unwrap_err();
        assert_eq!(both.var, DATABASE_SECRET_VAR);
        assert_eq!(
            database(&[]).unwrap_err().to_string(),
            "DATABASE_SECRET_ID: is not set (nor DATABASE_URL): name the database's secret"
        );
    }

    #[test]
    fn the_pooler_is_none_unless_named() {
        let url = (DATABASE_URL_VAR, "postgres://u:p@h/d");
        assert_eq!(database(&[url]).unwrap().pooler, Pooler::None);
        assert_eq!(
            database(&[url, (DATABASE_POOLER_VAR, "none")])
                .unwrap()
                .pooler,
            Pooler::None
        );
        assert_eq!(
            database(&[url, (DATABASE_POOLER_VAR, " transaction ")])
                .unwrap()
                .pooler,
            Pooler::Transaction
        );
        assert_eq!(
            database(&[url, (DATABASE_POOLER_VAR, "session")]).unwrap_err().to_string(),
            "DATABASE_POOLER: 'session' is neither 'none' nor 'transaction' (RDS Proxy is 'transaction')"
        );
    }

    #[test]
    fn a_relative_ca_file_is_in_the_package() {
        let c = database(&[
            (DATABASE_SECRET_VAR, "db"),
            (DATABASE_CA_VAR, "certs/global-bundle.pem"),
            ("LAMBDA_TASK_ROOT", "/var/task"),
        ])
        .unwrap();
        assert_eq!(
            c.ca_file.as_deref(),
            Some(Path::new("/var/task/certs/global-bundle.pem"))
        );
    }

    #[test]
    fn a_secret_is_verified_in_full_unless_told_otherwise_and_a_url_keeps_its_own() {
        let secret = (
            DATABASE_SECRET_VAR,
            "arn:aws:secretsmanager:eu-west-1:1:secret:rds!db-1-AbCdEf",
        );
        let url = (
            DATABASE_URL_VAR,
            "postgres://postgres@127.0.0.1:61320/postgres",
        );
        let ca = (DATABASE_CA_VAR, "/opt/global-bundle.pem");
        let mode = |vars: &[(&str, &str)]| database(vars).unwrap().tls_mode();
        assert_eq!(mode(&[secret]), Some(Tls::VerifyFull));
        assert_eq!(mode(&[secret, ca]), Some(Tls::VerifyFull));
        // Local use and tests: what the URL says (sqlx's prefer when it says nothing).
        assert_eq!(mode(&[url]), None);
        assert_eq!(mode(&[url, ca]), Some(Tls::VerifyFull));
        for (value, tls) in [
            ("verify-full", Tls::VerifyFull),
            ("verify-ca", Tls::VerifyCa),
            ("require", Tls::Require),
            ("prefer", Tls::Prefer),
            (" disable ", Tls::Disable),
        ] {
            assert_eq!(mode(&[secret, (DATABASE_TLS_VAR, value)]), Some(tls));
            assert_eq!(mode(&[url, (DATABASE_TLS_VAR, value)]), Some(tls));
        }
        assert_eq!(
            mode(&[secret, ca, (DATABASE_TLS_VAR, "verify-ca")]),
            Some(Tls::VerifyCa)
        );
    }

    #[test]
    fn a_tls_setting_that_cannot_work_is_refused_by_name() {
        let secret = (DATABASE_SECRET_VAR, "db");
        assert_eq!(
            database(&[secret, (DATABASE_TLS_VAR, "verify")])
                .unwrap_err()
                .to_string(),
            "DATABASE_TLS: 'verify' is not one of verify-full, verify-ca, require, prefer, disable"
        );
        assert_eq!(
            database(&[
                secret,
                (DATABASE_TLS_VAR, "require"),
                (DATABASE_CA_VAR, "/opt/global-bundle.pem")
            ])
            .unwrap_err()
            .to_string(),
            "DATABASE_CA_FILE: names a CA bundle ('/opt/global-bundle.pem'), but DATABASE_TLS \
             'require' checks no certificate: set DATABASE_TLS to verify-full (or verify-ca), \
             or leave DATABASE_CA_FILE unset"
        );
    }

    #[test]
    fn the_source_never_shows_its_url() {
        let shown = format!("{:?}", DatabaseConfig::url("postgres://u:hunter2@h/d"));
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    const SOURCES: &str = r#"[{"name":"stripe","kind":"stripe","secrets":["whsec_x"]},
        {"name":"polar","kind":"standard-webhooks","secrets":["p"],"secret_encoding":"raw","tolerance_secs":60},
        {"name":"kinde","kind":"kinde","jwks_url":"https://x.kinde.com/.well-known/jwks"}]"#;

    #[test]
    fn the_bridge_takes_a_stripe_partner_source_for_a_stripe_source_and_refuses_the_rest() {
        let config = |event_source: &str, source: &str| {
            BridgeConfig::from_lookup(lookup(&[
                ("DATABASE_URL", "postgres://x"),
                ("QUEUE_URL", "http://q"),
                ("INBOX_SOURCES", SOURCES),
                ("INBOX_STRIPE_EVENT_SOURCE", event_source),
                ("INBOX_STRIPE_EVENT_SOURCE_FOR", source),
            ]))
        };
        let ok = config("aws.partner/stripe.com/ed_test_61Abc", "stripe").unwrap();
        assert_eq!(ok.event_source, "aws.partner/stripe.com/ed_test_61Abc");
        assert_eq!(ok.source, "stripe");
        for (event_source, source, said) in [
            (
                "aws.partner/other.com/x",
                "stripe",
                "not a Stripe partner event source",
            ),
            (
                "aws.partner/stripe.com/",
                "stripe",
                "not an event source name",
            ),
            (
                "aws.partner/stripe.com/a b",
                "stripe",
                "not an event source name",
            ),
            (
                "aws.partner/stripe.com/ed_1",
                "polar",
                "not a Stripe source",
            ),
            (
                "aws.partner/stripe.com/ed_1",
                "paypal",
                "not in INBOX_SOURCES",
            ),
        ] {
            let error = config(event_source, source).unwrap_err().to_string();
            assert!(error.contains(said), "{event_source} {source}: {error}");
        }
    }

    #[test]
    fn full_config_parses() {
        let c = IntakeConfig::from_lookup(lookup(&[
            ("DATABASE_URL", "postgres://x"),
            ("QUEUE_URL", "http://q"),
            ("INBOX_SOURCES", SOURCES),
        ]))
        .unwrap();
        assert_eq!(c.sources.len(), 3);
        assert_eq!(c.sources[1].kind, SourceKind::StandardWebhooks);
        assert_eq!(c.sources[1].secret_encoding, Some(SecretEncoding::Raw));
        assert_eq!(c.tolerance, Duration::from_secs(300));
    }

    #[test]
    fn missing_variable_is_named() {
        let err =
            IntakeConfig::from_lookup(lookup(&[("DATABASE_URL", "postgres://x")])).unwrap_err();
        assert_eq!(err.to_string(), "QUEUE_URL: is not set");
    }

    #[test]
    fn malformed_sources_are_named() {
        let err = IntakeConfig::from_lookup(lookup(&[
            ("DATABASE_URL", "postgres://x"),
            ("QUEUE_URL", "http://q"),
            ("INBOX_SOURCES", r#"[{"name":"s","kind":"paypal"}]"#),
        ]))
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("INBOX_SOURCES: not a valid list"),
            "{err}"
        );
        assert!(parse_sources(r#"[{"name":"a/b","kind":"stripe"}]"#).is_err());
        assert!(parse_sources("[]").is_err());
        assert!(parse_sources(r#"[{"name":"s","kind":"stripe","secret":["typo"]}]"#).is_err());
    }

    #[test]
    fn debug_output_redacts_secrets() {
        let sources = parse_sources(
            r#"[{"name":"s","kind":"stripe","secrets":["whsec_topsecret"],"api_key":"sk_live_topsecret"}]"#,
        )
        .unwrap();
        let shown = format!("{sources:?}");
        assert!(!shown.contains("topsecret"), "{shown}");
    }

    #[test]
    fn tolerance_must_be_positive() {
        let base = [
            ("DATABASE_URL", "postgres://x"),
            ("QUEUE_URL", "http://q"),
            ("INBOX_SOURCES", SOURCES),
        ];
        let mut vars = base.to_vec();
        vars.push(("INBOX_TOLERANCE_SECS", "0"));
        assert!(IntakeConfig::from_lookup(lookup(&vars)).is_err());
        vars.pop();
        vars.push(("INBOX_TOLERANCE_SECS", "120"));
        assert_eq!(
            IntakeConfig::from_lookup(lookup(&vars)).unwrap().tolerance,
            Duration::from_secs(120)
        );
    }

    #[test]
    fn errors_name_the_variable_and_the_field() {
        let twice = parse_sources(
            r#"[{"name":"s","kind":"stripe","secrets":["a"]},{"name":"s","kind":"stripe","secrets":["b"]}]"#,
        )
        .unwrap_err();
        assert_eq!(
            twice.to_string(),
            "INBOX_SOURCES: source 's': is configured twice"
        );
        let bad_name = parse_sources(r#"[{"name":"a/b","kind":"stripe"}]"#).unwrap_err();
        assert_eq!(bad_name.field.as_deref(), Some("[0].name"));
        let plans = parse_plans(r#"{"gold":{"plan":"gold","monthly_allowance":-5}}"#).unwrap_err();
        assert_eq!(plans.var, PLANS_VAR);
        assert_eq!(plans.field.as_deref(), Some("gold"));
    }

    #[test]
    fn the_api_key_has_a_secret_of_its_own_and_one_place() {
        let split = parse_sources(
            r#"[{"name":"s","kind":"stripe","secret_id":"billing-inbox/stripe","api_key_secret_id":"billing-inbox/stripe-api-key"},
                {"name":"k","kind":"kinde","jwks_url":"https://x.kinde.com/.well-known/jwks","api_client_id":"m2m","api_key_secret_id":"billing-inbox/kinde-api-key"}]"#,
        )
        .unwrap();
        assert_eq!(
            split[0].api_key_secret_id.as_deref(),
            Some("billing-inbox/stripe-api-key")
        );
        let cases = [
            (
                r#"[{"name":"s","kind":"stripe","secret_id":"a","api_key":"sk_inline_value","api_key_secret_id":"b"}]"#,
                "INBOX_SOURCES: source 's': api_key: is given inline and in api_key_secret_id: the API key must be in one place (deployed: its secret; remove the inline api_key)",
            ),
            (
                r#"[{"name":"s","kind":"stripe","secret_id":"same","api_key_secret_id":"same"}]"#,
                r#"INBOX_SOURCES: source 's': api_key_secret_id: names the secret_id secret: the API key needs a secret of its own, {"api_key": "..."}, so that the intake may not read it"#,
            ),
            (
                r#"[{"name":"s","kind":"stripe","secret_id":"a","api_key_secret_id":" "}]"#,
                "INBOX_SOURCES: source 's': api_key_secret_id: is empty: name a Secrets Manager secret (ARN or name), or leave the field out",
            ),
            (
                r#"[{"name":"s","kind":"stripe","secret_id":""}]"#,
                "INBOX_SOURCES: source 's': secret_id: is empty: name a Secrets Manager secret (ARN or name), or leave the field out",
            ),
        ];
        for (raw, expected) in cases {
            let error = parse_sources(raw).unwrap_err().to_string();
            assert_eq!(error, expected, "{raw}");
            assert!(!error.contains("sk_inline_value"), "{error}");
        }
        let shown = format!("{:?}", split[0]);
        assert!(
            shown.contains(r#"api_key_secret_id: Some("billing-inbox/stripe-api-key")"#),
            "{shown}"
        );
    }

    #[test]
    fn worker_and_scheduler_read_their_variables() {
        let base = [
            ("DATABASE_URL", "postgres://x"),
            ("QUEUE_URL", "http://q"),
            ("INBOX_SOURCES", SOURCES),
        ];
        let missing = WorkerConfig::from_lookup(lookup(&base)).unwrap_err();
        assert_eq!(missing.to_string(), "INBOX_PLANS: is not set");
        // The scheduler's audit folds accounts with the catalog, as the worker applies them.
        let missing = SchedulerConfig::from_lookup(lookup(&base)).unwrap_err();
        assert_eq!(missing.to_string(), "INBOX_PLANS: is not set");
        let mut vars = base.to_vec();
        vars.push((
            PLANS_VAR,
            r#"{"pro":{"plan":"pro","monthly_allowance":500}}"#,
        ));
        let worker = WorkerConfig::from_lookup(lookup(&vars)).unwrap();
        assert!(worker
            .sources
            .iter()
            .any(|s| s.name == "kinde" && s.kind == SourceKind::Kinde));
        // The queue the reads it stores go to; without it the rescue sends them.
        assert_eq!(worker.queue_url.as_deref(), Some("http://q"));
        let without: Vec<_> = vars
            .iter()
            .filter(|v| v.0 != "QUEUE_URL")
            .cloned()
            .collect();
        let worker = WorkerConfig::from_lookup(lookup(&without)).unwrap();
        assert_eq!(worker.queue_url, None);
        let scheduler = SchedulerConfig::from_lookup(lookup(&vars)).unwrap();
        assert_eq!(scheduler.retention, Duration::from_secs(30 * 86_400));
        vars.push(("INBOX_RETENTION_DAYS", "2"));
        let short = SchedulerConfig::from_lookup(lookup(&vars)).unwrap_err();
        assert_eq!(short.var, "INBOX_RETENTION_DAYS");
    }

    #[test]
    fn a_worker_without_provider_reads_keeps_no_api_key_nor_its_secret() {
        let sources = r#"[{"name":"stripe","kind":"stripe","secret_id":"billing-inbox/stripe","api_key_secret_id":"billing-inbox/stripe-api-key"},
            {"name":"polar","kind":"standard-webhooks","secrets":["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],"api_key":"polar_oat_x"}]"#;
        let vars = |reads: &'static str| {
            vec![
                ("DATABASE_URL", "postgres://x"),
                ("INBOX_SOURCES", sources),
                (
                    PLANS_VAR,
                    r#"{"pro":{"plan":"pro","monthly_allowance":500}}"#,
                ),
                (PROVIDER_READS_VAR, reads),
            ]
        };
        let keys = |reads| {
            WorkerConfig::from_lookup(lookup(&vars(reads)))
                .unwrap()
                .sources_read()
                .iter()
                .map(|s| {
                    (
                        s.api_key.is_some(),
                        s.api_key_secret_id.is_some(),
                        s.secret_id.is_some(),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keys("false"),
            [(false, false, false), (false, false, false)]
        );
        assert_eq!(keys("true"), [(false, true, true), (true, false, false)]);
        assert_eq!(keys(""), keys("true"), "unset: provider reads on");
        assert_eq!(
            WorkerConfig::from_lookup(lookup(&vars("no")))
                .unwrap_err()
                .to_string(),
            "INBOX_PROVIDER_READS: 'no' is neither 'true' nor 'false'"
        );
    }

    const SINKS: &str = r#"[{"name":"app","kind":"webhook","url":"https://app.example/billing-events","secret":"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
        {"name":"bus","kind":"eventbridge","bus":"billing"}]"#;

    fn worker_vars(effects: &str) -> Vec<(&str, &str)> {
        vec![
            ("DATABASE_URL", "postgres://x"),
            ("INBOX_SOURCES", SOURCES),
            (
                "INBOX_PLANS",
                r#"{"pro":{"plan":"pro","monthly_allowance":5}}"#,
            ),
            ("INBOX_EFFECTS", effects),
        ]
    }

    #[test]
    fn effects_are_off_unless_inbox_effects_is_set() {
        let mut vars = worker_vars(SINKS);
        vars.pop();
        assert!(WorkerConfig::from_lookup(lookup(&vars))
            .unwrap()
            .effects
            .is_none());
    }

    #[test]
    fn effect_sinks_parse_and_need_their_queue() {
        let missing = WorkerConfig::from_lookup(lookup(&worker_vars(SINKS))).unwrap_err();
        assert_eq!(missing.to_string(), "EFFECTS_QUEUE_URL: is not set");
        let mut vars = worker_vars(SINKS);
        vars.push(("EFFECTS_QUEUE_URL", "http://q/effects"));
        let effects = WorkerConfig::from_lookup(lookup(&vars))
            .unwrap()
            .effects
            .unwrap();
        assert_eq!(effects.queue_url, "http://q/effects");
        assert_eq!(effects.sinks[0].kind, SinkKind::Webhook);
        assert_eq!(effects.sinks[1].bus.as_deref(), Some("billing"));
        let shown = format!("{:?}", effects.sinks[0]);
        assert!(!shown.contains("whsec_"), "{shown}");
    }

    #[test]
    fn malformed_sinks_are_named() {
        let cases = [
            ("[]", "INBOX_EFFECTS: lists no sink (leave it unset to write no effects)"),
            (
                r#"[{"name":"app","kind":"webhook","url":"https://a.example/e"}]"#,
                "INBOX_EFFECTS: sink 'app': secret: a webhook sink takes exactly one of secret (whsec_<base64>) or secret_id",
            ),
            (
                r#"[{"name":"app","kind":"webhook","url":"https://a.example/e","secret":"whsec_AAAA","secret_id":"s"}]"#,
                "INBOX_EFFECTS: sink 'app': secret: a webhook sink takes exactly one of secret (whsec_<base64>) or secret_id",
            ),
            (
                r#"[{"name":"app","kind":"webhook","url":"ftp://a.example/e","secret":"whsec_AAAA"}]"#,
                "INBOX_EFFECTS: sink 'app': url: must be an http(s) URL with a host",
            ),
            (
                r#"[{"name":"app","kind":"webhook","url":"https://a.example/e","secret":"whsec_!!"}]"#,
                "INBOX_EFFECTS: sink 'app': secret: must be whsec_ followed by base64 (of the signing key)",
            ),
            (
                r#"[{"name":"bus","kind":"eventbridge"}]"#,
                "INBOX_EFFECTS: sink 'bus': bus: is required",
            ),
            (
                r#"[{"name":"bus","kind":"eventbridge","bus":"b","url":"https://a.example"}]"#,
                "INBOX_EFFECTS: sink 'bus': url: url, secret and secret_id are webhook settings",
            ),
            (
                r#"[{"name":"b","kind":"eventbridge","bus":"x"},{"name":"b","kind":"eventbridge","bus":"y"}]"#,
                "INBOX_EFFECTS: sink 'b': name: is configured twice",
            ),
            (
                r#"[{"name":"b","kind":"sns"}]"#,
                "INBOX_EFFECTS: not a valid list of sinks: a value has the wrong type (line 1, column 25)",
            ),
        ];
        for (raw, expected) in cases {
            assert_eq!(parse_sinks(raw).unwrap_err().to_string(), expected, "{raw}");
        }
    }

    const API_KEYS: &str = r#"[{"name":"ops","sha256":"0000000000000000000000000000000000000000000000000000000000000000","scopes":["admin"]}]"#;

    /// The app API's variables, with `INBOX_ENGINE_ROOM` and `QUEUE_URL` as given.
    fn api_config(engine_room: Option<&str>, queue: bool) -> Result<ApiConfig, ConfigError> {
        let sources = r#"[{"name":"kinde","kind":"kinde","jwks_url":"http://127.0.0.1:9/jwks"},
            {"name":"stripe","kind":"stripe","secrets":["whsec_test"],"livemode":false},
            {"name":"stripe-live","kind":"stripe","secrets":["whsec_live"],"livemode":true},
            {"name":"polar","kind":"standard-webhooks","secrets":["polar_secret"],"secret_encoding":"raw"}]"#;
        let mut vars = vec![
            ("DATABASE_URL", "postgres://x"),
            ("INBOX_SOURCES", sources),
            (
                "INBOX_PLANS",
                r#"{"pro":{"plan":"pro","monthly_allowance":500}}"#,
            ),
            ("INBOX_API_KEYS", API_KEYS),
        ];
        if let Some(raw) = engine_room {
            vars.push(("INBOX_ENGINE_ROOM", raw));
        }
        if queue {
            vars.push(("QUEUE_URL", "http://127.0.0.1:9/queue/q"));
        }
        ApiConfig::from_lookup(lookup(&vars))
    }

    /// With meter reports off (the stack's `MeterReports`), a source with a meter stops the
    /// api's cold start, naming the source; on, or unset, it starts.
    #[test]
    fn a_metered_source_with_meter_reports_off_is_refused_at_cold_start() {
        let with = |reports: Option<&'static str>| {
            let mut vars = vec![
                ("DATABASE_URL", "postgres://x"),
                (
                    "INBOX_SOURCES",
                    r#"[{"name":"stripe","kind":"stripe","secrets":["whsec_test"],"api_key":"rk_test_1","meter":{"event_name":"api_calls"}}]"#,
                ),
                (
                    "INBOX_PLANS",
                    r#"{"pro":{"plan":"pro","monthly_allowance":500}}"#,
                ),
                ("INBOX_API_KEYS", API_KEYS),
            ];
            if let Some(reports) = reports {
                vars.push((METER_REPORTS_VAR, reports));
            }
            ApiConfig::from_lookup(lookup(&vars))
        };
        let refused = with(Some("off")).unwrap_err();
        assert_eq!(refused.var, METER_REPORTS_VAR);
        assert!(refused.detail.contains("'stripe'"), "{}", refused.detail);
        assert!(with(Some("on")).is_ok());
        assert!(with(None).is_ok());
        assert_eq!(with(Some("maybe")).unwrap_err().var, METER_REPORTS_VAR);
    }

    #[test]
    fn the_consoles_base_and_the_silence_hours_are_checked_and_default_to_none_and_a_day() {
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut vars = vec![
                ("DATABASE_URL", "postgres://x"),
                (
                    "INBOX_SOURCES",
                    r#"[{"name":"kinde","kind":"kinde","jwks_url":"http://127.0.0.1:9/jwks"}]"#,
                ),
                (
                    "INBOX_PLANS",
                    r#"{"pro":{"plan":"pro","monthly_allowance":500}}"#,
                ),
                ("INBOX_API_KEYS", API_KEYS),
            ];
            vars.extend_from_slice(extra);
            ApiConfig::from_lookup(lookup(&vars))
        };
        let plain = with(&[]).unwrap();
        assert_eq!(
            (
                plain.console_base.as_str(),
                plain.source_silent_hours,
                plain.queue_url
            ),
            ("", 24.0, None)
        );
        let set = with(&[
            (CONSOLE_BASE_VAR, "/lambda-url/api"),
            (SILENT_HOURS_VAR, "6"),
            ("QUEUE_URL", "http://q"),
        ])
        .unwrap();
        assert_eq!(
            (set.console_base.as_str(), set.source_silent_hours),
            ("/lambda-url/api", 6.0)
        );
        assert_eq!(set.queue_url.as_deref(), Some("http://q"));
        for bad in ["lambda-url/api", "/api/", "/a b", "/a\"<"] {
            assert_eq!(
                with(&[(CONSOLE_BASE_VAR, bad)]).unwrap_err().var,
                CONSOLE_BASE_VAR,
                "{bad:?}"
            );
        }
        for bad in ["0", "-1", "soon", "NaN"] {
            assert_eq!(
                with(&[(SILENT_HOURS_VAR, bad)]).unwrap_err().var,
                SILENT_HOURS_VAR,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_engine_room_is_off_unless_set_and_keeps_only_its_test_sources_secrets() {
        let off = api_config(None, true).unwrap();
        assert!(off.engine_room.is_none());

        let on = api_config(Some(r#"{"sources":["stripe"," polar"]}"#), true).unwrap();
        let room = on.engine_room.unwrap();
        let names: Vec<&str> = room.sources.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["stripe", "polar"]);
        assert_eq!(room.sources[0].secrets, ["whsec_test"]);
        assert_eq!(room.queue_url, "http://127.0.0.1:9/queue/q");
        assert_eq!(room.tolerance, Duration::from_secs(DEFAULT_TOLERANCE_SECS));
        assert_eq!(room.kinde_key, None);

        let kinde = api_config(
            Some(r#"{"sources":["kinde"],"kinde_key_file":"/k.pem","kinde_kid":"dev-key"}"#),
            true,
        )
        .unwrap();
        assert_eq!(
            kinde.engine_room.unwrap().kinde_key,
            Some(KeyFile {
                path: "/k.pem".into(),
                kid: "dev-key".into()
            })
        );
    }

    #[test]
    fn an_engine_room_naming_a_live_unknown_or_repeated_source_is_refused_at_cold_start() {
        for (raw, queue, message) in [
            (
                r#"{"sources":["stripe-live"]}"#,
                true,
                "INBOX_ENGINE_ROOM: sources: 'stripe-live' is a live-mode source (livemode: true in INBOX_SOURCES): the Engine Room runs only on test-mode sources",
            ),
            (
                r#"{"sources":["paddle"]}"#,
                true,
                "INBOX_ENGINE_ROOM: sources: 'paddle' is not a source of INBOX_SOURCES (its sources: kinde, stripe, stripe-live, polar)",
            ),
            (
                r#"{"sources":["stripe","stripe"]}"#,
                true,
                "INBOX_ENGINE_ROOM: sources: 'stripe' is named twice",
            ),
            (
                r#"{"sources":[]}"#,
                true,
                "INBOX_ENGINE_ROOM: sources: lists no source (leave INBOX_ENGINE_ROOM unset to keep the Engine Room off)",
            ),
            (
                r#"{"sources":["kinde"],"kinde_key_file":"/k.pem"}"#,
                true,
                "INBOX_ENGINE_ROOM: kinde_key_file: kinde_key_file and kinde_kid go together: the key's PEM file and the kid its JWKS names it by",
            ),
            (
                r#"{"source":["stripe"]}"#,
                true,
                r#"INBOX_ENGINE_ROOM: not {"sources": [the names of test-mode sources]}: unknown field `source`, expected one of `sources`, `kinde_key_file`, `kinde_kid` (line 1, column 9)"#,
            ),
            (
                r#"{"sources":["stripe"]}"#,
                false,
                "QUEUE_URL: is not set: the Engine Room (INBOX_ENGINE_ROOM) hands its events to the intake's queue",
            ),
        ] {
            let refused = api_config(Some(raw), queue).unwrap_err();
            assert_eq!(refused.to_string(), message, "{raw}");
        }
    }
}
