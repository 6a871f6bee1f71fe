//! `INBOX_EFFECTS`: where effects are delivered.

use std::fmt;

use serde::Deserialize;

use crate::signing::standard_webhooks::{decode_secret, SecretEncoding};

use super::{value_free, ConfigError};

pub const EFFECTS_VAR: &str = "INBOX_EFFECTS";
pub const EFFECTS_QUEUE_VAR: &str = "EFFECTS_QUEUE_URL";

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
