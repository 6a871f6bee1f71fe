//! Configuration from environment variables, read and validated once at cold start.

use std::time::Duration;

use serde::Deserialize;

pub const DEFAULT_TOLERANCE_SECS: u64 = 300;

/// A variable that is missing or malformed; the message names it.
#[derive(thiserror::Error)]
#[error("{var}: {detail}")]
pub struct ConfigError {
    pub var: &'static str,
    pub detail: String,
}

/// Shown as its message: a function that fails at start prints its error with `{:?}`.
impl std::fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

impl ConfigError {
    fn new(var: &'static str, detail: impl Into<String>) -> Self {
        Self {
            var,
            detail: detail.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    Kinde,
    Stripe,
    StandardWebhooks,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecretEncoding {
    Base64,
    Raw,
}

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
    /// The provider's API base URL (default: the provider's public API).
    #[serde(default)]
    pub api_base_url: Option<String>,
}

/// Secrets never reach a log line, not even through `{:?}`.
impl std::fmt::Debug for SourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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
            .finish()
    }
}

/// What the intake function needs.
#[derive(Debug, Clone)]
pub struct IntakeConfig {
    pub database_url: String,
    pub queue_url: String,
    pub sources: Vec<SourceConfig>,
    pub tolerance: Duration,
}

fn required(
    var: &'static str,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    match lookup(var) {
        Some(v) if !v.trim().is_empty() => Ok(v.trim().to_owned()),
        _ => Err(ConfigError::new(var, "is not set")),
    }
}

/// Parses `INBOX_SOURCES`: a JSON list of sources with unique, route-safe names.
pub fn parse_sources(raw: &str) -> Result<Vec<SourceConfig>, ConfigError> {
    const VAR: &str = "INBOX_SOURCES";
    let sources: Vec<SourceConfig> = serde_json::from_str(raw)
        .map_err(|e| ConfigError::new(VAR, format!("not a valid list of sources: {e}")))?;
    if sources.is_empty() {
        return Err(ConfigError::new(VAR, "lists no source"));
    }
    for source in &sources {
        let name_ok = !source.name.is_empty()
            && source
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            return Err(ConfigError::new(
                VAR,
                format!(
                    "source name '{}' must be non-empty letters, digits, '-' or '_'",
                    source.name
                ),
            ));
        }
    }
    Ok(sources)
}

fn tolerance(lookup: &impl Fn(&str) -> Option<String>) -> Result<Duration, ConfigError> {
    const VAR: &str = "INBOX_TOLERANCE_SECS";
    match lookup(VAR) {
        None => Ok(Duration::from_secs(DEFAULT_TOLERANCE_SECS)),
        Some(raw) => raw
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|s| *s > 0)
            .map(Duration::from_secs)
            .ok_or_else(|| {
                ConfigError::new(VAR, format!("'{raw}' is not a positive number of seconds"))
            }),
    }
}

impl IntakeConfig {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }

    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Ok(Self {
            database_url: required("DATABASE_URL", &lookup)?,
            queue_url: required("QUEUE_URL", &lookup)?,
            sources: parse_sources(&required("INBOX_SOURCES", &lookup)?)?,
            tolerance: tolerance(&lookup)?,
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

    const SOURCES: &str = r#"[{"name":"stripe","kind":"stripe","secrets":["whsec_x"]},
        {"name":"polar","kind":"standard-webhooks","secrets":["p"],"secret_encoding":"raw","tolerance_secs":60},
        {"name":"kinde","kind":"kinde","jwks_url":"https://x.kinde.com/.well-known/jwks"}]"#;

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
}
